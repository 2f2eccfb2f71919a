"""Quality benchmark: MovieLens 100K (u1.base / u1.test), single-process tf-keras vs tfps with 2 workers and 2 ps.

Trains the ranking models (label: rating >= 4) and the two-tower retrieval model on both sides with the same epochs,
batch size, steps per epoch, optimizer, learning rate and seeds (`bench/quality_run.py` does the work: once alone
with `--mode=single`, once under `tfps-launch --num_ps=2 --num_workers=2` with `--mode=tfps`), then prints a table
of test AUC and top-10/top-100 retrieval accuracy against all 1,682 movies (mean ± standard deviation over seeds),
the differences, and whether the targets hold: tfps within 0.005 AUC and within 2% (relative) top-100 of single.

  .venv/bin/python bench/quality.py            # defaults: 9 minutes on 2 cores shared with other work (load ~12)
  .venv/bin/python bench/quality.py --epochs=1 --retrieval_epochs=1 --max_rows=2000 --seeds=0 \
      --json_out=/tmp/quality.json   # a smoke run

MovieLens is read from `--data_dir` (default `../shared/data/ml-100k` beside the repository) and never copied.
Imports no TensorFlow: both sides run in their own processes.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Sequence

from absl import app
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join(ROOT, "bench", "quality_run.py")
LAUNCHER = os.path.join(os.path.dirname(sys.executable), "tfps-launch")

_DATA_DIR = flags.DEFINE_string("data_dir", os.path.join(os.path.dirname(ROOT), "shared", "data", "ml-100k"),
                                "The MovieLens 100K folder (read in place, never copied).")
_MODELS = flags.DEFINE_list("models", ["wide_deep", "dcn", "retrieval"], "Models: wide_deep, dcn, retrieval.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; each model is trained once per seed on each side.")
_EPOCHS = flags.DEFINE_integer("epochs", 10, "Epochs (of u1.base rows / batch size steps) of Wide&Deep and DCN.",
                                lower_bound=1)
_RETRIEVAL_EPOCHS = flags.DEFINE_integer(
    "retrieval_epochs", 20, "Epochs of the retrieval model: under two async workers it converges more slowly than in "
    "one process (at 10 epochs tfps is about 2% behind; at 20 both sides have levelled off).", lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Examples per step.", lower_bound=1)
_MAX_ROWS = flags.DEFINE_integer("max_rows", 0, "Training rows per epoch (0: all 80,000); for smoke runs.",
                                 lower_bound=0)
_RANKING_LR = flags.DEFINE_float("ranking_learning_rate", 0.2, "Adagrad learning rate of Wide&Deep and DCN.",
                                 lower_bound=0)
_RETRIEVAL_LR = flags.DEFINE_float("retrieval_learning_rate", 0.05, "Adagrad learning rate of the retrieval model.",
                                   lower_bound=0)
_SHUFFLE_BUFFER = flags.DEFINE_integer("shuffle_buffer", 100_000, "Training rows in the shuffle buffer (u1.base is "
                                      "sorted by user; the default holds all of it).", lower_bound=0)
_TFPS_WORKERS = flags.DEFINE_integer("tfps_workers", 2, "Workers of the tfps side (1: no concurrent updates, to "
                                    "separate asynchrony from the rest).", lower_bound=1)
_MIN_SHARD_BYTES = flags.DEFINE_integer("min_shard_bytes", 48 << 10, "tfps side: variables of at least this many "
                                        "bytes are sharded over both ps (the default shards the embedding tables).",
                                        lower_bound=0)
_TFPS_FLAGS = flags.DEFINE_list("tfps_flags", [], "More flags of the tfps side, e.g. --tfps_flags=--pipelined_updates "
                                "(the training mode flags of `tfps.define_mode_flags`).")
_JSON_OUT = flags.DEFINE_string("json_out", os.path.join(ROOT, "bench", "results", "quality.json"), "Results (JSON).")
_LOG_DIR = flags.DEFINE_string("logs", os.path.join(tempfile.gettempdir(), "tfps_quality_logs"),
                               "Logs of both sides (tfps: one file per task).")
_TIMEOUT = flags.DEFINE_float("timeout_secs", 1800, "Longest each side may run.", lower_bound=1)
_STACK = flags.DEFINE_boolean("stack_tables", False, "Both sides: Wide&Deep and DCN with one table for all "
                              "categorical features (`--stack_tables`).")
_AT_ONCE = flags.DEFINE_boolean("sides_at_once", False, "Run both sides at the same time (smoke runs: their "
                                "train_secs then share the machine).")

AUC_TARGET = 0.005  # absolute
TOP_100_TARGET = 0.02  # relative
METRICS = {"wide_deep": ("auc",), "dcn": ("auc",), "retrieval": ("top_10", "top_100")}


def side_args(out: str, mode: str) -> List[str]:
  """The flags of `quality_run.py` for one side; identical except for `--mode` and `--json_out`."""
  return [f"--mode={mode}", f"--data_dir={os.path.abspath(_DATA_DIR.value)}", f"--models={','.join(_MODELS.value)}",
          f"--seeds={','.join(_SEEDS.value)}", f"--epochs={_EPOCHS.value}",
          f"--retrieval_epochs={_RETRIEVAL_EPOCHS.value}", f"--batch_size={_BATCH_SIZE.value}",
          f"--max_rows={_MAX_ROWS.value}", f"--shuffle_buffer={_SHUFFLE_BUFFER.value}",
          f"--ranking_learning_rate={_RANKING_LR.value}",
          f"--retrieval_learning_rate={_RETRIEVAL_LR.value}", f"--json_out={out}"] + (
              ["--stack_tables"] if _STACK.value else [])


def commands(workdir: str) -> Dict[str, List[str]]:
  """The command of each side."""
  single = [sys.executable, RUNNER] + side_args(os.path.join(workdir, "single.json"), "single")
  tfps = ([LAUNCHER, "--num_ps=2", f"--num_workers={_TFPS_WORKERS.value}",
           f"--log_dir={os.path.join(_LOG_DIR.value, 'tfps')}", RUNNER, "--"]
          + side_args(os.path.join(workdir, "tfps.json"), "tfps") + [f"--min_shard_bytes={_MIN_SHARD_BYTES.value}"]
          + _TFPS_FLAGS.value)
  return {"single": single, "tfps": tfps}


def start_side(name: str, command: Sequence[str]) -> subprocess.Popen:
  """Starts one side in a session of its own, its log in `--log_dir/<name>.log`."""
  os.makedirs(_LOG_DIR.value, exist_ok=True)
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
  print(f"[{name}] {' '.join(command)}", flush=True)
  with open(os.path.join(_LOG_DIR.value, f"{name}.log"), "w", encoding="utf-8") as log:
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)


def finish_side(name: str, process: subprocess.Popen, out: str) -> dict:
  """Waits for a side `start_side` started; returns its JSON."""
  status = process.wait(timeout=_TIMEOUT.value)
  log_path = os.path.join(_LOG_DIR.value, f"{name}.log")
  if status != 0 or not os.path.isfile(out):
    with open(log_path, encoding="utf-8", errors="replace") as log:
      tail = "".join(log.readlines()[-30:])
    raise RuntimeError(f"the {name} side exited with status {status}; end of {log_path}:\n{tail}")
  with open(out, encoding="utf-8") as f:
    return json.load(f)


def run_sides(workdir: str) -> Dict[str, dict]:
  """Runs the sides one after the other (or both at once with `--sides_at_once`); returns each side's JSON."""
  started, results = {}, {}
  try:
    for name, command in commands(workdir).items():
      started[name] = start_side(name, command)
      if not _AT_ONCE.value:
        results[name] = finish_side(name, started[name], os.path.join(workdir, f"{name}.json"))
    for name, process in started.items():
      if name not in results:
        results[name] = finish_side(name, process, os.path.join(workdir, f"{name}.json"))
  finally:
    for process in started.values():
      if process.poll() is None:  # a timeout, an interrupt or the other side's failure
        os.killpg(process.pid, signal.SIGTERM)  # tfps-launch stops every task it started on SIGTERM
        process.wait(timeout=60)
  return results


