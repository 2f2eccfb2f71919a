"""The coordinator training loop: how steps are driven, kept apart from what a step is.

A step is any `step_fn(batch) -> (loss, num_examples)` run in replica context; the Estimator path builds one from a
model_fn, other training modes bring their own. This module packs steps into scheduled functions, counts them in a
global step kept on a ps (a function run again after a worker failure skips the steps it applied: `exactly_once`),
saves checkpoints at fixed step intervals and writes the step log (`step | loss | steps/s | ex/s`) to absl logging,
`model_dir/loss.log` and TensorBoard.
"""

import dataclasses
import os
import time
from typing import Callable, List, Optional

from absl import logging
import tensorflow as tf

from tfps.training import exactly_once
from tfps.formatting import format_duration, format_rate

LOSS_LOG = "loss.log"


def build_global_step() -> tf.Variable:
  """The int64 step counter; create it under the strategy scope so that it lives on a ps."""
  return tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


def build_train_function(strategy: tf.distribute.Strategy, step_fn: Callable, global_step: tf.Variable,
                         progress: exactly_once.StepProgress, variables: Callable[[], List[tf.Variable]]) -> Callable:
  """A `tf.function(iterator, num_steps, seq) -> (loss_sum, num_examples)` running `num_steps` steps of `step_fn`.

  `seq` is `progress.next_sequence()`: a function run again after a worker failure skips the steps it applied.
  `variables()` gives the variables a step updates (they may be created by the step's first trace); a step is recorded
  after their updates.
  """

  @tf.function(autograph=False)  # errors in step_fn surface as raised, not wrapped in autograph's StagingError
  def train_steps(iterator, num_steps, seq):
    def body(index, loss_sum, examples):
      loss, count = strategy.run(step_fn, args=(next(iterator),))
      with tf.control_dependencies([loss]):
        global_step.assign_add(1)
      recorded = progress.record(slot, exactly_once.after_updates(variables() + [global_step]))
      with tf.control_dependencies([recorded]):
        return index + 1, loss_sum + tf.cast(loss, tf.float32), examples + tf.cast(count, tf.int64)

    slot, first = progress.begin(seq, num_steps)
    first = tf.cast(first, tf.int32)
    start = (first, tf.constant(0.0, tf.float32), tf.constant(0, tf.int64))
    _, loss_sum, examples = tf.while_loop(lambda index, *_: index < num_steps, body, start, parallel_iterations=1)
    return loss_sum, examples

  return train_steps


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """How the loop drives steps.

  Attributes:
    steps_per_execution: steps packed into one scheduled function.
    log_every_steps: one step-log line every this many steps.
    checkpoint_every_steps: one checkpoint every this many steps (and one at the end).
  """

  steps_per_execution: int = 10
  log_every_steps: int = 100
  checkpoint_every_steps: int = 1000

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{field.name}` ({value!r}) must be a positive integer")


def _next_multiple(step: int, every: int) -> int:
  return (step // every + 1) * every


class TrainLoop:
  """Drives a packed train function on a ClusterCoordinator until the global step reaches `max_steps`.

  Between chunks (at every log or checkpoint boundary) it joins the coordinator, so a checkpoint always holds the
  variables of exactly the step it is named after.
  """

  def __init__(self, *, coordinator, train_function: Callable, iterator, global_step: tf.Variable,
               progress: exactly_once.StepProgress, checkpoint_manager: tf.train.CheckpointManager,
               config: LoopConfig, model_dir: str, sync_steps=None, static_steps: bool = False):
    self._coordinator = coordinator
    self._progress = progress
    self._train_function = train_function
    self._iterator = iterator
    self._global_step = global_step
    self._manager = checkpoint_manager
    self._config = config
    self._model_dir = model_dir
    self._writer = tf.summary.create_file_writer(model_dir)
    self._sync_steps = sync_steps  # a tfps.training.sync.SyncSteps: steps run in sync mode, not packed async
    self._static_steps = static_steps  # the train function takes its step count as a Python int (geo rounds)

  @property
  def step(self) -> int:
    """The global step, read from its ps."""
    return int(self._global_step.numpy())

  def run(self, max_steps: Optional[int], after_checkpoint: Optional[Callable[[int], None]] = None) -> int:
    """Trains until the global step reaches `max_steps` (None: until the input ends); returns the final step.

    `after_checkpoint(step)` runs after each checkpoint is saved (e.g. an inline evaluation).
    """
    step = self.step
    last_saved = step
    clock = (time.monotonic(), step)
    while max_steps is None or step < max_steps:
      boundary = min(_next_multiple(step, self._config.log_every_steps),
                     _next_multiple(step, self._config.checkpoint_every_steps))
      if max_steps is not None:
        boundary = min(boundary, max_steps)
      try:
        loss_sum, examples = self._run_chunk(step, boundary - step)
      except tf.errors.OutOfRangeError:
        logging.info("The training input ended at step %d", self.step)
        step = self.step
        break
      step = self.step
      clock = self._log(step, loss_sum, examples, clock, max_steps)
      if step >= last_saved + self._config.checkpoint_every_steps or step == max_steps:
        self._save(step, after_checkpoint)
        last_saved = step
        clock = (time.monotonic(), step)  # an evaluation after the checkpoint is not training time
    if last_saved != step:
      self._save(step, after_checkpoint)
    self._writer.flush()
    return step

  def _run_chunk(self, step: int, num_steps: int):
    """From global step `step`, schedules `num_steps` steps in functions of at most `steps_per_execution` steps and
    waits for them."""
    if self._sync_steps is not None:
      loss_sum, examples, _ = self._sync_steps.run(self._iterator, num_steps)
      return loss_sum, examples
    results: List = []
    start = (step, self._progress.position)
    while num_steps > 0:
      count = min(num_steps, self._config.steps_per_execution)
      steps = count if self._static_steps else tf.constant(count, tf.int32)
      results.append(self._coordinator.schedule(
          self._train_function, args=(self._iterator, steps, self._progress.next_sequence())))
      num_steps -= count
    self._coordinator.join()
    if not self._static_steps:  # a geo round is recorded once for all its steps
      self._progress.settle(self._global_step, *start)
    loss_sum, examples = 0.0, 0
    for result in results:
      loss, count = result.fetch()
      loss_sum, examples = loss_sum + float(loss), examples + int(count)
    return loss_sum, examples

  def _log(self, step: int, loss_sum: float, examples: int, clock, max_steps: Optional[int]):
    start_time, start_step = clock
    now = time.monotonic()
    steps = max(step - start_step, 1)
    seconds = max(now - start_time, 1e-9)
    loss = loss_sum / steps
    line = (f"step {step} | loss {loss:.4f} | {format_rate(steps / seconds)} steps/s | "
            f"{format_rate(examples / seconds)} ex/s")
    if max_steps is not None:
      line += f" | eta {format_duration((max_steps - step) * seconds / steps)}"
    logging.info(line)
    with open(os.path.join(self._model_dir, LOSS_LOG), "a", encoding="utf-8") as log:
      log.write(line + "\n")
    with self._writer.as_default(step=step):
      tf.summary.scalar("loss", loss)
      tf.summary.scalar("global_step/sec", steps / seconds)
      tf.summary.scalar("examples/sec", examples / seconds)
    return now, step

  def _save(self, step: int, after_checkpoint: Optional[Callable[[int], None]]) -> None:
    path = self._manager.save(checkpoint_number=step)
    logging.info("Saved checkpoint %s", path)
    if after_checkpoint is not None:
      after_checkpoint(step)

