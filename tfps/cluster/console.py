"""What of a task's output the launcher shows on its console: TensorFlow's noise stays in the task's log file only.

Quiet by default, the console drops (the log file keeps every line):
- TensorFlow's C++ INFO lines written before its logging starts (the oneDNN banner, "Could not find cuda drivers"),
  which TF_CPP_MIN_LOG_LEVEL does not reach;
- the CUDA probe's "failed call to cuInit" error on machines without a GPU;
- the session-config protobuf dump of `tf.config.experimental_connect_to_cluster`;
- the "Sharding callback duration" lines and the retracing warnings of TensorFlow's checkpoint-save functions, which
  tfps's per-epoch saves trigger;
- TensorFlow's warning about preserving tf.data options across serialization boundaries.
Imports no TensorFlow.
"""

import re

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
