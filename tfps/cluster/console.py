"""What of a task's output the launcher shows on its console: TensorFlow's noise stays in the task's log file only.

Quiet by default, the console drops (the log file keeps every line):
- TensorFlow's C++ INFO lines written before its logging starts (the oneDNN banner, "Could not find cuda drivers"),
  which TF_CPP_MIN_LOG_LEVEL does not reach;
- the CUDA probe's "failed call to cuInit" error on machines without a GPU;
- the session-config protobuf dump of `tf.config.experimental_connect_to_cluster`;
- the "Sharding callback duration" lines and the retracing warnings of TensorFlow's checkpoint-save functions, which
  tfps's per-epoch saves trigger;
- TensorFlow's warning about preserving tf.data options across serialization boundaries.

A task started on its own (on its host, in a Kubernetes pod) gets the same quiet console: `quiet_task_console`, run
when tfps is imported, sends its stderr through this filter in a small child process (`python console.py`), which
stops when the task's last writer closes it, so nothing is lost when the task ends with `os._exit`.
Imports no TensorFlow.
"""

import os
import re
import signal
import subprocess
import sys
from typing import Mapping, Sequence

_PREFIX = rb"^[IWE]\d{4} [\d:.]+ +\d+ "  # an absl/TensorFlow log line: level, date, time, thread
_NOISE = tuple(re.compile(pattern) for pattern in (
    rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    rb"^I\d{4} [\d:.]+ +\d+ \w+\.cc:\d+\] ",
    _PREFIX + rb"cuda_\w+\.cc:\d+\] failed call to cuInit",
    _PREFIX + rb"functional_saver\.py:\d+\] Sharding callback duration",
    rb"tf_function_(save|restore) at 0x[0-9a-f]+> triggered tf\.function retracing",
    rb"UserWarning: To make it possible to preserve tf\.data options across serialization boundaries",
))
_DUMP_START = re.compile(_PREFIX + rb"remote\.py:\d+\] default session config: ")
_WARNING_SOURCE = re.compile(rb"^  warnings\.warn\(")


class ConsoleFilter:
  """`keep(line)` says whether a line of a task's output goes to the console; it follows multi-line entries."""

  def __init__(self, quiet: bool = True):
    self.quiet = quiet
    self._in_dump = False
    self._dropped_warning = False

  def keep(self, line: bytes) -> bool:
    if not self.quiet:
      return True
    dropped_warning, self._dropped_warning = self._dropped_warning, False
    if self._in_dump:
      self._in_dump = bool(line.strip())  # the dump ends with an empty line
      return False
    if _DUMP_START.match(line):
      self._in_dump = True
      return False
    if dropped_warning and _WARNING_SOURCE.match(line):
      return False
    if any(pattern.search(line) for pattern in _NOISE):
      self._dropped_warning = b"Warning: " in line
      return False
    return True


def drop_executor_teardown_errors() -> None:
  """Drops the errors TensorFlow's eager executors raise when they are collected after a remote function failed or
  was cancelled (`Exception ignored in: <function Executor.__del__ ...>` and a CancelledError or OutOfRangeError
  traceback): a task that lost a peer prints them as it ends, in pieces that another thread's line (the chief's one
  line naming the lost task) can land between. Every other unraisable error still goes to the hook before."""
  before = sys.unraisablehook

  def hook(unraisable) -> None:
    teardown = unraisable.object
    if (getattr(teardown, "__qualname__", None) == "Executor.__del__" and
        getattr(teardown, "__module__", "").startswith("tensorflow.")):
      return
    before(unraisable)

  sys.unraisablehook = hook


QUIET_ENV = "TFPS_QUIET_CONSOLE"  # set in a task whose stderr goes through the filter (its children inherit both)
_FILTER_CHILDREN = []  # the filter child of this process (held: it runs as long as the task)


def is_lone_task(environ: Mapping[str, str], argv: Sequence[str], user_log_level) -> bool:
  """Whether this process is a tfps task started on its own that should get the quiet console: it has a cluster role
  (TF_CONFIG, a pod's TFPS_TASK_TYPE, or `--job_name`), is not under tfps-launch and not filtered already, and the
  user set no TF_CPP_MIN_LOG_LEVEL (`user_log_level` None; a level of the user's shows everything, as under
  tfps-launch)."""
  from tfps import run_records  # pylint: disable=g-import-not-at-top  (not in the filter child, run as a script)
  if environ.get(QUIET_ENV) or environ.get(run_records.LAUNCH_DIR_ENV) or user_log_level is not None:
    return False
  role = any(arg == "--job_name" or arg.startswith("--job_name=") for arg in argv[1:])
  return bool(role or environ.get("TF_CONFIG", "").strip() or environ.get("TFPS_TASK_TYPE", "").strip())


def quiet_task_console(user_log_level=None) -> bool:
  """Sends this process's stderr through `ConsoleFilter` if `is_lone_task` and TensorFlow is not loaded yet (its
  start-up noise comes with its import); returns whether it did."""
  if "tensorflow" in sys.modules or not is_lone_task(os.environ, sys.argv, user_log_level):
    return False
  os.environ[QUIET_ENV] = "1"  # before the child starts: it and every later child of this task inherit it
  sys.stderr.flush()
  read_end, write_end = os.pipe()
  _FILTER_CHILDREN.append(subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__)], stdin=read_end,
                                           stdout=2, stderr=2))
  os.dup2(write_end, 2)
  os.close(write_end)
  os.close(read_end)
  return True


def _filter_stdin() -> None:
  """The filter child: copies stdin to stdout, without the noise, until every writer has closed it."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the task; its last lines still come through here
  keep = ConsoleFilter().keep
  source, sink = sys.stdin.buffer, sys.stdout.buffer
  try:
    for line in iter(source.readline, b""):
      if keep(line):
        sink.write(line)
        sink.flush()
  except BrokenPipeError:
    pass


if __name__ == "__main__":
  _filter_stdin()
