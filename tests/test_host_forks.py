"""Python tasks on test hosts forked from one fork server per group (`tfps.testing.host_forks`): a forked task is on
its host as `ip netns exec` puts a fresh one (its network namespace, the hosts' names, its `/sys`), reaches another
host's forked task by name, has its own argv, environment and exit status, dies by a signal to its group, and the
hosts' `close()` leaves no task, server, namespace or log behind. Anything else, and `fork_tasks=False` or
`TFPS_TEST_FRESH_TASKS=1`, starts a fresh process. Scripts here import no TensorFlow: cheap."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import needs
from tfps.cluster import forkserver
from tfps.testing import host_forks
from tfps.testing import hosts as hosts_lib

PROBE = """import json, os, socket, sys
import numpy
print(json.dumps({"net": os.readlink("/proc/self/ns/net"), "b": socket.gethostbyname("b-alias"),
                  "links": sorted(os.listdir("/sys/class/net")), "argv": sys.argv[1:], "mark": os.environ.get("MARK"),
                  "server_env": [k for k in os.environ if k.startswith("TFPS_FORK")]}), flush=True)
sys.exit(5)
"""
ECHO_SERVER = """import socket, sys
server = socket.create_server(("", 2222))
print("listening", flush=True)
conn, _ = server.accept()
conn.sendall(conn.recv(100).upper())
"""
CLIENT = """import socket, sys, time
for _ in range(600):
  try:
    conn = socket.create_connection(("b", 2222), timeout=5)
    break
  except OSError:
    time.sleep(0.05)
conn.sendall(b"hello")
print(conn.recv(100).decode(), flush=True)
"""


@pytest.fixture
def hosts(tmp_path):
  needs.require_root()
  made = hosts_lib.TestHosts(["a", "b"], aliases={"b": ["b-alias"]})
  yield made
  netns = [host.netns for host in made.hosts.values()]
  made.close()
  assert not set(netns) & set(hosts_lib.leftovers()), "test hosts left behind"


def script(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def start(hosts, host, argv, log_path, **kwargs):
  with open(log_path, "ab") as log:
    return hosts.popen(host, argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kwargs)


def netns_pids(hosts, host):
  out = subprocess.run(["ip", "netns", "pids", hosts.hosts[host].netns], capture_output=True, text=True, check=True)
  return {int(pid) for pid in out.stdout.split()}


def test_a_forked_task_is_on_its_host(tmp_path, hosts):
  probe = script(tmp_path, "probe.py", PROBE)
  task = start(hosts, "a", [sys.executable, probe, "--x=1"], tmp_path / "a.log", env=dict(os.environ, MARK="m"))
  assert isinstance(task, forkserver.ForkedProcess)
  assert task.wait(timeout=120) == 5
  seen = json.loads((tmp_path / "a.log").read_text().splitlines()[-1])
  assert seen["net"] == hosts.run("a", ["readlink", "/proc/self/ns/net"]).stdout.strip()
  assert seen["net"] != os.readlink("/proc/self/ns/net")
  assert seen["b"] == hosts.address("b")
  assert seen["links"] == sorted(["lo", hosts.hosts["a"].interface])
  assert (seen["argv"], seen["mark"], seen["server_env"]) == (["--x=1"], "m", [])


def test_forked_tasks_talk_by_name_and_die_by_signal(tmp_path, hosts):
  server = start(hosts, "b", [sys.executable, script(tmp_path, "server.py", ECHO_SERVER)], tmp_path / "b.log")
  client = start(hosts, "a", [sys.executable, script(tmp_path, "client.py", CLIENT)], tmp_path / "a.log")
  assert client.wait(timeout=120) == 0 and server.wait(timeout=30) == 0
  assert (tmp_path / "a.log").read_text().split() == ["HELLO"]
  sleeper = start(hosts, "b", [sys.executable, script(tmp_path, "sleep.py", "import time\ntime.sleep(600)\n")],
                  tmp_path / "sleep.log")
  assert isinstance(sleeper, forkserver.ForkedProcess)
  deadline = time.monotonic() + 30  # the task enters the host's namespace just after its fork, before its script
  while sleeper.pid not in netns_pids(hosts, "b"):
    assert time.monotonic() < deadline and sleeper.poll() is None, f"{sleeper.pid} never in b's namespace"
    time.sleep(0.02)
  os.killpg(sleeper.pid, signal.SIGKILL)
  assert sleeper.wait(timeout=30) == -signal.SIGKILL
  left = start(hosts, "a", [sys.executable, str(tmp_path / "sleep.py")], tmp_path / "left.log")
  server_pid = hosts._forks._server.process.pid  # pylint: disable=protected-access
  log = hosts._forks._log  # pylint: disable=protected-access
  hosts.close()
  assert left.poll() == -signal.SIGKILL
  assert not os.path.exists(f"/proc/{left.pid}") and not os.path.exists(f"/proc/{server_pid}")
  assert not log.exists()


@pytest.mark.parametrize("how", ["argument", "environment", "not_a_script"])
def test_the_fresh_path(tmp_path, monkeypatch, how):
  needs.require_root()
  if how == "environment":
    monkeypatch.setenv(host_forks.FRESH_ENV, "1")
  probe = script(tmp_path, "probe.py", PROBE)
  argv = [sys.executable, probe] if how != "not_a_script" else [sys.executable, "-c", f"exec(open({probe!r}).read())"]
  with hosts_lib.TestHosts(["a", "b"], aliases={"b": ["b-alias"]}, fork_tasks=how != "argument") as hosts:
    task = start(hosts, "a", argv, tmp_path / "a.log")
    assert isinstance(task, subprocess.Popen)
    assert task.wait(timeout=120) == 5
    seen = json.loads((tmp_path / "a.log").read_text().splitlines()[-1])
    assert seen["b"] == hosts.address("b")
    assert hosts._forks._server is None  # pylint: disable=protected-access
