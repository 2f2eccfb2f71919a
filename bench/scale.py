"""Step time, ps memory and checkpoint speed as one table grows, on 2 ps + 2 workers (docs/performance.md).

  .venv/bin/python bench/scale.py            # hashed and dynamic tables of 1e5, 1e6, 1e7 rows, twice (~25 min)
  .venv/bin/python bench/scale.py --large    # also hashed 1e8 rows (12.8 GB) and dynamic 3e7, once; needs ~16 GiB free
  .venv/bin/python bench/scale.py --large --hashed_rows= --dynamic_rows= --add_to_results --wait_for_memory_secs=1800
                                             # only the large ones, added to the results of an earlier run

Each run is one cluster under `tfps-launch` running bench/scale_run.py (the model and its data:
bench/scale_train.py); bench/runner.py samples every ps's memory. Sizes alternate, ascending in even repetitions and
descending in odd ones, hashed and dynamic in turn, so that the machine's load falls on every size alike. A run is
skipped, and named in the results, when the memory available is below what its ps would hold at the bound plus
`--headroom_gib`; a run that fails is named with the end of its log, and the others go on. The checkpoint: the
largest hashed run (1e8 with `--large`) writes one after its timed epochs, and a cluster of `--resume_ps` ps resumes
from it. Writes `--out/scale.json` and `--out/scale.png` (summary:
bench/scale_summary.py), and the runs so far to `--out/scale_runs.json` after each run (`--summarize_only`: summarize
the runs of scale.json again).
"""

import json
import os
import shutil
import sys
import tempfile
import time

from absl import app
from absl import flags
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import report  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import scale_summary  # pylint: disable=g-import-not-at-top,wrong-import-position

SCRIPT = os.path.join(runner.ROOT, "bench", "scale_run.py")
_HASHED = flags.DEFINE_list("hashed_rows", ["100000", "1000000", "10000000"], "Sizes of the hashed table.")
_DYNAMIC = flags.DEFINE_list("dynamic_rows", ["100000", "1000000", "10000000"], "Sizes of the dynamic table.")
_LARGE = flags.DEFINE_boolean("large", False, "After the others, once each: the hashed table at "
                              "--large_hashed_rows (the checkpoint's) and the dynamic at --large_dynamic_rows.")
_LARGE_HASHED = flags.DEFINE_integer("large_hashed_rows", 10**8, "The hashed size of --large.", lower_bound=2)
_LARGE_DYNAMIC = flags.DEFINE_integer("large_dynamic_rows", 3 * 10**7, "The dynamic size of --large (0: none).",
                                       lower_bound=0)
_REPEATS = flags.DEFINE_integer("repeats", 2, "Repetitions of the sizes (not of --large's).", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 200, "Steps per epoch.", lower_bound=20)
_MEASURE = flags.DEFINE_integer("measure", 3, "Timed epochs after the first.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step (per worker).", lower_bound=1)
_RESUME_PS = flags.DEFINE_list("resume_ps", ["3"], "ps counts of the clusters that resume from the checkpoint, "
                               "one after another (empty: none).")
_EVERY = flags.DEFINE_boolean("checkpoint_every_size", False, "Write a checkpoint (and resume from it) at every hashed "
                               "size of the last repetition, not only the largest.")
_SCRATCH = flags.DEFINE_string("scratch", tempfile.gettempdir(), "Where the checkpoint is written (then removed).")
_HEADROOM = flags.DEFINE_float("headroom_gib", 3.0, "Memory a run leaves free beyond its ps's bound.", lower_bound=0)
_ADD = flags.DEFINE_boolean("add_to_results", False, "Start from the runs of --out/scale.json (its baseline too) and "
                            "add this invocation's (e.g. --large alone, with empty --hashed_rows and --dynamic_rows).")
_WAIT = flags.DEFINE_integer("wait_for_memory_secs", 0, "How long a run waits for the memory it needs before it is "
                             "skipped.", lower_bound=0)
_SUMMARIZE = flags.DEFINE_boolean("summarize_only", False, "Run nothing: summarize the runs of --out/scale.json "
                                  "again (after a change to bench/scale_summary.py).")
_OUT = flags.DEFINE_string("out", "bench/results/scale", "Folder for scale.json and scale.png (task logs: "
                           "$TFPS_BENCH_LOGS, else a new folder per run, printed at its first task).")
NUM_PS, NUM_WORKERS, BASELINE_ROWS = 2, 2, 1000


def _order(repeat: int) -> list:
  """`(table, rows)` of one repetition: sizes ascending (even) or descending (odd), the two tables in turn."""
  sizes = sorted({int(r) for r in _HASHED.value + _DYNAMIC.value}, reverse=bool(repeat % 2))
  tables = ("hashed", "dynamic") if repeat % 2 == 0 else ("dynamic", "hashed")
  chosen = {"hashed": {int(r) for r in _HASHED.value}, "dynamic": {int(r) for r in _DYNAMIC.value}}
  return [(table, size) for size in sizes for table in tables if size in chosen[table]]


