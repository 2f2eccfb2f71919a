"""The callbacks `tfps.fit` adds: a progress line per logging interval, dynamic tables' metrics and a checkpoint per
epoch."""

import math
import os
import threading
import time
from typing import Optional

from absl import logging
import tensorflow as tf
import tf_keras

from tfps import _tf_private
from tfps.training import checkpoints as checkpoints_lib
from tfps import run_records
from tfps.training import tables
from tfps.formatting import format_duration, format_rate


_MIN_SAMPLE_SECS = 0.05  # `interval_secs=0`: a line whenever the step moved, at most this often
RECORD_SECS = 1.0  # a progress record (what tfps-report plots) this often while steps run; lines every interval


class ProgressLogger(tf_keras.callbacks.Callback):
  """Logs `epoch | step | loss | ex/s` every `interval_secs` on the chief, without slowing training down.

  Under ParameterServerStrategy `fit` schedules an epoch's functions long before they run (the coordinator queues them),
  so its batch hooks say nothing about progress. A thread of this callback reads, every interval, the optimizer's step
  from its ps and fetches the loss of the newest function that ran that far (done: no wait); the rate is the steps since
  the previous line (or the epoch's start) over the time, training only. The clock of a fit's first steps starts once
  the thread first sees the step move: the trace of the training function before them (seconds) is not training. In geo
  mode the step moves once per round, when a worker pushes its steps. The loss is the epoch's running mean, as tf-keras
  reports it. With a `recorder`, the thread also writes a progress record every `RECORD_SECS` (or `interval_secs` if
  shorter) while steps run, with the rate since the previous record, and each epoch's metrics go to the run records
  (`model_dir/run/`), its rate over the epoch's training (from the clock's start in the first); the summary is written
  when training ends.
  """

  def __init__(self, steps_per_epoch: int, epochs: int, batch_size: Optional[int], interval_secs: float = 10.0,
               recorder: Optional[run_records.RunRecorder] = None):
    super().__init__()
    _tf_private.accept_remote_logs(self)  # so batch hooks are allowed under ParameterServerStrategy
    self.recorder = recorder
    self._final_logs = {}
    self.steps_per_epoch = steps_per_epoch
    self.epochs = epochs
    self.batch_size = batch_size
    self.interval_secs = interval_secs
    self._epoch = 0
    self._last = (0.0, 0)  # (time, global step) of the previous record or of the epoch's start
    self._last_line = (0.0, 0)  # the same for the previous line
    self._logs_at = {}  # steps into the epoch at a scheduled function's end -> its logs
    self._training = False  # the epoch's steps run (not its validation)
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._sampler = None
    self._epoch_began = time.monotonic()
    self._epoch_start = (self._epoch_began, 0)  # (time, global step) the epoch's training rate is measured from
    self._epoch_end: Optional[float] = None  # when its training ended (its validation comes after)
    self._clock_started = False  # the thread saw this fit's first steps run (their trace is over)
    self._began = False  # an epoch began in this run (the first one > 0 means a resumed run)

  def on_train_begin(self, logs=None):
    self._clock_started = False
    self._stop.clear()
    # The step counter itself, taken before any step is traced: while one is, a current tf-keras optimizer's
    # `iterations` is a tensor of the trace (`_tf_private`'s step copies), which this thread must not read.
    self._sampler = threading.Thread(target=self._sample_until_stopped, args=(self.model.optimizer.iterations,),
                                     name="tfps-progress", daemon=True)
    self._sampler.start()

  def on_epoch_begin(self, epoch, logs=None):
    if not self._began and epoch > 0 and self.recorder is not None:  # a resumed run (`fitting._resume` says so)
      self.recorder.start_step = epoch * self.steps_per_epoch
    with self._lock:
      self._epoch = epoch
      self._began = True
      self._last = self._last_line = (time.monotonic(), epoch * self.steps_per_epoch)  # not evaluation, checkpoints
      self._epoch_began, self._epoch_start, self._epoch_end = self._last[0], self._last, None
      self._logs_at = {}
      self._training = True

  def on_train_batch_end(self, batch, logs=None):
    with self._lock:
      self._logs_at[batch + 1] = logs  # scheduled, not run yet: the sampler fetches it once the step got there

  def _sample_until_stopped(self, iterations: tf.Variable):
    poll_secs = max(min(self.interval_secs, RECORD_SECS if self.recorder is not None else self.interval_secs),
                    _MIN_SAMPLE_SECS)
    while not self._stop.wait(poll_secs):
      try:
        step = int(iterations.numpy())
      except (tf.errors.OpError, RuntimeError, ValueError):  # the cluster is going away: the run's end says why
        return
      except TypeError:  # geo mode while a round is traced: its variables answer from local copies; look again
        continue
      with self._lock:
        if not self._training or step <= self._last[1]:
          continue
        now, epoch, first = time.monotonic(), self._epoch, self._epoch * self.steps_per_epoch
        if not self._clock_started:  # the first steps ran: the clock starts now, after the function's trace
          self._clock_started = True
          self._last = self._last_line = self._epoch_start = (now, step)
          continue
        rate = (step - self._last[1]) / (now - self._last[0])
        line_rate = (step - self._last_line[1]) / (now - self._last_line[0])
        line = now - self._last_line[0] >= self.interval_secs
        self._last = (now, step)
        if line:
          self._last_line = self._last
        done = [at for at in self._logs_at if at <= step - first]
        logs = self._logs_at[max(done)] if done else None
      loss = self._loss_of(logs)
      if self.recorder is not None:
        self.recorder.progress(step, {} if loss is None else {"loss": loss},
                               rate * self.batch_size if self.batch_size else None)
      if line:
        self._log_line(epoch, step, loss, line_rate)

  @staticmethod
  def _loss_of(logs) -> Optional[float]:
    try:
      return _fetch_scalar(_fetch(logs or {}).get("loss"))
    except tf.errors.OpError:  # that function failed on a lost worker and runs again elsewhere
      return None

  def _log_line(self, epoch: int, step: int, loss: Optional[float], rate: float) -> None:
    """The progress line at global `step` of `epoch`, with the loss of a function that ran, `rate` steps/s."""
    speed = f"{format_rate(rate * self.batch_size)} ex/s" if self.batch_size else f"{format_rate(rate)} steps/s"
    eta = (self.epochs * self.steps_per_epoch - step) / rate if rate else 0
    loss_text = "-" if loss is None else f"{loss:.4f}"
    logging.info("epoch %d/%d | step %d/%d | loss %s | %s | eta %s", epoch + 1, self.epochs,
                 step - epoch * self.steps_per_epoch, self.steps_per_epoch, loss_text, speed, format_duration(eta))

  def on_test_begin(self, logs=None):
    with self._lock:
      self._training = False
      if self._epoch_end is None:
        self._epoch_end = time.monotonic()

  def on_epoch_end(self, epoch, logs=None):
    with self._lock:
      self._training = False
      self._clock_started = True  # the next epochs' functions are traced already
    values = {name: _fetch_scalar(value) for name, value in (logs or {}).items()}
    values = {name: value for name, value in values.items() if value is not None}
    logging.info("epoch %d/%d done | %s", epoch + 1, self.epochs,
                 " | ".join(f"{name} {value:.4f}" for name, value in values.items()))
    self._final_logs = values
    if self.recorder is not None:
      step = (epoch + 1) * self.steps_per_epoch
      train, validation = run_records.split_metrics(values)
      self.recorder.progress(step, train, self._epoch_speed(step))
      if validation:
        self.recorder.validation(step, validation)

  def _epoch_speed(self, step: int) -> Optional[float]:
    """Examples/s of the epoch ending at `step`, over its training from its start (or the clock's)."""
    (start, start_step), end = self._epoch_start, self._epoch_end or time.monotonic()
    if start_step >= step:  # the clock started at the epoch's end: over the whole epoch, trace included
      start, start_step = self._epoch_began, step - self.steps_per_epoch
    if not self.batch_size or end <= start:
      return None
    return (step - start_step) * self.batch_size / (end - start)

  def stop(self) -> None:
    """Stops the sampling thread: at the end of training, and where fit ends with an error (tf-keras then calls no
    `on_train_end`, and the thread would go on reading the step of a model that is gone)."""
    self._stop.set()
    if self._sampler is not None:
      self._sampler.join(timeout=30)
      self._sampler = None

  def on_train_end(self, logs=None):
    self.stop()
    if self.recorder is not None:
      step = int(self.model.optimizer.iterations.numpy())
      summary = self.recorder.finish(step, self._final_logs, tensorboard=os.path.join(self.recorder.model_dir, "logs"))
      logging.info("Run records in %s (steps %d, %.0fs)", run_records.run_dir(self.recorder.model_dir),
                   summary["steps"], summary["wall_secs"])


