"""DynamicEmbedding under real worker kills (tfps-launch, 2 workers, 2 ps), in async, sync and geo mode: a training
function run again after its worker died neither counts sightings nor admits twice, nor applies a table update twice.

The run (tests/fixtures/dynamic_kills_train.py) sees the same 8 raw ids in every batch, so after `n` applied steps of
`b` batches each (async and geo: 1; sync: one per worker, 2) every table shard's clock reads `n * b`, every id was
sighted `n * b` times, and each admitted row (min_count 3, so admitted in the batch that sights it a third time)
received exactly one update of gradient 1 per step from the first step whose batches all see its row (its Adagrad
accumulator says how many). The same holds after a ps restart that resumes from the last epoch's checkpoint.

The three runs (one per mode) start together once for the file; the async run's ps kill comes after its worker kills.
"""

import concurrent.futures
import json
import pathlib
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tfps.cluster import tasks as tasks_lib
from tfps.testing import applied_steps
from tfps.training import checkpoints as checkpoints_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
EPOCHS, STEPS, MIN_COUNT = 3, 100, 3
BATCHES_PER_STEP = {"async": 1, "sync": 2, "geo": 1}  # sync: one batch per worker slot, 2 workers

pytestmark = pytest.mark.slow


def _task(launcher: subprocess.Popen, name: str, log_dir: pathlib.Path):
  """The live process of task `name` ("worker:1") under `launcher` (logging to `log_dir`), or None."""
  try:
    children = psutil.Process(launcher.pid).children(recursive=True)
  except psutil.NoSuchProcess:
    return None
  return tasks_lib.find_task(log_dir, name, children)


def _wait_for(condition, what: str, launcher: subprocess.Popen, out: pathlib.Path, timeout_secs: float = 480):
  # A bound, not a timing: geo's first epoch (tracing a round on each worker) took 54 s at a load average of 3 and
  # more than 220 s at 18-20 on 2 shared cores.
  deadline = time.monotonic() + timeout_secs
  while not (found := condition()):
    assert launcher.poll() is None, f"{what}: the run ended first\n{out.read_text()[-3000:]}"
    assert time.monotonic() < deadline, f"{what}: not within {timeout_secs}s"
    time.sleep(0.05)
  return found


def _run(tmp_path, env, kills, sync_mode="async", steps_per_epoch=STEPS, epochs=EPOCHS) -> tuple:
  """Trains the fixture under tfps-launch, SIGKILLing task `name` 0.2 s after checkpoint `epoch` for each
  `(epoch, name)` of `kills`; returns the launcher's output and the counts the chief wrote."""
  tmp_path.mkdir(parents=True, exist_ok=True)
  counts, out, model_dir = tmp_path / "counts.json", tmp_path / "out.txt", tmp_path / "run"
  command = [sys.executable, "-m", "tfps.cluster.launch", "--num_workers=2", "--num_ps=2", "--max_restarts=5",
             f"--log_dir={tmp_path / 'logs'}", "tests/fixtures/dynamic_kills_train.py", "--",
             f"--model_dir={model_dir}", f"--counts_json={counts}", f"--epochs={epochs}",
             f"--steps_per_epoch={steps_per_epoch}", f"--sync_mode={sync_mode}"]
  with open(out, "w", encoding="utf-8") as output:
    launcher = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
  try:
    for epoch, name in kills:
      _wait_for(lambda epoch=epoch: checkpoints_lib.is_registered(str(model_dir), epoch),
                f"checkpoint {epoch}", launcher, out)
      time.sleep(0.2)  # into the next epoch, at some point of a step
      _wait_for(lambda name=name: _task(launcher, name, tmp_path / "logs"), name, launcher, out).send_signal(signal.SIGKILL)
    assert launcher.wait(timeout=400) == 0, out.read_text()[-3000:]
  finally:
    leftovers = [process for process in (_task(launcher, name, tmp_path / "logs") for name in
                                         ("chief:0", "worker:0", "worker:1", "ps:0", "ps:1")) if process]
    for process in leftovers:
      process.kill()
    if launcher.poll() is None:
      launcher.kill()
      launcher.wait()
  assert not leftovers, f"processes left behind: {leftovers}"
  result = json.loads(counts.read_text())
  final = json.loads((model_dir / "checkpoints" / "FINAL").read_text())
  result["applied_by_ps"] = applied_steps.applied_per_ps(final["last_checkpoint"],
                                                         (tmp_path / "logs" / "chief-0.log").read_text())
  return out.read_text(), result


