"""Numbers written once: every figure of the README's "What works" table is the value of the results file or the
bound of the test its row cites (rounded as quoted), no number in that table is left without one, and the generated
tables of docs/performance.md are what bench/tables.py renders from their results today. JSON and text only: no
TensorFlow, well under a second."""

import dataclasses
import json
import pathlib
import re
import statistics
import sys
from typing import Callable, Tuple

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))

from bench import aims  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench_modules import bench_module  # pylint: disable=g-import-not-at-top,wrong-import-position

tables = bench_module("tables")


def _json(name: str) -> dict:
  return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _rate(name: str, variant: str, batch: int = None) -> float:
  """Median examples/s of `variant` in the throughput results `name` (at `batch`, if the file has several)."""
  rows = tables.load(name)["summary"]["rows"]
  return next(r["examples_per_sec"] for r in rows if r["variant"] == variant and batch in (None, r["batch_size"]))


def _row(name: str, variant: str, batch: int = None) -> dict:
  rows = tables.load(name)["summary"]["rows"]
  return next(r for r in rows if r["variant"] == variant and batch in (None, r["batch_size"]))


def _ratio(name: str, variant: str, other: str, batch: int = None) -> float:
  return _rate(name, variant, batch) / _rate(name, other, batch)


def _first_trace(name: str) -> tuple:
  """`(ratio, seconds with 4, seconds with 1)` of `bench/first_trace.py`'s medians."""
  seconds = {steps: statistics.median(runs) for steps, runs in _json(name)["seconds"].items()}
  return seconds["4"] / seconds["1"], seconds["4"], seconds["1"]


def _quality_diffs(name: str) -> tuple:
  return tuple(c["diff"] for c in _json(name)["comparison"] if c["model"] in ("wide_deep", "dcn"))


def _capped(rate_mbit: float) -> float:
  """bf16 rows' median examples/s over the default's on links capped at `rate_mbit` (0: no cap)."""
  runs = [r for r in _json("bf16_rows/capped_links.json")["runs"] if r["rate_mbit"] == rate_mbit]
  return (statistics.median(r["examples_per_sec"] for r in runs if r["bf16_rows"])
          / statistics.median(r["examples_per_sec"] for r in runs if not r["bf16_rows"]))


def _capped_megabytes(bf16: bool) -> float:
  runs = _json("bf16_rows/capped_links.json")["runs"]
  return statistics.median(r["sent_bytes_per_step"] for r in runs if r["bf16_rows"] == bf16) / 1e6


def _host_delay(delay_ms: float, key: str = "examples_per_sec") -> float:
  return next(r[key] for r in _json("host_delay.json")["runs"] if r["delay_ms"] == delay_ms)


def _pipelined_delay(delay_ms: float) -> float:
  rate = lambda name: next(r["examples_per_sec"] for r in _json(name)["runs"] if r["delay_ms"] == delay_ms)
  return rate("pipelined/host_delay.json") / rate("pipelined/host_delay_default.json")


def _seeds_below(name: str, other: str) -> tuple:
  """(seeds, of how many) in which the tfps side of `name` ends below that of `other`, the same for each model."""
  counts = set()
  for mine, theirs in zip(_json(name)["comparison"], _json(other)["comparison"]):
    assert mine["model"] == theirs["model"] and _json(name)["seeds"] == _json(other)["seeds"]
    counts.add((sum(a < b for a, b in zip(mine["tfps"]["values"], theirs["tfps"]["values"])),
                len(mine["tfps"]["values"])))
  (count,) = counts
  return count


def _pooled(names, variant: str) -> float:
  """The median examples/s of every run of `variant` in the throughput results `names` together."""
  return statistics.median(rate for name in names for rate in _row(name, variant)["runs"])


def _restore_factor(series: str, num_ps: int) -> float:
  """A ps's peak over its share when the 1e7-row checkpoint saved on 2 ps was resumed on `num_ps` (scale/restore_*)."""
  return next(row["restore_factor"] for row in _json(f"scale/restore_{series}/scale.json")["summary"]["checkpoints"]
              if row["table_rows"] == 10**7 and row["resumed_on_ps"] == num_ps)


def _load_range(names) -> tuple:
  """The lowest and highest 1-minute load average at the end of any run of the throughput results `names`."""
  loads = [run["load"] for name in names for run in tables.load(name)["runs"]["results"]]
  return min(loads), max(loads)


def _coordinator_shares() -> list:
  return [value for name in (_TP + "b256_1x1", _TP + "b256_more")
          for target, (value, _) in tables.load(name)["summary"]["targets"].items()
          if target.startswith("coordinator") and "+" not in target]


def _worker_cut(key: str):
  return next(r for r in _json("host_cut_worker.json")["results"] if r["scenario"] == "worker_cut")[key]


def _holdback_loss(variant: str) -> float:
  medians = _json("throughput_holdback.json")["median_examples_per_sec"][variant]
  return 1 - medians["per-ps records + hold-back (f9f5adf)"]["median"] / medians["before (bd08e09)"]["median"]


def _scaling_1e7() -> tuple:
  return tuple(r["peak_over_baseline_vs_state_per_ps"] for r in _json("scaling.json")["summary"]["rows"]
               if r["table_rows"] == 10**7)


def _applied(name: str) -> tuple:
  summary = _json(name)["summary"]
  return sum(1 for run in _json(name)["runs"] if set(run["applied_by_ps"].values()) == {run["asked_steps"]}), \
      summary["runs"]


def _applied_per_ps(name: str) -> tuple:
  """(runs exact on every ps, runs, steps applied on each ps, steps asked, steps counted) of a per-ps kills run."""
  runs = _json(name)["runs"]
  applied = {count for run in runs for count in run["applied_by_ps"].values()}
  (asked,), (counted,) = {run["asked_steps"] for run in runs}, {run["iterations"] for run in runs}
  exact = sum(1 for run in runs if set(run["applied_by_ps"].values()) == {run["asked_steps"]})
  return exact, len(runs), min(applied), asked, counted


_ONLINE_1X1, _ONLINE_2X2 = "online/stream_vs_files.json", "online/stream_vs_files_2x2.json"
_ONLINE_EARLIER = ("online/stream_vs_files_first.json", "online/stream_vs_files_2x2_first.json",
                   "online/stream_vs_files_2x2_second.json")


def _online_loads() -> tuple:
  """The lowest and highest load average beside the runs of the stream-against-files series."""
  loads = [load for name in (_ONLINE_1X1, _ONLINE_2X2) for load in _json(name)["load_average"]]
  return min(loads), max(loads)


@dataclasses.dataclass(frozen=True)
class Figure:
  """A README row (its first cell starts with `row`) quotes `template` filled with `values()` from `source`."""
  row: str
  template: str
  source: str
  values: Callable[[], Tuple]


@dataclasses.dataclass(frozen=True)
class Bound:
  """A README row quotes `quote`, a bound or a setting of the test `source`, which holds each of `literals`."""
  row: str
  quote: str
  source: str
  literals: Tuple[str, ...]


