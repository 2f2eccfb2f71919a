"""Network faults on 7 test hosts (2 ps, 3 workers, chief, sidecar evaluator; `tfps.testing.host_cluster`), measured
side by side in one run on the Keras path (scripts/train_keras.py, small model):

  clean       no fault: wall time of the chief (the reference)
  loss        1% of the packets every host receives dropped (iptables): wall time, ratio to clean, steps
  ps_cut      ps:1 cut off after checkpoint 2: seconds until the chief stops (one line, exit 3); the same commands
              started again: seconds until the job ends, steps, the epoch it resumed at
  worker_cut  worker:1 cut off for 30 s after checkpoint 1: seconds until the coordinator found it failed, steps the
              others trained meanwhile (the chief's progress records), seconds from the restore until worker:1 sends
              half as much as worker:0 again, steps at the end
  chief_cut   the chief's host cut off after checkpoint 2 for 5 s, the chief started again: resumed epoch, steps

Each run also reports the steps each ps applied (`applied_by_ps`: a counter per ps, `--count_applied_steps`).
Needs root (network namespaces) and iptables. Writes bench/results/host_cut.json.
  .venv/bin/python bench/host_cut.py                  # about 6-10 minutes here
  .venv/bin/python bench/host_cut.py --scenarios=clean,ps_cut
  .venv/bin/python bench/host_cut.py --scenarios=clean,worker_cut --epochs=6 --steps_per_epoch=400 \
      --out=bench/results/host_cut_worker.json   # long enough to outlast the 30 s cut and the worker's return
"""

import json
import os
import re
import shutil
import sys
import tempfile
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.testing import applied_steps  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.testing import host_cluster  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.training import checkpoints as checkpoints_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

SCENARIOS = ("clean", "loss", "ps_cut", "worker_cut", "chief_cut")
_SCENARIOS = flags.DEFINE_list("scenarios", list(SCENARIOS), "Scenarios to run, in this order.")
_EPOCHS = flags.DEFINE_integer("epochs", 5, "Epochs per run.", lower_bound=3)
_STEPS = flags.DEFINE_integer("steps_per_epoch", 40, "Steps per epoch.", lower_bound=1)
_KEEP = flags.DEFINE_string("keep_dir", None, "Keep each run's model_dir and task logs here (default: a temporary "
                             "folder, removed).")
_OUT = flags.DEFINE_string("out", os.path.join(runner.ROOT, "bench", "results", "host_cut.json"), "Result JSON.")

SCRIPT = os.path.join(runner.ROOT, "scripts", "train_keras.py")
TRAINING = [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("worker", 2), ("chief", 0)]
CHIEF, WORKER = ("chief", 0), ("worker", 1)
TIMEOUT_SECS = 600
WORKER_CUT_SECS = 30


def _wait_for_checkpoint(cluster, model_dir, number):
  deadline = time.monotonic() + TIMEOUT_SECS
  while not checkpoints_lib.is_registered(model_dir, number):
    if time.monotonic() > deadline or cluster.processes[CHIEF].poll() is not None:
      raise RuntimeError(f"no checkpoint {number}; chief log:\n{cluster.log(CHIEF)[-2000:]}")
    time.sleep(0.1)


def _finish(cluster, model_dir, result, start):
  code = cluster.wait(CHIEF, TIMEOUT_SECS)
  result["chief_exit"] = code
  result["wall_secs"] = round(time.monotonic() - start, 1)
  final_path = os.path.join(model_dir, "checkpoints", "FINAL")
  if os.path.exists(final_path):
    with open(final_path) as f:
      final = json.load(f)
    result["steps"] = final.get("step")
    # each ps's count of the steps applied there (its counter, tfps.testing.applied_steps), from the last checkpoint
    result["applied_by_ps"] = applied_steps.applied_per_ps(final["last_checkpoint"], cluster.log(CHIEF))
  resumed = re.findall(r"Resumed from \S+ at epoch (\d+)/", cluster.log(CHIEF))
  if resumed:
    result["resumed_at_epoch"] = int(resumed[-1])
  return result


