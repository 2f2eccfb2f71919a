"""tfps-launch keeps its tasks' ports away from other hosts (a private network namespace with only loopback).

Two test hosts of the test's own (network namespaces on a private bridge, `tfps.testing.hosts`): `tfps-launch` trains
on one, and a probe on the other tries a TCP connection to every task port while training runs. Traffic goes only to
these namespaces' addresses and to loopback. Where namespaces cannot be made, these tests fail with that reason.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

import needs
from marked_processes import MARK, kill_marked, marked
from tfps.cluster import isolation
from tfps.cluster import tasks as tasks_lib
from tfps.testing import hosts as hosts_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "tfps.cluster.launch"]
FAKE_TASK = REPO / "tests" / "fixtures" / "fake_task.py"
EXPOSED = "accepts unauthenticated connections from any host that can reach it"
# Prints {port: "connected" or the error's name} for a TCP connection to ADDRESS:PORT, for each PORT.
PROBE = """
import json, socket, sys
result = {}
for port in sys.argv[2:]:
  try:
    socket.create_connection((sys.argv[1], int(port)), timeout=3).close()
    result[port] = "connected"
  except OSError as e:
    result[port] = type(e).__name__
print(json.dumps(result))
"""


def wait_for(predicate, what, process=None, timeout_secs=240):
  """`predicate()`'s first true value; fails after `timeout_secs`, or when `process` has ended first."""
  deadline = time.monotonic() + timeout_secs
  while time.monotonic() < deadline:
    value = predicate()
    if value:
      return value
    if process is not None and process.poll() is not None:
      raise AssertionError(f"the launcher ended (status {process.poll()}) before {what}")
    time.sleep(0.1)
  raise AssertionError(f"timed out after {timeout_secs}s waiting for {what}")


def read(path):
  try:
    return pathlib.Path(path).read_text(errors="replace")
  except FileNotFoundError:
    return ""


def task_ports(launcher_output):
  """{task: port} from the launcher's `Task ports: ps:0 127.0.0.1:PORT, ...` line (empty before it is written)."""
  lines = [line for line in launcher_output.splitlines() if "Task ports: " in line]
  if not lines:
    return {}
  entries = lines[0].split("Task ports: ", 1)[1].split(", ")
  return {entry.split()[0]: entry.split()[1].rsplit(":", 1)[1] for entry in entries}


def probe(command_prefix, address, ports):
  """{port: "connected" or the error's name} for a TCP connection from `command_prefix`'s host to each port."""
  result = subprocess.run([*command_prefix, sys.executable, "-c", PROBE, address, *ports], capture_output=True,
                          text=True, timeout=60, check=False)
  assert result.returncode == 0, result.stderr
  return json.loads(result.stdout)


def net_namespace(pid):
  return os.readlink(f"/proc/{pid}/ns/net")


def processes_in(namespace):
  """Pids of every process in the network namespace `namespace` (`net:[inode]`)."""
  pids = []
  for pid in psutil.pids():
    try:
      if net_namespace(pid) == namespace:
        pids.append(pid)
    except OSError:
      continue
  return pids


def task_process(log_dir, processes, task_type):
  return tasks_lib.find_task(log_dir, f"{task_type}:0", processes)


@pytest.fixture
def two_hosts():
  """A `trainer` and a `prober` host; asserts that closing them leaves no namespace or link behind."""
  try:
    hosts = hosts_lib.TestHosts(["trainer", "prober"])
  except hosts_lib.HostsUnavailableError as e:
    pytest.fail(f"this machine cannot make test hosts: {e}", pytrace=False)
  with hosts:
    yield hosts
  made = {host.netns for host in hosts.hosts.values()}
  assert not made & set(hosts_lib.leftovers()), "network namespaces left behind"
  listing = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
  links = {line.split(": ")[1].split("@")[0] for line in listing.splitlines()}
  assert not {hosts.bridge, *(host.interface for host in hosts.hosts.values())} & links, "links left behind"


@pytest.fixture
def marked_env(tmp_path, subprocess_env):
  env = dict(subprocess_env, **{MARK: str(tmp_path)})
  yield env
  kill_marked(tmp_path)  # leave nothing behind even when a test fails