_PD = "packed_default/"
_TP = "defaults_4/"  # the series against TensorFlow's tutorial peer: bench/tables.py's DEFAULTS
_THROUGHPUT = "`tfps.fit` against plain tf-keras"
_OVERLAP = ("overlap/b256", "overlap/b256_again")  # pipelined updates, the default and the tutorial's peer
FIGURES = (
    Figure("quality equals", "{:.4f} and {:.4f} AUC", _PD + "quality_5seeds.json",
           lambda: _quality_diffs(_PD + "quality_5seeds.json")),
    Figure("retrieval quality", "{:+.1%} and {:+.1%} in two runs",
           "quality.json, quality_retrieval_20_epochs.json",
           lambda: tuple(next(c["relative_diff"] for c in _json(name)["comparison"] if c["metric"] == "top_100")
                         for name in ("quality.json", "quality_retrieval_20_epochs.json"))),
    Figure("3 worker SIGKILLs", "{} of {} runs on 1 ps", "worker_kills.json", lambda: _applied("worker_kills.json")),
    Figure("3 worker SIGKILLs", "{} of {} on 2 ps", "worker_kills_2ps.json", lambda: _applied("worker_kills_2ps.json")),
    Figure("3 worker SIGKILLs", "{} of {} runs on 2 ps: {} of {} steps applied on each ps, {} counted",
           "worker_kills_per_ps_2ps.json", lambda: _applied_per_ps("worker_kills_per_ps_2ps.json")),
    Figure("geo mode", "{:.2f}-{:.2f}x async ex/s, {:.2f}-{:.2f}x ps bytes, {:+.4f} AUC", "modes.json",
           lambda: (min(r["speed_vs_async"] for r in _json("modes.json")["rows"] if r["mode"] == "geo"),
                    max(r["speed_vs_async"] for r in _json("modes.json")["rows"] if r["mode"] == "geo"),
                    min(r["traffic_vs_async"] for r in _json("modes.json")["rows"] if r["mode"] == "geo"),
                    max(r["traffic_vs_async"] for r in _json("modes.json")["rows"] if r["mode"] == "geo"),
                    next(r["auc_vs_async"] for r in _json("modes.json")["rows"] if r["mode"] == "geo"))),
    Figure("throughput, `tfps.fit`", "{:.2f}x one process measured beside it ({:,.0f} ex/s)", _TP + "b256_1x1",
           lambda: (_row(_TP + "b256_1x1", "fit_1x1")["vs_single"], _rate(_TP + "b256_1x1", "fit_1x1"))),
    Figure("throughput, `tfps.fit`", "the Estimator path {:.2f}x", _TP + "b256_1x1",
           lambda: (_row(_TP + "b256_1x1", "estimator_1x1")["vs_single"],)),
    Figure(_THROUGHPUT, "batch 256: {:.2f}x at 1 ps + 1 worker, {:.2f}x at 2 + 2, {:.2f}x at 4 + 2",
           _TP + "b256_1x1, b256_more",
           lambda: (_ratio(_TP + "b256_1x1", "fit_1x1", "keras_pss_1x1"),
                    _ratio(_TP + "b256_more", "fit_2x2", "keras_pss_2x2"),
                    _ratio(_TP + "b256_more", "fit_4x2", "keras_pss_4x2"))),
    Figure(_THROUGHPUT, "batch 4096: {:.2f}x, {:.2f}x, {:.2f}x", _TP + "b4096",
           lambda: tuple(_ratio(_TP + "b4096", f"fit_{s}", f"keras_pss_{s}") for s in ("1x1", "2x2", "4x2"))),
    Figure(_THROUGHPUT, "the FixedShards peer (`keras_pss_fixed_*`), batch 256: {:.2f}x, {:.2f}x, {:.2f}x",
           _TP + "b256_1x1, b256_more",
           lambda: (_ratio(_TP + "b256_1x1", "fit_1x1", "keras_pss_fixed_1x1"),
                    _ratio(_TP + "b256_more", "fit_2x2", "keras_pss_fixed_2x2"),
                    _ratio(_TP + "b256_more", "fit_4x2", "keras_pss_fixed_4x2"))),
    Figure(_THROUGHPUT, "1 + 1, batch 256: {:.2f}x one process", _TP + "b256_1x1",
           lambda: (_row(_TP + "b256_1x1", "fit_1x1")["cpu_vs_single"],)),
    Figure(_THROUGHPUT, "the tutorial's peer {:.2f}x)", _TP + "b256_1x1",
           lambda: (_row(_TP + "b256_1x1", "keras_pss_1x1")["cpu_vs_single"],)),
    Figure(_THROUGHPUT, "The ps spends {:.2f} ms per step there, {:.2f}x what the same ps work", _TP + "b256_1x1",
           lambda: (_row(_TP + "b256_1x1", "fit_1x1")["cpu_ms_per_step"]["ps"],
                    _row(_TP + "b256_1x1", "fit_1x1")["ps_vs_floor"])),
    Figure(_THROUGHPUT, "(aimed at: {}x;", "bench/aims.py", lambda: (aims.CPU_VS_SINGLE,)),
    Figure(_THROUGHPUT, "(aimed at: at most {}x)", "bench/aims.py", lambda: (aims.PS_VS_FLOOR,)),
    Figure(_THROUGHPUT, "one by one, {:.2f}x at 1 + 1", _PD + "b256_1x1",
           lambda: (_ratio(_PD + "b256_1x1", "fit_1x1+unpacked", "fit_1x1"),)),
    Figure("opt-in `--pipelined_updates`", "FixedShards peer: {:.2f}x at 1 ps + 1 worker (Estimator path {:.2f}x), "
           "{:.2f}x at 2 + 2, {:.2f}x at 4 + 2, {:.2f}x at batch 4096", "sleeping_default{,/more,/b4096}",
           lambda: (_row("sleeping_default", "fit_1x1+pipelined")["vs_keras_pss"],
                    _row("sleeping_default", "estimator_1x1+pipelined")["vs_keras_pss"],
                    _row("sleeping_default/more", "fit_2x2+pipelined")["vs_keras_pss"],
                    _row("sleeping_default/more", "fit_4x2+pipelined")["vs_keras_pss"],
                    _row("sleeping_default/b4096", "fit_1x1+pipelined")["vs_keras_pss"])),
    Figure("opt-in `--pipelined_updates`", "2 / 5 ms of delay per host: {:.2f}x / {:.2f}x the default",
           "pipelined/host_delay.json, pipelined/host_delay_default.json",
           lambda: (_pipelined_delay(2.0), _pipelined_delay(5.0))),
    Figure("opt-in `--pipelined_updates`", "{:.2f}x / {:.2f}x the default at 1 + 1 / 2 + 2 (medians over two series' "
           "runs; one series at 1 + 1: {:.2f}x)", "overlap/b256{,_again}",
           lambda: tuple(_pooled(_OVERLAP, f"fit_{size}+pipelined") / _pooled(_OVERLAP, f"fit_{size}")
                         for size in ("1x1", "2x2")) + (_ratio("overlap/b256", "fit_1x1+pipelined", "fit_1x1"),)),
    Figure("opt-in `--pipelined_updates`", "quality {:.4f} (Wide&Deep) and {:.4f} (DCN)", "overlap/quality.json",
           lambda: _quality_diffs("overlap/quality.json")),
    Figure("`--unrolled_steps=4`", "{:.2f}x at 1 ps + 1 worker, batch 256, with {:.0%} less CPU per step",
           "unrolled_steps/ab", lambda: (_ratio("unrolled_steps/ab", "fit_1x1", "fit_1x1+unroll1"),
                                         1 - _row("unrolled_steps/ab", "fit_1x1")["cpu_ms_per_step"]["total"]
                                         / _row("unrolled_steps/ab", "fit_1x1+unroll1")["cpu_ms_per_step"]["total"])),
    Figure("`--unrolled_steps=4`", "({:.2f}x in the series of 2026-11-28)", "defaults_auto/b256",
           lambda: (_ratio("defaults_auto/b256", "fit_1x1", "fit_1x1+unroll1"),)),
    Figure("`--unrolled_steps=4`", "every start and restart traces {:.1f}x as long (20 steps: {:.1f} s against {:.1f} s)",
           "unrolled_steps/first_trace_again.json", lambda: _first_trace("unrolled_steps/first_trace_again.json")),
    Figure("`--unrolled_steps=4`", "{:.2f}x at 2 ps + 2 workers, batch 4096 (workers spend {:.1f}x the CPU",
           "unrolled_steps/b4096_2x2",
           lambda: (_ratio("unrolled_steps/b4096_2x2", "fit_2x2", "fit_2x2+unroll1"),
                    _row("unrolled_steps/b4096_2x2", "fit_2x2")["cpu_ms_per_step"]["worker"]
                    / _row("unrolled_steps/b4096_2x2", "fit_2x2+unroll1")["cpu_ms_per_step"]["worker"])),
    Figure("opt-in `--bf16_rows`", "{:.1f} MB sent per step instead of {:.1f}", "bf16_rows/capped_links.json",
           lambda: (_capped_megabytes(True), _capped_megabytes(False))),
    Figure("opt-in `--bf16_rows`", "{:.2f}x the default's examples/s with 200 Mbit/s links, {:.2f}x with 1 Gbit/s, "
           "{:.2f}x uncapped", "bf16_rows/capped_links.json", lambda: (_capped(200), _capped(1000), _capped(0))),
    Figure("opt-in `--bf16_rows`", "loopback {:.2f}-{:.2f}x", "bf16_rows/b256, bf16_rows/b4096",
           lambda: (min(_bf16_loopback()), max(_bf16_loopback()))),
    Figure("opt-in `--bf16_rows`", "quality {:.4f} (Wide&Deep) and {:.4f} (DCN) AUC against one process with stacked",
           "bf16_rows/quality.json", lambda: _quality_diffs("bf16_rows/quality.json")),
    Figure("opt-in `--bf16_rows`", "{:.4f} and {:.4f} with a table per feature", "bf16_rows/quality_per_feature.json",
           lambda: _quality_diffs("bf16_rows/quality_per_feature.json")),
    Figure("the Estimator path against", "the tutorial's peer {:.2f}x (1 + 1, batch 256), {:.2f}x at 2 + 2, {:.2f}x at "
           "4 + 2; batch 4096: {:.2f}x, {:.2f}x, {:.2f}x; CPU per example {:.2f}x one process; {:.2f}x the FixedShards "
           "peer with", _TP + "b256_1x1, b256_more, b4096; sleeping_default",
           lambda: (_ratio(_TP + "b256_1x1", "estimator_1x1", "keras_pss_1x1"),
                    _ratio(_TP + "b256_more", "estimator_2x2", "keras_pss_2x2"),
                    _ratio(_TP + "b256_more", "estimator_4x2", "keras_pss_4x2"),
                    *(_ratio(_TP + "b4096", f"estimator_{s}", f"keras_pss_{s}") for s in ("1x1", "2x2", "4x2")),
                    _row(_TP + "b256_1x1", "estimator_1x1")["cpu_vs_single"],
                    _row("sleeping_default", "estimator_1x1+pipelined")["vs_keras_pss"])),
    Figure("the coordinator is not", "{:.1f}-{:.1f}% at batch 256", _TP + "b256_1x1, b256_more",
           lambda: (100 * min(_coordinator_shares()), 100 * max(_coordinator_shares()))),
    Figure("step time as tables grow", "{:.2f}-{:.2f} of the median", "scaling.json",
           lambda: (min(r["step_vs_smallest"] for r in _json("scaling.json")["summary"]["rows"]),
                    max(r["step_vs_smallest"] for r in _json("scaling.json")["summary"]["rows"]))),
    Figure("a ps holds its share", "{:.2f}, {:.2f}, {:.2f}x on 1, 2, 4 ps", "scaling.json", _scaling_1e7),
    Figure("the price of exactly-once", "{:.0f}-{:.0f}% fewer ex/s", "throughput_holdback.json",
           lambda: (100 * _holdback_loss("fit_1x1"), 100 * _holdback_loss("fit_2x2"))),
    Figure("7 test hosts (network namespaces)", "exact step count ({} of {})", "host_cut.json",
           lambda: next((r["steps"], r["asked_steps"]) for r in _json("host_cut.json")["results"]
                        if r["scenario"] == "loss")),
    Figure("7 test hosts (network namespaces)", "the chief stops in {:.1f} s", "host_cut.json",
           lambda: (next(r["secs_to_chief_stop"] for r in _json("host_cut.json")["results"]
                         if r["scenario"] == "ps_cut"),)),
    Figure("7 test hosts: a worker cut off", "worker found silent after {:.1f} s, {:,} of {:,} steps during the cut); "
           "the worker works again {:.1f} s after the restore; exact step count", "host_cut_worker.json",
           lambda: (_worker_cut("secs_to_worker_failed"), _worker_cut("steps_during_cut"), _worker_cut("asked_steps"),
                    _worker_cut("secs_restore_to_sending"))),
    Figure("examples/s against network delay", "{:.2f}x at 1 ms per host, {:.2f}x at 2, {:.2f}x at 5, {:.2f}x at 10",
           "host_delay.json", lambda: tuple(_host_delay(ms) / _host_delay(0.0) for ms in (1.0, 2.0, 5.0, 10.0))),
    Figure("examples/s against network delay", "about {:.0f} round trips one after another per step", "host_delay.json",
           lambda: ((_host_delay(10.0, "step_secs") - _host_delay(2.0, "step_secs")) * 1000 / (2 * 8),)),
    Figure("resume a run on a different", "({:.2f} GB table saved on 2 ps)", "reshard.json",
           lambda: (_json("reshard.json")["table_bytes"] / 1e9,)),
    Figure("resume a run on a different", "resumed on 4 ps in {:.2f} s, on 2 in {:.2f} s ({:.2f}x)", "reshard.json",
           lambda: (_reshard(4), _reshard(2), _reshard(4) / _reshard(2))),
    Figure("raw ids without hashing", "step time {:.2f}x a hashed table", "dynamic_embedding_measured_fused.json",
           lambda: (_json("dynamic_embedding_measured_fused.json")["experiments"]["step_time"]["summary"]
                    ["cluster_dynamic_vs_hashed"],)),
    Figure("raw ids without hashing", "with `--bf16_rows` {:.2f}x the bytes", "dynamic_embedding_measured_bf16.json",
           lambda: (_json("dynamic_embedding_measured_bf16.json")["experiments"]["bf16_rows"]["summary"]
                    ["bytes_bf16_vs_float32"],)),
    Figure("stream input against file input", "1 ps + 1 worker: {:.2f}x the examples/s", _ONLINE_1X1,
           lambda: (_json(_ONLINE_1X1)["stream_over_files"]["windows"],)),
    Figure("stream input against file input", "2 ps + 2 workers: {:.2f}x", _ONLINE_2X2,
           lambda: (_json(_ONLINE_2X2)["stream_over_files"]["windows"],)),
    Figure("stream input against file input", "CPU per example over all tasks {:.2f}x and {:.2f}x",
           f"{_ONLINE_1X1}, {_ONLINE_2X2}",
           lambda: tuple(_json(name)["stream_cpu_over_files"]["all"] for name in (_ONLINE_1X1, _ONLINE_2X2))),
    Figure("stream input against file input", "load average {:.0f}-{:.0f}", f"{_ONLINE_1X1}, {_ONLINE_2X2}",
           lambda: _online_loads()),
    Figure("a stream replay of the bundled MovieLens", "{:+.4f} AUC at {} passes ({:.4f} against {:.4f}) and {:+.4f} "
           "at {} pass (medians of {} seeds and of {} seeds)", "online/stream_quality.json",
           lambda: (_json(_Q3)["stream_minus_files_auc"], _json(_Q3)["passes"], _json(_Q3)["median_auc"]["stream"],
                    _json(_Q3)["median_auc"]["files"], _json(_Q1)["stream_minus_files_auc"], _json(_Q1)["passes"],
                    len(_json(_Q3)["runs"]), len(_json(_Q1)["runs"]))),
    Figure("raw ids without hashing", "{:+.3f} AUC over hashed tables", "dynamic_embedding_measured_movielens.json",
           lambda: (_json("dynamic_embedding_measured_movielens.json")["experiments"]["movielens"]["summary"]
                    ["auc_dynamic_minus_hashed"],)),
)
BOUNDS = (
    Bound("online training on a Kafka stream",
          "each of 2 x 3 waves of 320 messages and of 4 waves of 160 counted once",
          "tests/test_online_processes.py", ("WAVE = 320", "messages = (len(kills) + 1) * wave",
                                             'WAVE, ["worker:1", "chief:0"], num_ps=1',
                                             'WAVE, ["worker:1", "ps:1"], "--sync_mode=geo"',
                                             'WAVE // 2, ["worker:1", "chief:0", "ps:1"], "--path=keras"')),
    Bound("the main job", "validation AUC above 0.6 after 2 epochs of 60 steps", "tests/test_jobs.py",
          ("assert val_auc > 0.6", '"--epochs=2", "--steps_per_epoch=60"')),
    Bound("a model of your own", "held-out AUC of at least 0.80", "tests/test_docs.py",
          ("STATED_VAL_AUC = 0.80", 'assert metrics["val_auc"] >= STATED_VAL_AUC')),
    Bound("ps or chief SIGKILL", "ends at exactly 600 of 600 steps", "tests/test_chaos.py",
          ("EPOCHS, STEPS = 4, 100", "KILLS_EPOCHS = EPOCHS + 2", "assert final[\"step\"] == KILLS_EPOCHS * STEPS")),
    Bound("Estimator path, 2 ps: 2 worker and 1 ps SIGKILLs", "resumes at step 750, ends at exactly 1000 of 1000 steps",
          "tests/test_chaos.py", ('endswith("resuming at step 750")', "ESTIMATOR_STEPS = 1000",
                                  'assert final["step"] == ESTIMATOR_STEPS')),
    Bound("sync mode equals", "loss within 1e-4 of one process's", "tests/test_modes.py", ("- expected) < 1e-4",)),
    Bound("a 400 MB table", "at most 1.2x table and accumulator", "tests/test_initialization.py",
          ('peak["before_bytes"] <= 1.2 * state',)),
    Bound("2 ms and 10 ms of delay", "exact step count (20 of 20), 20 applied on each ps", "tests/test_host_delay.py",
          ("epochs, steps = 2, 10", '["step"] == epochs * steps', '"ps:0": epochs * steps, "ps:1": epochs * steps')),
    Bound("7 test hosts: a worker cut off", "480 of 480, and 480 applied on each ps", "tests/test_many_hosts.py",
          ("epochs, steps = 6, 80", 'assert final["step"] == epochs * steps',
           '"ps:0": epochs * steps, "ps:1": epochs * steps')),
    Bound("two-tower retrieval", "top-100 above 0.08 after 40 steps", "tests/test_dynamic_embedding_retrieval.py",
          ('assert top_k["top_100"] > 0.08', '"--steps_per_epoch=40"')),
)
# Figures in the prose of docs/performance.md (its tables are generated): (quoted text, results file, values).