class DynamicTableMetrics(tf_keras.callbacks.Callback):
  """Adds each table layer's (`tfps.training.tables`, e.g. `DynamicEmbedding`) occupancy, admitted, evicted and
  fallbacks (`<layer>/<metric>`, read from the ps) to the epoch's logs, so the epoch line, the History and TensorBoard
  show them. Place it before those callbacks.

  The table layers are looked for once, at the first epoch's end (the model has run a step then): walking a model's
  submodules costs the chief milliseconds per epoch, more the larger the model.
  """

  def __init__(self):
    super().__init__()
    self._tables = None

  def set_model(self, model):
    super().set_model(model)
    self._tables = None

  def on_epoch_end(self, epoch, logs=None):
    if logs is None:
      return
    if self._tables is None:
      self._tables = tables.tables_of(self.model)
    logs.update(tables.table_metrics(self._tables))


class TerminateOnNaNAtEpochEnd(tf_keras.callbacks.Callback):
  """tf-keras's `TerminateOnNaN` at each epoch's end: under ParameterServerStrategy a batch's loss is a value on its
  worker (`TerminateOnNaN` failed on it), the epoch's is on the chief."""

  def on_epoch_end(self, epoch, logs=None):
    loss = _fetch_scalar((logs or {}).get("loss"))
    if loss is not None and not math.isfinite(loss):
      logging.warning("Epoch %d: invalid loss %s, terminating training", epoch + 1, loss)
      self.model.stop_training = True