@pytest.mark.slow
@pytest.mark.parametrize("expose", [False, True], ids=["isolated", "expose_ports"])
def test_other_hosts_reach_task_ports_only_with_expose_ports(tmp_path, marked_env, two_hosts, expose):
  model_dir, out_path = tmp_path / "run", tmp_path / "launch.out"
  args = [*LAUNCH, f"--log_dir={tmp_path / 'logs'}", "--num_workers=1", *(["--expose_ports"] if expose else []),
          "scripts/train_keras.py", "--", f"--model_dir={model_dir}", "--epochs=4", "--steps_per_epoch=40",
          "--vocab_size=2000", "--batch_size=32"]
  with open(out_path, "w") as out:
    launcher = two_hosts.popen("trainer", args, cwd=REPO, env=marked_env, stdout=out, stderr=subprocess.STDOUT)
  ports = wait_for(lambda: task_ports(read(out_path)), "the task ports", launcher)
  assert sorted(ports) == ["chief:0", "ps:0", "worker:0"]
  wait_for(lambda: "Training on " in read(tmp_path / "logs" / "chief-0.log"), "training to start", launcher)
  from_other_host = probe(two_hosts.command("prober", []), two_hosts.address("trainer"), ports.values())
  ps = task_process(tmp_path / "logs", marked(tmp_path), "ps")
  from_inside = probe(["nsenter", f"--net=/proc/{ps.pid}/ns/net"], "127.0.0.1", ports.values())
  assert launcher.poll() is None, "training ended before the probes ran"

  assert launcher.wait(timeout=300) == 0, read(out_path)[-3000:]
  assert json.loads((model_dir / "checkpoints" / "FINAL").read_text())["step"] == 4 * 40
  assert set(from_inside.values()) == {"connected"}, from_inside  # the servers were listening all along
  if expose:
    assert set(from_other_host.values()) == {"connected"}, from_other_host
  else:
    assert set(from_other_host.values()) == {"ConnectionRefusedError"}, from_other_host
  for task in ("ps-0", "worker-0", "chief-0"):  # each task says so once, only where other hosts can reach it
    assert read(tmp_path / "logs" / f"{task}.log").count(EXPOSED) == (1 if expose else 0), task
  assert marked(tmp_path) == []


