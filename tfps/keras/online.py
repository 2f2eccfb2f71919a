"""Online training on the Keras path: a compiled tf-keras model trained without end on a stream, from the chief.

The loop is the Estimator path's (`tfps.training.online.StreamLoop`): the chief reads the stream and gives each
scheduled function its batches; after each join every batch fed was applied exactly once (async: the runner's
records; sync: each step's update recorded per ps; geo: each round's push), so each checkpoint (`model_dir/checkpoints/ckpt-<step>`, the
model and the step, as `tfps.fit` saves them) holds the stream position after its last example, and offsets are
committed after it. A chief started again restores the newest checkpoint and reads on from its position. Its
progress lines carry the model's compiled metrics over the line's steps. See docs/online.md.
"""

import dataclasses
from typing import Callable, Optional

from absl import logging
import tensorflow as tf
import tf_keras

from tfps import _env
from tfps import checks
from tfps.cluster import config as cluster_lib
from tfps.cluster import options as options_lib
from tfps.errors import ArgumentTypeError, UsageError
from tfps.keras import deltas
from tfps.keras import evaluation
from tfps.keras import fitting
from tfps.keras import steps as keras_steps
from tfps.keras import stream_evaluation
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import chief as chief_lib
from tfps.training import dataset_fns
from tfps.training import loop
from tfps.training import modes
from tfps.training import online
from tfps.training import runners
from tfps.training import tables
from tfps.training import window_evaluation


@dataclasses.dataclass(frozen=True)
class StreamOptions:
  """How `train_on_stream` saves and logs, checked.

  Attributes:
    steps_per_execution: async: steps per scheduled function (default 20); not in sync and geo mode.
    checkpoint_every_steps: a checkpoint every this many steps (1000), whenever the stream pauses with steps not
      saved, and at the end.
    checkpoint_every_secs: a checkpoint at least this often while steps are trained (None: by steps alone).
    log_every_steps: a progress line every this many steps (100).
    keep_checkpoint_max: checkpoints kept (5; None keeps all).
    evaluate_every_steps, evaluate_every_secs: evaluate the newest checkpoint on the newest held-out window
      (`StreamBatches(held_out=...)`) this often (None: not by steps, not by time; `tfps.training.window_evaluation`).
    eval_batch_size: the window's batches in those evaluations (1024).
    delta_export_secs: a base export at the start, then a delta of the rows changed every this many seconds into
      `model_dir/deltas`, each with the stream span it ships and its examples' write times (`tfps.keras.deltas`;
      None: no deltas).
  """

  steps_per_execution: Optional[int] = None
  checkpoint_every_steps: int = 1000
  checkpoint_every_secs: Optional[float] = None
  log_every_steps: int = 100
  keep_checkpoint_max: Optional[int] = 5
  evaluate_every_steps: Optional[int] = None
  evaluate_every_secs: Optional[float] = None
  eval_batch_size: int = 1024
  delta_export_secs: Optional[float] = None

  def __post_init__(self):
    checks.positive_int("steps_per_execution", self.steps_per_execution, allow_none=True)
    checks.positive_int("checkpoint_every_steps", self.checkpoint_every_steps)
    checks.positive_int("log_every_steps", self.log_every_steps)
    checks.positive_int("keep_checkpoint_max", self.keep_checkpoint_max, allow_none=True)
    checks.positive_int("evaluate_every_steps", self.evaluate_every_steps, allow_none=True)
    checks.positive_int("eval_batch_size", self.eval_batch_size)
    if self.evaluate_every_secs is not None:
      checks.non_negative_number("evaluate_every_secs", self.evaluate_every_secs, "number of seconds")
    if self.checkpoint_every_secs is not None and not self.checkpoint_every_secs > 0:
      raise UsageError(f"`checkpoint_every_secs` ({self.checkpoint_every_secs!r}) must be a positive number or None")
    if self.delta_export_secs is not None:
      checks.non_negative_number("delta_export_secs", self.delta_export_secs, "number of seconds")