def _scale_flatness(name: str, table: str) -> float:
  """A scale series' slowest step median over its fastest, for `table`."""
  return next(value for aim, (value, _) in _json(name)["summary"]["targets"].items()
              if aim.startswith(f"{table}: slowest step"))


def _side_by_side_floor(folder: str) -> tuple:
  """fit_2x2's ps CPU per step, per ps, over the floor's, in the old and the new runs of a side-by-side folder (the
  medians of each side's runs)."""
  def ps_ms(run):
    cores = [task["cores"] for name, task in run["tasks"].items() if name.startswith("ps")]
    return 1000 * run["step_secs"] * sum(cores) / len(cores)

  ratios = []
  for side in ("old", "new"):
    runs = [run for path in sorted((RESULTS / folder).glob(f"{side}_*.json"))
            for run in json.loads(path.read_text())["runs"]["results"]]
    ratios.append(statistics.median(ps_ms(r) for r in runs if r["variant"] == "fit_2x2")
                  / statistics.median(ps_ms(r) for r in runs if r["variant"] == "ps_floor_2x2"))
  return tuple(ratios)

def _dynamic_again() -> tuple:
  """The load range of the dynamic table's series again, and its step medians' median over the quiet hour's."""
  again = [row for row in _json("scale/dynamic_again/scale.json")["summary"]["rows"] if row["table"] == "dynamic"]
  quiet = [row for row in _json("scale/quiet/scale.json")["summary"]["rows"] if row["table"] == "dynamic"]
  loads = [value for row in again for value in row["load_runs"]]
  return (min(loads), max(loads), statistics.median(row["step_secs"] for row in again)
          / statistics.median(row["step_secs"] for row in quiet))

