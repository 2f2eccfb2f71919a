"""Processes of a local cluster: start one per task with its own TF_CONFIG and log file, and stop them all.

Imports no TensorFlow. Each task runs in a session of its own, so a terminal's Ctrl-C reaches only the launcher, which
then stops every task (and whatever a task started) by itself.
"""

import collections
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import psutil

from tfps import _env
from tfps.cluster import config as cluster_lib
from tfps.cluster import console
from tfps.cluster import forkserver
from tfps import run_records

TaskName = Tuple[str, int]
TAIL_LINES = 20
TASKS_FILE = "tasks.json"  # in the log folder: each task's pid, for whoever looks for a task (its TF_CONFIG is not
# in /proc/<pid>/environ when the fork server started it)
FORK_SERVER_LOG = "forkserver.log"
START_ORDER = ("ps", "worker", "chief", "evaluator")  # ps first: workers and the chief connect to them


def exit_status(returncode: int) -> int:
  """A shell-style exit status: a process killed by signal N gives 128 + N."""
  return 128 - returncode if returncode < 0 else returncode


def describe_returncode(returncode: int) -> str:
  if returncode < 0:
    return f"was killed by {signal.Signals(-returncode).name}"
  return f"exited with code {returncode}"


def task_environ(config: cluster_lib.ClusterConfig, base: Optional[Dict[str, str]] = None,
                 verbose: bool = False, log_dir: Optional[pathlib.Path] = None) -> Dict[str, str]:
  """The environment of a task process: `shared_environ(base, verbose, log_dir)` plus its TF_CONFIG."""
  env = shared_environ(base, verbose, log_dir)
  env["TF_CONFIG"] = json.dumps(config.to_tf_config())
  return env


def shared_environ(base: Optional[Dict[str, str]] = None, verbose: bool = False,
                   log_dir: Optional[pathlib.Path] = None) -> Dict[str, str]:
  """What every task's environment has (the fork server's): `base` (default: ours) without TF_CONFIG and
  TFPS_TASK_TYPE (a cluster of the user's shell, or a pod's: each task gets its own TF_CONFIG), plus the settings tfps
  needs.

  `verbose` lets TensorFlow's C++ INFO lines through (TF_CPP_MIN_LOG_LEVEL=0) unless the user set a level;
  `log_dir` is where the chief tells the launcher its model_dir (for the end-of-run summary).
  """
  env = dict(os.environ if base is None else base)
  env.pop("TF_CONFIG", None)
  env.pop("TFPS_TASK_TYPE", None)
  if verbose and _env.USER_LOG_LEVEL is None:
    env[_env.LOG_LEVEL] = "0"
  if log_dir is not None:
    env[run_records.LAUNCH_DIR_ENV] = str(log_dir.resolve())
  env["GRPC_FAIL_FAST"] = "use_caller"
  env["TF_USE_LEGACY_KERAS"] = "1"
  env["PYTHONUNBUFFERED"] = "1"
  env[cluster_lib.PS_FAILURE_RESTARTS_ALL_ENV] = "1"  # tfps-launch starts every task again when a ps fails
  return env


class Task:
  """One running task: what it runs, its process (a `subprocess.Popen`, or a `forkserver.ForkedProcess`) and its log
  file."""

  def __init__(self, config: cluster_lib.ClusterConfig, command: Sequence[str], process,
               log_path: pathlib.Path, stream: bool):
    self.config = config
    self.name: TaskName = (config.task_type, config.task_index)
    self.command = list(command)
    self.process = process
    self.log_path = log_path
    self.stream = stream
    self.reported = False  # the launcher has dealt with this task's exit
    self._pump: Optional[threading.Thread] = None

  @property
  def label(self) -> str:
    return f"{self.name[0]}:{self.name[1]}"

  def poll(self) -> Optional[int]:
    return self.process.poll()

  def wait(self, timeout_secs: float) -> Optional[int]:
    """The return code, or None if the process is still running after `timeout_secs`."""
    try:
      code = self.process.wait(timeout=timeout_secs)
    except subprocess.TimeoutExpired:
      return None
    if self._pump is not None:
      self._pump.join(timeout=5)
    return code

  def tail(self, lines: int = TAIL_LINES, quiet: bool = False) -> List[str]:
    """The last `lines` lines of the task's log; `quiet`: of those `console.ConsoleFilter` keeps (no TensorFlow
    start-up noise)."""
    keep = console.ConsoleFilter(quiet=quiet).keep
    try:
      with open(self.log_path, "rb") as f:
        return list(collections.deque((line.decode(errors="replace") for line in f if keep(line)), maxlen=lines))
    except OSError:
      return []

  def stream_to(self, stream, console_filter: console.ConsoleFilter) -> None:
    """Copies the process's output to its log file, and the lines `console_filter` keeps to `stream`, in a
    background thread."""
    def pump():
      with open(self.log_path, "ab") as log:
        for line in iter(self.process.stdout.readline, b""):
          log.write(line)
          log.flush()
          if console_filter.keep(line):
            stream.buffer.write(line)
            stream.flush()
    self._pump = threading.Thread(target=pump, name=f"pump-{self.label}", daemon=True)
    self._pump.start()


