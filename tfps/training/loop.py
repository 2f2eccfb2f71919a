"""The coordinator training loop: the outer loop around a training mode's runner (`tfps.training.steps.Runner`).

What a step is (a `Step`) and how the mode drives steps (the `Runner`) are not this module's concern. It runs the
runner in chunks up to each log or checkpoint boundary, joins the coordinator and lets the runner settle the step
counter after each chunk, saves checkpoints at fixed step intervals and writes the step log
(`step | loss | steps/s | ex/s`, then any `metrics()` the caller gives, e.g. dynamic tables' `<layer>/occupancy`) to
absl logging, `model_dir/loss.log` and TensorBoard. A run's first functions (one per worker) run alone, and its
first line measures the steps after them: the function's trace on the chief and its first run on each worker are not
training. Given a delta schedule (`tfps.training.delta_schedule`), it writes the deltas due after a chunk (no step in
flight then) and the last one at the end.
"""

import dataclasses
import os
import time
from typing import Callable, Dict, List, Optional

from absl import logging
import tensorflow as tf

from tfps import checks
from tfps import run_records
from tfps.training import checkpoints
from tfps.training import steps as steps_lib
from tfps.formatting import format_duration, format_rate

LOSS_LOG = "loss.log"


def build_global_step() -> tf.Variable:
  """The int64 step counter; create it under the strategy scope so that it lives on a ps."""
  return tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """How often the loop logs and saves.

  Attributes:
    log_every_steps: one step-log line every this many steps.
    checkpoint_every_steps: one checkpoint every this many steps (and one at the end).
  """

  log_every_steps: int = 100
  checkpoint_every_steps: int = 1000

  def __post_init__(self):
    for field in dataclasses.fields(self):
      checks.positive_int(field.name, getattr(self, field.name))


