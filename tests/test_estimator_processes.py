"""scripts/train_estimator.py as real processes: per role (a chief SIGKILLed after its first checkpoint and started
again resumes at the checkpointed step and ends at exactly max_steps; a sidecar evaluator follows the checkpoints),
and under tfps-launch."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

from fixtures.launcher import QUICK_STOP
import portpicker
import psutil
import pytest

from tfps.testing import applied_steps
from tfps.testing import host_forks

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "train_estimator.py"
MAX_STEPS = 600
EVAL_EXAMPLES = 1000


class Processes:
  """Processes started by one test; `stop_all` kills each with its descendants."""

  def __init__(self, log_dir: pathlib.Path, env: dict):
    self.log_dir = log_dir
    self.env = env
    self.started = {}
    self.forks = host_forks.HostForks()  # the script's processes fork from one import of TensorFlow

  def start(self, name: str, *args: str, command=(sys.executable, str(SCRIPT))):
    """Starts `command + args` (default: the script, forked as tfps-launch starts its tasks; else a fresh process in
    a session of its own), its output in `<log_dir>/<name>.log`."""
    with open(self.log_dir / f"{name}.log", "ab") as log:
      options = {"env": self.env, "stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
      process = self.forks.spawn(None, [*command, *args], options)
      if process is None:
        process = subprocess.Popen([*command, *args], cwd=REPO, start_new_session=True, **options)
    self.started[name] = process
    return process

  def start_servers(self):
    """Starts 1 ps and 2 workers from the script's role flags; returns their hosts and those flags."""
    hosts = [f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(3)]
    cluster = [f"--ps_hosts={hosts[0]}", f"--worker_hosts={hosts[1]},{hosts[2]}"]
    self.start("ps-0", "--job_name=ps", "--task_index=0", *cluster)
    for index in range(2):
      self.start(f"worker-{index}", "--job_name=worker", f"--task_index={index}", *cluster)
    return hosts, cluster

  def log(self, name: str) -> str:
    return (self.log_dir / f"{name}.log").read_text(errors="replace")

  def stop_all(self) -> None:
    for process in self.started.values():
      kill_tree(process)
    self.forks.close()


def kill_tree(process) -> None:
  """SIGKILL to `process` and all its descendants; waits for them."""
  try:
    tree = [psutil.Process(process.pid)] + psutil.Process(process.pid).children(recursive=True)
  except psutil.NoSuchProcess:
    tree = []
  for member in tree:
    try:
      member.kill()
    except psutil.NoSuchProcess:
      pass
  psutil.wait_procs(tree, timeout=10)
  process.wait(timeout=10)


def _wait_for(predicate, timeout_secs: float, what: str, processes: Processes):
  """The first true `predicate()`; fails early if a process died meanwhile."""
  deadline = time.monotonic() + timeout_secs
  while time.monotonic() < deadline:
    value = predicate()
    if value:
      return value
    for name, process in processes.started.items():
      if process.poll() not in (None, 0):
        raise AssertionError(f"{name} exited with {process.returncode} while waiting for {what}:\n"
                             f"{processes.log(name)[-3000:]}")
    time.sleep(0.05)
  raise AssertionError(f"timed out after {timeout_secs}s waiting for {what}")


def _latest_checkpoint_step(model_dir: pathlib.Path):
  """The step of the checkpoint the `checkpoint` state file names (what a restarted chief restores), or None."""
  try:
    state = (model_dir / "checkpoints" / "checkpoint").read_text()
  except OSError:
    return None
  match = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state, re.MULTILINE)
  return int(match.group(1)) if match else None


