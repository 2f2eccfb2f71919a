"""A fork server for the local launcher's Python tasks: TensorFlow is imported once per launch, not once per task.

The launcher starts one server (`ForkServer.start`) with the environment every task of the launch shares (no
TF_CONFIG). The server imports the modules it is given (TensorFlow, tf-keras, tfps) without starting TensorFlow's
runtime (no eager context, no thread pools: it reports its thread count when ready), then answers requests on a unix
socket: a script, its arguments, environment and working directory, and the file descriptors of its stdout and
stderr. Per request it forks twice; the grandchild runs the script as `python script args...` would (own session,
`__main__`, exit status, a traceback and status 1 for an exception), and the middle process ends at once, so the task
is re-parented to the launcher, which is a child subreaper (`become_subreaper`): the launcher waits for it, sees how
it ended and lists it among its children, as with a process it started itself (`ForkedProcess`).

The launcher side imports no TensorFlow. A forked task's `/proc/<pid>/environ` shows the server's environment, not
the task's TF_CONFIG: the launcher names its tasks' pids in `<log_dir>/tasks.json` instead.
"""

import ast
import ctypes
import importlib
import json
import os
import pathlib
import runpy
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

_MAX_MESSAGE = 1 << 20
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_POLL_SECS = 0.05


class ForkServerError(RuntimeError):
  """The fork server could not start, or could not start a task."""


def become_subreaper(enabled: bool = True) -> None:
  """Makes this process a child subreaper (`enabled`; else no longer one): orphaned descendants (the forked tasks)
  become its children.

  Raises:
    ForkServerError: the kernel refused it (not Linux).
  """
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    failed = libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0) != 0
  except (OSError, AttributeError) as e:
    raise ForkServerError(f"prctl(PR_SET_CHILD_SUBREAPER) is not available: {e}") from None
  if failed:
    raise ForkServerError(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}")


