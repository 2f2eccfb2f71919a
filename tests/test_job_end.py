"""A ps or worker ends by itself: exit 0 once the chief wrote FINAL and is gone, exit 3 when the chief stays silent
before that (`tfps.cluster.job_end`); on 6 test hosts every task of a run exits 0 by itself, a chief killed mid-run
and started again finds its ps and workers still there, and the sidecar's last record is the FINAL checkpoint."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import portpicker
import pytest

import needs
from tfps.cluster import config as cluster_lib
from tfps.cluster import job_end
from tfps.errors import EXIT_LOST_TASK
from tfps.testing import host_cluster as host_cluster_lib
from tfps.testing import host_forks
from tfps.testing import hosts as hosts_lib
from tfps.training import checkpoints as checkpoints_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
CHIEF = "chief-host:2222"
MARKER = '{"last_checkpoint": "/m/checkpoints/ckpt-3", "step": 60}'


def watch(initial=None, chief=CHIEF, timeout=60.0):
  return job_end.EndWatch("ps:0", chief, "/m/checkpoints/FINAL", initial, timeout, now=0.0)


def run(end_watch, looks):
  """Feeds `(time, marker, chief_answered)` looks; returns `(time, outcome)` of the first that ends the task."""
  for now, marker, answered in looks:
    outcome = end_watch.look(marker, answered, now)
    if outcome is not None:
      return now, outcome
  return None


def test_a_new_run_ends_once_final_is_written_and_the_chief_is_gone():
  looks = [(t, None, True) for t in range(0, 100, 2)]  # training, longer than the lost-chief timeout
  looks += [(100, MARKER, True), (102, MARKER, True)]  # FINAL written; the chief exports, still answering
  looks += [(104, MARKER, False), (106, MARKER, False), (108, MARKER, False), (110, MARKER, False)]
  now, (status, message) = run(watch(), looks)
  assert (now, status) == (108, 0)  # silent for END_GRACE_SECS (5 s) since its last answer at 102
  assert message == "training ended (/m/checkpoints/FINAL) and chief:0 at chief-host:2222 is gone: ps:0 exits"


def test_a_previous_runs_marker_is_not_an_end_until_a_chief_came_and_went():
  # A new run: the ps starts before its chief, which removes the old marker once it trains.
  looks = [(t, MARKER, False) for t in range(0, 30, 2)] + [(30, MARKER, True), (32, None, True), (34, None, False)]
  looks += [(t, None, t > 50) for t in range(36, 80, 2)]  # the chief killed at 34, started again: back at 52
  looks += [(80, MARKER, True), (82, MARKER, False), (88, MARKER, False)]  # the same text again: a new marker
  now, (status, _) = run(watch(initial=MARKER), looks)
  assert (now, status) == (88, 0)
  # A chief started on a finished run restores it and exits without writing a marker: it came and went.
  now, (status, _) = run(watch(initial=MARKER), [(10, MARKER, True), (14, MARKER, False), (16, MARKER, False)])
  assert (now, status) == (16, 0)


def test_a_chief_silent_for_the_timeout_before_the_end_is_lost():
  looks = [(0, None, True)] + [(t, None, False) for t in range(2, 100, 2)]
  now, (status, message) = run(watch(timeout=20), looks)
  assert (now, status) == (20, EXIT_LOST_TASK)
  assert message.startswith("ps:0: chief:0 at chief-host:2222 has not answered for 20s and training has not ended "
                            "(no new /m/checkpoints/FINAL); stopping with status 3")
  assert "--lost_chief_timeout_secs" in message and "\n" not in message
  # An old marker and no chief ever: the same (the job's chief never came).
  now, (status, _) = run(watch(initial=MARKER, timeout=20), [(t, MARKER, False) for t in range(0, 40, 2)])
  assert (now, status) == (20, EXIT_LOST_TASK)


def test_a_chief_that_answers_long_after_final_and_an_unlisted_chief_end_within_a_bound():
  looks = [(0, None, True), (10, MARKER, True)] + [(t, MARKER, True) for t in range(12, 200, 2)]
  now, (status, message) = run(watch(timeout=60), looks)
  assert (now, status) == (70, 0) and "chief:0 still answers 60s later" in message
  looks = [(0, None, False), (10, MARKER, False)] + [(t, MARKER, False) for t in range(12, 100, 2)]
  now, (status, message) = run(watch(chief=None), looks)  # nothing to probe: never lost, ends 30 s after FINAL
  assert (now, status) == (40, 0) and "the chief is not listed" in message


def test_a_worker_ends_when_a_ps_process_ends_before_training_ended_and_not_after():
  ps = ["ps-a:2222", "ps-b:2222"]
  worker = job_end.EndWatch("worker:1", CHIEF, "/m/checkpoints/FINAL", None, 60.0, now=0.0, followed_ps=ps)
  assert worker.look(None, True, 2.0) is None
  status, message = worker.look(None, True, 4.0, ended_ps=["ps-b:2222"])
  assert status == EXIT_LOST_TASK and "\n" not in message
  assert message.startswith("worker:1: the process of ps:1 at ps-b:2222 ended and training has not ended; stopping "
                            "with status 3 so that a restart policy starts this task again")
  # at the end of training the ps exit by themselves: not a failure
  worker = job_end.EndWatch("worker:1", CHIEF, "/m/checkpoints/FINAL", None, 60.0, now=0.0, followed_ps=ps)
  assert worker.look(MARKER, False, 2.0, ended_ps=ps) is None
  # a task that follows no ps (a ps; a worker whose supervisor restarts every task) goes on
  assert watch().look(None, True, 2.0, ended_ps=ps) is None


@pytest.mark.parametrize("task_type,environ,followed", [
    ("worker", {}, ["a:1", "b:1"]),
    ("worker", {"TFPS_PS_FAILURE_RESTARTS_ALL": "1"}, []),  # tfps-launch, a JobSet
    ("ps", {}, [])])
def test_only_a_worker_follows_its_ps_and_not_where_every_task_restarts(task_type, environ, followed):
  config = cluster_lib.ClusterConfig(ps_hosts=("a:1", "b:1"), worker_hosts=("c:1",), chief_hosts=("d:1",),
                                     task_type=task_type, task_index=0)
  assert job_end.followed_ps_of(config, environ) == followed


def test_the_marker_is_read_where_the_chief_writes_it(tmp_path):
  from tfps.training import checkpoints  # pylint: disable=g-import-not-at-top
  assert job_end.read_marker_text(str(tmp_path)) is None
  checkpoints.write_final_marker(str(tmp_path), "ckpt-2", 40)
  assert json.loads(job_end.read_marker_text(str(tmp_path))) == {"last_checkpoint": "ckpt-2", "step": 40}
  assert checkpoints.read_final_marker(str(tmp_path))["step"] == 40


@pytest.mark.slow
def test_servers_exit_3_for_a_lost_chief_and_0_after_final(tmp_path, subprocess_env):
  """Two ps processes on loopback whose chief never comes: one fails after --lost_chief_timeout_secs, the other ends
  with status 0 once FINAL appears (written here) and the chief stays silent. Both fork from one import of
  TensorFlow (`tfps.testing.host_forks`)."""
  forks, started = host_forks.HostForks(), []

  def start(name, timeout_secs):
    ports = [portpicker.pick_unused_port() for _ in range(3)]
    argv = [sys.executable, str(REPO / "scripts" / "train_keras.py"), "--job_name=ps",
            f"--ps_hosts=127.0.0.1:{ports[0]}", f"--worker_hosts=127.0.0.1:{ports[1]}",
            f"--chief_hosts=127.0.0.1:{ports[2]}", f"--model_dir={tmp_path / name}",
            f"--lost_chief_timeout_secs={timeout_secs}"]
    with open(tmp_path / f"{name}.log", "w") as log:
      options = {"env": subprocess_env, "stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
      started.append(forks.spawn(None, argv, options) or subprocess.Popen(argv, cwd=REPO, **options))
    return started[-1]

  try:
    lost, ended = start("lost", 3), start("ended", 300)
    deadline = time.monotonic() + 120
    while "Serving ps:0" not in (tmp_path / "ended.log").read_text():
      assert time.monotonic() < deadline and ended.poll() is None, (tmp_path / "ended.log").read_text()
      time.sleep(0.2)
    (tmp_path / "ended" / "checkpoints").mkdir(parents=True)
    (tmp_path / "ended" / "checkpoints" / "FINAL").write_text(MARKER)
    written = time.monotonic()
    assert ended.wait(timeout=60) == 0, (tmp_path / "ended.log").read_text()[-2000:]
    assert time.monotonic() - written < 15
    assert "training ended" in (tmp_path / "ended.log").read_text()
    assert lost.wait(timeout=120) == EXIT_LOST_TASK
    lines = [line for line in (tmp_path / "lost.log").read_text().splitlines() if "train_keras.py: ps:0:" in line]
    assert len(lines) == 1 and re.search(r"has not answered for [3-9]s and training has not ended", lines[0]), lines
    assert "Traceback" not in (tmp_path / "lost.log").read_text()
  finally:
    for process in started:
      if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    forks.close()


SIX = (("ps", 2), ("worker", 2), ("chief", 1), ("evaluator", 1))


@pytest.mark.slow
def test_six_hosts_every_task_exits_0_by_itself_after_a_chief_restart(tmp_path, subprocess_env):
  needs.require_root()
  epochs, steps = 3, 40
  model_dir = tmp_path / "shared" / "model"
  cluster = host_cluster_lib.HostCluster(str(REPO / "scripts/train_keras.py"), [
      f"--model_dir={model_dir}", f"--epochs={epochs}", f"--steps_per_epoch={steps}", "--vocab_size=2000",
      "--batch_size=32", "--noexact_evaluation", "--connect_timeout_secs=120", "--lost_chief_timeout_secs=120"],
      str(tmp_path / "logs"), replicas=SIX, env=subprocess_env,
      role_args={"evaluator": ["--evaluate_every_checkpoint"]})
  netns = [host.netns for host in cluster.hosts.hosts.values()]
  try:
    cluster.start_all()
    servers = {task: cluster.processes[task] for task in cluster.tasks if task[0] in ("ps", "worker")}
    deadline = time.monotonic() + 300
    while not checkpoints_lib.is_registered(str(model_dir), 1):
      assert time.monotonic() < deadline, cluster.log(("chief", 0))[-3000:]
      time.sleep(0.2)
    cluster.stop(("chief", 0))  # SIGKILL mid-run: no FINAL; the ps and workers wait for a chief
    time.sleep(3)
    cluster.start(("chief", 0))
    started = time.monotonic()
    assert cluster.wait(("chief", 0), timeout_secs=300) == 0, cluster.log(("chief", 0))[-3000:]
    chief_done = time.monotonic()
    final = json.loads((model_dir / "checkpoints" / "FINAL").read_text())
    assert final["step"] == epochs * steps
    assert re.search(r"Resumed from \S+ at epoch", cluster.log(("chief", 0)))
    for task, process in servers.items():  # the same processes as before the chief's restart
      assert cluster.processes[task] is process
      assert cluster.wait(task, timeout_secs=60) == 0, f"{task}:\n{cluster.log(task)[-2000:]}"
      assert "training ended" in cluster.log(task)
    servers_done = time.monotonic()
    assert cluster.wait(("evaluator", 0), timeout_secs=180) == 0, cluster.log(("evaluator", 0))[-3000:]
    records = [json.loads(line) for line in (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["checkpoint"] == final["last_checkpoint"] and records[-1]["step"] == epochs * steps
    print(f"chief ran {chief_done - started:.0f}s after its restart; ps and workers all exited "
          f"{servers_done - chief_done:.1f}s after the chief")
  finally:
    processes = list(cluster.processes.values())
    cluster.close()
    assert not set(netns) & set(hosts_lib.leftovers()), "test hosts left behind"
    assert all(p.poll() is not None for p in processes), "processes left behind"
