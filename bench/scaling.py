"""Step time as one embedding table grows, and each ps's peak memory as it is sharded (issue 8, item 5).

  .venv/bin/python bench/scaling.py                     # 1e5, 1e6, 1e7 rows x 1, 2, 4 ps, twice (~10 min)
  .venv/bin/python bench/scaling.py --quick             # 1e5 and 1e6 rows x 1 and 2 ps, once (~2 min)
  .venv/bin/python bench/scaling.py --shards_per_ps=4   # each large variable in 4 shards per ps

Wide&Deep (`bench/workload.py`) with C1's table grown to `--table_rows` rows and the 25 other features at
`--other_vocab` rows, trained by `tfps.fit` under `tfps-launch` with 1 worker and 1, 2 or 4 ps. Every ps's peak RSS
(`VmHWM`) is read while the cluster runs and compared with `1.2 x state / num_ps + baseline`, where state is every
variable plus its Adagrad accumulator (rows x (16 + 1) x 4 B x 2, plus the MLP) and baseline the peak RSS of a ps
in the same training with tables of ~1,000 rows. Writes `--out/scaling.json` and `--out/scaling.png`.
"""

import json
import os
import random
import statistics
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import report  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import workload  # pylint: disable=g-import-not-at-top,wrong-import-position

_ROWS = flags.DEFINE_list("table_rows", ["100000", "1000000", "10000000"], "Rows of the large table.")
_NUM_PS = flags.DEFINE_list("num_ps", ["1", "2", "4"], "Numbers of ps.")
_OTHER = flags.DEFINE_integer("other_vocab", 1000, "Rows of each of the 25 other features' tables.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 1024, "Examples per step.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 100, "Steps per measured window.", lower_bound=1)
_MEASURE = flags.DEFINE_integer("measure", 2, "Measured windows per run.", lower_bound=1)
_SHARDS_PER_PS = flags.DEFINE_integer("shards_per_ps", 1, "Shards of each large variable per ps (tfps's "
                                      "--num_shards = this x ps).", lower_bound=1)
_STACK = flags.DEFINE_boolean("stack_tables", True, "One deep and one wide table for all features.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Repetitions of the grid, each in a shuffled order; the step time is "
                                "their median, the peak RSS their maximum.", lower_bound=1)
_QUICK = flags.DEFINE_boolean("quick", False, "1e5 and 1e6 rows, 1 and 2 ps, 1 repetition.")
_OUT = flags.DEFINE_string("out", "bench/results",
                          "Folder for scaling.json and scaling.png (task logs: $TFPS_BENCH_LOGS, else a new "
                          "folder per run, printed at its first task).")


def _grid():
  if _QUICK.value:
    return [100_000, 1_000_000], [1, 2]
  return [int(r) for r in _ROWS.value], [int(n) for n in _NUM_PS.value]


def _args(table_rows: int, other_vocab: int, num_ps: int):
  return ["--path=fit", f"--batch_size={_BATCH.value}", f"--steps={_STEPS.value}", f"--measure={_MEASURE.value}",
          f"--vocab_size={other_vocab}", f"--big_table_rows={table_rows}", f"--stack_tables={_STACK.value}",
          f"--num_shards={_SHARDS_PER_PS.value * num_ps}"]