def script_imports(script: str) -> List[str]:
  """The modules `script` imports at its top level (`import a.b`: a.b; `from a import b`: a.b, which the server
  imports if it is a module, else a), in order; none if it cannot be read or parsed."""
  try:
    tree = ast.parse(pathlib.Path(script).read_bytes(), script)
  except (OSError, SyntaxError, ValueError):
    return []
  names = []
  for node in tree.body:
    if isinstance(node, ast.Import):
      names.extend(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.extend(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
  return names


# What the fork server imports once for every task of a script that trains: TensorFlow, tf-keras and the tfps modules
# scripts import (none of them starts TensorFlow's runtime on import, which would leave threads behind that a fork
# does not copy).
TRAINING_PRELOAD = ("tensorflow", "tf_keras", "tfps", "tfps.cli.flags", "tfps.cli.model_flags", "tfps.keras",
                    "tfps.estimator", "tfps.models")
_PRELOAD_PACKAGES = ("absl", "numpy", "tensorflow", "tf_keras", "tfps")  # whose imports start no runtime
_LIGHT_TFPS = ("tfps.run_records", "tfps.errors", "tfps.checks", "tfps.formatting")  # import no TensorFlow


def preload_for(script: str) -> List[str]:
  """What the fork server imports for `script`: its own top-level imports of `_PRELOAD_PACKAGES`, and, unless those
  are only absl, numpy and tfps modules that import no TensorFlow, `TRAINING_PRELOAD` (`import tfps` imports
  TensorFlow only when training starts: in every task, without it)."""
  names = [name for name in script_imports(script) if name.split(".")[0] in _PRELOAD_PACKAGES]
  light = all(name.split(".")[0] in ("absl", "numpy") or name.startswith(_LIGHT_TFPS) for name in names)
  return names if light else [*TRAINING_PRELOAD, *names]


class ForkedProcess:
  """A task the fork server started, re-parented to this process: the part of `subprocess.Popen` the launcher uses
  (`pid`, `returncode`, `stdout`, `poll()`, `wait(timeout)`)."""

  def __init__(self, pid: int, stdout=None):
    self.pid = pid
    self.stdout = stdout
    self.returncode: Optional[int] = None

  def poll(self) -> Optional[int]:
    """The return code (-N: killed by signal N), or None while the task runs."""
    if self.returncode is None:
      try:
        pid, status = os.waitpid(self.pid, os.WNOHANG)
      except ChildProcessError:  # reaped elsewhere (psutil's wait reaps children): as Popen, status unknown
        pid, status = self.pid, 0
      if pid == self.pid:
        self.returncode = os.waitstatus_to_exitcode(status)
    return self.returncode

  def wait(self, timeout: Optional[float] = None) -> int:
    """The return code, once the task has ended.

    Raises:
      subprocess.TimeoutExpired: still running after `timeout` seconds.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.poll() is None:
      if deadline is not None and time.monotonic() >= deadline:
        raise subprocess.TimeoutExpired(str(self.pid), timeout)
      time.sleep(_POLL_SECS)
    return self.returncode


class ForkServer:
  """The launcher's handle on its fork server."""

  def __init__(self, process: subprocess.Popen, sock: socket.socket, threads: int):
    self.process = process
    self.threads = threads  # the server's threads when it was ready (1-2: TensorFlow's runtime not started)
    self._sock = sock

  @classmethod
  def start(cls, environ: Dict[str, str], preload: Sequence[str], log_path: pathlib.Path,
            timeout_secs: float = 300.0) -> "ForkServer":
    """Starts a server with `environ` that imports `preload`, and waits until it is ready; its output goes to
    `log_path`.

    Raises:
      ForkServerError: it could not start or import `preload` (what it said is in `log_path`), or was not ready
        within `timeout_secs`.
    """
    become_subreaper()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    package_parent = str(pathlib.Path(__file__).resolve().parents[2])
    code = (f"import os, sys; environ = dict(os.environ); sys.path.insert(0, {package_parent!r}); "
            f"from tfps.cluster import forkserver; forkserver.main({theirs.fileno()}, sys.argv[1:], environ)")
    with open(log_path, "wb") as log:
      process = subprocess.Popen([sys.executable, "-c", code, *preload], env=environ, stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT, pass_fds=[theirs.fileno()],
                                 start_new_session=True)
    theirs.close()
    ours.settimeout(timeout_secs)
    try:
      ready = _receive(ours)
    except (OSError, ValueError) as e:
      _end(process)
      raise ForkServerError(f"the fork server was not ready ({e}); see {log_path}") from None
    ours.settimeout(None)
    if "error" in ready:
      _end(process)
      raise ForkServerError(f"the fork server could not start: {ready['error']}; see {log_path}")
    return cls(process, ours, ready["threads"])

  def spawn(self, argv: Sequence[str], environ: Dict[str, str], stdout: int, stderr: int,
            stdout_pipe=None) -> ForkedProcess:
    """Runs `argv` (`python` SCRIPT ARGS...) as a forked task with `environ`, in our working directory, its output on
    the descriptors `stdout` and `stderr`; `stdout_pipe` becomes the result's `stdout`.

    Raises:
      ForkServerError: the server is gone, or could not fork.
    """
    request = {"argv": list(argv[1:]), "env": dict(environ), "cwd": os.getcwd()}
    try:
      socket.send_fds(self._sock, [json.dumps(request).encode()], [stdout, stderr])
      reply = _receive(self._sock)
    except (OSError, ValueError) as e:
      raise ForkServerError(f"the fork server did not answer: {e}") from None
    if "error" in reply:
      raise ForkServerError(reply["error"])
    return ForkedProcess(reply["pid"], stdout_pipe)

  def close(self) -> None:
    """Ends the server (its tasks run on)."""
    self._sock.close()
    _end(self.process)


def _receive(sock: socket.socket) -> dict:
  data = sock.recv(_MAX_MESSAGE)
  if not data:
    raise ValueError("it ended")
  return json.loads(data)


def _end(process: subprocess.Popen) -> None:
  try:
    process.wait(timeout=5)
  except subprocess.TimeoutExpired:
    process.kill()
    process.wait()


# The server side (runs in the server process).


def main(fd: int, preload: Sequence[str], environ: Dict[str, str]) -> None:
  """The server process: `serve`s until the launcher closes the socket; in a forked task, runs its script as
  `__main__`, and Python's own exit follows (non-daemon threads, atexit, its status, a traceback and status 1 for an
  exception). `environ`: the environment it started with (before tfps, imported to run this, set its part)."""
  script = serve(fd, preload, environ)
  if script is not None:
    runpy.run_path(script, run_name="__main__")


def serve(fd: int, preload: Sequence[str], environ: Dict[str, str]) -> Optional[str]:
  """Imports `preload`, says it is ready, then forks a task per request; returns None when the launcher closes the
  socket, and in a forked task the script to run (`_become_task` made the process the task's)."""
  sock = socket.socket(fileno=fd)
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher ends it by closing the socket
  try:
    for name in preload:
      _preload(name)
  except Exception as e:  # pylint: disable=broad-except  (any import error: the launcher falls back to Popen)
    sock.send(json.dumps({"error": f"importing {name}: {type(e).__name__}: {e}"}).encode())
    return None
  sock.send(json.dumps({"threads": len(os.listdir("/proc/self/task"))}).encode())
  # what the imports set in the environment (tfps's gRPC options, TensorFlow's own), as they would in each task
  imported = {key: value for key, value in os.environ.items() if environ.get(key) != value}
  while True:
    try:
      data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 2)
    except OSError:
      return None
    if not data:
      return None
    request = json.loads(data)
    try:
      pid = _fork_task()
    except OSError as e:
      pid = f"could not fork a task: {e}"
    if pid is None:  # the task
      sock.close()
      return _become_task(request, fds, imported)
    for fd_ in fds:
      os.close(fd_)
    sock.send(json.dumps({"pid": pid} if isinstance(pid, int) else {"error": pid}).encode())


def _preload(name: str) -> None:
  """Imports module `name`, or its parent if `name` is a name inside it (`from a import b`: b a function)."""
  try:
    importlib.import_module(name)
  except ModuleNotFoundError as e:
    parent = name.rpartition(".")[0]
    if not parent or e.name != name:
      raise
    importlib.import_module(parent)


def _fork_task() -> Optional[int]:
  """Forks the middle process, which forks the task, sends us its pid and ends; returns the task's pid, and None in
  the task."""
  read_end, write_end = os.pipe()
  middle = os.fork()
  if middle == 0:
    middle_pid = os.getpid()
    os.close(read_end)
    try:
      task = os.fork()
    except OSError:
      os._exit(1)
    if task == 0:
      os.close(write_end)
      while os.getppid() == middle_pid:  # the middle ends at once: run as the subreaper's child, as tasks.json says
        time.sleep(0.001)
      return None
    os.write(write_end, str(task).encode())
    os._exit(0)
  os.close(write_end)
  with os.fdopen(read_end, "rb") as pipe:
    pid = pipe.read()
  os.waitpid(middle, 0)
  if not pid:
    raise OSError("the task's fork failed")
  return int(pid)


NETNS_ENV = "TFPS_FORK_NETNS"  # in a request's environment: the network namespace the task runs in (`_enter_netns`)
_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000  # linux/sched.h
_MS_BIND, _MS_REC, _MS_SLAVE = 0x1000, 0x4000, 1 << 19  # linux/mount.h
_MNT_DETACH = 2


def _enter_netns(name: str) -> None:
  """In the task, what `ip netns exec NAME` does before it runs a command: enters network namespace NAME, and in a
  mount namespace of its own sees each file of `/etc/netns/NAME` over its namesake in `/etc` and a `/sys` of NAME.

  Raises:
    OSError: a step failed (what and why).
  """
  libc = ctypes.CDLL(None, use_errno=True)

  def check(result: int, what: str) -> None:
    if result != 0:
      raise OSError(ctypes.get_errno(), f"{what} for network namespace {name}: {os.strerror(ctypes.get_errno())}")

  with open(os.path.join("/var/run/netns", name), "rb") as f:
    check(libc.setns(f.fileno(), _CLONE_NEWNET), "setns")
  check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
  check(libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None), "making / a slave mount")
  etc = os.path.join("/etc/netns", name)
  for entry in sorted(os.listdir(etc)) if os.path.isdir(etc) else []:
    check(libc.mount(os.path.join(etc, entry).encode(), os.path.join("/etc", entry).encode(), b"none", _MS_BIND,
                     None), f"binding {etc}/{entry}")
  libc.umount2(b"/sys", _MNT_DETACH)  # as ip: there may be no /sys mounted
  check(libc.mount(name.encode(), b"/sys", b"sysfs", 0, None), "mounting /sys")


def _become_task(request: dict, fds: Sequence[int], imported: Dict[str, str]) -> str:
  """In the task: makes this process `python SCRIPT ARGS...` with the request's environment, plus what the imports
  set in it (`imported`), and the request's output (in a session of its own, stdin from /dev/null, Python's signal
  handlers); returns the script."""
  os.setsid()
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.dup2(fds[0], 1)
  os.dup2(fds[1], 2)
  for fd in (null, *fds):
    os.close(fd)
  if NETNS_ENV in request["env"]:
    _enter_netns(request["env"].pop(NETNS_ENV))
  signal.signal(signal.SIGINT, signal.default_int_handler)
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"], **imported)
  script = request["argv"][0]
  sys.argv = list(request["argv"])
  sys.path[0] = os.path.dirname(os.path.abspath(script))
  if "numpy" in sys.modules:  # its global generator's state, else the same in every task
    sys.modules["numpy"].random.seed()
  return script