class TaskGroup:
  """The tasks of one local cluster."""

  def __init__(self, log_dir: pathlib.Path, stop_grace_secs: float = 5.0, verbose: bool = False):
    """`verbose`: TensorFlow's noise too on the console (else `console.ConsoleFilter` leaves it to the logs)."""
    self.log_dir = log_dir
    self.stop_grace_secs = stop_grace_secs
    self.verbose = verbose
    self.tasks: List[Task] = []
    self.fork_server: Optional[forkserver.ForkServer] = None
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / run_records.MODEL_DIR_POINTER).unlink(missing_ok=True)  # a previous launch's
    (log_dir / TASKS_FILE).unlink(missing_ok=True)

  def start_fork_server(self, preload: Sequence[str]) -> bool:
    """Starts a fork server that imports `preload`, for the Python tasks `start` starts from now on; returns whether
    it did (if not, after one warning line, each task starts as its own Python)."""
    try:
      self.fork_server = forkserver.ForkServer.start(shared_environ(verbose=self.verbose, log_dir=self.log_dir),
                                                     preload, self.log_dir / FORK_SERVER_LOG)
    except forkserver.ForkServerError as e:
      print(f"tfps-launch: warning: {e}; starting each task as its own Python", file=sys.stderr, flush=True)
      return False
    return True

  def close_fork_server(self) -> None:
    """Ends the fork server, if any (the tasks it started run on)."""
    if self.fork_server is not None:
      self.fork_server.close()
      self.fork_server = None
      log = self.log_dir / FORK_SERVER_LOG
      if log.exists() and not log.stat().st_size:  # it said nothing: only the tasks' logs are left
        log.unlink()

  def start(self, config: cluster_lib.ClusterConfig, command: Sequence[str], stream: bool = False,
            restart: int = 0) -> Task:
    """Starts the task `config` describes, running `command`; with `stream` its output also goes to stdout.

    A restarted task (`restart` > 0) appends to its log after a line that says so.
    """
    log_path = self.log_dir / f"{config.task_type}-{config.task_index}.log"
    if restart:
      with open(log_path, "ab") as log:
        log.write(f"===== tfps-launch: restart {restart} of this task =====\n".encode())
    else:
      log_path.write_bytes(b"")
    with open(log_path, "ab") as log:
      process = self._spawn(command, task_environ(config, verbose=self.verbose, log_dir=self.log_dir), log, stream)
    task = Task(config, command, process, log_path, stream)
    if stream:
      task.stream_to(sys.stdout, console.ConsoleFilter(quiet=not self.verbose and _env.USER_LOG_LEVEL is None))
    self.tasks.append(task)
    self._write_pids()
    return task

  def _spawn(self, command: Sequence[str], environ: Dict[str, str], log, stream: bool):
    """A process running `command` with `environ`, its output to `log` (or a pipe with `stream`): forked by the
    fork server for a Python script, else a fresh process."""
    if self.fork_server is None or len(command) < 2 or command[0] != sys.executable:
      return subprocess.Popen(list(command), env=environ, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE if stream else log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    if not stream:
      return self.fork_server.spawn(command, environ, log.fileno(), log.fileno())
    read_end, write_end = os.pipe()
    try:
      return self.fork_server.spawn(command, environ, write_end, write_end, stdout_pipe=os.fdopen(read_end, "rb"))
    finally:
      os.close(write_end)

  def _write_pids(self) -> None:
    """`<log_dir>/tasks.json`: each task's pid (`{"ps:0": pid, ...}`), replaced whole at each start."""
    temporary = self.log_dir / f".{TASKS_FILE}.tmp"
    temporary.write_text(json.dumps({task.label: task.process.pid for task in self.tasks}))
    os.replace(temporary, self.log_dir / TASKS_FILE)

  def restart(self, tasks: Sequence[Task], restart: int) -> None:
    """Stops `tasks` (those still running) and starts each again with the same TF_CONFIG, port and command."""
    self.stop(tasks)
    for task in tasks:
      self.tasks.remove(task)
    for task in sorted(tasks, key=lambda t: START_ORDER.index(t.name[0])):
      self.start(task.config, task.command, task.stream, restart=restart)

  def find(self, name: TaskName) -> Optional[Task]:
    return next((task for task in self.tasks if task.name == name), None)

  def describe_exit(self, task: Task) -> str:
    """Which task ended, how, and the last lines of its log (without TensorFlow's noise unless verbose)."""
    lines = "".join("  | " + line for line in task.tail(quiet=not self.verbose))
    return (f"task {task.label} {describe_returncode(task.poll())}; last lines of {task.log_path}:\n"
            f"{lines.rstrip() or '  | (empty log)'}")

  def stop_all(self) -> None:
    """Stops every task: the chief first, then the others (an online chief given SIGTERM ends its steps in flight
    and writes a checkpoint, which needs its ps and workers)."""
    chief = [task for task in self.tasks if task.name[0] == "chief"]
    self.stop(chief)
    self.stop([task for task in self.tasks if task not in chief])

  def stop(self, tasks: Sequence[Task]) -> None:
    """SIGTERM to `tasks` and their descendants, SIGKILL to whatever is left after the grace period."""
    processes = []
    for task in tasks:
      task.reported = True  # stopped on purpose: its exit is no failure
      processes.extend(_process_tree(task.process.pid))
    for process in processes:
      _signal(process, signal.SIGTERM)
    _, alive = psutil.wait_procs(processes, timeout=self.stop_grace_secs)
    for process in alive:
      _signal(process, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    for task in tasks:
      task.wait(timeout_secs=5)


def task_pids(log_dir: pathlib.Path) -> Dict[str, int]:
  """Each task's pid (`{"ps:0": pid, ...}`) from `<log_dir>/tasks.json`, as the launcher sees them (in its private
  pid namespace unless --expose_ports); empty before the first task started."""
  try:
    return json.loads((pathlib.Path(log_dir) / TASKS_FILE).read_text())
  except (OSError, ValueError):
    return {}


def find_task(log_dir: pathlib.Path, label: str, processes: Sequence[psutil.Process]) -> Optional[psutil.Process]:
  """The live process of task `label` ("worker:1") of the launch that logs to `log_dir`, among `processes` (e.g.
  the launcher's descendants, seen from any pid namespace: a pid is matched in the launcher's, the innermost); None
  if it has not started (again) yet."""
  pid = task_pids(log_dir).get(label)
  for process in processes:
    try:
      if pid is not None and _innermost_pid(process.pid) == pid and process.status() != psutil.STATUS_ZOMBIE:
        return process
    except psutil.Error:
      continue
  return None


def _innermost_pid(pid: int) -> Optional[int]:
  """`pid`'s pid in its innermost pid namespace (the last of /proc/PID/status's NSpid)."""
  try:
    with open(f"/proc/{pid}/status") as status:
      line = next((line for line in status if line.startswith("NSpid:")), f"NSpid: {pid}")
  except OSError:
    return None
  return int(line.split()[-1])


def _process_tree(pid: int) -> List[psutil.Process]:
  try:
    root = psutil.Process(pid)
    return [root] + root.children(recursive=True)
  except psutil.NoSuchProcess:
    return []


def _signal(process: psutil.Process, signum: int) -> None:
  try:
    process.send_signal(signum)
  except psutil.NoSuchProcess:
    pass
