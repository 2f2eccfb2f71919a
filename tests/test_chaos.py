"""Chaos under tfps-launch with real processes: SIGKILL workers, the ps, the chief; SIGTERM the launcher.

Each run trains scripts/train_keras.py, or a model that counts on every ps the steps applied there
(bench/worker_kills_train.py, or the example scripts with --count_applied_steps: `tfps.testing.applied_steps`), for 4
epochs (3 in runs whose kills need no fourth, 6 in the run with five kills); the steps it counted are the step counter
the chief records in the FINAL marker, the steps applied are each ps's counter in the final checkpoint. Runs
that claim an exact count under failures run the counting models on 2 ps and assert both: the step counter is settled
from the ps's records (`tfps.training.exactly_once`), so alone it would not show a step applied twice or lost. Each run
costs a cluster's start-up: kills that do not interfere share a run (3 worker kills, then the ps, then the chief; the
chief while it writes a checkpoint, then the ps after the end), and runs of the same kills in two modes go side by
side.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

from fixtures.launcher import QUICK_STOP
import psutil
import pytest

from tfps.cluster import tasks as tasks_lib
from tfps.testing import applied_steps
from tfps.training import checkpoints as checkpoints_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
EPOCHS, STEPS = 4, 100

pytestmark = pytest.mark.slow


KERAS_ARGS = ("scripts/train_keras.py", "--", f"--epochs={EPOCHS}", f"--steps_per_epoch={STEPS}", "--vocab_size=2000",
              "--batch_size=32", "--noexact_evaluation")
# A model with a counter on each ps whose Adagrad accumulator counts the step updates that reached it.
COUNTING_ARGS = ("bench/worker_kills_train.py", "--", f"--epochs={EPOCHS}", f"--steps_per_epoch={STEPS}")
TWO_PS = "--num_ps=2"
# Workers are killed after the checkpoints at steps 250 and 500, the ps after the one at 750, and it must be restored
# from it, not from the next one (1000): the run ends there, so no step runs that the assertions do not need. At 220
# steps/s (2 ps, 2 workers, load average 3) 250 steps last 1.1 s, and each kill (0.2 s after its checkpoint) lands in
# them.
ESTIMATOR_STEPS = 1000
ESTIMATOR_ARGS = ("scripts/train_estimator.py", "--", f"--max_steps={ESTIMATOR_STEPS}", "--save_checkpoints_steps=250",
                  "--noinline_eval", "--count_applied_steps")


def on_each_ps(steps, num_ps=2):
  """What `Run.applied` gives where each of the `num_ps` ps applied `steps` steps."""
  return {f"ps:{index}": steps for index in range(num_ps)}


class Run:
  """One tfps-launch run (of scripts/train_keras.py unless `script` says otherwise) in its own session."""

  def __init__(self, tmp_path, env, *launch_args, script_args=(), script=KERAS_ARGS):
    self.model_dir = tmp_path / "run"
    self.out = tmp_path / "out.txt"
    self.log_dir = tmp_path / "logs"
    command = [sys.executable, "-m", "tfps.cluster.launch", "--num_workers=2", f"--log_dir={tmp_path / 'logs'}",
               QUICK_STOP, *launch_args, *script, f"--model_dir={self.model_dir}", *script_args]
    self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=open(self.out, "w"), stderr=subprocess.STDOUT,
                                    start_new_session=True)

  def tasks(self):
    try:
      return psutil.Process(self.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
      return []

  def task(self, name):
    """The live process of task `name` ("worker:1")."""
    return tasks_lib.find_task(self.log_dir, name, self.tasks())

  def wait_for_checkpoint(self, number, timeout_secs=240):
    deadline = time.monotonic() + timeout_secs
    while not checkpoints_lib.is_registered(str(self.model_dir), number):
      assert self.process.poll() is None, self.output()[-3000:]
      assert time.monotonic() < deadline, f"no checkpoint {number} after {timeout_secs}s"
      time.sleep(0.1)

  def kill(self, name):
    deadline = time.monotonic() + 60
    while (process := self.task(name)) is None:
      assert time.monotonic() < deadline, f"task {name} never (re)started"
      time.sleep(0.1)
    process.send_signal(signal.SIGKILL)

  def output(self):
    return self.out.read_text()

  def resumed_lines(self):
    """The chief's own lines on resuming from its last checkpoint; not the launcher's quotes ("  | ...") of a dead
    task's log, which may repeat one."""
    return [line for line in self.output().splitlines()
            if re.search(r"Resumed from \S+ at epoch", line) and not line.startswith("  | ")]

  def evidence(self, lines=40):
    """What a failed count is read against: the chief's log lines on failures, restarts, checkpoints and settling,
    and the last lines of each ps's log (a run's folder goes with its pytest temp folder)."""
    wanted = re.compile(r"failed with|restart|Saved checkpoint|settled|Training on|rror")
    chief = [line[:200] for line in (self.log_dir / "chief-0.log").read_text(errors="replace").splitlines()
             if wanted.search(line)]
    parts = ["chief-0.log:", *chief[-lines:]]
    for log in sorted(self.log_dir.glob("ps-*.log")):
      parts += [f"{log.name}:", *(line[:200] for line in log.read_text(errors="replace").splitlines()[-lines // 4:])]
    return "\n".join(parts)

  def applied(self, final):
    """`{"ps:N": steps applied there}`, from the counters in the final checkpoint (`final`: the FINAL marker) and
    their placement in the chief's log."""
    return applied_steps.applied_per_ps(final["last_checkpoint"], (self.log_dir / "chief-0.log").read_text())

  def finish(self, timeout_secs=400):
    code = self.process.wait(timeout=timeout_secs)
    final = self.model_dir / "checkpoints" / "FINAL"
    return code, json.loads(final.read_text()) if final.exists() else None

  def cleanup(self):
    leftovers = self.tasks()
    for process in leftovers:
      process.kill()
    if self.process.poll() is None:
      self.process.kill()
    return leftovers


@pytest.fixture
def run(tmp_path, subprocess_env):
  runs = []

  def start(*args, folder="", **kwargs):
    (tmp_path / folder).mkdir(exist_ok=True)
    runs.append(Run(tmp_path / folder, subprocess_env, *args, **kwargs))
    return runs[-1]
  yield start
  leftovers = [p for r in runs for p in r.cleanup()]
  assert not leftovers, f"processes left behind: {leftovers}"


def kill_after_checkpoints(plan, timeout_secs=240):
  """`plan`: {job: [(checkpoint number, task name), ...]}. Kills each task just after its job wrote that checkpoint,
  watching every job at once (runs side by side); fails when a job ends or waits `timeout_secs` for a checkpoint."""
  left = {job: list(kills) for job, kills in plan.items()}
  deadline = time.monotonic() + timeout_secs
  while any(left.values()):
    for job, kills in left.items():
      if kills and checkpoints_lib.is_registered(str(job.model_dir), kills[0][0]):
        time.sleep(0.2)  # into the next epoch, which lasts seconds
        job.kill(kills.pop(0)[1])
        deadline = time.monotonic() + timeout_secs
      assert not kills or job.process.poll() is None, job.output()[-3000:]
    assert time.monotonic() < deadline, f"no checkpoint after {timeout_secs}s; kills left: {list(left.values())}"
    time.sleep(0.05)


# The default run of the worker kills also takes the ps kill and then the chief kill (one cluster start-up fewer than a
# run of their own): 2 epochs more, each kill in an epoch of its own.
KILLS_EPOCHS = EPOCHS + 2


@pytest.fixture(scope="module")
def worker_kill_runs(tmp_path_factory, module_subprocess_env):
  """`{name: (Run, exit code, FINAL marker)}` of two runs side by side on 2 ps, "default" and "pipelined" (pipelined
  updates), each with a worker killed in epochs 2, 3 and 4; the default run (6 epochs) then with ps:0 killed in epoch
  5 and, once the run resumed, the chief in epoch 6. Each kill lands in an epoch that lasts seconds (a kill after the
  end would find a finished run)."""
  tmp_path = tmp_path_factory.mktemp("worker_kills")
  jobs, leftovers = {}, []
  try:
    for name, args in (("default", [f"--epochs={KILLS_EPOCHS}"]), ("pipelined", ["--pipelined_updates"])):
      (tmp_path / name).mkdir()
      jobs[name] = Run(tmp_path / name, module_subprocess_env, "--max_restarts=7", TWO_PS, script=COUNTING_ARGS,
                       script_args=args)
    worker_kills = [(epoch, f"worker:{epoch % 2}") for epoch in (1, 2, 3)]
    kill_after_checkpoints({jobs["default"]: worker_kills + [(4, "ps:0")], jobs["pipelined"]: worker_kills})
    default = jobs["default"]
    deadline = time.monotonic() + 240
    while not (default.resumed_lines() and checkpoints_lib.is_registered(str(default.model_dir), 5)):
      assert time.monotonic() < deadline and default.process.poll() is None, default.output()[-3000:]
      time.sleep(0.05)
    time.sleep(0.2)  # into epoch 6, which lasts seconds
    default.kill("chief:0")
    yield {name: (job, *job.finish()) for name, job in jobs.items()}
  finally:
    leftovers = [p for job in jobs.values() for p in job.cleanup()]
  assert not leftovers, f"processes left behind: {leftovers}"


def test_workers_killed_several_times_every_step_is_applied_and_counted_once(worker_kill_runs):
  """bench/worker_kills.py repeats these worker kills and counts the outcomes. 2 ps: a step cut short can reach one ps
  and not the other, which the per-ps records complete on the other alone. Beside it (side by side, to save time) the
  same with pipelined updates: a killed worker also takes the gradients of the step it held back, which the re-run
  computes again. (The default run's ps and chief kills come after its worker kills and count here too.)"""
  for name, (job, code, final) in worker_kill_runs.items():
    steps = (KILLS_EPOCHS if name == "default" else EPOCHS) * STEPS
    assert code == 0, (name, job.output()[-3000:])
    assert job.output().count("restarting worker:") == 3, name
    # The function that was running on the killed worker is run again elsewhere, skipping the steps it had recorded
    # (9 steps too many without the record), and the step its worker was sending is applied by the re-run alone.
    assert final["step"] == steps, name
    assert job.applied(final) == on_each_ps(steps), (name, job.evidence())


# Steps per epoch of each mode's run. A sync step waits for both workers' batches: 50 ms at a load average of 3 (an
# epoch of 40 steps, two functions of 20, lasts 2 s, and each kill lands in it); a geo epoch of 100 steps took 0.2 s.
SYNC_AND_GEO_STEPS = {"sync": 40, "geo": STEPS}
SYNC_AND_GEO_EPOCHS = 3  # the kills land in epochs 2 and 3


def test_sync_and_geo_modes_survive_worker_kills(run):
  """Both runs side by side, on 2 ps, for 3 epochs."""
  jobs = {mode: run("--max_restarts=5", TWO_PS, script=COUNTING_ARGS, folder=mode,
                    script_args=[f"--sync_mode={mode}", f"--epochs={SYNC_AND_GEO_EPOCHS}",
                                 f"--steps_per_epoch={steps}"])
          for mode, steps in SYNC_AND_GEO_STEPS.items()}
  kill_after_checkpoints({job: [(epoch, f"worker:{epoch % 2}") for epoch in (1, 2)] for job in jobs.values()})
  for mode, job in jobs.items():
    code, final = job.finish()
    assert code == 0, (mode, job.output()[-3000:])
    assert job.output().count("restarting worker:") == 2, mode
    # sync: a worker's slot is filled once per step, and each ps applies a step's update once (its records); geo:
    # each ps takes a round's push (differences and step count) once, so a re-run round is never counted twice.
    steps = SYNC_AND_GEO_EPOCHS * SYNC_AND_GEO_STEPS[mode]
    assert final["step"] == steps, (mode, final)
    assert job.applied(final) == on_each_ps(steps), (mode, job.evidence())


def test_ps_then_chief_killed_each_resume_from_the_last_checkpoint(worker_kill_runs):
  """On 2 ps, the default run of the worker kills, after them: ps:0 killed in epoch 5, then, once the run resumed, the
  chief in epoch 6."""
  job, code, final = worker_kill_runs["default"]
  output = job.output()
  assert code == 0, output[-3000:]
  assert "restart 4/7: ps:0 failed; restarting the training cluster" in output  # after 3 worker restarts
  assert "restart 5/7: chief:0 failed; restarting the training cluster" in output
  resumed = job.resumed_lines()
  assert len(resumed) == 2 and ("epoch 5/6 (step 400)" in resumed[0] or "epoch 6/6 (step 500)" in resumed[0]), resumed
  assert "epoch 6/6 (step 500)" in resumed[1], resumed
  assert final["step"] == KILLS_EPOCHS * STEPS  # the epochs run again are not counted twice
  # each epoch again, from the checkpoint's values
  assert job.applied(final) == on_each_ps(KILLS_EPOCHS * STEPS), job.evidence()


def test_sigterm_to_the_launcher_mid_training_leaves_nothing(run):
  """SIGTERM once the first epoch's checkpoint is written (epochs of 20 steps: 1 of 4)."""
  job = run("--evaluator", script_args=["--steps_per_epoch=20"])
  job.wait_for_checkpoint(1)
  pids = [p.pid for p in job.tasks()]
  assert len(pids) >= 5  # ps, 2 workers, chief, evaluator
  job.process.send_signal(signal.SIGTERM)
  assert job.process.wait(timeout=60) == 128 + signal.SIGTERM
  time.sleep(0.5)
  alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
  assert alive == []


def test_chief_killed_while_writing_a_checkpoint_then_the_ps_after_the_end(run):
  """One run on 1 ps for 3 epochs with both kills: the chief killed while it writes a checkpoint (after the first)
  restores the last complete one; once training has ended (the FINAL marker written), the ps killed while the chief
  is still on its way out of fit (seconds under ParameterServerStrategy) restarts the cluster, whose chief finds the
  marker and trains nothing again."""
  epochs = 3
  # a 64 MB table (and as much Adagrad state): saves take a while
  job = run(script_args=["--vocab_size=2000000", "--count_applied_steps", f"--epochs={epochs}"])
  job.wait_for_checkpoint(1)
  deadline = time.monotonic() + 240
  while not (writing := [p for p in job.model_dir.rglob("*_temp*")]):
    assert time.monotonic() < deadline and job.process.poll() is None, "never saw a checkpoint being written"
    time.sleep(0.005)
  job.kill("chief:0")
  final_marker = job.model_dir / "checkpoints" / "FINAL"
  deadline = time.monotonic() + 300
  while not final_marker.exists():
    assert time.monotonic() < deadline and job.process.poll() is None, job.output()[-3000:]
    time.sleep(0.05)
  job.kill("ps:0")
  code, final = job.finish()
  output = job.output()
  assert code == 0, output[-3000:]
  assert "restart 1/3: chief:0 failed" in output
  # the ps kill's restart: 2/3, or 3/3 after a restarted chief failed once on its own (seen once: "Unable to parse
  # request" from a worker right after the restore)
  ps_restart = re.search(r"restart [23]/3: ps:0 failed", output)
  assert ps_restart, output[-3000:]  # the ps kill restarted the cluster
  before_end, after_end = output[:ps_restart.start()], output[ps_restart.end():]
  # from the last complete checkpoint: the one before the one being written (or that one, where the kill came after
  # it was complete)
  resumed = re.search(r"Resumed from \S+/ckpt-(\d+) at epoch (\d+)/3", before_end)
  assert resumed and resumed[1] in ("1", "2") and int(resumed[2]) == int(resumed[1]) + 1, writing
  assert "Training already finished in" in after_end
  # no epoch trained again, from the start or from a checkpoint
  assert (f"epoch 1/{epochs}" not in after_end and "| step " not in after_end
          and "Resumed from" not in after_end), after_end
  assert final["step"] == epochs * STEPS, writing
  assert job.applied(final) == on_each_ps(epochs * STEPS, num_ps=1), job.evidence()


def test_estimator_path_workers_and_ps_killed_ends_at_exactly_max_steps(run):
  """On 2 ps; the ps killed is one of them."""
  job = run("--max_restarts=5", TWO_PS, script=ESTIMATOR_ARGS)
  for step, victim in ((250, "worker:0"), (500, "worker:1"), (750, "ps:0")):
    job.wait_for_checkpoint(step)
    time.sleep(0.2)
    job.kill(victim)
  code, final = job.finish()
  output = job.output()
  assert code == 0, output[-3000:]
  assert output.count("restarting worker:") == 2
  assert "restart 3/5: ps:0 failed; restarting the training cluster" in output
  resumed = [line for line in output.splitlines() if "; resuming at step" in line]
  assert len(resumed) == 1 and resumed[0].endswith("resuming at step 750"), resumed
  assert final["step"] == ESTIMATOR_STEPS  # exact: after the worker kills and after the ps restart
  assert job.applied(final) == on_each_ps(ESTIMATOR_STEPS), job.evidence()