def measure() -> dict:
  rows, num_ps_list = _grid()
  runs = {"load_before": os.getloadavg(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "results": []}
  runs["baseline_bytes"] = {}
  for num_ps in num_ps_list:
    # The baseline: the same training with tables of 1,000 + 25 x 10 rows (state < 2 MiB): TensorFlow, the server,
    # the traced functions and the per-step buffers, without the table.
    baseline = runner.run(_args(1000, 10, num_ps), num_ps=num_ps, num_workers=1,
                          log_dir=runner.log_dir(f"{_name()}_baseline_{num_ps}ps"))
    runs["baseline_bytes"][num_ps] = max(baseline["tasks"][f"ps:{i}"]["peak_rss_bytes"] for i in range(num_ps))
  repeats = 1 if _QUICK.value else _REPEATS.value
  for repeat in range(repeats):
    order = [(num_ps, table_rows) for num_ps in num_ps_list for table_rows in rows]
    random.Random(repeat).shuffle(order)
    for num_ps, table_rows in order:
      print(f"repeat {repeat + 1}/{repeats}: {table_rows:,} rows over {num_ps} ps ...", flush=True)
      result = runner.run(_args(table_rows, _OTHER.value, num_ps), num_ps=num_ps, num_workers=1,
                          log_dir=runner.log_dir(f"{_name()}_{table_rows}_{num_ps}ps_r{repeat}"))
      runs["results"].append(dict(result, num_ps=num_ps, table_rows=table_rows, repeat=repeat,
                                  load=os.getloadavg()[0]))
  runs["load_after"] = os.getloadavg()
  return runs


def summarize(runs: dict) -> dict:
  """Per (rows, ps): median step time over repetitions, each ps's maximum peak RSS, the limit, and the targets."""
  grouped = {}
  for result in runs["results"]:
    grouped.setdefault((result["num_ps"], result["table_rows"]), []).append(result)
  rows = []
  for (num_ps, table_rows), results in sorted(grouped.items()):
    state = workload.Workload(batch_size=_BATCH.value, vocab_size=_OTHER.value, big_table_rows=table_rows).state_bytes()
    peaks = [max(r["tasks"][f"ps:{i}"]["peak_rss_bytes"] for r in results) for i in range(num_ps)]
    baseline = runs["baseline_bytes"][num_ps]
    limit = 1.2 * state / num_ps + baseline
    rows.append({"table_rows": table_rows, "num_ps": num_ps, "step_secs": statistics.median(
        r["step_secs"] for r in results), "step_secs_runs": [r["step_secs"] for r in results],
                 "baseline_bytes": baseline, "state_bytes": state, "ps_peak_rss_bytes": peaks, "limit_bytes": limit,
                 "peak_over_baseline_vs_state_per_ps": (max(peaks) - baseline) / (state / num_ps),
                 "rss_holds": max(peaks) <= limit})
  for row in rows:  # against the median over table sizes with the same number of ps
    reference = statistics.median(r["step_secs"] for r in rows if r["num_ps"] == row["num_ps"])
    row["step_vs_smallest"] = row["step_secs"] / reference
  steps_hold = all(0.8 <= row["step_vs_smallest"] <= 1.2 for row in rows)
  spread = {num_ps: max(r["step_secs"] for r in rows if r["num_ps"] == num_ps) /
            min(r["step_secs"] for r in rows if r["num_ps"] == num_ps) for num_ps in {r["num_ps"] for r in rows}}
  return {"rows": rows, "runs": runs, "shards_per_ps": _SHARDS_PER_PS.value,
          "targets": {"step time within +-20% of the median over table sizes (same ps)": steps_hold,
                      "every ps peak RSS <= 1.2 x state/num_ps + baseline": all(r["rss_holds"] for r in rows)},
          "step_spread_max_over_min": spread,
          "median_step_secs": statistics.median(r["step_secs"] for r in rows)}


def _name() -> str:
  return "scaling" if _SHARDS_PER_PS.value == 1 else f"scaling_{_SHARDS_PER_PS.value}_shards_per_ps"


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  runs = measure()
  summary = summarize(runs)
  with open(os.path.join(_OUT.value, _name() + ".json"), "w", encoding="utf-8") as out:
    json.dump({"summary": summary, "command": " ".join(sys.argv)}, out, indent=2)
  print(f"Large variables sharded {_SHARDS_PER_PS.value} way(s) per ps")
  print(report.scaling_table(summary))
  for name, holds in summary["targets"].items():
    print(f"{name}: {'holds' if holds else 'does not hold'}")
  plot = report.plot_scaling(summary, os.path.join(_OUT.value, _name() + ".png"))
  print(f"Wrote {os.path.join(_OUT.value, _name() + '.json')}" + (f" and {plot}" if plot else ""))


if __name__ == "__main__":
  app.run(main)
