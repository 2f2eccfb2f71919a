"""A tf-keras legacy optimizer's learning rate, read on each ps from a copy there.

A legacy optimizer makes the coefficients of its updates on each variable's ps, each reading its `learning_rate`
variable, which lives on one ps: every other ps received the rate from that one in every step, a transfer between two
ps ahead of each step's updates there (bench/results/ps_floor/cross_ps/NOTES.md). Each other ps keeps a copy instead
(a resource variable shared by name on that ps, in no model and no checkpoint), which every scheduled function sets
from the rate's variable once, before its steps; the coefficients made on that ps read the copy. A rate changed between
scheduled functions (by a callback such as `LearningRateScheduler`, or a restore) reaches every ps with the next
function, as before; one changed by a step itself reaches the other ps with the next function, not the next step.

Where the rate is a schedule, a callable, or not made yet when the function is first traced, or the optimizer is not a
legacy one, nothing changes (`tfps._tf_private.learning_rate_variable`).
"""

import contextlib
import uuid
from typing import Dict, Optional, Tuple

import tensorflow as tf

from tfps import _tf_private


class RateCopies:
  """The learning rate's copies of one runner's optimizer, one on each ps but the rate's own.

  In a function: `set(optimizer)` before the steps, then their updates traced inside `reading(optimizer)`.
  """

  def __init__(self, num_ps: int):
    self._num_ps = num_ps
    self._name = f"tfps_rate_copy/{uuid.uuid4().hex}"  # this runner's copies, apart from any other on the same ps
    self._handles: Dict[int, Tuple[tf.Tensor, tf.DType]] = {}  # ps task -> its copy, in the function being traced

  def set(self, optimizer) -> None:
    """In a function being traced, before its steps: each copy takes the rate's value (one transfer to each other ps
    per function). Without a rate to copy (see the module docstring), the steps read the rate itself."""
    self._handles = {}
    rate = _tf_private.learning_rate_variable(optimizer)
    if rate is None or _ps_task(rate.device) is None:
      return
    with tf.device(rate.device):
      value = tf.convert_to_tensor(rate)
    for task in range(self._num_ps):
      if task == _ps_task(rate.device):
        continue
      with tf.device(f"/job:ps/replica:0/task:{task}/device:CPU:0"):
        handle = tf.raw_ops.VarHandleOp(dtype=rate.dtype, shape=[], shared_name=self._name, container="")
        tf.raw_ops.AssignVariableOp(resource=handle, value=value)  # ordered before the steps' reads (same handle)
      self._handles[task] = (handle, rate.dtype)

  def reading(self, optimizer):
    """While a step's updates are traced (after `set` in the same function): the optimizer's coefficients on each ps
    with a copy read the copy."""
    if not self._handles:
      return contextlib.nullcontext()
    return _tf_private.learning_rate_read(optimizer, self._read)

  def _read(self, device: str) -> Optional[tf.Tensor]:
    copy = self._handles.get(_ps_task(device))
    if copy is None:
      return None
    with tf.device(device):
      return tf.raw_ops.ReadVariableOp(resource=copy[0], dtype=copy[1])


def _ps_task(device: str) -> Optional[int]:
  """The ps task index of a device name, or None where it names no ps."""
  spec = tf.DeviceSpec.from_string(device or "")
  return spec.task if spec.job == "ps" else None
