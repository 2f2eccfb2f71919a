"""Many hosts for real: 2 ps, 3 workers, a chief and a sidecar evaluator on 7 test hosts (network namespaces), each
task started as a user (or an orchestrator) would start it on its host, with network faults injected on the links.

Keras path: the JobSet/StatefulSet form (tfps derives the cluster from the pod's variables), 1% packet loss on every
link; one worker cut off for 20 s: training goes on with the other two meanwhile and the worker rejoins once back;
then one ps cut off: the chief stops with one line naming the ps and its address; the same commands started again
resume from the last checkpoint and end at the exact step count; the sidecar evaluates every checkpoint.
Estimator path: TF_CONFIG as the Kubeflow TFJob operator writes it; one worker cut off for 15 s (the same: training
goes on, the worker rejoins), then the chief's host cut off and the chief started again; the job ends at exactly
max_steps.

While a worker is cut off, both ps send at most PACE_KBIT kbit/s: the run is paced by the network rather than by how
busy this machine is, so that it outlasts the cut and the worker's return on an idle machine too; the cap is lifted
once the worker is back. Measured at load average 30 on 2 cores: 4-5 minutes per test, most of it TensorFlow starting
(the chief's first step came 48 s after its start).
"""

import json
import os
import pathlib
import re
import time

import pytest

