"""The table-size bench (bench/scale.py) at tiny sizes on the in-process cluster: a hashed table trained, timed and
checkpointed, resumed into another number of shards with the same rows, a dynamic table filled to its capacity, and
the summary, tables and plot written from those runs with every field.

The driver's clusters (tfps-launch, one per size) cost a minute each here; the chief's work (bench/scale_train.py) is
what runs in them, and is what runs here. The in-process ps live in this process, so this process's memory stands for
each ps's in the summary: its arithmetic is checked, not the figures (those come from the driver's runs)."""

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import report  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import scale_summary  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import scale_train  # pylint: disable=g-import-not-at-top,wrong-import-position

_ROWS = 3000
_TINY = dict(batch_size=32, steps=20, measure=1)
_SHARDED = tfps.StrategyOptions(min_shard_bytes=0)  # a tiny table in 2 shards, as a large one is


def _this_process_as_ps(result: dict, num_ps: int) -> dict:
  """`result` with `tasks` as bench/runner.py gives them, from this process's /proc (where the in-process ps are)."""
  memory = {}
  with open("/proc/self/status", encoding="ascii") as status:
    for line in status:
      field = line.split(":", 1)[0]
      if field in ("VmHWM", "VmRSS"):
        memory[field] = int(line.split()[1]) * 1024
  task = {"peak_rss_bytes": memory["VmHWM"], "rss_bytes": memory["VmRSS"]}
  return dict(result, tasks={f"ps:{index}": dict(task) for index in range(num_ps)})


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
  """The runs of bench/scale.py's `measure`, at tiny sizes: hashed (saved), its resume into 4 shards, dynamic."""
  checkpoint = tmp_path_factory.mktemp("scale") / "checkpoint"
  saved = scale_train.run(cluster, scale_train.Settings("hashed", _ROWS, save_to=str(checkpoint),
                                                          strategy_options=_SHARDED, **_TINY))
  four_shards = tfps.StrategyOptions(num_shards=4, min_shard_bytes=0)
  resumed = scale_train.run(cluster, scale_train.Settings("hashed", _ROWS, resume_from=str(checkpoint),
                                                          strategy_options=four_shards, **_TINY))
  dynamic = scale_train.run(cluster, scale_train.Settings("dynamic", _ROWS, strategy_options=_SHARDED, **_TINY))
  as_ps = lambda result: _this_process_as_ps(result, cluster.num_ps)
  return {"load_before": [1.0, 1.0, 1.0], "load_after": [1.0, 1.0, 1.0], "skipped": [],
          "baseline": as_ps(dict(saved)), "results": [as_ps(saved), as_ps(dynamic)],
          "checkpoints": [{"save": as_ps(saved), "resume": as_ps(resumed)}]}


def test_a_hashed_run_is_timed_checkpointed_and_resumed_into_other_shards_with_its_rows(runs):
  saved, resumed = runs["checkpoints"][0]["save"], runs["checkpoints"][0]["resume"]
  assert saved["step"] == 2 * _TINY["steps"] and len(saved["window_step_secs"]) == _TINY["measure"]
  assert saved["step_secs"] > 0 and saved["save_secs"] > 0
  assert saved["checkpoint_bytes"] > scale_summary.state_bytes(_ROWS)  # rows and accumulators, on disk
  assert saved["state_bytes"] == _ROWS * 16 * 4 * 2
  assert resumed["resumed"] and resumed["shards"] == 4 and resumed["step"] == saved["step"]
  assert resumed["restore_secs"] > 0 and resumed["create_secs"] > 0
  assert len(saved["probe"]) == 4 and resumed["probe"] == saved["probe"]  # each row as saved, across the shards


def test_a_dynamic_table_is_full_before_its_steps_are_timed(runs):
  dynamic = runs["results"][1]
  assert dynamic["table"] == "dynamic" and dynamic["fill_secs"] > 0 and dynamic["step_secs"] > 0
  metrics = dynamic["table_metrics"]
  assert metrics["occupancy"] == _ROWS  # every shard filled: the ids left over read the default
  assert metrics["fallbacks"] >= scale_train.fill_count(_ROWS) - _ROWS