def summarize(values: Sequence[float]) -> dict:
  """Mean, sample standard deviation (0 for one value) and the values."""
  return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
          "values": list(values)}


def compare(single: dict, tfps: dict) -> List[dict]:
  """One row per model and metric: both sides' summaries, the difference of means, and the target check."""
  rows = []
  for model in _MODELS.value:
    for metric in METRICS[model]:
      values = {side: [run[metric] for run in result["runs"] if run["model"] == model]
                for side, result in (("single", single), ("tfps", tfps))}
      row = {"model": model, "metric": metric, "single": summarize(values["single"]),
             "tfps": summarize(values["tfps"])}
      diff = row["tfps"]["mean"] - row["single"]["mean"]
      row["diff"] = diff
      if metric == "auc":
        row["target"], row["holds"] = f"|diff| <= {AUC_TARGET}", abs(diff) <= AUC_TARGET
      elif metric == "top_100":
        relative = diff / row["single"]["mean"] if row["single"]["mean"] else float("inf")
        row["relative_diff"] = relative
        row["target"], row["holds"] = f"|diff| / single <= {TOP_100_TARGET:.0%}", abs(relative) <= TOP_100_TARGET
      rows.append(row)
  return rows


def table(rows: Sequence[dict], num_seeds: int) -> str:
  """The comparison as a Markdown table."""
  lines = [f"| model | metric | single process | tfps ({_TFPS_WORKERS.value} workers, 2 ps) | tfps - single | target |",
           "| --- | --- | --- | --- | --- | --- |"]
  for row in rows:
    def cell(side):
      return f"{row[side]['mean']:.4f} ± {row[side]['std']:.4f}" if num_seeds > 1 else f"{row[side]['mean']:.4f}"
    diff = f"{row['diff']:+.4f}"
    if "relative_diff" in row:
      diff += f" ({row['relative_diff']:+.1%})"
    target = f"{row['target']}: {'holds' if row['holds'] else 'MISSED'}" if "target" in row else ""
    lines.append(f"| {row['model']} | {row['metric']} | {cell('single')} | {cell('tfps')} | {diff} | {target} |")
  return "\n".join(lines)


