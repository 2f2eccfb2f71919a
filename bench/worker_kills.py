"""Worker kills on the Keras path, run many times: does every run end with exactly the asked steps, counted and applied?

Each run trains `bench/worker_kills_train.py` (4 epochs x 100 steps) under `tfps-launch --num_workers=2` (`--num_ps`),
and SIGKILLs a worker 0.2 s after each of the first three epoch checkpoints (as `tests/test_chaos.py` does), at a random
point of a step. Per run it reports the step counter the chief recorded in the FINAL marker (`iterations`), how many
steps each ps applied (`applied_by_ps`: the counter on that ps, `tfps.testing.applied_steps`, read from the final
checkpoint; more than asked means a dead worker's step reached that ps and ran again, fewer that one was lost there),
and whether the chief settled its step counter from the records (`tfps/training/exactly_once.py`). A run is exact
where every ps applied exactly the asked steps (`runs_exact_on_every_ps`). Writes `bench/results/worker_kills.json`.

  .venv/bin/python bench/worker_kills.py --runs=20      # about 25 s a run here
  .venv/bin/python bench/worker_kills.py --runs=10 --num_ps=2 --out=bench/results/worker_kills_2ps.json
  .venv/bin/python bench/worker_kills.py --runs=10 --num_ps=2 --train_flags=--pipelined_updates \
      --out=bench/results/pipelined/worker_kills_2ps.json
  .venv/bin/python bench/worker_kills.py --runs=20 --num_ps=2 --keep_inexact=/tmp/inexact   # keeps what went wrong
"""

import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.testing import applied_steps  # pylint: disable=g-import-not-at-top,wrong-import-position

_RUNS = flags.DEFINE_integer("runs", 20, "Runs.", lower_bound=1)
_NUM_PS = flags.DEFINE_integer("num_ps", 1, "ps tasks (a counter on each).", lower_bound=1)
_KILLS = flags.DEFINE_integer("kills", 3, "Worker kills per run, one an epoch (at most epochs - 1).", lower_bound=1)
_TRAIN_FLAGS = flags.DEFINE_list("train_flags", [], "More flags of the training run, e.g. "
                                 "--train_flags=--pipelined_updates (the mode flags of `tfps.define_mode_flags`).")
_KEEP = flags.DEFINE_string("keep_inexact", None, "Copy the folder (logs, checkpoints, output) of each run that is not "
                            "exact on every ps into a folder of this one, run_<N>.")
_OUT = flags.DEFINE_string("out", os.path.join(runner.ROOT, "bench", "results", "worker_kills.json"), "Result JSON.")

SCRIPT = os.path.join(runner.ROOT, "bench", "worker_kills_train.py")
EPOCHS, STEPS, TIMEOUT_SECS = 4, 100, 400


def _task(launcher: psutil.Process, name: str, log_dir: str):
  for child in launcher.children(recursive=True):
    try:
      if runner.task_name(child, log_dir) == name and child.status() != psutil.STATUS_ZOMBIE:
        return child
    except psutil.Error:
      continue
  return None


def _wait(condition, what: str, process: subprocess.Popen, timeout_secs: float = 240) -> None:
  deadline = time.monotonic() + timeout_secs
  while not condition():
    if process.poll() is not None or time.monotonic() > deadline:
      raise runner.BenchError(f"{what}: not reached (launcher exit status {process.poll()})")
    time.sleep(0.05)


def one_run(workdir: str) -> dict:
  model_dir, log_dir = os.path.join(workdir, "run"), os.path.join(workdir, "logs")
  command = [runner.LAUNCHER, f"--num_ps={_NUM_PS.value}", "--num_workers=2", "--max_restarts=5",
             f"--log_dir={log_dir}", SCRIPT, "--", f"--model_dir={model_dir}", f"--epochs={EPOCHS}",
             f"--steps_per_epoch={STEPS}", *_TRAIN_FLAGS.value]
  with open(os.path.join(workdir, "out.txt"), "w", encoding="utf-8") as out:
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, cwd=runner.ROOT)
  try:
    launcher = psutil.Process(process.pid)
    for epoch in range(1, _KILLS.value + 1):
      checkpoint = os.path.join(model_dir, "checkpoints", f"ckpt-{epoch}.index")
      _wait(lambda: os.path.exists(checkpoint), f"checkpoint {epoch}", process)
      time.sleep(0.2)
      victim = f"worker:{epoch % 2}"
      _wait(lambda: _task(launcher, victim, log_dir) is not None, f"{victim} running", process, 60)
      _task(launcher, victim, log_dir).send_signal(signal.SIGKILL)
    process.wait(timeout=TIMEOUT_SECS)
  finally:
    runner.stop(process)
  if process.returncode != 0:
    raise runner.BenchError(f"run in {workdir} exited with {process.returncode}")
  with open(os.path.join(model_dir, "checkpoints", "FINAL"), encoding="utf-8") as final_file:
    final = json.load(final_file)
  with open(os.path.join(log_dir, "chief-0.log"), encoding="utf-8", errors="replace") as chief_log:
    log = chief_log.read()
  applied = applied_steps.applied_per_ps(final["last_checkpoint"], log)
  return {"iterations": final["step"], "applied_by_ps": applied, "asked_steps": EPOCHS * STEPS,
          "exact_on_every_ps": len(applied) == _NUM_PS.value and set(applied.values()) == {EPOCHS * STEPS},
          "settled": log.count("Step counter settled")}


def main(argv):
  del argv
  results = []
  for index in range(_RUNS.value):
    with tempfile.TemporaryDirectory(prefix="tfps_worker_kills_") as workdir:
      results.append(one_run(workdir))
      if not results[-1]["exact_on_every_ps"] and _KEEP.value:
        results[-1]["kept"] = runner.keep_folder(workdir, _KEEP.value, f"run_{index + 1}")
    print(f"run {index + 1}/{_RUNS.value}: {results[-1]}", flush=True)
  summary = {
      "runs": len(results), "num_ps": _NUM_PS.value, "kills_per_run": _KILLS.value, "train_flags": _TRAIN_FLAGS.value,
      "iterations": dict(collections.Counter(str(r["iterations"]) for r in results)),
      "applied_by_ps": dict(collections.Counter(json.dumps(r["applied_by_ps"], sort_keys=True) for r in results)),
      "runs_exact_on_every_ps": sum(r["exact_on_every_ps"] for r in results),
      "runs_settled": sum(r["settled"] > 0 for r in results),
  }
  print(json.dumps(summary))
  os.makedirs(os.path.dirname(_OUT.value), exist_ok=True)
  with open(_OUT.value, "w", encoding="utf-8") as out:
    json.dump({"summary": summary, "runs": results}, out, indent=1)


if __name__ == "__main__":
  app.run(main)