def _epoch_end(side: str) -> tuple:
  """`bench/results/epoch_end/`: the median over runs of each run's median epoch seconds, with `side`'s (before or
  after) saves; and the GB its model_dir held after the last epoch (the same in every run)."""
  runs = [_json(f"epoch_end/{side}_{index}.json") for index in (1, 2, 3)]
  held = {run["model_dir_bytes_after_epoch"][-1] // 10**7 for run in runs}
  assert len(held) == 1, held
  return statistics.median(run["median_epoch_secs"] for run in runs), held.pop() / 100


PERFORMANCE_PROSE = (
    ("every start and restart traces {:.1f}x as long", "unrolled_steps/first_trace_again.json",
     lambda: _first_trace("unrolled_steps/first_trace_again.json")[:1]),
    ("tfps.fit ran {:.3f}x one process's examples/s and {:.3f}x its CPU per example", _TP + "b256_1x1",
     lambda: (_row(_TP + "b256_1x1", "fit_1x1+unroll4")["vs_single"],
              _row(_TP + "b256_1x1", "fit_1x1+unroll4")["cpu_vs_single"])),
    ("The ps's floor itself ran {:.3f}x one process's examples/s here", _TP + "b256_1x1",
     lambda: (_row(_TP + "b256_1x1", "ps_floor_1x1")["vs_single"],)),
    ("fit_2x2's ps CPU {:.3f}x -> {:.3f}x the floor's side by side", "ps_floor/cross_ps/side_by_side",
     lambda: _side_by_side_floor("ps_floor/cross_ps/side_by_side")),
    ("set once per function: {:.3f}x -> {:.3f}x in a later side by side", "ps_floor/rate_copies",
     lambda: _side_by_side_floor("ps_floor/rate_copies")),
    ("step record (once per function: {:.3f}x -> {:.3f}x,", "ps_floor/step_record",
     lambda: _side_by_side_floor("ps_floor/step_record")),
    ("within the runs' spread: tfps.fit {:.3f}x and the Estimator path {:.3f}x in the defaults' series, {:.3f}x and "
     "{:.3f}x in a quieter one",
     "defaults_4/b256_more, ps_floor/fit_vs_estimator_2x2/quiet",
     lambda: tuple(_row(series, variant)["ps_vs_floor"] for series in ("defaults_4/b256_more",
                                                                      "ps_floor/fit_vs_estimator_2x2/quiet")
                   for variant in ("fit_2x2", "estimator_2x2"))),
    ("an epoch took {:.2f} s with both saves and {:.2f} s with one (medians), and `model_dir` held {:.2f} GB after it "
     "instead of {:.2f}", "epoch_end/{before,after}_*.json",
     lambda: [_epoch_end(side)[part] for part in (0, 1) for side in ("before", "after")]),
    ("met by the hashed table ({:.3f}); the dynamic one missed it in the quiet series ({:.3f}) and met it in a series "
     "of its sizes alone at today's code ({:.3f})", "scale/quiet/scale.json, scale/dynamic_again/scale.json",
     lambda: (_scale_flatness("scale/quiet/scale.json", "hashed"), _scale_flatness("scale/quiet/scale.json", "dynamic"),
              _scale_flatness("scale/dynamic_again/scale.json", "dynamic"))),
    ("the ps's CPU per step: {:.2f} ms against the peer's {:.2f} at 1x1", _TP + "b256_1x1",
     lambda: (_row(_TP + "b256_1x1", "fit_1x1")["cpu_ms_per_step"]["ps"],
              _row(_TP + "b256_1x1", "keras_pss_1x1")["cpu_ms_per_step"]["ps"])),
    ("tfps.fit reaches {:.3f}x its examples/s at batch 256 and {:.3f}x at batch 4096", _TP + "b256_1x1, b4096",
     lambda: (_row(_TP + "b256_1x1", "fit_1x1")["vs_single"], _row(_TP + "b4096", "fit_1x1")["vs_single"])),
    ("series before it ({:,.0f} ex/s:", "tutorial_peer/b256_1x1", lambda: (_rate("tutorial_peer/b256_1x1", "single"),)),
    ("one process ran {:,.0f} ex/s at batch 256", _TP + "b256_1x1", lambda: (_rate(_TP + "b256_1x1", "single"),)),
    ("(2026-11-28 20:36-20:41 UTC, load {:.1f}-{:.1f}, on a machine whose cores ran every step ~{:.1f}x slower than the quiet hour's",
     "scale/dynamic_again/scale.json, scale/quiet/scale.json", lambda: _dynamic_again()),
    ("the rows' update arithmetic itself is {:.0f}%", "loop_index/profile/profile.json",
     lambda: (_json("loop_index/profile/profile.json")["tasks"]["ps:0"]["kinds"]
              ["optimizer: sparse Adagrad on table rows"],)),
    ("2 and 5 ms apart: {:.2f}x and {:.2f}x the default", "pipelined/host_delay{,_default}.json",
     lambda: (_pipelined_delay(2.0), _pipelined_delay(5.0))),
    ("Wide&Deep {:.4f} AUC, DCN {:.4f} over 5 seeds", "overlap/quality.json",
     lambda: _quality_diffs("overlap/quality.json")),
    ("below the default's {:.4f} and {:.4f} over the same seeds", _PD + "quality_5seeds.json",
     lambda: _quality_diffs(_PD + "quality_5seeds.json")),
    ("in {} of {} seeds of each model the pipelined run ends below the default's", "overlap/quality.json",
     lambda: _seeds_below("overlap/quality.json", _PD + "quality_5seeds.json")),
    ("(load average {:.0f} to {:.0f} during the runs)", "overlap/b256{,_again}", lambda: _load_range(_OVERLAP)),
    ("slower in one ({:.2f}x at 1x1 in the first series)", "overlap/b256",
     lambda: (_ratio("overlap/b256", "fit_1x1+pipelined", "fit_1x1"),)),
    ("over the 6 runs of both series, {:.2f}x at 1x1 and {:.2f}x at 2x2 (medians)", "overlap/b256{,_again}",
     lambda: tuple(_pooled(_OVERLAP, f"fit_{size}+pipelined") / _pooled(_OVERLAP, f"fit_{size}")
                   for size in ("1x1", "2x2"))),
    ("over the default's: {:.2f}x and {:.2f}x at 1x1, {:.2f}x and {:.2f}x at 2x2", "overlap/b256{,_again}",
     lambda: tuple(_row(name, f"fit_{size}+pipelined")["cpu_ms_per_step"]["total"]
                   / _row(name, f"fit_{size}")["cpu_ms_per_step"]["total"] for size in ("1x1", "2x2")
                   for name in _OVERLAP)),
    ("{:.1f} MB sent per step instead of {:.1f}, {:.2f}x the default's examples/s at 200 Mbit/s, {:.2f}x at 1 Gbit/s, "
     "{:.2f}x uncapped", "bf16_rows/capped_links.json",
     lambda: (_capped_megabytes(True), _capped_megabytes(False), _capped(200), _capped(1000), _capped(0))),
    ("Wide&Deep {:.4f} AUC, DCN {:.4f} against one process in float32", "bf16_rows/quality.json",
     lambda: _quality_diffs("bf16_rows/quality.json")),
    ("with a 1,000-row table ({:.0f} MiB)", "scale/quiet/scale.json",
     lambda: (_json("scale/quiet/scale.json")["summary"]["baseline_bytes"] / 2**20,)),
    ("the peak falls from {:.2f}x the share before the piecewise restore to {:.2f}x on another number of ps, and "
     "from {:.2f}x to {:.2f}x on as many", "scale/restore_{before,after,same_ps}/scale.json",
     lambda: (_restore_factor("before", 3), _restore_factor("same_ps", 3), _restore_factor("after", 2),
              _restore_factor("same_ps", 2))),
    ("at 1x1 with `--unrolled_steps=4` {:.2f}x and {:.2f}x the default where a core was free, {:.2f}x where the load "
     "took", "one_box/overlap/{a,c,b}", lambda: tuple(_ratio(f"one_box/overlap/{name}", "fit_1x1+unroll4+pipelined",
                                                              "fit_1x1") for name in "acb")),
    ("(with 4 unrolled steps: {:.4f}, {:.4f}, 2 seeds)", "one_box/overlap/quality_unroll4_pipelined.json",
     lambda: _quality_diffs("one_box/overlap/quality_unroll4_pipelined.json")),
    ("2x2 and 4x2: {:.2f}x and {:.2f}x, `one_box/overlap/shapes`", "one_box/overlap/shapes",
     lambda: tuple(statistics.median(tables.run_cpu_ms("one_box/overlap/shapes", f"fit_{size}+unroll4", 256))
                   / statistics.median(tables.run_cpu_ms("one_box/overlap/shapes", f"fit_{size}", 256))
                   for size in ("2x2", "4x2"))),
    ("`geo_steps` ({} here)", "modes.json", lambda: (_json("modes.json")["geo_steps"],)),
    ("load average {:.1f} before and {:.1f} after", "modes.json",
     lambda: (_json("modes.json")["load_before"][0], _json("modes.json")["load_after"][0])),
)


def _online(name: str, *path):
  """A value of a stream-against-files results file: `path` keys into it."""
  value = _json(name)
  for key in path:
    value = value[key]
  return value


def _online_pair(*path) -> tuple:
  return tuple(_online(name, *path) for name in (_ONLINE_1X1, _ONLINE_2X2))


def _online_runs(name: str, variant: str) -> str:
  return ", ".join(f"{run['windows']:,.0f}" for run in _json(name)["examples_per_sec"][variant])


def _online_load(name: str) -> tuple:
  return min(_json(name)["load_average"]), max(_json(name)["load_average"])


def _quality_diffs_per_run(name: str) -> str:
  return ", ".join(f"{run['stream']['auc'] - run['files']['auc']:+.4f}" for run in _json(name)["runs"])


_CPU = "cpu_ms_per_1000_examples"


def _online_cpu(task: str) -> tuple:
  """Median CPU ms per 1,000 examples of `task` (chief, all), files then stream, at 1 ps + 1 worker then 2 + 2."""
  return tuple(_online(name, "median", variant, _CPU, task) for name in (_ONLINE_1X1, _ONLINE_2X2)
               for variant in ("files", "stream"))


_Q3, _Q1 = "online/stream_quality.json", "online/stream_quality_1pass.json"
_Q1_SAME, _Q1_SAME_UNSEEDED = ("online/stream_quality_1pass_seed0_thrice.json",
                               "online/unseeded/stream_quality_1pass_seed0_thrice.json")
_Q1_ASYNC = "online/stream_quality_1pass_1x2_async.json"
_Q1_SYNC = ("online/stream_quality_1pass_1x2_sync_first.json", "online/stream_quality_1pass_1x2_sync_second.json")


def _same_seed_aucs(names, variant: str = None) -> str:
  """The test AUCs of every run in the results `names` (of `variant`): "A in all N runs" where all are the same float,
  else each, in the order they ran."""
  aucs = [run[variant]["auc"] if variant else run["auc"] for name in names for run in _json(name)["runs"]]
  if len(set(aucs)) == 1:
    return f"{aucs[0]:.4f} in all {len(aucs)} runs"
  return ", ".join(f"{auc:.4f}" for auc in aucs)


_BEFORE, _AFTER = "online/stacked_parse_before.json", "online/stacked_parse_after.json"
_BEFORE_LOWER = "online/stacked_parse_before_lower_load.json"
# Figures in docs/online.md: (quoted text, results file, values).
ONLINE_PROSE = (
    ("| examples/s over the step-log windows, files | {:,.0f} | {:,.0f} |", "online/stream_vs_files*.json",
     lambda: _online_pair("median", "files", "windows")),
    ("| examples/s over the step-log windows, stream | {:,.0f} | {:,.0f} |", "online/stream_vs_files*.json",
     lambda: _online_pair("median", "stream", "windows")),
    ("| stream / files | {:.2f}x | {:.2f}x |", "online/stream_vs_files*.json",
     lambda: _online_pair("stream_over_files", "windows")),
    ("| CPU ms per 1,000 examples over all tasks, files and stream | {:.1f} and {:.1f} | {:.1f} and {:.1f} |",
     "online/stream_vs_files*.json", lambda: _online_cpu("all")),
    ("| stream / files, CPU per example | {:.2f}x | {:.2f}x |", "online/stream_vs_files*.json",
     lambda: _online_pair("stream_cpu_over_files", "all")),
    ("| the chief's CPU ms per 1,000 examples, files and stream | {:.1f} and {:.1f} | {:.1f} and {:.1f} |",
     "online/stream_vs_files*.json", lambda: _online_cpu("chief")),
    ("| the chief reading and parsing alone, records/s over the wall time and over its CPU time | {:,.0f} and {:,.0f} "
     "| {:,.0f} and {:,.0f} |", "online/stream_vs_files*.json",
     lambda: tuple(_online(name, "chief_reads_and_parses_records_per_sec", kind) for name in (_ONLINE_1X1, _ONLINE_2X2)
                   for kind in ("wall", "cpu"))),
    ("| load average beside the runs | {:.0f}-{:.0f} | {:.0f}-{:.0f} |", "online/stream_vs_files*.json",
     lambda: _online_load(_ONLINE_1X1) + _online_load(_ONLINE_2X2)),
    ("Earlier series gave {:.2f}x at 1 ps + 1 worker and {:.2f}x and {:.2f}x at 2 ps + 2 workers (load averages "
     "{:.0f}-{:.0f}, {:.0f}-{:.0f} and {:.0f}-{:.0f})", "online/stream_vs_files_{first,2x2_first,2x2_second}.json",
     lambda: tuple(_online(name, "stream_over_files", "windows") for name in _ONLINE_EARLIER)
     + sum((_online_load(name) for name in _ONLINE_EARLIER), ())),
    ("1 ps + 1 worker, the stream runs gave {} examples/s in turn, the file runs {}", _ONLINE_1X1,
     lambda: (_online_runs(_ONLINE_1X1, "stream"), _online_runs(_ONLINE_1X1, "files"))),
    ("2 ps + 2 workers {} and {}", _ONLINE_2X2,
     lambda: (_online_runs(_ONLINE_2X2, "stream"), _online_runs(_ONLINE_2X2, "files"))),
    ("the chief's CPU per 1,000 examples went from {:.1f} ms to {:.1f} ms, all tasks' from {:.2f}x the files' to "
     "{:.2f}x", "online/stacked_parse_{before,after}.json",
     lambda: (_online(_BEFORE, "median", "stream", _CPU, "chief"), _online(_AFTER, "median", "stream", _CPU, "chief"),
              _online(_BEFORE, "stream_cpu_over_files", "all"), _online(_AFTER, "stream_cpu_over_files", "all"))),
    ("at a lower load, {} runs of each before the change: the chief's CPU per 1,000 examples {:.1f} ms against {:.1f} "
     "ms after (the series above), its reader and parse alone {:,.0f} records/s of CPU time against {:,.0f}",
     f"{_BEFORE_LOWER}, {_ONLINE_1X1}",
     lambda: (len(_json(_BEFORE_LOWER)["examples_per_sec"]["stream"]),
              _online(_BEFORE_LOWER, "median", "stream", _CPU, "chief"),
              _online(_ONLINE_1X1, "median", "stream", _CPU, "chief"),
              _online(_BEFORE_LOWER, "chief_reads_and_parses_records_per_sec", "cpu"),
              _online(_ONLINE_1X1, "chief_reads_and_parses_records_per_sec", "cpu"))),
    ("examples/s over the windows {:.2f}x the files' before and {:.2f}x after", "online/stacked_parse_{before,after}.json",
     lambda: (_online(_BEFORE, "stream_over_files", "windows"), _online(_AFTER, "stream_over_files", "windows"))),
    ("after {} passes the medians are {:.4f} from the stream and {:.4f} from files, {:+.4f}", _Q3,
     lambda: (_online(_Q3, "passes"), _online(_Q3, "median_auc", "stream"), _online(_Q3, "median_auc", "files"),
              _online(_Q3, "stream_minus_files_auc"))),
    ("after {} pass {:.4f} and {:.4f}, {:+.4f}", _Q1,
     lambda: (_online(_Q1, "passes"), _online(_Q1, "median_auc", "stream"), _online(_Q1, "median_auc", "files"),
              _online(_Q1, "stream_minus_files_auc"))),
    ("three runs of seed 0 in one series gave {} from files and {} from the stream", _Q1_SAME_UNSEEDED,
     lambda: tuple(_same_seed_aucs([_Q1_SAME_UNSEEDED], variant) for variant in ("files", "stream"))),
    ("Three runs of seed 0 in one launch now give {} from files and {} from the stream", _Q1_SAME,
     lambda: tuple(_same_seed_aucs([_Q1_SAME], variant) for variant in ("files", "stream"))),
    ("Stream minus files per seed: {} at 3 passes, {} at 1 pass", f"{_Q3}, {_Q1}",
     lambda: (_quality_diffs_per_run(_Q3), _quality_diffs_per_run(_Q1))),
    ("{} runs of seed 0 on 1 ps + 2 workers in async mode gave {} from files and {} from the stream", _Q1_ASYNC,
     lambda: (len(_json(_Q1_ASYNC)["runs"]),
              *(_same_seed_aucs([_Q1_ASYNC], variant) for variant in ("files", "stream")))),
    ("in sync mode (two launches of two runs) {} from files and {} from the stream", ", ".join(_Q1_SYNC),
     lambda: tuple(_same_seed_aucs(_Q1_SYNC, variant) for variant in ("files", "stream"))),
)


_KERAS_SAME_SEED = {kind: tuple(f"repeatability/keras_{kind}_{launch}.json" for launch in ("first", "second"))
                    for kind in ("1x1", "1x2_sync", "1x2_async")}
# Figures in docs/repeatability.md: (quoted text, results files, values).
REPEATABILITY_PROSE = (
    ("| Keras, 1 ps + 1 worker, async | {} |", _KERAS_SAME_SEED["1x1"],
     lambda: (_same_seed_aucs(_KERAS_SAME_SEED["1x1"]),)),
    ("| Keras, 1 ps + 2 workers, sync | {} |", _KERAS_SAME_SEED["1x2_sync"],
     lambda: (_same_seed_aucs(_KERAS_SAME_SEED["1x2_sync"]),)),
    ("| Keras, 1 ps + 2 workers, async | {} |", _KERAS_SAME_SEED["1x2_async"],
     lambda: (_same_seed_aucs(_KERAS_SAME_SEED["1x2_async"]),)),
    ("| Estimator, 1 ps + 1 worker, async | files {}; stream {} |", _Q1_SAME,
     lambda: tuple(_same_seed_aucs([_Q1_SAME], variant) for variant in ("files", "stream"))),
    ("| Estimator, 1 ps + 2 workers, sync | files {}; stream {} |", _Q1_SYNC,
     lambda: tuple(_same_seed_aucs(_Q1_SYNC, variant) for variant in ("files", "stream"))),
    ("| Estimator, 1 ps + 2 workers, async | files {}; stream {} |", _Q1_ASYNC,
     lambda: tuple(_same_seed_aucs([_Q1_ASYNC], variant) for variant in ("files", "stream"))),
)


def _main_job(key: str):
  return _json("main_job.json")[key]


def _main_job_training_rate() -> float:
  """The summary's examples/s for training alone: the median of the progress records' rates (tfps.cluster.summary)."""
  return statistics.median(r["examples_per_sec"] for r in _main_job("progress")
                           if r["kind"] == "train" and r.get("examples_per_sec"))


# Figures in the README's prose on the main job (`bash scripts/main.sh`): (quoted text, values from main_job.json).
MAIN_JOB_PROSE = (
    ("Measured ({}, after set-up", lambda: (_main_job("date"),)),
    ("): {:.0f} s wall;", lambda: (_main_job("launch_wall_secs"),)),
    ("`Final: {}`", lambda: (" | ".join(f"{name} {value:.4f}" for name, value in
                                       sorted(_main_job("summary")["final_metrics"].items())),)),
    ("gives {} steps in {} s of wall time", lambda: (_main_job("summary")["steps"],
                                                     int(_main_job("summary")["wall_secs"]))),
    ("({:,.0f} examples/s over it)", lambda: (_main_job("summary")["examples_per_sec"],)),
    ("{:,.0f} examples/s for training alone", lambda: (_main_job_training_rate(),)),
    ("`{}` (AUC {:.4f})", lambda: (pathlib.PurePath(_main_job("best")["checkpoint"]).name, _main_job("best")["value"])),
)
# Numbers in the table that are not measurements: shapes, settings, dates, what a target is.
_CONTEXT = re.compile(
    r"\d+ ps\b|\d+ \+ \d+|\d+ workers?\b|batch \d+|\d+ seeds|\d+ alternating runs|\d+ shared cores|\d{4}-\d\d-\d\d|"
    r"\(target[^)]*\)|target <= [\d.]+x: missed\)|\d+ steps per scheduled function|"
    r"\(\d+ ms round trip\)|from \d+ to \d+ ms")


def _bf16_loopback() -> list:
  pairs = (("bf16_rows/b256", "fit_1x1"), ("bf16_rows/b256", "estimator_1x1"), ("bf16_rows/b4096", "fit_1x1"),
           ("bf16_rows/b4096", "fit_2x2"))
  return [_ratio(name, f"{variant}+bf16", variant) for name, variant in pairs]


def _reshard(num_ps: int) -> float:
  return _json("reshard.json")["medians"][str(num_ps)]["resume_secs"]


def what_works_rows() -> dict:
  """The README's "What works" table: first cell -> the whole row, minus signs as hyphens."""
  text = (REPO / "README.md").read_text(encoding="utf-8").replace("\u2212", "-")
  table = text[text.index("## What works"):text.index("Not yet shown")]
  return {line.split(" | ")[0][2:]: line for line in table.splitlines()
          if line.startswith("| ") and not line.startswith(("| what |", "| --- |"))}


def _row_of(rows: dict, start: str) -> str:
  found = [row for first, row in rows.items() if first.startswith(start)]
  assert len(found) == 1, f"README's What works table has {len(found)} rows starting with {start!r}"
  return found[0]


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f"{f.row[:24]}: {f.template[:40]}")
def test_each_readme_figure_is_its_results_value(figure):
  quoted = figure.template.format(*figure.values())
  row = _row_of(what_works_rows(), figure.row)
  assert quoted in row, f"README quotes {figure.row!r} against {figure.source}; the results give {quoted!r}"