def _assert_each_step_counted_once(result, sync_mode="async", steps_per_epoch=STEPS, epochs=EPOCHS):
  steps, per_step = epochs * steps_per_epoch, BATCHES_PER_STEP[sync_mode]
  batches = steps * per_step
  assert result["iterations"] == steps, result
  assert result["applied_by_ps"] == {"ps:0": steps, "ps:1": steps}, result  # each ps's step counter
  assert result["clocks"] == [batches] * 4, result  # 2 tables x 2 shards: one tick per batch of an applied step
  assert result["sightings"] == [batches] * 8, result
  admitted_in_step = (MIN_COUNT - 1) // per_step  # the step whose batches sight an id for the MIN_COUNT-th time
  assert result["updates_after_admission"] == [steps - admitted_in_step] * 8, result
  assert (result["admitting"]["admitted"], result["admitting"]["fallbacks"]) == (8, 0), result
  assert result["counting"]["admitted"] == 0, result


# mode -> (steps per epoch, epochs, kills): each run's workers are killed after checkpoints 1 and 2; the async run's
# ps:0 after checkpoint 3, once the counts of the worker kills' epochs are in the checkpoint it resumes from. Sync:
# epochs of 20 steps, one function per worker slot (a sync step waits for both workers' batches and its bookkeeping:
# such an epoch lasts 1 s alone, seconds beside the other runs, and each kill lands in it).
RUNS = {"async": (STEPS, EPOCHS + 1, [(1, "worker:1"), (2, "worker:0"), (3, "ps:0")]),
        "sync": (20, EPOCHS, [(1, "worker:1"), (2, "worker:0")]),
        "geo": (40, EPOCHS, [(1, "worker:1"), (2, "worker:0")])}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, module_subprocess_env) -> dict:
  """mode -> (launcher output, counts) of RUNS, run side by side (each run costs a cluster's start-up)."""
  tmp_path = tmp_path_factory.mktemp("kills")
  with concurrent.futures.ThreadPoolExecutor(len(RUNS)) as pool:
    futures = {mode: pool.submit(_run, tmp_path / mode, module_subprocess_env, kills, mode, steps_per_epoch=steps,
                                 epochs=epochs)
               for mode, (steps, epochs, kills) in RUNS.items()}
    return {mode: future.result() for mode, future in futures.items()}


def test_worker_kills_neither_double_count_sightings_nor_double_apply_table_updates(runs):
  """The async run, and beside it the sync and the geo run with the same kills.

  Sync: a gradient function run again for a worker slot whose first run reached a shard only looks up there (and a
  batch filling a dead worker's slot counts where the dead worker's batch did not). Geo: a round cut short runs again
  from its pull, its discovery only looking up where its first run did the bookkeeping, and pushes once."""
  for mode, (output, result) in runs.items():
    assert output.count("restarting worker:") == 2, mode
    steps, epochs, _ = RUNS[mode]
    _assert_each_step_counted_once(result, mode, steps_per_epoch=steps, epochs=epochs)


def test_ps_restart_restores_maps_counts_and_rows_with_the_step(runs):
  """A ps killed mid-epoch (the async run's last kill): the cluster restarts and resumes from the last epoch's
  checkpoint, whose rows, maps, counts and clocks were saved with the optimizer's step, so every count still equals
  the applied steps."""
  output, result = runs["async"]
  assert "ps:0 failed; restarting the training cluster" in output
  assert re.search(r"Resumed from \S+/ckpt-3 at epoch 4/4", output)
  steps, epochs, _ = RUNS["async"]
  _assert_each_step_counted_once(result, steps_per_epoch=steps, epochs=epochs)
