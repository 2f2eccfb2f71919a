"""Network delay on test hosts without netem (`TestHosts.delay`: NFQUEUE + `tfps.testing.netdelay`).

A TCP round trip between two delayed hosts grows by 2 x the delay and is back when the delay is removed; nothing is
left behind. Training (Keras path, 2 ps + 2 workers + a chief on 5 hosts) with 2 ms and with 10 ms of delay and 1%
packet loss on every link ends at the exact step count, each ps having applied every step once (a counter per ps,
`tfps.testing.applied_steps`), with every host's packets delayed and some dropped (both runs at once, on two sets of
test hosts).
"""

import contextlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

import needs
from tfps.testing import applied_steps
from tfps.testing import host_cluster as host_cluster_lib
from tfps.testing import hosts as hosts_lib
from tfps.testing import netdelay
from tfps.testing import netprobe

REPO = pathlib.Path(__file__).resolve().parents[1]
CHIEF = ("chief", 0)
DELAYS_MS = (2, 10)



@pytest.fixture(autouse=True)
def root():
  needs.require_root()


def test_round_trip_grows_by_twice_the_delay_and_comes_back():
  with hosts_lib.TestHosts(["a", "b"]) as hosts:
    netprobe.start_server(hosts, "b")
    before = netprobe.round_trip_ms(hosts, "a", "b")
    hosts.delay("a", 10)
    hosts.delay("b", 10)
    delayed = netprobe.round_trip_ms(hosts, "a", "b")
    hosts.delay("b", 5)  # replaced, not added
    replaced = netprobe.round_trip_ms(hosts, "a", "b")
    pids = list(hosts.delayer_pids().values())
    hosts.delay("a", 0)
    hosts.delay("b", 0)
    after = netprobe.round_trip_ms(hosts, "a", "b")
    netns = [host.netns for host in hosts.hosts.values()]
    rules = hosts.run("a", ["iptables", "-t", "mangle", "-S", "PREROUTING"]).stdout
  print(f"round trip: {before:.2f} ms, delayed 10+10 ms: {delayed:.2f}, 10+5 ms: {replaced:.2f}, removed: {after:.2f}")
  assert before < 1, before
  assert 20 <= delayed < 20 + 3, delayed  # measured: +0.2-0.5 ms over the delays (the delayer's own time)
  assert 15 <= replaced < 15 + 3, replaced
  assert after < 1, after
  assert "NFQUEUE" not in rules, rules
  assert not any(os.path.exists(f"/proc/{pid}") for pid in pids), "a delayer outlived its removal"
  assert not set(netns) & set(hosts_lib.leftovers()), "test hosts left behind"


def test_bad_delay_is_one_line(capsys):
  with hosts_lib.TestHosts(["a"]) as hosts:
    with pytest.raises(ValueError, match=r"^`ms` \(-1\) must be in \[0, 10000\]$"):
      hosts.delay("a", -1)
    squatter = hosts.popen("a", [sys.executable, "-m", "tfps.testing.netdelay", "--ms=1"], stdout=subprocess.PIPE,
                           text=True)
    assert squatter.stdout.readline().strip() == "ready"
    with pytest.raises(hosts_lib.HostsUnavailableError) as error:
      hosts.delay("a", 3)  # another program holds the host's queue
    rules = hosts.run("a", ["iptables", "-t", "mangle", "-S", "PREROUTING"]).stdout
  assert str(error.value) == ("the packet delayer on a did not start: netdelay: binding NFQUEUE 0 failed: EPERM "
                              "(another program holds this queue, or this process lacks CAP_NET_ADMIN)")
  assert "NFQUEUE" not in rules, rules
  with pytest.raises(SystemExit):
    netdelay.main(["--ms=20000"])
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      "python -m tfps.testing.netdelay: error: --ms (20000.0) must be in [0, 10000]")


@pytest.mark.slow
def test_training_with_delay_and_loss_on_every_link_ends_exact(tmp_path, subprocess_env):
  """The 2 ms and the 10 ms run at the same time, each on test hosts of its own (a bridge and a subnet each)."""
  epochs, steps = 2, 10
  runs = {}
  with contextlib.ExitStack() as stack:
    for ms in DELAYS_MS:
      model_dir = tmp_path / f"delay{ms}" / "shared" / "model"
      cluster = stack.enter_context(host_cluster_lib.HostCluster(
          str(REPO / "bench" / "worker_kills_train.py"),
          [f"--model_dir={model_dir}", f"--epochs={epochs}", f"--steps_per_epoch={steps}", "--connect_timeout_secs=120",
           "--lost_task_timeout_secs=60"],
          str(tmp_path / f"delay{ms}" / "logs"), replicas=(("ps", 2), ("worker", 2), ("chief", 1)),
          env=subprocess_env))
      cluster.delay(ms)
      cluster.drop(0.01)
      cluster.start_all()
      runs[ms] = cluster, model_dir
    codes = {ms: cluster.wait(CHIEF, timeout_secs=240) for ms, (cluster, _) in runs.items()}
    # The rules were made just before the tasks started: what they took, they took while the job ran.
    faults = {ms: cluster.fault_counts() for ms, (cluster, _) in runs.items()}
    delaying = {ms: all(os.path.exists(f"/proc/{pid}") for pid in cluster.hosts.delayer_pids().values())
                for ms, (cluster, _) in runs.items()}
    logs = {ms: cluster.log(CHIEF) for ms, (cluster, _) in runs.items()}
    netns = [host.netns for cluster, _ in runs.values() for host in cluster.hosts.hosts.values()]
    processes = [p for cluster, _ in runs.values() for p in cluster.processes.values()]
  for ms, (_, model_dir) in runs.items():
    assert codes[ms] == 0, (ms, logs[ms][-3000:])
    final = json.loads((model_dir / "checkpoints" / "FINAL").read_text())
    assert final["step"] == epochs * steps, ms
    assert applied_steps.applied_per_ps(final["last_checkpoint"], logs[ms]) == {
        "ps:0": epochs * steps, "ps:1": epochs * steps}, ms
    # Every host's packets went through its delayer, still running at the end; 1% of them were dropped.
    assert delaying[ms] and all(count["delayed"] > 0 for count in faults[ms].values()), (ms, faults[ms])
    assert sum(count["dropped"] for count in faults[ms].values()) > 0, (ms, faults[ms])
  assert not set(netns) & set(hosts_lib.leftovers()), "test hosts left behind"
  assert all(p.poll() is not None for p in processes), "processes left behind"
