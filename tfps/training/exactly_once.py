"""Steps applied once, and counted once, even when a scheduled training function is run again after a worker failure.

ParameterServerStrategy runs a function that was on a failed worker again, in full, on another worker, although it
may already have applied some of its steps to the ps. `StepProgress` records on a ps how many of its steps each
scheduled function has applied (the async runner: all of them once they all ran, rule 2), and a function run again
starts after those. Scheduled function number `seq` owns slot `seq % SLOTS` of a progress vector and holds absolute
values (`seq * stride + steps done`), so a slot needs no reset.

Four rules keep a step's effect on the ps whole when its worker dies; `tfps.training.asynchronous.AsyncRunner` applies
all four on both training paths (tf-keras `Model.fit` and the Estimator path's coordinator loop). Rules 1 to 3, each
ps's updates of a step and its record of them, are `tfps.training.ps_records`; rule 4 is here.

1. A step's updates on a ps start only once all its gradients for that ps are there
   (`ps_records.updates_after_every_gradient`). tf-keras would otherwise apply each gradient, and its current
   optimizers increment the step counter, as soon as it arrives. A worker that dies before sending its last gradient
   leaves each ps with all or none of its updates of that step applied (a ps does not wait for another's gradients;
   rule 3 applies the rest). (Not for an optimizer that clips or scales its gradients: see
   `ps_records.updates_after_every_gradient`.) With pipelined updates a ps also waits for its reads of the next step,
   which the updates follow (`step_order.after_reads`): an embedding lookup there awaits the worker's ids, and a ps
   that applied its dense layers' updates while the table's awaited them was left with the step applied in part when
   the worker died, and the re-run applied that part again.
2. A scheduled function is recorded (all its steps at once) only after its loop ended, every op of its steps run on
   every ps, so a re-run never skips a step that did not reach every ps. A re-run of a function whose worker died
   mid-way starts at its first step, and each ps skips the steps it applied (rule 3): those are computed again, not
   applied again. (Recording each step cost a control signal from every other ps to the progress vector's in every
   step.)
3. Each ps records the steps it applied, right after its own updates, and a step run again skips the updates its ps
   applied already (`ps_records.PsRecords`). When a worker dies, a ps still awaiting a tensor of its step cancels that
   step, and the cancellation reaches every ps that awaits a signal from that one: measured with two ps, the ps
   holding the record was cancelled after its own updates had run, so the step was applied on both ps and not
   recorded.
4. The step counter is settled from the records wherever every function has ended (`AsyncRunner.settle`: at each
   tf-keras epoch end, after each chunk of the coordinator loop), so a step counted but not recorded is not counted
   twice.

`bench/worker_kills.py` counts, with weights whose gradient is always 1, how many times each step reached the ps.
"""

from absl import logging
import numpy as np
import tensorflow as tf


SLOTS = 16_384  # more than the functions scheduled between two joins of the coordinator


def check_functions_per_join(steps: int, steps_per_execution: int) -> None:
  """Raises `ValueError` where `steps` between two joins of the coordinator (a tf-keras epoch) need more scheduled
  functions than the progress vector tracks."""
  if -(-steps // steps_per_execution) > SLOTS:
    raise ValueError(f"`steps_per_epoch` ({steps}) needs more than {SLOTS} scheduled functions per epoch at "
                     f"{steps_per_execution} steps each; raise `steps_per_execution`")


class StepProgress:
  """The progress vector (on a ps) and the sequence numbers of scheduled functions; build under the strategy scope.

  Args:
    stride: the most steps one scheduled function runs.
    counter: the scalar step counter each step increments (on a ps); the vector is placed beside it.
  """

  def __init__(self, stride: int, counter: tf.Variable):
    # Beside the counter (see the module docstring). The vector (128 KiB) also stays whole on one ps this way, whatever
    # `min_shard_bytes` is: ParameterServerStrategy never partitions a variable created colocated with another, and a
    # sharded one could not be indexed by a tensor.
    with tf.distribute.get_strategy().extended.colocate_vars_with(counter):
      self.variable = tf.Variable(tf.zeros([SLOTS], tf.int64), trainable=False, name="tfps_step_progress",
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self.stride = stride
    self._next = 0

  def next_sequence(self) -> tf.Tensor:
    """The sequence number to schedule the next function with."""
    seq, self._next = self._next, self._next + 1
    return tf.constant(seq, tf.int64)

  @property
  def position(self) -> int:
    """The sequence number the next scheduled function gets (for `settle`)."""
    return self._next

  def begin(self, seq, steps):
    """At a scheduled function's start: `(slot, first)`, its slot (kept on the vector's ps, for `record`) and the
    first of its `steps` steps not applied yet (`steps` if all were), made on the caller's device: a loop over the
    steps starting there keeps its index there (on the ps, each iteration sent the index to the worker and back)."""
    with tf.device(self.variable.device):
      slot = tf.reshape(seq % SLOTS, [1])
      # A slot last used by an older function holds less than `seq * stride`: raise it to that, the "none done" mark.
      floor = self.variable.scatter_max(tf.IndexedSlices(tf.reshape(seq * self.stride, [1]), slot))
      with tf.control_dependencies([floor]):
        done = tf.gather(self.variable.read_value(), slot)[0] - seq * self.stride
      first = tf.minimum(tf.maximum(done, 0), tf.cast(steps, tf.int64))
    return slot, tf.identity(first)

  def record(self, slot, mark, after):
    """In a scheduled function: its step `mark` (`seq * stride + step index + 1`) is applied, once the ops or tensors
    in `after` have run (the step's updates: `step_order.after_updates`). Recording a step again changes nothing."""
    with tf.device(self.variable.device), tf.control_dependencies(after):
      return self.variable.scatter_max(tf.IndexedSlices(tf.reshape(tf.cast(mark, tf.int64), [1]), slot))

  def steps_recorded(self, since: int) -> int:
    """The steps recorded by the functions scheduled from position `since` on; call when they have all ended (after
    the coordinator's join)."""
    if self._next - since > SLOTS:
      raise RuntimeError(f"{self._next - since} functions were scheduled between two joins of the coordinator; at most "
                         f"{SLOTS} can be tracked")
    seqs = np.arange(since, self._next, dtype=np.int64)
    done = self.variable.numpy()[seqs % SLOTS] - seqs * self.stride
    return int(np.clip(done, 0, self.stride).sum())

  def settle(self, counter: tf.Variable, start: int, since: int) -> int:
    """Sets `counter` to `start` plus the steps recorded since position `since` (see the module docstring) and returns
    it; call when every function scheduled since has ended."""
    settled = start + self.steps_recorded(since)
    settle_counter(counter, settled)
    return settled


def settle_counter(counter: tf.Variable, settled: int) -> None:
  """Sets `counter` to `settled`, the steps the ps records say were applied, where it reads otherwise (a failed
  worker's step reached the counter's ps without its record and ran again); logs the correction."""
  counted = int(counter.numpy())
  if counted != settled:
    logging.info("Step counter settled at %d from the steps recorded on the ps (it read %d): a failed worker's step "
                 "reached the ps without its record and ran again", settled, counted)
    counter.assign(settled)