@pytest.mark.slow
def test_chief_restart_resumes_and_sidecar_follows(tmp_path, subprocess_env):
  model_dir = tmp_path / "model"
  job = [f"--model_dir={model_dir}", f"--max_steps={MAX_STEPS}", "--save_checkpoints_steps=100",
         "--log_step_count_steps=50", "--steps_per_execution=2", f"--eval_examples={EVAL_EXAMPLES}",
         "--noinline_eval", "--count_applied_steps"]
  env = {k: v for k, v in subprocess_env.items() if k != "TF_CONFIG"}
  processes = Processes(tmp_path, env)
  try:
    _, cluster = processes.start_servers()
    processes.start("evaluator", "--job_name=evaluator", *cluster, *job)
    first_chief = processes.start("chief-1", "--job_name=chief", *cluster, *job)
    _wait_for(lambda: _latest_checkpoint_step(model_dir), 120, "the first checkpoint", processes)
    os.kill(first_chief.pid, signal.SIGKILL)
    first_chief.wait(timeout=10)
    saved = _latest_checkpoint_step(model_dir)
    assert saved < MAX_STEPS, "the chief finished before it could be killed; slow it down"

    second_chief = processes.start("chief-2", "--job_name=chief", *cluster, *job)
    assert second_chief.wait(timeout=180) == 0, processes.log("chief-2")[-3000:]
    log = processes.log("chief-2")
    assert f"resuming at step {saved}" in log
    final = json.loads((model_dir / "checkpoints" / "FINAL").read_text())
    assert final["step"] == MAX_STEPS
    assert applied_steps.applied_per_ps(final["last_checkpoint"], log) == {"ps:0": MAX_STEPS}  # none applied twice
    assert _latest_checkpoint_step(model_dir) == MAX_STEPS
    logged = [int(s) for s in re.findall(r"step (\d+) \| loss", log)]
    assert logged == list(range(saved + 50, MAX_STEPS + 1, 50))

    evaluator = processes.started["evaluator"]
    assert evaluator.wait(timeout=120) == 0, processes.log("evaluator")[-3000:]
    records = [json.loads(line) for line in (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == MAX_STEPS
    assert all(r["metrics"]["examples"] == EVAL_EXAMPLES == r["metrics"]["examples_counted"] for r in records)
    assert records[-1]["metrics"]["auc"] >= 0.95, records[-1]
  finally:
    processes.stop_all()
  assert all(p.poll() is not None for p in processes.started.values())


@pytest.mark.slow
def test_train_estimator_under_tfps_launch(tmp_path, subprocess_env):
  model_dir = tmp_path / "model"
  env = {k: v for k, v in subprocess_env.items() if k != "TF_CONFIG"}
  command = [sys.executable, "-m", "tfps.cluster.launch", "--num_ps=1", "--num_workers=2", "--evaluator", QUICK_STOP,
             f"--log_dir={tmp_path / 'logs'}", str(SCRIPT), "--", f"--model_dir={model_dir}", "--max_steps=400",
             "--save_checkpoints_steps=200", f"--eval_examples={EVAL_EXAMPLES}", "--noinline_eval"]
  launcher = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
  try:
    output, _ = launcher.communicate(timeout=240)
    assert launcher.returncode == 0, output[-4000:]
  finally:
    kill_tree(launcher)
  assert json.loads((model_dir / "checkpoints" / "FINAL").read_text())["step"] == 400
  assert "step 400 | loss" in (model_dir / "loss.log").read_text()
  records = [json.loads(line) for line in (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()]
  assert records[-1]["step"] == 400 and records[-1]["metrics"]["examples_counted"] == EVAL_EXAMPLES
  assert records[-1]["metrics"]["auc"] >= 0.95, records[-1]


CHIEF_EVAL = """
import json, os, sys
from absl import logging
import tfps
import tensorflow as tf
from tfps.estimator import synthetic
from tfps.estimator.evaluation import ShardedEvaluation

logging.set_verbosity(logging.INFO)
tf.get_logger().setLevel("INFO")  # the coordinator reports a retried closure at INFO
ps_hosts, worker_hosts, model_dir = sys.argv[1:4]
cluster = tfps.cluster.config.from_hosts(ps_hosts=ps_hosts, worker_hosts=worker_hosts)
params = {"batch_size": 25, "eval_examples": %(examples)d}
estimator = tfps.Estimator(synthetic.model_fn, model_dir=model_dir, params=params, cluster=cluster)
estimator.train(synthetic.train_input_fn, max_steps=10)

def slow_eval_input_fn(params):  # each batch costs ~30 matmuls of 256x256 on a worker
  def slow(features, labels):
    x = tf.random.stateless_normal([256, 256], seed=[1, 2])
    for _ in range(30):
      x = tf.matmul(x, x) / 256.0
    return dict(features, dense=features["dense"] + 0.0 * tf.reduce_sum(x)), labels
  return synthetic.eval_input_fn(params).map(slow)

model = estimator.distributed_model()
evaluation = ShardedEvaluation(model.model, slow_eval_input_fn, None, num_shards=8)
evaluation.concrete_function()
print("EVALUATING", flush=True)
results = evaluation.run_on_cluster(model.coordinator)
print("RESULTS " + json.dumps(results), flush=True)
logging.flush()
os._exit(0)  # the coordinator's clean-up would try to reach the killed worker
"""


@pytest.mark.slow
def test_evaluation_exact_when_a_worker_dies(tmp_path, subprocess_env):
  env = {k: v for k, v in subprocess_env.items() if k != "TF_CONFIG"}
  processes = Processes(tmp_path, env)
  try:
    hosts, _ = processes.start_servers()
    chief = processes.start("chief", hosts[0], f"{hosts[1]},{hosts[2]}", str(tmp_path / "model"),
                            command=(sys.executable, "-c", CHIEF_EVAL % {"examples": EVAL_EXAMPLES}))
    _wait_for(lambda: "EVALUATING" in processes.log("chief"), 120, "the evaluation to start", processes)
    time.sleep(1.0)
    os.kill(processes.started["worker-1"].pid, signal.SIGKILL)
    processes.started["worker-1"].wait(timeout=10)
    del processes.started["worker-1"]
    assert chief.wait(timeout=120) == 0, processes.log("chief")[-3000:]
    log = processes.log("chief")
    assert "Putting back a closure after it failed" in log, log[-3000:]  # a shard was retried on the other worker
    results = json.loads(log.split("RESULTS ", 1)[1].splitlines()[0])
    assert results["examples"] == EVAL_EXAMPLES and results["examples_counted"] == EVAL_EXAMPLES
  finally:
    processes.stop_all()