def epoch_level(callback: tf_keras.callbacks.Callback) -> tf_keras.callbacks.Callback:
  """`callback`, or the epoch-level callback that does its job under ParameterServerStrategy."""
  return TerminateOnNaNAtEpochEnd() if type(callback) is tf_keras.callbacks.TerminateOnNaN else callback


def _fetch(value):
  """The value of a remote value (of a step long finished), or `value` itself."""
  return value.fetch() if hasattr(value, "fetch") else value


def _fetch_scalar(value) -> Optional[float]:
  if value is None:
    return None
  value = _fetch(value)
  try:
    return float(value)
  except (TypeError, ValueError):
    return None


class EpochCheckpoint(tf_keras.callbacks.Callback):
  """Saves the model at the end of every epoch into `model_dir/checkpoints/ckpt-<epoch>`.

  Each checkpoint holds `model` and, under `checkpoints.STEP_KEY`, the optimizer's step (the convention of
  `tfps.training.checkpoints`, shared with the Estimator path). Sharded variables are saved whole, so the checkpoints
  restore into an unsharded model (sidecar evaluator, export). At the end of the last epoch (or of training, where it
  stops earlier) it writes the FINAL marker naming the last checkpoint and the step.
  """

  def __init__(self, model_dir: str, max_to_keep: Optional[int] = 5):
    super().__init__()
    self.model_dir = model_dir
    self.max_to_keep = max_to_keep
    self._writer: Optional[checkpoints_lib.CheckpointWriter] = None

  def on_train_begin(self, logs=None):
    self._writer = checkpoints_lib.CheckpointWriter(self.model_dir, self.model.optimizer.iterations,
                                                    self.max_to_keep, model=self.model)
    self._writer.begin()

  def on_epoch_end(self, epoch, logs=None):
    self._writer.save(checkpoint_number=epoch + 1)
    if epoch + 1 == self.params.get("epochs"):
      # At the last epoch's end, not at training's: a chief or ps that dies after it (on the chief's way out of fit)
      # leaves a finished run, which a restarted chief does not train again.
      self._writer.finish()

  def on_train_end(self, logs=None):
    if not self._writer.finished():  # training stopped before its last epoch
      self._writer.finish()