@pytest.mark.parametrize("bound", BOUNDS, ids=lambda b: b.row[:30])
def test_each_readme_bound_is_its_tests(bound):
  assert bound.quote in _row_of(what_works_rows(), bound.row), bound
  test = (REPO / bound.source).read_text(encoding="utf-8")
  missing = [literal for literal in bound.literals if literal not in test]
  assert not missing, f"{bound.source} no longer holds {missing}, which README's {bound.row!r} row quotes"


def unsourced_numbers(first: str, row: str) -> list:
  """The numbers of a What works row's measured cell that no figure or bound of the row covers and that are not
  context (a shape, a setting, a target; code and links are skipped)."""
  measured = row.split(" | ")[1]
  for figure in FIGURES:
    if first.startswith(figure.row):
      measured = measured.replace(figure.template.format(*figure.values()), "")
  for bound in BOUNDS:
    if first.startswith(bound.row):
      measured = measured.replace(bound.quote, "")
  return re.findall(r"\d[\d,.]*", _CONTEXT.sub("", re.sub(r"\([^()]*\.md[^()]*\)|`[^`]*`", "", measured)))


@pytest.mark.parametrize("template,source,values", PERFORMANCE_PROSE, ids=[p[0][:40] for p in PERFORMANCE_PROSE])
def test_each_figure_in_performance_md_prose_is_its_results_value(template, source, values):
  text = " ".join((REPO / "docs" / "performance.md").read_text(encoding="utf-8").split())
  quoted = template.format(*values())
  assert quoted in text, f"docs/performance.md quotes {source}; the results give {quoted!r}"


