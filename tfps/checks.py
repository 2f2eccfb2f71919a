"""Argument checks shared by every layer: each raises `UsageError` with one line naming the argument, the value given
and what is allowed (``"`epochs` (0) must be a positive integer"``).

`UsageError` is a `ValueError`, so callers that catch `ValueError` keep working; `tfps.run_main` prints it as one line.
"""

import math
from typing import Any, Iterable, Optional

from tfps.errors import UsageError


def is_int(value: Any) -> bool:
  """Whether `value` is an integer (a bool is not)."""
  return isinstance(value, int) and not isinstance(value, bool)


def positive_int(name: str, value: Any, *, allow_none: bool = False) -> Optional[int]:
  """Returns `value` if it is an integer >= 1 (or None where `allow_none`), else raises `UsageError`."""
  if value is None and allow_none:
    return None
  if not is_int(value) or value < 1:
    allowed = "a positive integer or None" if allow_none else "a positive integer"
    raise UsageError(f"`{name}` ({value!r}) must be {allowed}")
  return value


def non_negative_int(name: str, value: Any) -> int:
  """Returns `value` if it is an integer >= 0, else raises `UsageError`."""
  if not is_int(value) or value < 0:
    raise UsageError(f"`{name}` ({value!r}) must be a non-negative integer")
  return value


def non_negative_number(name: str, value: Any, unit: str = "number") -> float:
  """Returns `value` if it is an int or float >= 0, else raises `UsageError` (`unit`: "number of seconds", ...)."""
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
    raise UsageError(f"`{name}` ({value!r}) must be a non-negative {unit}")
  return value


def int_in_range(name: str, value: Any, low: int, high: int) -> int:
  """Returns `value` if it is an integer in `low`-`high` (both included), else raises `UsageError`."""
  if not is_int(value) or not low <= value <= high:
    raise UsageError(f"`{name}` ({value!r}) must be an integer in {low}-{high}")
  return value


def one_of(name: str, value: Any, allowed: Iterable[Any]) -> Any:
  """Returns `value` if it is one of `allowed`, else raises `UsageError` listing them."""
  allowed = tuple(allowed)
  if value not in allowed:
    raise UsageError(f"`{name}` ({value!r}) must be one of {', '.join(str(a) for a in allowed)}")
  return value


def positive_ints(name: str, values: Any) -> list:
  """Returns `list(values)` if every entry is a positive integer, else raises `UsageError` quoting the list."""
  values = list(values)
  if any(not is_int(v) or v < 1 for v in values):
    raise UsageError(f"`{name}` ({values!r}) must be positive integers")
  return values


def directory(name: str, path: Any) -> str:
  """Returns `path` if it is a directory, or makes it one (a local path or a URL TensorFlow's file system reads);
  raises `UsageError` where it is a file or cannot be made (``"`model_dir` ('/data/run') is a file, not a
  directory"``)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (this module is imported without TensorFlow)
  try:
    if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
      raise UsageError(f"`{name}` ({path!r}) is a file, not a directory")
    tf.io.gfile.makedirs(path)
  except (OSError, tf.errors.OpError) as e:
    reason = getattr(e, "message", None) or getattr(e, "strerror", None) or str(e)
    raise UsageError(f"`{name}` ({path!r}) cannot be made a directory: {reason}") from None
  return path
