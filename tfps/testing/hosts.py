"""Test hosts on one machine: Linux network namespaces on a private bridge, each with its own address and a name the
other hosts resolve.

Used by tests and benchmarks of what crosses a network (isolation, many-host clusters, network faults). Needs root
(or CAP_NET_ADMIN) and iproute2. Nothing is reachable from these hosts but each other: the bridge has no address in
the machine's own namespace and no route leads out. Every namespace, link, `/etc/netns` folder and process made is
removed by `close()` (the context manager calls it, also when the body raises).

    with TestHosts(["ps0", "worker0"]) as hosts:
      proc = hosts.popen("ps0", ["python", "server.py"])
      hosts.run("worker0", ["ping", "-c1", "ps0"])
      hosts.delay("ps0", ms=10)    # every packet ps0 receives, 10 ms later
      hosts.drop("ps0", 0.01)      # 1% of them lost
      hosts.cut("worker0"); hosts.restore("worker0")
"""

import dataclasses
import itertools
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from tfps.testing import host_forks

NETNS_ETC = "/etc/netns"
_COUNTER = itertools.count()
MAX_DELAY_MS = 10_000
DELAYER_START_SECS = 30


class HostsUnavailableError(RuntimeError):
  """This machine cannot make test hosts (no iproute2, or not allowed to create network namespaces)."""


@dataclasses.dataclass(frozen=True)
class Host:
  """One test host: its name, network namespace, address and the interface that links it to the bridge."""
  name: str
  netns: str
  address: str
  interface: str


