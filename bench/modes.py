"""Training modes side by side: async, sync and geo on the same model, cluster and data, in one run.

Two parts, each run once per mode, modes interleaved:

* Throughput and ps traffic: `bench/train_bench.py --path=fit` (Wide&Deep over synthetic Criteo-schema batches,
  the workload of `bench/throughput.py`) under `tfps-launch --num_ps=1 --num_workers=2`, once per table size
  (`--vocab_sizes`). Examples/s over the measured windows, and the bytes the ps's TCP sockets sent and received over
  them (`bench/runner.py`), per example.
* Quality: `scripts/train.py` with `configs/wide_deep_movielens.cfg` (MovieLens 100K u1.base, AUC on all of u1.test,
  exact evaluation) under the same cluster, same epochs and batch size: the chief's final `val_auc`.

Prints a table, writes `bench/results/modes.json` and draws `bench/results/modes.png`.

  .venv/bin/pip install -e '.[bench]' && .venv/bin/python bench/modes.py      # about 15 minutes here
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import report  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position

ROOT = runner.ROOT
MODES = ("async", "sync", "geo")
_MODES = flags.DEFINE_list("modes", list(MODES), "Modes to compare (async first: the others are relative to it).")
_GEO_STEPS = flags.DEFINE_integer("geo_steps", 10, "geo: local steps per round.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 256, "Throughput part: examples per worker batch.", lower_bound=1)
_VOCABS = flags.DEFINE_list("vocab_sizes", ["100000", "1000", "10"], "Throughput part: rows of each feature's table, "
                            "one run per size (ids repeat more within a geo round in small tables; at 10 rows the "
                            "dense weights are nearly all the traffic).")
_STEPS = flags.DEFINE_integer("steps", 400, "Throughput part: steps per measured window.", lower_bound=1)
_MEASURE = flags.DEFINE_integer("measure", 2, "Throughput part: measured windows after the warm-up.", lower_bound=1)
_DATA_DIR = flags.DEFINE_string("data_dir", os.path.join(os.path.dirname(ROOT), "shared", "data", "ml-100k"),
                                "Quality part: the MovieLens 100K folder (read in place); skipped where absent.")
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Quality part: epochs.", lower_bound=1)
_STEPS_PER_EPOCH = flags.DEFINE_integer("steps_per_epoch", 300, "Quality part: steps per epoch.", lower_bound=1)
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.2, "Quality part: Adagrad learning rate (as in the Quality "
                                    "section).", lower_bound=0)
_JSON_OUT = flags.DEFINE_string("json_out", os.path.join(ROOT, "bench", "results", "modes.json"), "Results (JSON).")
_PLOT = flags.DEFINE_string("plot", os.path.join(ROOT, "bench", "results", "modes.png"), "Plot (PNG).")

_FINAL = re.compile(r"Final: .*\bval_auc ([0-9.]+)")


def mode_flags(mode: str) -> List[str]:
  return [f"--sync_mode={mode}"] + ([f"--geo_steps={_GEO_STEPS.value}"] if mode == "geo" else [])


def throughput(mode: str, vocab_size: int) -> dict:
  result = runner.run(["--path=fit", f"--batch_size={_BATCH.value}", f"--steps={_STEPS.value}",
                       f"--measure={_MEASURE.value}", f"--vocab_size={vocab_size}"] + mode_flags(mode),
                      num_ps=1, num_workers=2, log_dir=runner.log_dir(f"modes_{mode}_{vocab_size}"),
                      timeout_secs=1200)
  ps = result["tasks"]["ps:0"]
  examples = result["examples_per_sec"] * ps["network_secs"]  # over the same span as the traffic
  return {"examples_per_sec": result["examples_per_sec"], "ps_bytes_per_example": ps["network_bytes"] / examples,
          "ps_cores": ps.get("cores"), "worker_cores": [result["tasks"][f"worker:{i}"].get("cores") for i in (0, 1)]}


def quality(mode: str, workdir: str) -> dict:
  log_path = os.path.join(workdir, f"quality_{mode}.log")
  command = [runner.LAUNCHER, "--num_ps=1", "--num_workers=2", f"--log_dir={os.path.join(workdir, mode)}",
             os.path.join(ROOT, "scripts", "train.py"), "--", "--flagfile=configs/wide_deep_movielens.cfg",
             f"--data_dir={os.path.abspath(_DATA_DIR.value)}", f"--epochs={_EPOCHS.value}",
             f"--steps_per_epoch={_STEPS_PER_EPOCH.value}", f"--learning_rate={_LEARNING_RATE.value}",
             f"--model_dir={os.path.join(workdir, mode + '_model')}"] + mode_flags(mode)
  start = time.monotonic()
  with open(log_path, "w", encoding="utf-8") as log:
    code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, timeout=1800,
                          check=False).returncode
  with open(log_path, encoding="utf-8", errors="replace") as log:
    found = _FINAL.findall(log.read())
  if code != 0 or not found:
    raise runner.BenchError(f"quality run of {mode} failed (exit {code}); see {log_path}")
  return {"val_auc": float(found[-1]), "seconds": time.monotonic() - start}


def summarize(results: Dict[str, Dict[int, dict]], aucs: Dict[str, float]) -> List[dict]:
  """One row per (mode, vocab size), relative to async at the same size."""
  rows = []
  for mode, by_vocab in results.items():
    for vocab_size, result in by_vocab.items():
      base = results["async"][vocab_size]
      row = {"mode": mode, "vocab_size": vocab_size, **result,
             "speed_vs_async": result["examples_per_sec"] / base["examples_per_sec"],
             "traffic_vs_async": result["ps_bytes_per_example"] / base["ps_bytes_per_example"]}
      if mode in aucs:
        row["val_auc"], row["auc_vs_async"] = aucs[mode], aucs[mode] - aucs["async"]
      rows.append(row)
  return rows


def table(rows: List[dict]) -> str:
  lines = ["| mode | table rows | examples/s | x async | ps bytes/example | x async | MovieLens W&D AUC | - async |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for row in rows:
    auc = f"{row['val_auc']:.4f}" if "val_auc" in row else "-"
    gap = f"{row['auc_vs_async']:+.4f}" if "auc_vs_async" in row else "-"
    lines.append(f"| {row['mode']} | {row['vocab_size']:,} | {row['examples_per_sec']:,.0f} | "
                 f"{row['speed_vs_async']:.2f} | {row['ps_bytes_per_example']:,.0f} | {row['traffic_vs_async']:.3f} | "
                 f"{auc} | {gap} |")
  return "\n".join(lines)


def plot(rows: List[dict], path: str):
  plt = report._pyplot()  # pylint: disable=protected-access
  if plt is None:
    return None
  figure, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  names = [f"{row['mode']}\n{row['vocab_size']:,} rows" for row in rows]
  axes[0].bar(names, [row["speed_vs_async"] for row in rows], color="tab:blue")
  axes[0].set_title("examples/s (x async)")
  axes[1].bar(names, [row["traffic_vs_async"] for row in rows], color="tab:orange")
  axes[1].set_title("ps bytes per example (x async)")
  for axis in axes:
    axis.tick_params(axis="x", labelsize=7)
  for axis in axes:
    axis.axhline(1.0, color="gray", linewidth=0.8)
  figure.suptitle(f"Wide&Deep, 1 ps + 2 workers, batch {_BATCH.value}, geo_steps {_GEO_STEPS.value}")
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  return path


def main(argv):
  del argv
  modes = list(_MODES.value)
  if modes[0] != "async" or any(mode not in MODES for mode in modes):
    raise app.UsageError(f"--modes ({','.join(modes)}) must start with async and name only {', '.join(MODES)}")
  load_before = os.getloadavg()
  results: Dict[str, Dict[int, dict]] = {mode: {} for mode in modes}
  aucs: Dict[str, float] = {}
  with tempfile.TemporaryDirectory(prefix="tfps_modes_") as workdir:
    for vocab_size in (int(size) for size in _VOCABS.value):
      for mode in modes:
        result = results[mode][vocab_size] = throughput(mode, vocab_size)
        print(f"{mode}, {vocab_size:,} rows: {result['examples_per_sec']:,.0f} examples/s, "
              f"{result['ps_bytes_per_example']:,.0f} ps bytes/example", flush=True)
    if os.path.isdir(_DATA_DIR.value):
      for mode in modes:
        aucs[mode] = quality(mode, workdir)["val_auc"]
        print(f"{mode}: MovieLens val_auc {aucs[mode]:.4f}", flush=True)
    else:
      print(f"no MovieLens at {_DATA_DIR.value}: quality part skipped")
  rows = summarize(results, aucs)
  print(table(rows))
  load_after = os.getloadavg()
  print(f"load average before {'/'.join(f'{x:.1f}' for x in load_before)}, after "
        f"{'/'.join(f'{x:.1f}' for x in load_after)}")
  os.makedirs(os.path.dirname(_JSON_OUT.value), exist_ok=True)
  with open(_JSON_OUT.value, "w", encoding="utf-8") as out:
    json.dump({"rows": rows, "geo_steps": _GEO_STEPS.value, "batch_size": _BATCH.value, "steps": _STEPS.value,
               "vocab_sizes": [int(size) for size in _VOCABS.value], "learning_rate": _LEARNING_RATE.value,
               "measure": _MEASURE.value, "epochs": _EPOCHS.value, "steps_per_epoch": _STEPS_PER_EPOCH.value,
               "load_before": load_before, "load_after": load_after}, out, indent=2)
  drawn = plot(rows, _PLOT.value)
  print(f"wrote {_JSON_OUT.value}" + (f" and {drawn}" if drawn else ""))


if __name__ == "__main__":
  app.run(main)