@pytest.mark.parametrize("ending", ["exit", "SIGTERM", "SIGKILL"])
def test_nothing_outlives_the_launcher(tmp_path, marked_env, ending):
  chief = ["--chief_secs=4"] if ending == "exit" else ["--chief_hang"]
  launcher = subprocess.Popen([*LAUNCH, f"--log_dir={tmp_path / 'logs'}", str(FAKE_TASK), "--", "--spawn_child",
                               *chief], cwd=REPO, env=marked_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
  expected = 3 + 1 + 4 + 4  # launcher, unshare, launcher inside, its fork server; ps, 2 workers, chief; a grandchild
  # of each task
  wait_for(lambda: len(marked(tmp_path)) >= expected and len(tasks_lib.task_pids(tmp_path / "logs")) == 4,
           f"{expected} processes, 4 of them in tasks.json", launcher, timeout_secs=60)  # (it names each once started)
  tasks = [tasks_lib.find_task(tmp_path / "logs", label, marked(tmp_path))
           for label in tasks_lib.task_pids(tmp_path / "logs")]
  assert len(tasks) == 4 and all(tasks), tasks
  namespaces = {net_namespace(p.pid) for p in tasks}
  assert len(namespaces) == 1 and net_namespace(os.getpid()) not in namespaces
  namespace = namespaces.pop()
  assert processes_in(namespace)

  if ending != "exit":
    launcher.send_signal(getattr(signal, ending))
  _, err = launcher.communicate(timeout=60)
  assert launcher.returncode == {"exit": 0, "SIGTERM": 128 + signal.SIGTERM, "SIGKILL": -signal.SIGKILL}[ending], err
  wait_for(lambda: not marked(tmp_path), "every process to end", timeout_secs=15)
  wait_for(lambda: not processes_in(namespace), "the namespace to be gone", timeout_secs=15)


@pytest.mark.parametrize("delay_secs", [0.3, 0.8])
def test_sigterm_at_startup_leaves_nothing(tmp_path, marked_env, delay_secs):
  """A SIGTERM that may come before the launcher inside the namespace is ready for it (which would drop it): it is
  passed on once it can be handled, so the launcher ends soon (not only when it gives up waiting, 1 + 15 s later),
  and takes every task with it."""
  launcher = subprocess.Popen([*LAUNCH, f"--log_dir={tmp_path / 'logs'}", "--stop_grace_secs=1", str(FAKE_TASK), "--",
                               "--chief_hang"], cwd=REPO, env=marked_env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
  time.sleep(delay_secs)
  launcher.send_signal(signal.SIGTERM)
  signalled = time.monotonic()
  launcher.wait(timeout=1 + 15 + 10)
  assert time.monotonic() - signalled < 12
  wait_for(lambda: not marked(tmp_path), "every process to end", timeout_secs=15)


def test_refuses_in_one_line_where_no_namespace_can_be_made(tmp_path, subprocess_env):
  # A user namespace of the test's own that allows no further network namespace (the limit holds only inside it).
  restricted = ["unshare", "--user", "--map-root-user", "sh", "-c",
                'echo 0 > /proc/sys/user/max_net_namespaces && exec "$@"', "sh"]
  command = [*restricted, *LAUNCH, f"--log_dir={tmp_path / 'logs'}", str(FAKE_TASK)]
  result = subprocess.run(command, cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=60)
  assert result.returncode == 2, result.stderr
  assert result.stderr.startswith("tfps-launch: cannot run the tasks in a private network namespace (unshare: "
                                  "unshare failed: No space left on device); pass --expose_ports to run them in "
                                  "this one"), result.stderr
  assert len(result.stderr.strip().splitlines()) == 1
  assert not (tmp_path / "logs").exists()

  command.insert(len(restricted) + len(LAUNCH), "--expose_ports")
  result = subprocess.run(command, cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stderr
  assert "chief done" in result.stdout
  assert "--expose_ports: every task port accepts unauthenticated connections" in result.stderr


def test_a_non_loopback_host_is_refused_in_one_line(tmp_path):
  result = subprocess.run([*LAUNCH, "--host=10.1.2.3", f"--log_dir={tmp_path}", str(FAKE_TASK)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 2
  assert result.stderr.startswith("tfps-launch: --host=10.1.2.3 is not a loopback address, and the tasks run in a "
                                  "network namespace with only loopback; use 127.0.0.1 (the default), or "
                                  "--expose_ports"), result.stderr
  assert len(result.stderr.strip().splitlines()) == 1


def test_the_inside_marker_outside_a_namespace_is_refused(tmp_path, subprocess_env):
  env = dict(subprocess_env, **{isolation.INSIDE_ENV: "1"})  # as if tfps-launch had made the namespace: it did not
  result = subprocess.run([*LAUNCH, f"--log_dir={tmp_path}", str(FAKE_TASK)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
  assert result.returncode == 2
  assert result.stderr.startswith("tfps-launch: the launcher's network namespace has interfaces besides lo ("), \
      result.stderr
  assert len(result.stderr.strip().splitlines()) == 1
  assert not list(tmp_path.iterdir())  # no task started


def test_without_root_the_namespace_comes_with_a_user_namespace(monkeypatch):
  """The command a non-root launcher uses (`unshare --user --map-root-user ...`) gives a namespace with only `lo`,
  up (run here by root, as the machine allows unprivileged user namespaces or not)."""
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  assert "--map-root-user" in isolation.namespace_command(["true"])
  isolation.check_possible()
  inside = ("import os, sys; from tfps.cluster import isolation; isolation.enter_namespace(); "
            "sys.exit(0 if os.environ[isolation.INSIDE_ENV] == '1' and not isolation.non_loopback_interfaces() else 3)")
  assert isolation.run_isolated([sys.executable, "-c", inside], stop_grace_secs=1) == 0


def test_exposure_warning_only_with_other_interfaces(monkeypatch):
  monkeypatch.setattr(isolation.socket, "if_nameindex", lambda: [(1, "lo")])
  assert isolation.exposure_warning("ps:0", "127.0.0.1:2222") is None
  monkeypatch.setattr(isolation.socket, "if_nameindex", lambda: [(1, "lo"), (2, "eth0")])
  assert isolation.exposure_warning("ps:0", "127.0.0.1:2222") == (
      "ps:0 listens on port 2222 of every interface (eth0, lo) and accepts unauthenticated connections from any host "
      "that can reach it: they can run any op on this task, read and write its files and variables; "
      "docs/security.md says how to restrict it")


@pytest.mark.parametrize("job,note", [("worker", True), ("chief", True), ("evaluator", False)])
def test_tfps_config_says_that_a_server_listens_on_every_interface(job, note):
  result = subprocess.run([sys.executable, "-m", "tfps.cluster.config_cli", "--ps_hosts=h0:2222",
                           "--worker_hosts=h1:2222,h2:2223", "--chief_hosts=h3:2224", "--evaluator_hosts=h4:2225",
                           f"--job_name={job}", "--task_index=0"], cwd=REPO, capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stderr
  assert json.loads(result.stdout)["task"] == {"type": job, "index": 0}  # stdout is still the TF_CONFIG alone
  port, host = {"worker": ("2222", "h1"), "chief": ("2224", "h3"), "evaluator": (None, None)}[job]
  expected = (f"tfps-config: note: {job}:0 listens on port {port} of every interface of its host (not only the one "
              f"{host} names) and accepts unauthenticated connections from any host that can reach it: they can run "
              "any op on this task, read and write its files and variables; docs/security.md says how to restrict "
              "it\n") if note else ""  # the evaluator listens on no port
  assert result.stderr == expected


def test_the_documented_firewall_rules_admit_only_the_cluster_hosts():
  """docs/security.md's iptables recipe, run on a test host: a cluster host connects, another host is refused,
  loopback still works, and the documented removal leaves no rule."""
  needs.require_tools("iptables", "ip6tables", install="apt-get install -y iptables")
  doc = (REPO / "docs" / "security.md").read_text()
  recipe = re.search(r"```sh\n(.*?)```", doc, re.S).group(1)
  removal = re.search(r"To remove the rules:\s*`(.*?)`", doc, re.S).group(1).replace("\n", " ")
  try:
    hosts = hosts_lib.TestHosts(["trainer", "peer", "stranger"])
  except hosts_lib.HostsUnavailableError as e:
    pytest.fail(f"this machine cannot make test hosts: {e}", pytrace=False)
  with hosts:
    hosts.popen("trainer", [sys.executable, "-c", "import socket, time; server = socket.create_server(('::', 2222), "
                            "family=socket.AF_INET6, dualstack_ipv6=True); time.sleep(120)"])
    trainer = hosts.address("trainer")
    wait_for(lambda: probe(hosts.command("trainer", []), "127.0.0.1", ["2222"])["2222"] == "connected", "the server",
             timeout_secs=30)
    cluster = f'CLUSTER="{trainer} {hosts.address("peer")}"'
    script = re.sub(r'^\s*CLUSTER=".*"$', cluster, recipe, flags=re.M)
    assert cluster in script and "PORTS=2222" in script
    applied = hosts.run("trainer", ["sh", "-ec", script])
    assert applied.returncode == 0, applied.stderr
    assert probe(hosts.command("peer", []), trainer, ["2222"]) == {"2222": "connected"}
    assert probe(hosts.command("stranger", []), trainer, ["2222"]) == {"2222": "ConnectionRefusedError"}
    for address in ("127.0.0.1", "::1"):
      assert probe(hosts.command("trainer", []), address, ["2222"]) == {"2222": "connected"}
    removed = hosts.run("trainer", ["sh", "-ec", f"PORTS=2222; {removal}; {removal.replace('iptables', 'ip6tables')}"])
    assert removed.returncode == 0, removed.stderr
    for tool in ("iptables", "ip6tables"):
      assert "TFPS" not in hosts.run("trainer", [tool, "-S"]).stdout
    assert probe(hosts.command("stranger", []), trainer, ["2222"]) == {"2222": "connected"}
