"""Steps applied once even when a scheduled training function is run again after a worker failure.

ParameterServerStrategy runs a function that was on a failed worker again, in full, on another worker, although it
may already have applied some of its steps to the ps. `StepProgress` records on a ps how many of its steps each
scheduled function has applied, and a function run again starts after those. Scheduled function number `seq` owns
slot `seq % SLOTS` of a progress vector and holds absolute values (`seq * stride + steps done`), so a slot needs no
reset and a re-run knows exactly where its first run stopped. Both training paths use it: `install` for tf-keras
`Model.fit`, `tfps.loop` for the coordinator loop.

The record sits beside the counter each step increments (the optimizer's `iterations`, the loop's global step), and
everything it needs (its slot) is on that ps before the function's first step, so it waits for nothing from the worker.
It still cannot be atomic with the step. A step's update is many ops (one per variable, on each ps), and when the
worker a step came from dies, the ps runs none of that step's remaining ops, not even ones that need nothing from the
worker: a trace of every increment, written by a ps-local op after it, lacked exactly one increment in each of the 3
of 8 runs (3 worker kills each) that ended at 401 of 400 steps. So a worker failure can leave one step applied (or
partly applied) without its record, and the re-run applies it again: at most one step per failed function, where
ParameterServerStrategy alone runs the whole function again (9 steps over in the same test). On the Keras path this
leaves 401 or 402 of 400 steps in about half the runs (9 of 18 at 401); the coordinator loop (Estimator path) has
ended exact in every run measured.
"""

import itertools

import tensorflow as tf
import tf_keras

from tfps import keras_train

SLOTS = 16_384  # more than the functions scheduled between two joins of the coordinator


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
    self._sequence = itertools.count()

  def next_sequence(self) -> tf.Tensor:
    """The sequence number to schedule the next function with."""
    return tf.constant(next(self._sequence), tf.int64)

  def begin(self, seq, steps):
    """At a scheduled function's start: `(slot, first)`, its slot (kept on the vector's ps, for `record`) and the
    first of its `steps` steps not applied yet (`steps` if all were)."""
    with tf.device(self.variable.device):
      slot = tf.reshape(seq % SLOTS, [1])
      # A slot last used by an older function holds less than `seq * stride`: raise it to that, the "none done" mark.
      floor = self.variable.scatter_max(tf.IndexedSlices(tf.reshape(seq * self.stride, [1]), slot))
      with tf.control_dependencies([floor]):
        done = tf.gather(self.variable.read_value(), slot)[0] - seq * self.stride
      return slot, tf.minimum(tf.maximum(done, 0), tf.cast(steps, tf.int64))

  def record(self, slot, increment):
    """In a scheduled function: one more of its steps is applied; `increment` is the op or value by which that step
    incremented the counter. Everything the record needs is on the counter's ps before the step starts, so once the
    increment has run, nothing from the worker is awaited before the record runs too."""
    with tf.device(self.variable.device), tf.control_dependencies([increment]):
      return self.variable.scatter_add(tf.IndexedSlices(tf.ones([1], tf.int64), slot))


def install(model: tf_keras.Model, max_steps_per_execution: int, steps_per_epoch: int):
  """Makes `model.fit` under ParameterServerStrategy apply each step once; call under the strategy scope.

  Returns `(train_function, progress)`: the function it schedules, `(iterator, steps, seq)`, and its `StepProgress`.
  """
  if -(-steps_per_epoch // max_steps_per_execution) > SLOTS:
    raise ValueError(f"`steps_per_epoch` ({steps_per_epoch}) needs more than {SLOTS} scheduled functions per epoch "
                     f"at {max_steps_per_execution} steps each; raise `steps_per_execution`")
  progress = StepProgress(max_steps_per_execution, model.optimizer.iterations)
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(model.distribute_strategy)

  def train_function(iterator, steps, seq):
    slot, first = progress.begin(seq, steps)
    for _ in tf.range(first, steps):
      model.distribute_strategy.run(model.train_step, args=(next(iterator),))
      # The read of the optimizer's step counter comes after the step's increment (ops on one variable keep program
      # order) and runs on the counter's ps, as the record does.
      progress.record(slot, model.optimizer.iterations.read_value())
    # The metrics' results, not the last step's outputs: a re-run may have no step left to run. tf-keras replaces the
    # logs with these results at every epoch end anyway.
    return model.get_metrics_result()

  traced = tf.function(train_function, reduce_retracing=True)

  keras_train.set_train_function(model, lambda iterator, steps: coordinator.schedule(
      traced, args=(iterator, tf.constant(steps, tf.int64), progress.next_sequence())))
  return traced, progress