def build_report(results: Dict[str, dict], rows: List[dict]) -> dict:
  """The JSON report: how it was run, the comparison rows, and every run of both sides."""
  settings = ("epochs", "retrieval_epochs", "batch_size", "steps_per_epoch", "shuffle_buffer",
              "ranking_learning_rate", "retrieval_learning_rate")
  return {"command": " ".join(["bench/quality.py"] + sys.argv[1:]), "data": "MovieLens 100K u1.base / u1.test",
          "seeds": [int(seed) for seed in _SEEDS.value],
          "settings": {key: results["single"][key] for key in settings if key in results["single"]},
          "optimizer": "adagrad (tf-keras legacy)",
          "tfps_cluster": {"num_workers": _TFPS_WORKERS.value, "num_ps": 2, "min_shard_bytes": _MIN_SHARD_BYTES.value,
                           "flags": _TFPS_FLAGS.value},
          "comparison": rows, "single": results["single"]["runs"], "tfps": results["tfps"]["runs"]}


def main(argv):
  del argv
  if not os.path.isfile(os.path.join(_DATA_DIR.value, "u1.base")):
    raise app.UsageError(f"--data_dir={_DATA_DIR.value} has no u1.base; give the unpacked MovieLens 100K folder")
  unknown = [name for name in _MODELS.value if name not in METRICS]
  if unknown:
    raise app.UsageError(f"--models names {unknown[0]!r}; allowed: {', '.join(METRICS)}")
  with tempfile.TemporaryDirectory(prefix="tfps_quality_") as workdir:
    results = run_sides(workdir)
  rows = compare(results["single"], results["tfps"])
  print(table(rows, len(_SEEDS.value)), flush=True)
  report = build_report(results, rows)
  os.makedirs(os.path.dirname(os.path.abspath(_JSON_OUT.value)), exist_ok=True)
  with open(_JSON_OUT.value, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1)
  print(f"wrote {_JSON_OUT.value}", flush=True)


if __name__ == "__main__":
  app.run(main)