def _ip(*args: str, netns: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
  command = ["ip", *args] if netns is None else ["ip", "netns", "exec", netns, "ip", *args]
  result = subprocess.run(command, capture_output=True, text=True, check=False)
  if check and result.returncode != 0:
    raise HostsUnavailableError(f"`{' '.join(command)}` failed: {result.stderr.strip() or result.returncode}")
  return result


class TestHosts:
  """`names` become hosts on one bridge, with addresses `10.250.<subnet>.<i + 1>` (i: position in `names`).

  Args:
    names: host names (letters, digits, '-' and '.'); each resolves on every host to its address.
    aliases: more names for a host (`{"ps0": ["tfjob-ps-0.default.svc"]}`), e.g. as an orchestrator would name it.
    subnet: the third octet of the hosts' /24 (default: chosen from this process's id, so parallel runs differ).
    fork_tasks: `popen` forks Python scripts from one fork server of these hosts (`tfps.testing.host_forks`);
      False: every task is a fresh `ip netns exec ... python`.
  """

  def __init__(self, names: Sequence[str], aliases: Optional[Mapping[str, Sequence[str]]] = None,
               subnet: Optional[int] = None, fork_tasks: bool = True):
    if not names or len(set(names)) != len(names):
      raise ValueError(f"`names` must be distinct and not empty, got {list(names)}")
    if len(names) > 250:
      raise ValueError(f"at most 250 hosts, got {len(names)}")
    if shutil.which("ip") is None:
      raise HostsUnavailableError("test hosts need iproute2's `ip` (apt-get install iproute2)")
    unknown = set(aliases or {}) - set(names)
    if unknown:
      raise ValueError(f"`aliases` names hosts that are not in `names`: {sorted(unknown)}")
    tag = f"{os.getpid() % 100000}{next(_COUNTER)}"
    self._tag = tag
    self._subnet = subnet if subnet is not None else (os.getpid() + int(tag[-1])) % 200 + 20
    self.bridge = f"tpb{tag}"[:15]
    self.hosts: Dict[str, Host] = {
        name: Host(name, f"tfps-{tag}-{i}", f"10.250.{self._subnet}.{i + 1}", f"tpv{tag}h{i}"[:15])
        for i, name in enumerate(names)}
    self._aliases = {name: list(aliases.get(name, ())) for name in names} if aliases else {n: [] for n in names}
    self._procs: List[subprocess.Popen] = []
    self._delayers: Dict[str, subprocess.Popen] = {}  # host name: its packet delayer (`delay`)
    self._made: List[str] = []  # namespaces made so far, for close()
    self._forks = host_forks.HostForks(fork_tasks)
    try:
      self._build()
    except BaseException:
      self.close()
      raise

  def _build(self) -> None:
    _ip("link", "add", self.bridge, "type", "bridge")
    _ip("link", "set", self.bridge, "up")
    hosts_file = "127.0.0.1 localhost\n::1 localhost\n" + "".join(
        f"{h.address} {h.name} {' '.join(self._aliases[h.name])}\n" for h in self.hosts.values())
    for i, host in enumerate(self.hosts.values()):
      _ip("netns", "add", host.netns)
      self._made.append(host.netns)
      peer = f"tpv{self._tag}b{i}"[:15]
      _ip("link", "add", host.interface, "type", "veth", "peer", "name", peer)
      _ip("link", "set", peer, "master", self.bridge, "up")
      _ip("link", "set", host.interface, "netns", host.netns)
      _ip("addr", "add", f"{host.address}/24", "dev", host.interface, netns=host.netns)
      _ip("link", "set", host.interface, "up", netns=host.netns)
      _ip("link", "set", "lo", "up", netns=host.netns)
      os.makedirs(os.path.join(NETNS_ETC, host.netns), exist_ok=True)
      with open(os.path.join(NETNS_ETC, host.netns, "hosts"), "w", encoding="utf-8") as f:
        f.write(hosts_file)

  def __enter__(self) -> "TestHosts":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def address(self, name: str) -> str:
    return self.hosts[name].address

  def command(self, name: str, argv: Sequence[str]) -> List[str]:
    """`argv` as run on host `name` (its network namespace and its `/etc/hosts`)."""
    return ["ip", "netns", "exec", self.hosts[name].netns, *argv]

  def popen(self, name: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
    """Starts `argv` on host `name` in a session of its own (a Python script: forked, see `fork_tasks`); `close()`
    kills it (and its children) if still running."""
    proc = self._forks.spawn(self.hosts[name].netns, argv, kwargs)
    if proc is None:
      proc = subprocess.Popen(self.command(name, argv), start_new_session=True, **kwargs)
    self._procs.append(proc)
    return proc

  def run(self, name: str, argv: Sequence[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Runs `argv` on host `name` to its end; its output is captured as text."""
    return subprocess.run(self.command(name, argv), capture_output=True, text=True, timeout=timeout, check=False,
                          **kwargs)

  def delay(self, name: str, ms: float) -> None:
    """Holds every packet host `name` receives for `ms` milliseconds (a round trip between two delayed hosts grows by
    2 x ms); `ms=0` removes the delay. Without netem: an iptables NFQUEUE rule on the host's link hands the packets
    to `tfps.testing.netdelay`, run on the host. Needs iptables (apt-get install -y iptables)."""
    if not 0 <= ms <= MAX_DELAY_MS:
      raise ValueError(f"`ms` ({ms}) must be in [0, {MAX_DELAY_MS}]")
    if shutil.which("iptables") is None:
      raise HostsUnavailableError("delaying packets needs iptables (apt-get install -y iptables)")
    self._iptables(name, ["iptables", "-t", "mangle", "-F", "PREROUTING"])  # the host's own namespace: ours only
    previous = self._delayers.pop(name, None)
    if previous is not None:
      _kill(previous)
    if not ms:
      return
    delayer = self.popen(name, [sys.executable, "-m", "tfps.testing.netdelay", f"--ms={ms:g}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    self._delayers[name] = delayer
    ready, _, _ = select.select([delayer.stdout], [], [], DELAYER_START_SECS)
    if not ready or delayer.stdout.readline().strip() != "ready":
      _, error = _kill(delayer)
      reason = error.strip() or f"no answer within {DELAYER_START_SECS}s"
      raise HostsUnavailableError(f"the packet delayer on {name} did not start: {reason}")
    self._iptables(name, ["iptables", "-t", "mangle", "-A", "PREROUTING", "-i", self.hosts[name].interface,
                          "-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass"])

  def delayer_pids(self) -> Dict[str, int]:
    """The process id of each host's packet delayer (`delay`), by host name."""
    return {name: proc.pid for name, proc in self._delayers.items()}

  def _iptables(self, name: str, argv: Sequence[str]) -> None:
    result = subprocess.run(self.command(name, argv), capture_output=True, text=True, check=False)
    if result.returncode != 0:
      raise HostsUnavailableError(f"`{' '.join(argv)}` on {name} failed: {result.stderr.strip()}")

  def drop(self, name: str, probability: float) -> None:
    """Drops a random `probability` of the packets host `name` receives (iptables' statistic match; the kernels
    without netem still have it); `probability=0` removes the rule. Needs iptables (apt-get install iptables)."""
    if not 0 <= probability < 1:
      raise ValueError(f"`probability` ({probability}) must be in [0, 1)")
    if shutil.which("iptables") is None:
      raise HostsUnavailableError("dropping packets needs iptables (apt-get install -y iptables)")
    commands = [["iptables", "-F", "INPUT"]]  # the host's own namespace: only rules made here
    if probability:
      commands.append(["iptables", "-A", "INPUT", "-m", "statistic", "--mode", "random", "--probability",
                       f"{probability:g}", "-j", "DROP"])
    for argv in commands:
      result = subprocess.run(self.command(name, argv), capture_output=True, text=True, check=False)
      if result.returncode != 0:
        raise HostsUnavailableError(f"`{' '.join(argv)}` on {name} failed: {result.stderr.strip()}")

  def fault_counts(self, name: str) -> Dict[str, int]:
    """Packets the fault rules of host `name` have taken so far (iptables' own counters): `dropped` by `drop`'s rule,
    `delayed` handed by `delay`'s rule to the delayer (each held there while the delayer runs: `delayer_pids`)."""
    counts = {}
    for kind, table, chain, target in (("dropped", "filter", "INPUT", "DROP"),
                                       ("delayed", "mangle", "PREROUTING", "NFQUEUE")):
      result = self.run(name, ["iptables", "-t", table, "-L", chain, "-v", "-x", "-n"])
      if result.returncode != 0:
        raise HostsUnavailableError(f"`iptables -t {table} -L {chain}` on {name} failed: {result.stderr.strip()}")
      rows = [line.split() for line in result.stdout.splitlines()[2:]]  # after the chain's line and the header
      counts[kind] = sum(int(row[0]) for row in rows if len(row) > 2 and row[2] == target)
    return counts

  def cut(self, name: str) -> None:
    """Takes host `name`'s link down: nothing reaches it or leaves it until `restore`."""
    _ip("link", "set", self.hosts[name].interface, "down", netns=self.hosts[name].netns)

  def restore(self, name: str) -> None:
    """Brings host `name`'s link back up after `cut`."""
    _ip("link", "set", self.hosts[name].interface, "up", netns=self.hosts[name].netns)

  def limit_rate(self, name: str, kbit: int) -> None:
    """Caps what host `name` sends at `kbit` kbit/s (tc's token bucket filter: packets wait up to 500 ms, then are
    dropped); `kbit=0` removes the cap. Paces a run by the network rather than by how busy this machine's CPUs are.
    The bucket holds 16 KB, or 4 ms of the rate where that is more (a smaller bucket than a timer tick's worth of
    bytes would cap a fast link below its rate)."""
    if kbit < 0:
      raise ValueError(f"`kbit` ({kbit}) must be >= 0")
    interface = self.hosts[name].interface
    burst_bytes = max(16 * 1024, kbit * 1000 // 8 * 4 // 1000)
    argv = (["tc", "qdisc", "del", "dev", interface, "root"] if kbit == 0 else
            ["tc", "qdisc", "replace", "dev", interface, "root", "tbf", "rate", f"{kbit}kbit", "burst",
             f"{burst_bytes}b", "latency", "500ms"])
    result = subprocess.run(self.command(name, argv), capture_output=True, text=True, check=False)
    if result.returncode != 0 and kbit:
      raise HostsUnavailableError(f"tc tbf on {name} failed: {result.stderr.strip()}")

  def traffic(self, name: str) -> Tuple[int, int]:
    """Bytes host `name` has received and sent on its link so far (`rx_bytes`, `tx_bytes`)."""
    counts = []
    for counter in ("rx_bytes", "tx_bytes"):
      path = f"/sys/class/net/{self.hosts[name].interface}/statistics/{counter}"
      result = subprocess.run(self.command(name, ["cat", path]), capture_output=True, text=True, check=False)
      if result.returncode != 0:
        raise HostsUnavailableError(f"cannot read {path} on {name}: {result.stderr.strip()}")
      counts.append(int(result.stdout))
    return counts[0], counts[1]

  def close(self) -> None:
    """Kills what runs on the hosts and removes every namespace, link and `/etc/netns` folder made."""
    for proc in self._procs:
      if proc.poll() is None:
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
    for proc in self._procs:
      try:
        proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        pass
    self._forks.close()
    for proc in self._delayers.values():
      for pipe in (proc.stdout, proc.stderr):
        pipe.close()
    self._delayers = {}
    for netns in self._made:
      pids = _ip("netns", "pids", netns, check=False).stdout.split()
      for pid in pids:  # anything else started inside (e.g. by hand through `command`)
        try:
          os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
          pass
      deadline = time.monotonic() + 10
      while _ip("netns", "pids", netns, check=False).stdout.split() and time.monotonic() < deadline:
        time.sleep(0.05)
      _ip("netns", "del", netns, check=False)
      shutil.rmtree(os.path.join(NETNS_ETC, netns), ignore_errors=True)
    self._made = []
    _ip("link", "del", self.bridge, check=False)


def _kill(proc: subprocess.Popen) -> Tuple[str, str]:
  """Kills `proc`'s process group, waits for it and closes its pipes; returns what it had written to them."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  return proc.communicate()


def leftovers(prefix: str = "tfps-") -> List[str]:
  """Network namespaces whose names start with `prefix` (tests assert none is left)."""
  out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
  return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]
