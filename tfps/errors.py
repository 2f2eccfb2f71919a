"""The exception types tfps users catch, and the exit statuses of a script that ends on one (`tfps.run_main`)."""

import os
import sys
from typing import NoReturn, Optional

from absl import logging

# A script ends on a tfps error with one line on stderr and one of these statuses; a supervisor (tfps-launch, a
# restart loop) can tell from it whether starting the task again may help.
EXIT_REFUSED = 2  # its input (flags, cluster, checkpoint, arguments) cannot be used: started again, it refuses again
EXIT_LOST_TASK = 3  # a task of the cluster did not answer or was lost: started again once that task is back, it resumes


def refuse(program: str, message: str) -> None:
  """Ends the process with one line `program: message` on stderr and status `EXIT_REFUSED`."""
  print(f"{program}: {message}", file=sys.stderr, flush=True)
  sys.exit(EXIT_REFUSED)


def exit_now(status: int, line: Optional[str] = None) -> NoReturn:
  """Ends the process at once (`os._exit`: TensorFlow's exit would wait on a lost task, and a server cannot be
  stopped), `line` the last line on stderr. TensorFlow's own threads go on writing there (a lost task's gRPC errors
  did, after the line that named it), so stderr is pointed at /dev/null before the line is written."""
  logging.flush()
  sys.stdout.flush()
  if line is not None:
    last_line_on_stderr(line)
  os._exit(status)


def last_line_on_stderr(line: str) -> None:
  """Writes `line` to stderr as the last of it, on a line of its own: stderr (the file descriptor, which TensorFlow's
  threads write to too) is pointed at /dev/null first, and the line goes to the stream it was, after a line break
  (another thread may have left a line unfinished there: a chief's log once ended "^train_keras.py: task ps:1 ...",
  a traceback's caret cut off)."""
  sys.stderr.flush()
  own = os.dup(2)
  os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
  os.write(own, ("\n" + line + "\n").encode())
  os.close(own)


class TfpsError(Exception):
  """Base class of every error tfps raises on purpose."""


class ClusterConfigError(TfpsError, ValueError):
  """A cluster description (flags or TF_CONFIG) breaks a rule.

  The message is one line naming the offending value and what is allowed.
  """


class KerasVersionError(TfpsError, ImportError):
  """TensorFlow is running with Keras 3, which has no ParameterServerStrategy support."""


class UnreachableTaskError(TfpsError, RuntimeError):
  """A task of the cluster did not answer within the connect timeout."""


class AddressInUseError(TfpsError, OSError):
  """A task cannot listen at its address: another process holds the port on that host."""


class IdleTimeoutError(TfpsError, TimeoutError):
  """What a follower waited for (a sidecar evaluator: a new checkpoint) did not come within its timeout."""


class UsageError(TfpsError, ValueError):
  """An argument a user gave is not one tfps can use; the message names it, its value and what is allowed."""


class CheckpointMismatchError(TfpsError, ValueError):
  """A checkpoint does not fit the model it should restore into (a variable's shape, a missing or extra variable, other
  optimizer slots); the message is one line naming what differs. Raised before any training step."""


class ArgumentTypeError(TfpsError, TypeError):
  """An argument a user gave has the wrong type (e.g. a Dataset where a function is needed); one line naming it."""