def _next_multiple(step: int, every: int) -> int:
  return (step // every + 1) * every


class TrainLoop:
  """Drives a runner on the ClusterCoordinator until the step counter (the global step) reaches `max_steps`.

  Between chunks (at every log or checkpoint boundary) it joins the coordinator, so a checkpoint always holds the
  variables of exactly the step it is named after.
  """

  def __init__(self, *, runner: steps_lib.Runner, iterator, checkpoint_manager: checkpoints.CheckpointWriter,
               config: LoopConfig, model_dir: str, metrics: Optional[Callable[[], Dict[str, float]]] = None,
               deltas=None):
    self._runner = runner
    self._deltas = deltas  # a `delta_schedule.DeltaSchedule`, or None
    self._metrics = metrics  # read at each step-log line, after its steps
    self._iterator = iterator
    self._global_step = runner.step.counter
    self._manager = checkpoint_manager
    self._config = config
    self._model_dir = model_dir
    self._writer = tf.summary.create_file_writer(model_dir)

  @property
  def step(self) -> int:
    """The global step, read from its ps."""
    return int(self._global_step.numpy())

  def run(self, max_steps: Optional[int], after_checkpoint: Optional[Callable[[int], None]] = None) -> int:
    """Trains until the global step reaches `max_steps` (None: until the input ends); returns the final step.

    `after_checkpoint(step)` runs after each checkpoint is saved (e.g. an inline evaluation).
    """
    step = self.step
    self._begin_deltas()
    self._records = run_records.RunRecorder(self._model_dir, start_step=step)
    self._examples, self._loss, self._last_metrics = 0, None, {}
    last_saved = step
    clock = (time.monotonic(), step)
    while max_steps is None or step < max_steps:
      boundary = min(_next_multiple(step, self._config.log_every_steps),
                     _next_multiple(step, self._config.checkpoint_every_steps))
      if max_steps is not None:
        boundary = min(boundary, max_steps)
      try:
        loss_sum, examples, measured = self._run_chunk(boundary - step, step == self._records.start_step)
      except tf.errors.OutOfRangeError:
        logging.info("The training input ended at step %d", self.step)
        step = self.step
        break
      if measured is not None:  # a run's first chunk: measured after its first function
        clock, self._examples = (measured[0], clock[1] + measured[1]), self._examples + measured[2]
      step = self.step
      clock = self._log(step, loss_sum, examples, clock, max_steps)
      if step >= last_saved + self._config.checkpoint_every_steps or step == max_steps:
        self._save(step, after_checkpoint)
        last_saved = step
        clock = (time.monotonic(), step)  # an evaluation after the checkpoint is not training time
      if self._wrote_delta_due():
        clock = (time.monotonic(), step)  # writing a delta is not training time
    if last_saved != step:
      self._save(step, after_checkpoint)
    self._finish_deltas()
    self._writer.flush()
    self._records.finish(step, {} if self._loss is None else {"loss": self._loss, **self._last_metrics},
                         examples=self._examples,
                         tensorboard=self._model_dir)
    return step

  def stream_position(self):
    """`(stream name, position after the last example trained on)` where training reads a stream, else None."""
    return None

  def _begin_deltas(self) -> None:
    """The base export, unless the schedule wrote one already (on a stream with its position: the examples before it
    are in the base)."""
    if self._deltas is not None:
      self._deltas.begin(self.stream_position())

  def _wrote_delta_due(self) -> bool:
    """Writes a delta where one is due (between chunks: no step in flight); whether one was written."""
    return self._deltas is not None and self._deltas.maybe_write(self.stream_position()) is not None

  def _finish_deltas(self) -> None:
    """The last delta of the run (where anything was trained since the last export)."""
    if self._deltas is not None:
      self._deltas.finish(self.stream_position())

  def _run_chunk(self, num_steps: int, first: bool = False):
    """Runs `num_steps` steps through the runner, `steps_per_execution` at a time, and waits for them; returns the
    summed loss and examples of the steps measured, and where not all are: `(time measured from, steps and examples
    not measured)`. With `first` (a run's first chunk of more than one function) its first functions, one per worker
    (fewer where the chunk has fewer functions after them), run before the rest and are not measured: the coordinator
    traces the function on the chief where it is first scheduled, and each worker prepares it at its first run
    (seconds, before any step; longer with unrolled steps)."""
    self._runner.begin()
    spe = self._runner.steps_per_execution
    warm = min(self._runner.num_workers, -(-num_steps // spe) - 1) if first else 0
    results, measured, scheduled = [], None, 0
    while num_steps > 0:
      count = min(num_steps, spe)
      results.append(self._runner.schedule(self._iterator, count))
      num_steps, scheduled = num_steps - count, scheduled + count
      if len(results) == warm:
        self._runner.coordinator.join()
        measured = (time.monotonic(), scheduled)
    self._runner.coordinator.join()
    self._runner.settle()
    sums = [(float(loss), int(examples)) for loss, examples in (result.fetch() for result in results)]
    if measured is not None:
      measured, sums = (*measured, sum(examples for _, examples in sums[:warm])), sums[warm:]
    return sum(loss for loss, _ in sums), sum(examples for _, examples in sums), measured

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
    extra = self._metrics() if self._metrics is not None else {}
    line += "".join(f" | {name} {value:g}" for name, value in extra.items())
    logging.info(line)
    self._examples, self._loss, self._last_metrics = self._examples + examples, loss, extra
    self._records.progress(step, {"loss": loss, **extra}, examples / seconds)
    with open(os.path.join(self._model_dir, LOSS_LOG), "a", encoding="utf-8") as log:
      log.write(line + "\n")
    with self._writer.as_default(step=step):
      tf.summary.scalar("loss", loss)
      tf.summary.scalar("global_step/sec", steps / seconds)
      tf.summary.scalar("examples/sec", examples / seconds)
      for name, value in extra.items():
        tf.summary.scalar(name, value)
    return now, step

  def _save(self, step: int, after_checkpoint: Optional[Callable[[int], None]]) -> None:
    self._manager.save(checkpoint_number=step)
    if after_checkpoint is not None:
      after_checkpoint(step)