def train_on_stream(build_model: Callable[[], tf_keras.Model], make_batches: Callable, *, model_dir: str,
                    max_steps: Optional[int] = None, sync_mode=None,
                    cluster: Optional[cluster_lib.ClusterConfig] = None,
                    strategy_options: Optional[options_lib.StrategyOptions] = None, stop=None,
                    after_checkpoint: Optional[Callable[[int], None]] = None, **options) -> int:
  """Trains `build_model()` on a stream, from the chief, until SIGTERM (or `stop`, a `threading.Event`, is set; or
  the step reaches `max_steps`); returns the final step.

  Every message is applied exactly once across lost workers, ps and chief restarts (in each mode): each
  checkpoint holds the stream position after the last example it holds, offsets are committed to the source after
  it, and a chief started again reads on from the newest checkpoint's position. SIGTERM ends training after the steps
  in flight, with a checkpoint and a commit.

  Args:
    build_model: returns a compiled tf-keras model (called under the strategy scope, as `tfps.fit` calls it); it
      trains on the stream's `(features, label)` batches with its own `train_step`.
    make_batches: `fn(positions) -> tfps.data.stream.batches.StreamBatches`, the stream's batches starting at
      `positions` (the newest checkpoint's, or None: the stream's own start).
    model_dir: checkpoints with their stream positions, `loss.log`, TensorBoard, run records (required).
    max_steps: stop when the step reaches it (None: never).
    sync_mode: "async" (default), "sync" or "geo", or a `tfps.TrainingMode` (without pipelined updates).
    cluster: the cluster, seen from the chief; default: TF_CONFIG.
    strategy_options: a `tfps.StrategyOptions`; its fields may also be given one by one.
    stop: an event that ends training (None: SIGTERM does).
    after_checkpoint: `fn(step)`, called after each checkpoint (before an inline evaluation on the newest window).
    **options: the `StreamOptions` (`steps_per_execution`, `checkpoint_every_steps`, `checkpoint_every_secs`,
      `log_every_steps`, `keep_checkpoint_max`, `evaluate_every_steps`, `evaluate_every_secs`, `eval_batch_size`,
      `delta_export_secs`) and `StrategyOptions` fields.
  """
  settings, mode = _checked(build_model, make_batches, model_dir, max_steps, sync_mode, options)
  config = fitting.chief_cluster(cluster, "tfps.keras.online.train_on_stream")
  if not _env.command_line_parsed() and logging.get_verbosity() < logging.INFO:
    logging.set_verbosity(logging.INFO)  # outside absl.app (a notebook), absl would hide the progress lines
  chief = chief_lib.connect(config, mode, options_lib.as_strategy_options(strategy_options, **options))
  batches = online.open_batches(make_batches, model_dir)
  after_checkpoint, evaluation_due = window_evaluation.with_window_evaluation(
      batches, after_checkpoint, model_dir,
      stream_evaluation.window_evaluation_of(build_model, batches.window_input_fn(settings.eval_batch_size)),
      settings.evaluate_every_steps, settings.evaluate_every_secs)
  with chief.strategy.scope():  # tf-keras creates its metrics' variables at the first trace of a step
    try:
      stream_loop = _prepare(chief, build_model, batches, model_dir, settings, evaluation_due)
    except BaseException:
      batches.source.close()
      raise
    return online.run_until_stopped(stream_loop, max_steps, after_checkpoint, stop)