import needs
from tfps.testing import applied_steps
from tfps.testing import host_cluster as host_cluster_lib
from tfps.testing import hosts as hosts_lib
from tfps.training import checkpoints as checkpoints_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
TRAINING = (("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("worker", 2), ("chief", 0))
CHIEF, EVALUATOR, WORKER = ("chief", 0), ("evaluator", 0), ("worker", 1)
PACE_KBIT = 2000  # per ps: about 8 steps/s of these small models

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def root():
  needs.require_root()


def wait_for(predicate, timeout_secs, what, cluster):
  deadline = time.monotonic() + timeout_secs
  while not (value := predicate()):
    if time.monotonic() > deadline:
      raise AssertionError(f"no {what} after {timeout_secs}s; chief log:\n{cluster.log(CHIEF)[-3000:]}")
    time.sleep(0.1)
  return value


def last_line(cluster, task):
  return cluster.log(task).strip().splitlines()[-1]


@pytest.fixture
def make_cluster(tmp_path, subprocess_env):
  made = []

  def make(script, args, **kwargs):
    cluster = host_cluster_lib.HostCluster(str(REPO / script), args, str(tmp_path / f"logs{len(made)}"),
                                           env=subprocess_env, **kwargs)
    made.append(cluster)
    return cluster
  yield make
  netns = [host.netns for cluster in made for host in cluster.hosts.hosts.values()]
  processes = [p for cluster in made for p in cluster.processes.values()]
  for cluster in made:
    cluster.close()
  assert not set(netns) & set(hosts_lib.leftovers()), "test hosts left behind"
  assert all(p.poll() is not None for p in processes), "processes left behind"


def cut_worker(cluster, model_dir, cut_secs):
  """Cuts worker:1 off for `cut_secs` while both ps are paced; checks that the chief found it silent (gRPC keepalive),
  that the other workers trained on meanwhile and that worker:1 works again once back; lifts the pacing."""
  for ps in TRAINING[:2]:
    cluster.limit_rate(ps, PACE_KBIT)
  cut_at = time.time()
  cluster.cut(WORKER)
  wait_for(lambda: host_cluster_lib.worker_failed(cluster.log(CHIEF), WORKER), cut_secs,
           "worker:1 found silent during its cut", cluster)
  found_at = time.time()
  time.sleep(max(0.0, cut_at + cut_secs - found_at))
  restored_at = time.time()
  cluster.restore(WORKER)
  # The chief's join waited on the silent worker's function before: a record between the worker found silent and its
  # restore, past every step recorded before the cut, is training that went on without it.
  before = max(host_cluster_lib.progress_steps(str(model_dir), 0, cut_at), default=0)
  meanwhile = host_cluster_lib.progress_steps(str(model_dir), found_at, restored_at)
  assert meanwhile and meanwhile[-1] > before, (before, meanwhile, found_at - cut_at)
  back_secs = cluster.wait_until_sending(WORKER, ("worker", 0), timeout_secs=60)
  assert back_secs is not None, f"worker:1 not at work again 60s after the restore:\n{cluster.log(CHIEF)[-3000:]}"
  for ps in TRAINING[:2]:
    cluster.limit_rate(ps, 0)
  return {"found_secs": round(found_at - cut_at, 1), "steps_meanwhile": meanwhile[-1] - before,
          "back_secs": round(back_secs, 1)}


def test_keras_path_with_packet_loss_a_worker_and_a_ps_cut_off(make_cluster, tmp_path):
  epochs, steps = 6, 80
  model_dir = tmp_path / "shared" / "model"
  cluster = make_cluster("scripts/train_keras.py", [
      f"--model_dir={model_dir}", f"--epochs={epochs}", f"--steps_per_epoch={steps}", "--vocab_size=2000",
      "--batch_size=32", "--noexact_evaluation", "--connect_timeout_secs=120", "--lost_task_timeout_secs=15",
      "--count_applied_steps"], form="jobset", role_args={"evaluator": ["--evaluate_every_checkpoint"]})
  cluster.drop(0.01)
  cluster.start_all()
  wait_for(lambda: checkpoints_lib.is_registered(str(model_dir), 1), 300, "checkpoint 1", cluster)
  worker_cut = cut_worker(cluster, model_dir, cut_secs=20)

  cut_at = time.monotonic()
  cluster.cut(("ps", 1))
  assert cluster.wait(CHIEF, timeout_secs=120) == 3, cluster.log(CHIEF)[-3000:]
  stopped_secs = time.monotonic() - cut_at
  line = last_line(cluster, CHIEF)
  assert re.match(r"train_keras.py: task ps:1 at ctr-ps-1.ctr:2222 (became unreachable|has not answered)", line), line
  assert "start this task again" in line

  cluster.restore(("ps", 1))
  for task in TRAINING:  # the restart policy: the same commands again
    cluster.restart(task)
  assert cluster.wait(CHIEF, timeout_secs=300) == 0, cluster.log(CHIEF)[-3000:]
  # The 1% loss was in effect for the whole run: every training task's host had packets dropped (the rules were made
  # just before the tasks started).
  faults = cluster.fault_counts()
  assert all(faults[host_cluster_lib.task_label(task)]["dropped"] > 0 for task in TRAINING), faults
  final = json.loads((model_dir / "checkpoints" / "FINAL").read_text())
  assert final["step"] == epochs * steps
  # Each ps applied every step once (its counter; the step counter alone is settled from the ps's records).
  assert applied_steps.applied_per_ps(final["last_checkpoint"], cluster.log(CHIEF)) == {
      "ps:0": epochs * steps, "ps:1": epochs * steps}
  resumed = re.findall(r"Resumed from \S+ at epoch (\d+)/", cluster.log(CHIEF))
  assert len(resumed) == 1 and int(resumed[0]) >= 2, resumed

  assert cluster.wait(EVALUATOR, timeout_secs=180) == 0, cluster.log(EVALUATOR)[-3000:]
  records = (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()
  evaluated = [os.path.basename(json.loads(line)["checkpoint"]) for line in records]
  # Every checkpoint the state file lists, in order (a save the lost ps interrupted is not one of them).
  state = (model_dir / "checkpoints" / "checkpoint").read_text()
  listed = re.findall(r'^all_model_checkpoint_paths: "(ckpt-\d+)"', state, re.MULTILINE)
  numbers = [int(name.split("-")[1]) for name in evaluated]
  assert len(listed) >= 3 and evaluated[-len(listed):] == listed and numbers == sorted(set(numbers)), (
      evaluated, listed)
  print(f"worker cut off 20s: {worker_cut}; ps cut off: chief stopped after {stopped_secs:.1f}s with: {line}")


def test_estimator_path_tfjob_with_a_worker_and_the_chief_cut_off(make_cluster, tmp_path):
  max_steps = 500
  model_dir = tmp_path / "shared" / "model"
  cluster = make_cluster("scripts/train_estimator.py", [
      f"--model_dir={model_dir}", f"--max_steps={max_steps}", "--save_checkpoints_steps=50",
      "--log_step_count_steps=10", "--steps_per_execution=2", "--eval_examples=1000", "--noinline_eval",
      "--connect_timeout_secs=120", "--lost_task_timeout_secs=15", "--count_applied_steps"], form="tfjob")
  cluster.start_all()
  checkpoint = model_dir / "checkpoints" / "checkpoint"
  wait_for(checkpoint.exists, 300, "a checkpoint", cluster)
  worker_cut = cut_worker(cluster, model_dir, cut_secs=15)

  before = _checkpoint_step(checkpoint)
  saved = wait_for(lambda: (_checkpoint_step(checkpoint) or 0) > before and _checkpoint_step(checkpoint), 60,
                   "a checkpoint after the worker came back", cluster)
  cluster.cut(CHIEF)
  time.sleep(5)
  cluster.restore(CHIEF)
  cluster.restart(CHIEF)
  assert cluster.wait(CHIEF, timeout_secs=300) == 0, cluster.log(CHIEF)[-3000:]
  resumed = [int(s) for s in re.findall(r"resuming at step (\d+)", cluster.log(CHIEF))]
  assert resumed and resumed[-1] >= saved, (resumed, saved)
  final = json.loads((model_dir / "checkpoints" / "FINAL").read_text())
  assert final["step"] == max_steps
  assert applied_steps.applied_per_ps(final["last_checkpoint"], cluster.log(CHIEF)) == {
      "ps:0": max_steps, "ps:1": max_steps}
  assert cluster.wait(EVALUATOR, timeout_secs=180) == 0, cluster.log(EVALUATOR)[-3000:]
  records = [json.loads(line) for line in (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()]
  assert records[-1]["step"] == max_steps
  print(f"worker cut off 15s: {worker_cut}; chief resumed at step {resumed[-1]}")


def _checkpoint_step(state_file: pathlib.Path):
  try:
    match = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state_file.read_text(), re.MULTILINE)
  except OSError:
    return None
  return int(match.group(1)) if match else None