def _inexact_runs(folder: str, zero="0") -> tuple:
  """`(runs not exact on every ps, runs)` over the `bench/worker_kills.py` summaries in `folder`; `zero` as quoted for
  none."""
  summaries = [json.loads(path.read_text(encoding="utf-8"))["summary"]
               for path in sorted((RESULTS / folder).glob("*.json"))]
  runs = sum(summary["runs"] for summary in summaries)
  inexact = runs - sum(summary["runs_exact_on_every_ps"] for summary in summaries)
  return inexact or zero, runs


def _lock_ratios(key: Callable[[dict], float], variants: Tuple[str, ...]) -> list:
  """Each series' ratio of medians (after / before) of `key(row)` for each of `variants`: the records lock's cost
  (`bench/results/records_lock/`, three series of three alternating pairs)."""
  series = (("after", "before"), ("after_long", "before_long"), ("after_lockfree", "before_long2"))
  ratios = []
  for after, before in series:
    for variant in variants:
      sides = [[key(row) for index in (1, 2, 3)
                for row in _json(f"records_lock/{side}_{index}/throughput.json")["summary"]["rows"]
                if row["variant"].split("+")[0] == variant] for side in (after, before)]
      ratios.append(statistics.median(sides[0]) / statistics.median(sides[1]))
  return ratios