def _checked(build_model, make_batches, model_dir, max_steps, sync_mode, options: dict):
  """`(StreamOptions, TrainingMode)` from `train_on_stream`'s arguments, each checked in one line before anything
  connects; the `StreamOptions` are taken out of `options` (the strategy's fields remain)."""
  for name, value in (("build_model", build_model), ("make_batches", make_batches)):
    if not callable(value):
      raise ArgumentTypeError(f"`{name}` must be a function, got {value!r}")
  if not model_dir or not isinstance(model_dir, str):
    raise UsageError(f"`model_dir` ({model_dir!r}) is required: each checkpoint there holds the stream position a "
                     "restarted chief reads on from")
  checks.positive_int("max_steps", max_steps, allow_none=True)
  fields = [field.name for field in dataclasses.fields(StreamOptions)]
  unknown = sorted(set(options) - set(fields) - set(options_lib.FIELDS))
  if unknown:
    hint = "a stream has no epochs; " if "epoch" in unknown[0] else ""
    raise ArgumentTypeError(f"train_on_stream() got an unexpected keyword argument {unknown[0]!r} ({hint}it takes "
                            f"{', '.join(fields)} and the StrategyOptions fields)")
  settings = StreamOptions(**{name: options.pop(name) for name in list(options) if name in fields})
  mode = modes.as_mode(sync_mode)
  online.check_mode(mode)
  runners.check_settings(mode, settings.steps_per_execution)
  return settings, mode


def _prepare(chief: chief_lib.Chief, build_model: Callable, batches, model_dir: str, settings: StreamOptions,
             evaluation_due):
  """The loop that trains the model on `batches`: its variables made, the newest checkpoint restored; it saves
  a checkpoint where `evaluation_due(step)` (None: never) asks for one."""
  model = fitting.build_model_in_scope(build_model, chief.strategy)
  zeros = tf.data.Dataset.from_tensors(tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype),
                                                             batches.element_spec))
  fitting.create_variables(chief, model, zeros)
  evaluation.ensure_metrics_built(model, lambda input_context: zeros)  # tf-keras would build them in the first step
  saved = checkpoints_lib.list_checkpoints(model_dir)
  if saved:  # the checkpoint whose position `make_batches` was given
    chief.restore(saved[-1], tf.train.Checkpoint(model=model))
  schedule = deltas.stream_schedule(build_model, model, zeros, model_dir, settings.delta_export_secs)
  writer = checkpoints_lib.CheckpointWriter(model_dir, model.optimizer.iterations, settings.keep_checkpoint_max,
                                            model=model)
  writer.begin()
  runner = chief.build_runner(stream_step(model), settings.steps_per_execution or modes.DEFAULT_STEPS_PER_EXECUTION)
  logging.info("Training on %s from step %d (%s)%s", batches.source.name, int(model.optimizer.iterations.numpy()),
               chief.mode.describe(chief.num_workers, dataset_fns.static_batch_size(batches.element_spec)),
               f", resumed from {saved[-1]}" if saved else "")
  return KerasStreamLoop(
      model=model, batches=batches, checkpoint_every_secs=settings.checkpoint_every_secs, runner=runner,
      checkpoint_manager=writer, model_dir=model_dir, evaluation_due=evaluation_due, deltas=schedule,
      config=loop.LoopConfig(log_every_steps=settings.log_every_steps,
                             checkpoint_every_steps=settings.checkpoint_every_steps))


def stream_step(model: tf_keras.Model):
  """The Keras step (`tfps.keras.steps.keras_step`) returning each function's summed loss and examples (the
  loop's `(loss, count)`), where `fit` takes the model's metrics."""
  return keras_steps.keras_step(model, metric_results=False)


class KerasStreamLoop(online.StreamLoop):
  """The stream loop with the model's compiled metrics over each progress line's steps in the line (read after the
  line's join, then reset); the line's loss is the loss metric's mean over those steps where the model tracks one
  (compiled with a loss), else the mean of its steps' losses.
  """

  def __init__(self, *, model: tf_keras.Model, **kwargs):
    self._model = model
    self._window = {}
    self._tables = tables.tables_of(model)
    super().__init__(metrics=lambda: {**self._window, **tables.table_metrics(self._tables)}, **kwargs)

  def chunk_ended(self, steps: int, loss_sum: float) -> float:
    results = {name: float(value) for name, value in self._model.get_metrics_result().items()
               if value.shape.num_elements() == 1}
    self._model.reset_metrics()
    self._window = results
    return results.pop("loss") * steps if "loss" in results else loss_sum
