"""Async training (ParameterServerStrategy's own): every worker step applies its gradients at once, each step applied
and counted once even when a worker dies (`tfps.training.exactly_once`, all four rules; table layers' bookkeeping
once per step and shard: `tfps.training.tables.StepMarks`). The dense gradients of each ps are sent in one transfer
per ps and step, and with `packed_reads` its small dense variables are read in one (`tfps.training.packing`); with
`lockfree_row_updates` a legacy Adagrad updates a batch's table rows all at once, lock-free (`tfps.training.modes`)."""

import contextlib

import tensorflow as tf

from tfps import _tf_private
from tfps.training import exactly_once
from tfps.training import packing
from tfps.training import steps as steps_lib
from tfps.training import tables


class AsyncRunner(steps_lib.Runner):
  """Packs up to `steps_per_execution` steps into one scheduled function `function(iterator, num_steps, seq)`.

  Attributes:
    function: the traced function it schedules (`seq` is `progress.next_sequence()`).
    progress: its `exactly_once.StepProgress`; `progress.ps_records` are the per-ps step records.
  """

  def __init__(self, step: steps_lib.Step, **kwargs):
    super().__init__(step, **kwargs)
    with self.strategy.scope():
      self.progress = exactly_once.StepProgress(self.steps_per_execution, step.counter)
    self.progress.ps_records = exactly_once.PsRecords()
    self.table_marks = tables.StepMarks(self.strategy)  # table layers' bookkeeping, once per step and shard
    # opt-in: the small dense variables of a ps read in one transfer per step
    self.packed_reads = packing.PackedReads() if self.mode.packed_reads else None
    self.function = tf.function(self._steps, autograph=False)  # a step's errors surface unwrapped
    self._start = (0, 0)

  def _steps(self, iterator, num_steps, seq):
    step, progress, strategy = self.step, self.progress, self.strategy
    num_steps = tf.cast(num_steps, tf.int64)
    slot, first = progress.begin(seq, num_steps)

    def body(index, loss_sum, examples):
      mark = seq * progress.stride + index + 1
      with exactly_once.updates_after_every_gradient(step.optimizer()), \
          (_tf_private.adagrad_rows_at_once(step.optimizer()) if self.mode.lockfree_row_updates
           else contextlib.nullcontext()), \
          progress.ps_records.skipping_applied(strategy, slot, mark) as ps_applied, \
          (self.packed_reads.reading(step.trainable_variables()) if self.packed_reads else contextlib.nullcontext()):
        loss, count = strategy.run(self.table_marks.marked(step.run, slot, mark), args=(next(iterator),))
        counted = None
        if not step.counts_itself:
          # Counted after the step's updates (so not before all its gradients are on their ps), through the
          # strategy's update too: skipped where the counter's ps applied this step already. Made on the counter's
          # ps from nothing of the worker's: a count built on the worker would wait there for the updates and go back
          # to the ps, a round trip in every step.
          with tf.device(step.counter.device), \
              tf.control_dependencies(exactly_once.after_updates(step.variables())):
            counted = step.count(1)
      after = exactly_once.after_updates(step.variables() + [step.counter]) + ps_applied()
      progress.record(slot, after + ([counted] if counted is not None else []))
      # The next step waits for this one's record: tf.function orders every stateful op of the loop body before the
      # next iteration, and gathers those of each ps into one signal, so no control edge of its own is sent.
      if step.outputs_use_loss:  # else the loss (a metric's result, on a ps) is not read back every step
        loss_sum += tf.cast(loss, tf.float32)
      return index + 1, loss_sum, examples + tf.cast(count, tf.int64)

    start = (first, tf.constant(0.0, tf.float32), tf.constant(0, tf.int64))
    _, loss_sum, examples = tf.while_loop(lambda index, *_: index < num_steps, body, start, parallel_iterations=1)
    return step.outputs(loss_sum, examples)

  def schedule(self, iterator, num_steps: int):
    return self.coordinator.schedule(self.function, args=(iterator, tf.constant(num_steps, tf.int64),
                                                          self.progress.next_sequence()))

  def begin(self) -> None:
    self._start = (int(self.step.counter.numpy()), self.progress.position)

  def settle(self) -> int:
    return self.progress.settle(self.step.counter, *self._start)
