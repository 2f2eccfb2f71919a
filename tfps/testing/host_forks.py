"""Python tasks on test hosts (or on this machine), forked from one fork server per group of hosts
(`tfps.cluster.forkserver`).

A fresh `ip netns exec NS python script.py` imports TensorFlow again in every task (2-3 s of CPU each). Instead the
first Python script started on a group's hosts starts a fork server in this machine's own namespace, which imports
once what tfps-launch's server would for that script (`forkserver.preload_for`); each task is a fork of it that
enters its host's network namespace as `ip netns exec` would (`/etc/netns/<ns>` files over `/etc`, that namespace's
`/sys`) before it runs the script. The task is re-parented to this process (a child subreaper while a server runs),
so it is waited for, killed and found among the host's processes (`ip netns pids`) as a process started with
`subprocess.Popen` is.

Only `[sys.executable, SCRIPT.py, ARGS...]` with its output to a file, stdin from /dev/null and no other Popen
argument is forked; anything else, a server that did not start, and `TFPS_TEST_FRESH_TASKS=1` (every task a fresh
Python, as before) start a fresh process.
"""

import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Dict, Optional, Sequence

from tfps.cluster import forkserver

FRESH_ENV = "TFPS_TEST_FRESH_TASKS"
_SERVERS = [0]  # fork servers running in this process: it is a child subreaper while there is one
_FORKABLE_KWARGS = {"env", "stdout", "stderr", "stdin"}


def forkable(argv: Sequence[str], kwargs: Dict) -> bool:
  """Whether `subprocess.Popen(argv, **kwargs)` can be a forked task: a Python script, output to a file."""
  stdout, stderr = kwargs.get("stdout"), kwargs.get("stderr")
  return (len(argv) >= 2 and argv[0] == sys.executable and argv[1].endswith(".py") and os.path.isfile(argv[1])
          and set(kwargs) <= _FORKABLE_KWARGS and kwargs.get("stdin") == subprocess.DEVNULL
          and hasattr(stdout, "fileno") and (stderr == subprocess.STDOUT or hasattr(stderr, "fileno")))


class HostForks:
  """The fork server of one group of test hosts, started by the first task `spawn` forks; `close` ends it."""

  def __init__(self, enabled: bool = True):
    self.enabled = enabled and os.environ.get(FRESH_ENV, "") not in ("1", "true")
    self._server: Optional[forkserver.ForkServer] = None
    self._log: Optional[pathlib.Path] = None

  def spawn(self, netns: Optional[str], argv: Sequence[str], kwargs: Dict) -> Optional[forkserver.ForkedProcess]:
    """`argv` forked into network namespace `netns` (None: this machine's) with `kwargs`' environment and output, or
    None if it is not `forkable` or there is no server (start it fresh)."""
    if not self.enabled or not forkable(argv, kwargs) or not self._start(argv[1], kwargs.get("env")):
      return None
    environ = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    if netns is not None:
      environ[forkserver.NETNS_ENV] = netns
    stdout = kwargs["stdout"].fileno()
    stderr = stdout if kwargs.get("stderr") == subprocess.STDOUT else kwargs["stderr"].fileno()
    return self._server.spawn(argv, environ, stdout, stderr)

  def _start(self, script: str, env: Optional[Dict[str, str]]) -> bool:
    """Starts the server (once) with `env` (no TF_CONFIG), importing `script`'s preload; False if it could not."""
    if self._server is None:
      environ = dict(os.environ if env is None else env)
      environ.pop("TF_CONFIG", None)
      fd, name = tempfile.mkstemp(prefix="tfps-host-forkserver-", suffix=".log")
      os.close(fd)
      self._log = pathlib.Path(name)
      try:
        self._server = forkserver.ForkServer.start(environ, forkserver.preload_for(script), self._log)
        _SERVERS[0] += 1
      except forkserver.ForkServerError as e:
        print(f"test hosts: {e}; starting each task as a fresh Python", file=sys.stderr, flush=True)
        self.enabled, self._log = False, None  # the log stays, for what the server said
        return False
    return True

  def close(self) -> None:
    """Ends the server (after the hosts' tasks were killed) and stops being a subreaper; removes its log."""
    if self._server is not None:
      self._server.close()
      self._server = None
      _SERVERS[0] -= 1
      if not _SERVERS[0]:
        forkserver.become_subreaper(False)
    if self._log is not None:
      self._log.unlink(missing_ok=True)
      self._log = None
