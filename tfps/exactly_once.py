"""Steps applied once even when a scheduled training function is run again after a worker failure.

ParameterServerStrategy runs a function that was on a failed worker again, in full, on another worker, although it
may already have applied some of its steps to the ps. `StepProgress` records on a ps how many of its steps each
scheduled function has applied, and a function run again starts after those. Scheduled function number `seq` owns
slot `seq % SLOTS` of a progress vector and writes absolute values (`seq * stride + steps done`), so a slot needs no
reset and a re-run knows exactly where its first run stopped. Both training paths use it: `install` for tf-keras
`Model.fit`, `tfps.loop` for the coordinator loop.

The record is placed beside the counter each step increments (the optimizer's `iterations`, the loop's global step)
and depends on nothing but that increment, so both run on the same ps. What remains: on the Keras path a run with 3
worker kills in 400 steps still ends a step or two over now and then (401 in 2 of 7 runs checked exactly, 400 in the
others; in 3 more runs with one step at a time in the loop: 400, 401, 402; 9 over without records). Neither making a
re-run wait a second for the dead worker's last step to land nor running the loop's iterations strictly one after
another changed it, so the cause is not a step still in flight nor records landing out of order; it is not found.
The coordinator loop (Estimator path) has ended exact in every run measured.
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

  def first_step(self, seq, steps):
    """In a scheduled function: the first of its `steps` steps not applied yet (`steps` if all were)."""
    done = self.variable[seq % SLOTS] - seq * self.stride
    return tf.minimum(tf.maximum(done, 0), tf.cast(steps, tf.int64))

  def record(self, seq, step, increment):
    """In a scheduled function: step `step` (0-based) of function `seq` is applied; `increment` is the op or value by
    which that step incremented the counter (the record depends on it alone)."""
    with tf.control_dependencies([increment]):
      return self.variable.scatter_update(tf.IndexedSlices(tf.reshape(seq * self.stride + tf.cast(step, tf.int64) + 1,
                                                                      [1]), tf.reshape(seq % SLOTS, [1])))


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
    for step in tf.range(progress.first_step(seq, steps), steps):
      model.distribute_strategy.run(model.train_step, args=(next(iterator),))
      # The read of the optimizer's step counter comes after the step's increment (ops on one variable keep program
      # order) and runs on the counter's ps, as the record does.
      progress.record(seq, step, model.optimizer.iterations.read_value())
    # The metrics' results, not the last step's outputs: a re-run may have no step left to run. tf-keras replaces the
    # logs with these results at every epoch end anyway.
    return model.get_metrics_result()

  traced = tf.function(train_function, reduce_retracing=True)

  keras_train.set_train_function(model, lambda iterator, steps: coordinator.schedule(
      traced, args=(iterator, tf.constant(steps, tf.int64), progress.next_sequence())))
  return traced, progress