def _lock_cost() -> tuple:
  rate, ps = (lambda row: row["examples_per_sec"]), (lambda row: row["cpu_ms_per_step"]["ps"])
  two, one, cpu = _lock_ratios(rate, ("fit_2x2",)), _lock_ratios(rate, ("fit_1x1",)), _lock_ratios(ps, ("fit_2x2",
                                                                                                       "fit_1x1"))
  return min(two), max(two), min(one), max(one), min(cpu), max(cpu)


def _current_optimizers() -> tuple:
  """The bounds over each ps of every variant with 2 and 4 ps (`bench/results/current_optimizers/`) of the updates
  awaiting another task's tensor after the decision before and after, and of the tensors moved per step after and
  before."""
  def every_ps(side):
    return [ps for num_ps in (2, 4) for counted in _json(f"current_optimizers/{side}_{num_ps}ps.json")[
        "variants"].values() for ps in counted["ps"]]

  late = lambda side: [len(ps["received_after_decision"]) for ps in every_ps(side)]
  moved = lambda side: [ps["per_step"].get("send", 0) + ps["per_step"].get("recv", 0) for ps in every_ps(side)]
  return (min(late("before")), max(late("before")), "none" if not any(late("after")) else "some",
          min(moved("after")), max(moved("after")), min(moved("before")), max(moved("before")))


# Figures in docs/failures.md: (quoted text, results files, values).
FAILURES_PROSE = (
    ("3 of 24 runs ended with 401 of 400 steps on a ps before both changes, {} of {} with the lock alone, {} of {} "
     "after both", "records_lock/lock_alone, records_lock/lock_and_coefficients",
     lambda: _inexact_runs("records_lock/lock_alone") + _inexact_runs("records_lock/lock_and_coefficients", "none")),
    ("(`received_after_decision`; {} on a ps of 2 before, {} now", "records_lock/transfers_{before,after}.json",
     lambda: (max(len(ps["received_after_decision"]) for ps in _json("records_lock/transfers_before.json")[
         "variants"]["fit"]["ps"]), "none" if not any(ps["received_after_decision"] for counted in _json(
             "records_lock/transfers_after.json")["variants"].values() for ps in counted["ps"]) else "some")),
    ("{:.2f}-{:.2f}x the examples/s at 2 ps + 2 workers, {:.2f}-{:.2f}x at 1 + 1, batch 256, the ps's CPU per step "
     "{:.2f}-{:.2f}x", "records_lock/{before,after}*", _lock_cost),
    ("{}-{} updates and records per ps awaited a tensor from another task after the ps's decision before, {} now; "
     "each ps moves {:.0f}-{:.0f} tensors per step instead of {:.0f}-{:.0f}", "current_optimizers/{before,after}_*",
     _current_optimizers),
)
# Figures in docs/modes.md: the records lock's cost, where its switch is described.
MODES_PROSE = tuple(prose for prose in FAILURES_PROSE if prose[2] is _lock_cost)


GEO_START_PROSE = (
    ("took {:.2f} CPU-s with rounds of 5 steps, {:.2f} with 10, {:.2f} with 20, {:.2f} with 40 and {:.2f} with 80",
     "geo_start.json", lambda: tuple(run["fit_cpu_secs"] for run in _json("geo_start.json")["runs"])),
    ("Before, 5, 10 and 20 steps took {:.2f}, {:.2f} and {:.2f} CPU-s", "geo_loop/geo_start_before.json",
     lambda: tuple(run["fit_cpu_secs"] for run in _json("geo_loop/geo_start_before.json")["runs"])),
    ("{:.3f}x the examples/s, medians of 4 alternating runs", "geo_loop/throughput.json",
     lambda: (_json("geo_loop/throughput.json")["written_out"]["new_over_old_examples_per_sec"],)),
)
_DOC_PROSE = [("online.md", *p) for p in ONLINE_PROSE] + [("repeatability.md", *p) for p in REPEATABILITY_PROSE] + [
    ("failures.md", *p) for p in FAILURES_PROSE] + [("modes.md", *p) for p in MODES_PROSE + GEO_START_PROSE]


@pytest.mark.parametrize("doc,template,source,values", _DOC_PROSE, ids=[f"{p[0]}:{p[1][:40]}" for p in _DOC_PROSE])
def test_each_figure_in_the_docs_prose_is_its_results_value(doc, template, source, values):
  text = " ".join((REPO / "docs" / doc).read_text(encoding="utf-8").split())
  quoted = " ".join(template.format(*values()).split())
  assert quoted in text, f"docs/{doc} quotes {source}; the results give {quoted!r}"


def test_no_number_in_the_what_works_table_is_without_a_source():
  unsourced = {first: numbers for first, row in what_works_rows().items() if (numbers := unsourced_numbers(first, row))}
  assert not unsourced, f"README's What works table quotes numbers no results file or test gives: {unsourced}"


def test_the_checks_see_a_figure_that_disagrees_with_its_results():
  rows = what_works_rows()
  figure = FIGURES[0]
  assert figure.template.format(*figure.values()) in _row_of(rows, figure.row)
  assert "{:.4f} and {:.4f} AUC".format(-0.0031, -0.0021) not in _row_of(rows, figure.row)
  batch_4096 = next(f for f in FIGURES if f.row == _THROUGHPUT and f.template.startswith("batch 4096"))
  shifted = batch_4096.template.format(*(value + 0.01 for value in batch_4096.values()))
  assert batch_4096.template.format(*batch_4096.values()) in _row_of(rows, _THROUGHPUT)
  assert shifted not in _row_of(rows, _THROUGHPUT)
  # A number nothing covers is found; the covered ones, and shapes, are not.
  made_up = "| geo mode: x | 1.24-1.31x async ex/s, 0.33-0.61x ps bytes, +0.0018 AUC, 1.37x at 2 + 2 on 2 ps | y |"
  assert unsourced_numbers("geo mode: x", made_up) == ["1.37"]


def test_the_generated_tables_of_performance_md_are_their_results():
  text = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
  blocks = re.findall(r"<!-- tables\.py: (\w+) -->", text)
  assert set(blocks) == set(tables.BLOCKS), "every table bench/tables.py renders is in docs/performance.md, once"
  assert len(blocks) == len(set(blocks))
  assert tables.stale_blocks(text) == [], "run .venv/bin/python bench/tables.py"


def test_a_verdict_is_computed_from_the_unrounded_ratio():
  before = tables.targets_table(("packed_default/b256_1x1", "packed_default/b256_more", "packed_default/b4096"))
  assert "| tfps.fit 2x2, batch 4096 >= 1.15x the tutorial's peer | not measured yet (x the FixedShards peer: " \
         "1.098) | pending |" in before
  ratio = _ratio(_TP + "b4096", "estimator_4x2", "keras_pss_4x2")
  assert f"| Estimator path 4x2, batch 4096 >= 1.15x the tutorial's peer | {ratio:.3f} | " \
         f"{'yes' if ratio >= 1.15 else 'no'} |" in tables.targets_table(tables.DEFAULTS)
  assert tables._verdict(1.098, 1.10, at_most=False) == "no" and tables._verdict(1.10, 1.10, at_most=False) == "yes"
  assert tables._verdict(None, 1.6, at_most=True) == "not measured"


def test_a_series_with_both_peers_is_judged_against_the_tutorials(monkeypatch):
  """What the pending series will give: keras_pss_* recorded as MinSizePartitioner's, keras_pss_fixed_* beside it."""
  def run(variant, rate, partitioner=None):
    return dict({"variant": variant, "batch_size": 256, "examples_per_sec": rate},
                **({"partitioner": partitioner} if partitioner else {}))
  result = {"runs": {"results": [run("keras_pss_2x2", 100.0, "min_size"), run("keras_pss_fixed_2x2", 90.0, "fixed"),
                                 run("fit_2x2", 114.9)]},
            "summary": {"rows": [dict(run("fit_2x2", 114.9), runs=[114.9], vs_single=None),
                                 dict(run("keras_pss_2x2", 100.0), runs=[100.0], vs_single=None),
                                 dict(run("keras_pss_fixed_2x2", 90.0), runs=[90.0], vs_single=None)]}}
  monkeypatch.setattr(tables, "load", lambda name: result)
  table = tables.series_table(["tutorial_peer/b256_more"], 256)
  assert "| x the tutorial's peer | x the FixedShards peer |" in table
  assert "| tfps.fit 2x2 | 115 (115) | 1.15 | 1.28 |" in table
  assert "| plain PSS `Model.fit`, tutorial (MinSize) 2x2 | 100 (100) |" in table
  assert "| plain PSS `Model.fit`, FixedShards 2x2 | 90 (90) |" in table
  targets = tables.targets_table(["tutorial_peer/b256_more"])
  assert "| tfps.fit 2x2, batch 256 >= 1.15x the tutorial's peer | 1.149 | no |" in targets  # 1.149 shows as 1.15