def test_the_summary_tables_and_plot_have_every_field(runs, tmp_path):
  summary = scale_summary.summarize(runs)
  rows = {row["table"]: row for row in summary["rows"]}
  assert set(rows) == {"hashed", "dynamic"}
  for row in rows.values():
    assert row["step_vs_median"] == 1.0 and row["runs"] == 1  # one size of each kind
    assert row["over_baseline_vs_state"] == pytest.approx(
        (max(row["ps_peak_rss_bytes"]) - summary["baseline_bytes"]) / (row["state_bytes"] / 2))
    assert row["rss_holds"] == (row["over_baseline_vs_state"] <= scale_summary.RSS_BOUND[row["table"]])
    assert set(row["ps_end_rss_bytes"]) and row["load_runs"]
  assert rows["dynamic"]["occupancy"] == _ROWS and rows["dynamic"]["fill_secs"] > 0
  assert len(summary["targets"]) == 4 and all(len(value) == 2 for value in summary["targets"].values())
  assert set(summary["advice"]["dynamic"]) == {"same_ps"}  # its checkpoint restores into as many shards only
  for table, kinds in summary["advice"].items():
    if table == "hashed":
      assert set(kinds) == {"resharded", "same_ps"}
      assert kinds["resharded"]["restore_factor"] == max(1.0, summary["checkpoints"][0]["restore_factor"])
    assert kinds["same_ps"]["restore_factor"] == 1.0  # no resume on as many ps here
    for advice in kinds.values():
      assert advice["from_rows"] == _ROWS and advice["table_rows"] == 10**9
      assert set(advice["ps"]) == {"32", "64"} and advice["ps"]["32"]["num_ps"] >= advice["ps"]["64"]["num_ps"] >= 1
      assert advice["ps"]["64"]["peak_gib_per_ps"] >= advice["ps"]["64"]["gib_per_ps"]
  assert "| hashed | 1e+09 |" in report.advice_table(summary)
  checkpoint, = summary["checkpoints"]
  assert checkpoint["rows_read_back_equal"] and checkpoint["step_restored"] == checkpoint["step_saved"]
  gigabytes = checkpoint["checkpoint_bytes"] / 1e9
  assert checkpoint["save_secs_per_gb"] == pytest.approx(checkpoint["save_secs"] / gigabytes)
  table = report.scale_table(summary)
  assert table.count("\n") == 3 and "| hashed | 3e+03 |" in table and "| dynamic | 3e+03 |" in table
  assert "| hashed 3e+03 rows, saved on 2 ps |" in report.checkpoint_table(summary)
  plot = report.plot_scale(summary, str(tmp_path / "scale.png"))
  assert plot and (tmp_path / "scale.png").read_bytes()[:4] == b"\x89PNG"


def test_the_advice_takes_the_resume_peaks_of_the_largest_table_resumed_only():
  resume = lambda rows, on_ps, factor: {"table_rows": rows, "saved_on_ps": 2, "resumed_on_ps": on_ps,
                                        "restore_factor": factor}
  checkpoints = [resume(10**6, 3, 9.0), resume(10**6, 2, 8.0), resume(10**7, 3, 2.3), resume(10**7, 2, 2.1),
                 {"table_rows": 10**8, "saved_on_ps": 2, "resumed_on_ps": None}]  # saved, never resumed
  assert scale_summary.largest_restore_factors(checkpoints) == {"resharded": 2.3, "same_ps": 2.1}


def test_the_plot_of_a_hashed_table_alone_is_written(runs, tmp_path):
  summary = scale_summary.summarize(dict(runs, results=[r for r in runs["results"] if r["table"] == "hashed"]))
  plot = report.plot_scale(summary, str(tmp_path / "scale.png"))
  assert plot and (tmp_path / "scale.png").read_bytes()[:4] == b"\x89PNG"