def _run(runs: dict, table: str, rows: int, name: str, *extra, num_ps: int = NUM_PS):
  """One cluster's run (None, noted in `runs["skipped"]`, when memory is short)."""
  need = scale_summary.RSS_BOUND[table] * scale_summary.state_bytes(rows) + _HEADROOM.value * 2**30
  deadline = time.monotonic() + _WAIT.value
  available = psutil.virtual_memory().available
  while available < need and time.monotonic() < deadline:
    time.sleep(15)
    available = psutil.virtual_memory().available
  if available < need:
    runs["skipped"].append({"table": table, "table_rows": rows, "need_bytes": need, "available_bytes": available})
    print(f"skipped {table} {rows:,} rows: needs {need / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available")
    return None
  print(f"{name}: {table} table, {rows:,} rows, {num_ps} ps (load {os.getloadavg()[0]:.1f}) ...", flush=True)
  args = [f"--table={table}", f"--table_rows={rows}", f"--batch_size={_BATCH.value}", f"--steps={_STEPS.value}",
          f"--measure={_MEASURE.value}", *extra]
  timeout = 900 + scale_summary.state_bytes(rows) / 2e7  # a 1e8-row table: ~1 h more
  try:
    return runner.run(args, num_ps=num_ps, num_workers=NUM_WORKERS, log_dir=runner.log_dir(f"scale_{name}"),
                      timeout_secs=timeout, script=SCRIPT)
  except runner.BenchError as error:  # noted, and the other sizes still run
    runs["failed"].append({"table": table, "table_rows": rows, "name": name, "num_ps": num_ps,
                           "ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "error": str(error)[-3000:]})
    print(f"{name} failed: {error}", flush=True)
    return None


def _checkpoint(runs: dict, rows: int, name: str, checkpoint_dir: str):
  """The hashed run of `rows` that writes the checkpoint, then a resume on each of `--resume_ps` ps counts."""
  saved = _run(runs, "hashed", rows, name, f"--save_to={checkpoint_dir}")
  if saved is None:
    return saved
  for num_ps in (int(count) for count in _RESUME_PS.value):
    resumed = _run(runs, "hashed", rows, f"{name}_resume{num_ps}", f"--resume_from={checkpoint_dir}", num_ps=num_ps)
    if resumed is not None:
      runs.setdefault("checkpoints", []).append({"save": saved, "resume": resumed})
  return saved


def _keep(runs: dict) -> None:
  """The runs so far, to `--out/scale_runs.json` (what a long series has measured survives its end)."""
  with open(os.path.join(_OUT.value, "scale_runs.json"), "w", encoding="utf-8") as out:
    json.dump(runs, out, indent=1)


def _start() -> dict:
  """The runs to add to: those of `--out/scale.json` with `--add_to_results`, else none but a fresh baseline."""
  started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
  if _ADD.value:
    with open(os.path.join(_OUT.value, "scale.json"), encoding="utf-8") as f:
      runs = json.load(f)["runs"]
    runs["added"] = runs.get("added", []) + [{"started": started, "load": os.getloadavg(), "command": sys.argv}]
    return runs
  runs = {"load_before": os.getloadavg(), "started": started, "results": [], "skipped": [], "failed": []}
  runs["baseline"] = _run(runs, "hashed", BASELINE_ROWS, "baseline")
  if runs["baseline"] is None:
    raise runner.BenchError(f"the baseline run failed: {runs['failed'] or runs['skipped']}")
  return runs


def measure() -> dict:
  runs = _start()
  checkpoint_rows = _LARGE_HASHED.value if _LARGE.value else max((int(r) for r in _HASHED.value), default=0)
  checkpoint_dir = tempfile.mkdtemp(prefix="tfps_scale_", dir=_SCRATCH.value)
  try:
    for repeat in range(_REPEATS.value):
      for table, rows in _order(repeat):
        name = f"{table}_{rows}_r{repeat}"
        saves = (table == "hashed" and (rows == checkpoint_rows or _EVERY.value) and repeat == _REPEATS.value - 1)
        result = _checkpoint(runs, rows, name, checkpoint_dir) if saves else _run(runs, table, rows, name)
        if result is not None:
          runs["results"].append(dict(result, repeat=repeat))
        _keep(runs)
    if _LARGE.value:
      for table, rows in (("dynamic", _LARGE_DYNAMIC.value), ("hashed", _LARGE_HASHED.value)):  # smaller first
        if not rows:
          continue
        name = f"{table}_{rows}_large"
        result = _checkpoint(runs, rows, name, checkpoint_dir) if table == "hashed" else _run(runs, table, rows, name)
        if result is not None:
          runs["results"].append(dict(result, repeat=0))
        _keep(runs)
  finally:
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
  measured = {(result["table"], result["table_rows"]) for result in runs["results"]}
  # A size skipped for memory and measured since is no longer missing; a failed run stays on record.
  runs["skipped"] = [run for run in runs["skipped"] if (run["table"], run["table_rows"]) not in measured]
  runs["load_after"] = os.getloadavg()
  return runs


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  path = os.path.join(_OUT.value, "scale.json")
  if _SUMMARIZE.value:
    with open(path, encoding="utf-8") as f:
      results = json.load(f)
    runs, command = results["runs"], results["command"]
  else:
    runs, command = measure(), " ".join(sys.argv)
  summary = scale_summary.summarize(runs)
  with open(path, "w", encoding="utf-8") as out:
    json.dump({"summary": summary, "runs": runs, "command": command}, out, indent=1)
  if not _SUMMARIZE.value:
    os.remove(os.path.join(_OUT.value, "scale_runs.json"))  # all of it is in scale.json now
  print(report.scale_table(summary))
  if summary["checkpoints"]:
    print(report.checkpoint_table(summary))
  for name, (value, holds) in summary["targets"].items():
    print(f"{name}: {value} ({'holds' if holds else 'does not hold'})")
  plot = report.plot_scale(summary, os.path.join(_OUT.value, "scale.png"))
  print(f"Wrote {path}" + (f" and {plot}" if plot else ""))


if __name__ == "__main__":
  app.run(main)