def test_the_1x1_cpu_aim_takes_each_runs_own_cpu(monkeypatch):
  """Each run's CPU per step is its tasks' cores times its own step time; a series' figure is their median."""
  def run(variant, step_ms, load, **cores):
    return {"variant": variant, "batch_size": 256, "step_secs": step_ms / 1000, "load": load,
            "tasks": {task: {"cores": value} for task, value in cores.items()}}
  result = {"runs": {"results": [run("single", 4.0, 7.0, single=1.0), run("single", 5.0, 9.4, single=1.0),
                                 run("single", 2.0, 8.0, single=1.5),  # 3 ms: the median of 4, 5 and 3 is 4
                                 run("fit_1x1", 6.5, 8.0, ps=0.5, worker=0.5),
                                 run("fit_1x1+unroll4", 6.3, 8.0, ps=0.5, worker=0.5)]}}
  monkeypatch.setattr(tables, "load", lambda name: result)
  assert tables.cpu_target_rows(["one_box/x"], "fit_1x1+unroll4") == [
      "| tfps.fit 1x1 / `--unrolled_steps=4`, batch 256: CPU per example over all tasks <= 1.6x one process, "
      "`one_box/x`, load 7-9 | 1.625 / 1.575 (x the default's CPU: 0.969) | no / yes |"]


def main_job_prose() -> str:
  """The README's sentences on the main job's measured run, whitespace as single spaces."""
  text = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
  return text[text.index("Measured ("):text.index("Logs of every task")]


@pytest.mark.parametrize("template,values", MAIN_JOB_PROSE, ids=[p[0][:30] for p in MAIN_JOB_PROSE])
def test_each_figure_in_the_readmes_main_job_prose_is_its_results_value(template, values):
  quoted = template.format(*values())
  assert quoted in main_job_prose(), f"README's main job quotes bench/results/main_job.json; it gives {quoted!r}"


def test_no_number_in_the_readmes_main_job_prose_is_without_a_source():
  prose = main_job_prose()
  for template, values in MAIN_JOB_PROSE:
    prose = prose.replace(template.format(*values()), "")
  prose = re.sub(r"\([^()]*\.md\)|`[^`]*\.(py|json)`|\d+-core", "", prose)  # links, file names, the machine
  assert not re.findall(r"\d[\d,.]*", prose), prose


_VARIANTS = {"with_deltas": "with deltas", "tracking": "rows marked, no delta", "without": "without"}


def _spread(values) -> str:
  """`median / max` seconds of `values` ("-" where there are none)."""
  return f"{statistics.median(values):.3f} / {max(values):.3f}" if values else "-"


# Per training path: its results' key in bench/results/delta_export.json, and how its table names a delta's pause.
_DELTA_PATHS = {"fit": ("training", "pauses within epochs, s", "a pause within an epoch"),
                "estimator": ("training_estimator", "pauses at step-log lines and checkpoints, s",
                              "a pause at a step-log line or checkpoint")}


def delta_training_table(series: list, path: str = "fit") -> str:
  """docs/delta_export.md's table of the training cost of delta exports on `path` (fit or estimator), from
  bench/results/delta_export.json's `training` or `training_estimator` (bench/delta_export.py --parts=training):
  a row per series and variant."""
  _, pauses_column, a_pause = _DELTA_PATHS[path]
  lines = ["| a delta every | variant | examples/s of each run (load average before-after) | median, x without | "
           "besides the checkpoints, x without | examples per CPU-second, median, x without | deltas written while "
           f"measured | delta writes, s (median / max) | {pauses_column} | checkpoints, s |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for one in series:
    for variant, runs in one["runs"].items():
      ratio = lambda key: ("1x" if variant == "without" else f"{one['ratios_to_without'][key][variant]}x")
      each = ", ".join(f"{run['examples_per_sec']:,.0f} ({run['load_average'][0]}-{run['load_average'][1]})"
                       for run in runs)
      lines.append(
          f"| {one['delta_every_secs']:g} s | {_VARIANTS[variant]} | {each} | "
          f"{one['medians']['examples_per_sec'][variant]:,.0f}, {ratio('examples_per_sec')} | "
          f"{ratio('examples_per_sec_besides_checkpoints')} | "
          f"{one['medians']['examples_per_cpu_sec'][variant]:,.0f}, {ratio('examples_per_cpu_sec')} | "
          f"{', '.join(str(run['deltas_written']) for run in runs)} | "
          f"{_spread([secs for run in runs for secs in run['delta_write_secs']])} | "
          f"{_spread([secs for run in runs for secs in run['delta_pause_secs']])} | "
          f"{_spread([secs for run in runs for secs in run['checkpoint_secs']])} |")
  lines.append("")
  for one in series:
    ratios, runs = one["ratios_to_without"], one["runs"]["with_deltas"]
    pauses = [secs for run in runs for secs in run["delta_pause_secs"]]
    checkpoints = [secs for variant in one["runs"].values() for run in variant for secs in run["checkpoint_secs"]]
    lines.append(
        f"- A delta every {one['delta_every_secs']:g} s: {ratios['examples_per_sec']['with_deltas']}x the examples/s "
        f"without ({ratios['examples_per_sec_besides_checkpoints']['with_deltas']}x besides the checkpoints), "
        f"{ratios['examples_per_cpu_sec']['with_deltas']}x the examples per CPU-second"
        + ("" if one["delta_every_secs"] != 30 else
           f" (the target, 0.95x at 30 s: {'met' if ratios['examples_per_cpu_sec']['with_deltas'] >= 0.95 else 'not met'}"
           f" by CPU, {'met' if ratios['examples_per_sec']['with_deltas'] >= 0.95 else 'not met'} by wall time)")
        + f"; {a_pause} took {_spread(pauses)} s (median / max) against {_spread(checkpoints)} s for a "
        "checkpoint.")
  return "\n".join(lines)


@pytest.mark.parametrize("path", ["fit", "estimator"])
def test_the_training_cost_table_of_delta_export_md_is_its_results(path):
  series = _json("delta_export.json")[_DELTA_PATHS[path][0]]
  assert [one["delta_every_secs"] for one in series] == [30.0, 3.0]  # the interval, and a short one
  for one in series:  # deltas were written while measured: every run at least once, the short interval's often
    written = [run["deltas_written"] for run in one["runs"]["with_deltas"]]
    assert min(written) >= 1 and (one["delta_every_secs"] > 3 or min(written) >= 2), written
  text = (REPO / "docs" / "delta_export.md").read_text(encoding="utf-8")
  assert delta_training_table(series, path) in text, "regenerate it: tests/test_figures.py's delta_training_table"


def freshness_sentence(results: dict) -> str:
  """docs/delta_export.md's measured freshness, as bench/results/delta_freshness.json gives it."""
  n = len(results["versions"])
  return (f"a delta every {results['delta_every_secs']:g} s, a slice of {results['slice_rows']:,} clicks every "
          f"{results['slice_every_secs']:g} s for {results['secs']:g} s, Wide&Deep on 1 ps + 1 worker: {n} versions "
          f"served, freshness median {results['median_freshness_secs']} s, worst {results['max_freshness_secs']} s; "
          f"{results['within_target']} of {n} within the target of 2 x {results['delta_every_secs']:g} s plus the "
          f"export time (median {results['median_export_secs']} s: the delta's write, the watch's look and the "
          f"apply); load average {results['load_average'][0]}-{results['load_average'][1]}, measured at "
          f"{results['measured_at']}.")


@pytest.mark.parametrize("name", ["delta_freshness.json", "delta_freshness_10s.json"])
def test_the_freshness_in_delta_export_md_is_its_results_value(name):
  results = _json(name)
  text = " ".join((REPO / "docs" / "delta_export.md").read_text(encoding="utf-8").split())
  assert freshness_sentence(results) in text, freshness_sentence(results)
  versions = results["versions"]
  assert results["within_target"] == sum(v["freshness_secs"] <= v["target_secs"] for v in versions)
  assert results["max_freshness_secs"] == max(v["freshness_secs"] for v in versions)
  assert all(v["target_secs"] == pytest.approx(2 * results["delta_every_secs"] + v["export_secs"], abs=2e-3)
             for v in versions)


def test_the_watch_lines_in_the_docs_are_the_bench_runs():
  results = _json("delta_freshness.json")
  versions = results["versions"]
  watch_lines = " ".join((REPO / "docs" / "delta_export.md").read_text(encoding="utf-8").split("```")[1::2])
  version = next(v for v in versions if v["version"] == 7)
  assert (f"(step {version['step']}; freshness {version['newest_freshness_secs']:.2f}-"
          f"{version['freshness_secs']:.2f} s)") in watch_lines and results["watch_summary"] in watch_lines
  assert results["watch_summary"] in (REPO / "docs" / "online.md").read_text(encoding="utf-8")
