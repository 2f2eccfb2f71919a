"""The fork server of tfps-launch: forked tasks get their own environment, output, exit status and parent; the
launcher names them in tasks.json, restarts a killed one, and falls back to a fresh Python per task."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from marked_processes import MARK, kill_marked, marked
from tfps.cli import launch as launch_lib
from tfps.cluster import forkserver
from tfps.cluster import tasks as tasks_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
FAKE_TASK = REPO / "tests" / "fixtures" / "fake_task.py"
TASK = """import os, sys, time
print("argv", sys.argv[1:], "path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)), flush=True)
print("TF_CONFIG", os.environ.get("TF_CONFIG"), "ppid", os.getppid(), "sid", os.getsid(0) == os.getpid(), flush=True)
print("stdin", sys.stdin.read() == "", "main", __name__, flush=True)
what = sys.argv[1]
if what == "sleep":
  time.sleep(60)
elif what == "raise":
  raise RuntimeError("on purpose")
elif what == "message":
  sys.exit("a message")
sys.exit(int(what))
"""


@pytest.fixture
def server(tmp_path):
  """A fork server that imports no TensorFlow (json); this process stops being a subreaper afterwards."""
  server = forkserver.ForkServer.start(dict(os.environ), ["json"], tmp_path / "forkserver.log", timeout_secs=60)
  yield server
  server.close()
  forkserver.become_subreaper(False)


def spawn(server, tmp_path, what, **env):
  script = tmp_path / "task.py"
  script.write_text(TASK)
  log = tmp_path / f"{what}.log"
  with open(log, "wb") as out:
    process = server.spawn([sys.executable, str(script), what], dict(os.environ, **env), out.fileno(), out.fileno())
  return process, log


def test_the_tasks_environment_drops_the_cluster_of_the_users_shell():
  env = tasks_lib.shared_environ({"TF_CONFIG": "{}", "TFPS_TASK_TYPE": "worker", "HOME": "/root"})
  assert "TF_CONFIG" not in env and "TFPS_TASK_TYPE" not in env and env["HOME"] == "/root"


def test_a_forked_task_gets_its_environment_output_and_status_and_is_our_child(server, tmp_path):
  process, log = spawn(server, tmp_path, "7", TF_CONFIG='{"task": 1}')
  assert process.pid in [child.pid for child in psutil.Process().children()]  # re-parented to us
  assert process.wait(timeout=60) == 7
  lines = log.read_text().splitlines()
  assert lines == ["argv ['7'] path0 True", f"TF_CONFIG {{\"task\": 1}} ppid {os.getpid()} sid True",
                   "stdin True main __main__"]
  assert process.poll() == 7 and process.returncode == 7


@pytest.mark.parametrize("what,status,text", [("0", 0, None), ("raise", 1, "RuntimeError: on purpose"),
                                              ("message", 1, "a message")])
def test_a_forked_task_exits_as_python_would(server, tmp_path, what, status, text):
  process, log = spawn(server, tmp_path, what)
  assert process.wait(timeout=60) == status
  if text:
    assert log.read_text().rstrip().endswith(text)


def test_a_killed_forked_task_is_seen_killed_by_its_signal(server, tmp_path):
  process, _ = spawn(server, tmp_path, "sleep")
  assert process.poll() is None
  with pytest.raises(subprocess.TimeoutExpired):
    process.wait(timeout=0.2)
  os.kill(process.pid, signal.SIGKILL)
  assert process.wait(timeout=30) == -signal.SIGKILL
  assert tasks_lib.describe_returncode(process.returncode) == "was killed by SIGKILL"


def test_a_server_that_cannot_import_its_modules_is_refused(tmp_path):
  with pytest.raises(forkserver.ForkServerError, match="importing no_such_module: ModuleNotFoundError"):
    forkserver.ForkServer.start(dict(os.environ), ["no_such_module"], tmp_path / "forkserver.log", timeout_secs=60)
  forkserver.become_subreaper(False)


def test_the_server_imports_tensorflow_without_starting_its_runtime(tmp_path):
  """Forking copies one thread: TensorFlow's thread pools, made at import, would be lost in every task. What a module
  draws for its process at import is drawn again in each task: two chiefs forked one after the other that named their
  geo rounds' worker-local variables alike took over each other's on a worker they shared."""
  server = forkserver.ForkServer.start(tasks_lib.shared_environ(), forkserver.TRAINING_PRELOAD,
                                       tmp_path / "forkserver.log")
  try:
    assert server.threads <= 2  # the main thread and OpenBLAS's (which re-creates its threads after a fork)
    script = tmp_path / "names.py"
    script.write_text("from tfps.training import geo_copies\nprint(geo_copies.LocalNames()._prefix)\n")
    prefixes = []
    for run in range(2):
      with open(tmp_path / f"names{run}.log", "wb") as out:
        assert server.spawn([sys.executable, str(script)], dict(os.environ), out.fileno(), out.fileno()).wait(60) == 0
      prefixes.append((tmp_path / f"names{run}.log").read_text().split()[-1])
    assert prefixes[0].startswith("tfps_geo_") and prefixes[0] != prefixes[1], prefixes
  finally:
    server.close()
    forkserver.become_subreaper(False)


def test_what_the_server_imports_for_a_script(tmp_path):
  light = tmp_path / "light.py"
  light.write_text("import os\nfrom absl import app\nfrom tfps import run_records\n")
  assert forkserver.preload_for(str(light)) == ["absl.app", "tfps.run_records"]
  trains = tmp_path / "trains.py"
  trains.write_text("import os\nimport tfps\n")
  assert forkserver.preload_for(str(trains)) == [*forkserver.TRAINING_PRELOAD, "tfps"]


@pytest.fixture
def marked_env(tmp_path):
  env = dict(os.environ, **{MARK: str(tmp_path)})
  yield env
  kill_marked(tmp_path)


def launch(tmp_path, env, *args, script_args=()):
  command = [sys.executable, "-m", "tfps.cluster.launch", f"--log_dir={tmp_path / 'logs'}", *args, str(FAKE_TASK),
             "--", *script_args]
  return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True)


def wait_for(condition, what, timeout_secs=60):
  deadline = time.monotonic() + timeout_secs
  while not (result := condition()):
    assert time.monotonic() < deadline, f"no {what} after {timeout_secs}s"
    time.sleep(0.1)
  return result


def test_tasks_json_names_each_task_and_a_killed_one_is_restarted_under_a_new_pid(tmp_path, marked_env):
  proc = launch(tmp_path, marked_env, "--max_restarts=1", script_args=["--chief_secs=8", "--spawn_child"])
  log_dir = tmp_path / "logs"
  wait_for(lambda: tasks_lib.find_task(log_dir, "chief:0", marked(tmp_path)), "chief:0")
  worker = tasks_lib.find_task(log_dir, "worker:1", marked(tmp_path))
  assert sorted(tasks_lib.task_pids(log_dir)) == ["chief:0", "ps:0", "worker:0", "worker:1"]
  assert "TF_CONFIG" not in worker.environ()  # forked: /proc shows the server's environment
  first_pid = tasks_lib.task_pids(log_dir)["worker:1"]
  worker.kill()
  wait_for(lambda: tasks_lib.task_pids(log_dir).get("worker:1") not in (None, first_pid), "worker:1 restarted")
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  assert "task worker:1 was killed by SIGKILL" in err and "restarting worker:1 alone" in err
  assert (log_dir / "worker-1.log").read_text().count("started worker:1") == 2
  assert "started chief:0" in out  # the chief's output, through a pipe, on the console
  assert marked(tmp_path) == []


def test_nofork_tasks_starts_each_task_as_its_own_python(tmp_path, marked_env):
  proc = launch(tmp_path, marked_env, "--nofork_tasks", script_args=["--chief_secs=3"])
  log_dir = tmp_path / "logs"
  chief = wait_for(lambda: tasks_lib.find_task(log_dir, "chief:0", marked(tmp_path)), "chief:0")
  assert json.loads(chief.environ()["TF_CONFIG"])["task"] == {"type": "chief", "index": 0}
  assert not [p for p in marked(tmp_path) if "forkserver" in " ".join(p.cmdline())]
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err


def test_a_fork_server_that_cannot_start_leaves_one_warning_and_fresh_pythons(tmp_path, capsys):
  group = tasks_lib.TaskGroup(tmp_path / "logs", stop_grace_secs=1)
  try:
    assert not group.start_fork_server(["no_such_module"])
    warning = capsys.readouterr().err
    assert warning.startswith("tfps-launch: warning: the fork server could not start: importing no_such_module: ")
    assert warning.endswith("; starting each task as its own Python\n") and warning.count("\n") == 1
    assert group.fork_server is None
    config = launch_lib.build_cluster(launch_lib.LaunchConfig(script=str(FAKE_TASK), expose_ports=True))
    task = group.start(config.for_task("ps", 0), [sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"])
    assert isinstance(task.process, subprocess.Popen)
    assert task.wait(timeout_secs=60) == 0
    assert '"type": "ps"' in task.log_path.read_text()
  finally:
    group.stop_all()
    forkserver.become_subreaper(False)


def test_a_forked_task_keeps_what_the_imports_set_in_the_environment(tmp_path):
  """`import tfps` sets gRPC's keepalive options (read by TensorFlow at its first channel, in the task)."""
  environ = {key: value for key, value in os.environ.items() if key != "TF_GRPC_DEFAULT_OPTIONS"}
  server = forkserver.ForkServer.start(environ, ["tfps"], tmp_path / "forkserver.log", timeout_secs=60)
  try:
    script = tmp_path / "grpc.py"
    script.write_text("import os\nprint(os.environ.get('TF_GRPC_DEFAULT_OPTIONS'), os.environ['TF_CONFIG'])\n")
    with open(tmp_path / "out.log", "wb") as out:
      task = server.spawn([sys.executable, str(script)], dict(environ, TF_CONFIG="{}"), out.fileno(), out.fileno())
    assert task.wait(timeout=60) == 0
    assert (tmp_path / "out.log").read_text() == "grpc.keepalive_time_ms=5000,grpc.keepalive_timeout_ms=5000," \
        "grpc.min_reconnect_backoff_ms=2000,grpc.max_reconnect_backoff_ms=5000 {}\n"
  finally:
    server.close()
    forkserver.become_subreaper(False)
