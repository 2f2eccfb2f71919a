"""Keeping a local cluster's ports away from other hosts: its tasks run in a network namespace with only loopback.

TensorFlow's gRPC servers listen on every interface, whatever address the cluster gives them, and accept
unauthenticated connections that can run any op on the task (docs/security.md). `tfps-launch` therefore runs itself
again inside new network, pid and mount namespaces (`unshare`, as root; with a user namespace otherwise):

- the network namespace has only `lo`, brought up here: the tasks reach each other on 127.0.0.1, nothing else reaches
  them (and they reach nothing but loopback);
- the launcher inside is the namespace's first process (pid 1): when it ends, for whatever reason, the kernel kills
  every process left in the namespace, and the namespace is gone with its last process;
- the outer process passes SIGTERM/SIGINT on to the launcher inside and waits; if it is SIGKILLed, `setpriv
  --pdeathsig` kills `unshare`, whose `--kill-child` kills the launcher inside, and so every task.

Imports no TensorFlow.
"""

import fcntl
import ipaddress
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from typing import List, Optional, Sequence

import psutil

from tfps.errors import TfpsError

INSIDE_ENV = "TFPS_LAUNCH_INSIDE_NAMESPACE"  # set for the launcher that runs inside the namespace
OPT_OUT_FLAG = "--expose_ports"
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_EXTRA_STOP_SECS = 15.0  # after the grace period, time the launcher inside gets before it is killed


class IsolationError(TfpsError, RuntimeError):
  """The tasks cannot be put in a private network namespace here; the message is one line naming the opt-out flag."""


def namespace_command(argv: Sequence[str]) -> List[str]:
  """`argv` run in new network, pid and mount namespaces, killed when the calling process dies."""
  user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
  return ["setpriv", "--pdeathsig", "KILL", "unshare", *user, "--net", "--pid", "--fork", "--kill-child",
          "--mount-proc", "--", *argv]


def check_possible() -> None:
  """Raises `IsolationError` unless `namespace_command` works on this machine (tried once with `true`)."""
  missing = [tool for tool in ("setpriv", "unshare") if shutil.which(tool) is None]
  if missing:
    _refuse(f"`{missing[0]}` (util-linux) is not installed")
  result = subprocess.run(namespace_command(["true"]), capture_output=True, text=True, check=False)
  if result.returncode != 0:
    reason = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
    how = "" if os.geteuid() == 0 else "; run as root or where unprivileged user namespaces are allowed"
    _refuse(f"{reason}{how}")


def _refuse(reason: str) -> None:
  raise IsolationError(f"cannot run the tasks in a private network namespace ({reason}); pass {OPT_OUT_FLAG} to run "
                       "them in this one, where every task port accepts unauthenticated connections from any host "
                       "that can reach this machine (docs/security.md)")


def run_isolated(argv: Sequence[str], stop_grace_secs: float) -> int:
  """Runs `argv` (a launcher) in the namespaces and returns its exit status.

  The first SIGTERM or SIGINT is passed on to it once it has a handler for it (the first process of a pid namespace
  drops other signals, as while it starts); if it has not ended `stop_grace_secs` + 15 s later, the namespace is
  killed.
  """
  env = dict(os.environ, **{INSIDE_ENV: "1"})
  process = subprocess.Popen(namespace_command(argv), env=env)
  stopping = {}  # once asked to stop: the signal, the deadline, whether the launcher inside got it

  def on_signal(signum, frame):
    del frame
    if not stopping:
      stopping.update(signum=signum, deadline=time.monotonic() + stop_grace_secs + _EXTRA_STOP_SECS,
                      delivered=_deliver(process.pid, signum))

  previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    while True:
      try:
        code = process.wait(timeout=0.2)
        break
      except subprocess.TimeoutExpired:
        if stopping and time.monotonic() > stopping["deadline"]:
          process.kill()  # unshare --kill-child takes the namespace's pid 1, and the kernel every task, with it
        elif stopping and not stopping["delivered"]:
          stopping["delivered"] = _deliver(process.pid, stopping["signum"])
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  return 128 - code if code < 0 else code


def _deliver(pid: int, signum: int) -> bool:
  """Sends `signum` to the launcher inside (the child of `pid`) if it handles it yet; returns whether it did."""
  for child in _children(pid):
    if _catches(child.pid, signum):
      try:
        child.send_signal(signum)
        return True
      except psutil.NoSuchProcess:
        return False
  return False


def _catches(pid: int, signum: int) -> bool:
  """Whether process `pid` has a handler for `signum` (the SigCgt mask of /proc/PID/status)."""
  try:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
      for line in status:
        if line.startswith("SigCgt:"):
          return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
  except OSError:
    pass
  return False


def _children(pid: int) -> List[psutil.Process]:
  try:
    return psutil.Process(pid).children()
  except psutil.NoSuchProcess:
    return []


def enter_namespace() -> None:
  """In the launcher inside: brings `lo` up and checks that it is the only interface (raises `IsolationError`)."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
    request = struct.pack("16sh22x", b"lo", 0)
    flags = struct.unpack("16sh22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
    fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP))
  others = non_loopback_interfaces()
  if others:
    raise IsolationError(f"the launcher's network namespace has interfaces besides lo ({', '.join(others)}); "
                         f"{INSIDE_ENV} is set only by tfps-launch itself")


def non_loopback_interfaces() -> List[str]:
  """The interfaces of this process's network namespace other than `lo` (through which other hosts may connect)."""
  return [name for _, name in socket.if_nameindex() if name != "lo"]


def is_loopback(host: str) -> bool:
  """Whether `host` (an address or `localhost`) names this machine's loopback."""
  if host.lower() == "localhost":
    return True
  try:
    return ipaddress.ip_address(host.strip("[]")).is_loopback
  except ValueError:
    return False


def exposure_warning(task: str, address: str) -> Optional[str]:
  """The one line a listening task logs when interfaces other than loopback may carry connections to its port; None
  inside tfps-launch's private namespace."""
  others = non_loopback_interfaces()
  if not others:
    return None
  named = others[:3] + ([f"{len(others) - 3} more"] if len(others) > 3 else [])
  return describe_exposure(task, address, f"({', '.join(named)}, lo)")


def describe_exposure(task: str, address: str, interfaces: str) -> str:
  """What anyone reaching `task`'s port can do, in one line; `interfaces` says which interfaces it listens on."""
  port = address.rsplit(":", 1)[-1]
  return (f"{task} listens on port {port} of every interface {interfaces} and accepts unauthenticated connections "
          "from any host that can reach it: they can run any op on this task, read and write its files and "
          "variables; docs/security.md says how to restrict it")