def run_scenario(name: str, work_dir: str) -> dict:
  """One training run with the fault `name`; returns what was measured."""
  model_dir = os.path.join(work_dir, name, "model")
  args = [f"--model_dir={model_dir}", f"--epochs={_EPOCHS.value}", f"--steps_per_epoch={_STEPS.value}",
          "--vocab_size=2000", "--batch_size=32", "--noexact_evaluation", "--connect_timeout_secs=180",
          "--lost_task_timeout_secs=15", "--count_applied_steps"]
  env = dict(os.environ, PYTHONPATH=runner.ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  result = {"scenario": name, "asked_steps": _EPOCHS.value * _STEPS.value}
  with host_cluster.HostCluster(SCRIPT, args, os.path.join(work_dir, name, "logs"), form="flags", env=env,
                                replicas=(("ps", 2), ("worker", 3), ("chief", 1))) as cluster:
    if name == "loss":
      cluster.drop(0.01)
    start = time.monotonic()
    cluster.start_all()
    if name == "ps_cut":
      _wait_for_checkpoint(cluster, model_dir, 2)
      cut_at = time.monotonic()
      cluster.cut(("ps", 1))
      result["chief_exit_after_cut"] = cluster.wait(CHIEF, 120)
      result["secs_to_chief_stop"] = round(time.monotonic() - cut_at, 1)
      result["chief_last_line"] = cluster.log(CHIEF).strip().splitlines()[-1]
      cluster.restore(("ps", 1))
      restart_at = time.monotonic()
      for task in TRAINING:
        cluster.restart(task)
      _finish(cluster, model_dir, result, start)
      result["secs_restart_to_end"] = round(time.monotonic() - restart_at, 1)
    elif name == "worker_cut":
      _wait_for_checkpoint(cluster, model_dir, 1)
      cut_at = time.time()
      cluster.cut(WORKER)
      while time.time() < cut_at + WORKER_CUT_SECS:
        if "secs_to_worker_failed" not in result and host_cluster.worker_failed(cluster.log(CHIEF), WORKER):
          result["secs_to_worker_failed"] = round(time.time() - cut_at, 1)
        time.sleep(0.2)
      restored_at = time.time()
      result["chief_running_after_cut"] = cluster.processes[CHIEF].poll() is None
      cluster.restore(WORKER)
      before = max(host_cluster.progress_steps(model_dir, 0, cut_at), default=0)
      during = host_cluster.progress_steps(model_dir, cut_at, restored_at)
      result["steps_during_cut"] = max(during, default=before) - before
      back = cluster.wait_until_sending(WORKER, ("worker", 0), TIMEOUT_SECS)
      result["secs_restore_to_sending"] = None if back is None else round(back, 1)
      _finish(cluster, model_dir, result, start)
      result["secs_restore_to_end"] = round(time.time() - restored_at, 1)
    elif name == "chief_cut":
      _wait_for_checkpoint(cluster, model_dir, 2)
      cluster.cut(CHIEF)
      time.sleep(5)
      cluster.restore(CHIEF)
      cluster.restart(CHIEF)
      _finish(cluster, model_dir, result, start)
    else:
      _finish(cluster, model_dir, result, start)
  return result


def main(argv):
  del argv
  unknown = sorted(set(_SCENARIOS.value) - set(SCENARIOS))
  if unknown:
    raise app.UsageError(f"--scenarios: unknown {unknown}; allowed {', '.join(SCENARIOS)}")
  work_dir = _KEEP.value or tempfile.mkdtemp(prefix="tfps_host_cut_")
  results = []
  try:
    for name in _SCENARIOS.value:
      results.append(run_scenario(name, work_dir))
      print(json.dumps(results[-1]), flush=True)
  finally:
    if not _KEEP.value:
      shutil.rmtree(work_dir, ignore_errors=True)
  clean = next((r for r in results if r["scenario"] == "clean"), None)
  for result in results:
    if clean and result is not clean and result.get("wall_secs"):
      result["wall_ratio_to_clean"] = round(result["wall_secs"] / clean["wall_secs"], 2)
  os.makedirs(os.path.dirname(_OUT.value), exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump({"epochs": _EPOCHS.value, "steps_per_epoch": _STEPS.value, "results": results}, f, indent=2)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
