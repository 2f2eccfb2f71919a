"""The Keras path: `tfps.fit` runs tf-keras `Model.fit` under ParameterServerStrategy with the defaults users need.

`tfps.fit` trains, on the chief. A script that serves every role calls `tfps.run_task(chief_fn, evaluator_fn=...)`:
ps and workers serve there, the chief's `chief_fn` calls `tfps.fit`, the evaluator's `evaluator_fn` calls
`tfps.run_sidecar_evaluator`. Every setting is an argument; nothing is read from flags.
"""

import dataclasses
import logging as logging_lib
import os
from typing import Callable, List, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf
import tf_keras

from tfps import _env
from tfps import _tf_private
from tfps import checks
from tfps.keras import callbacks as callbacks_lib
from tfps.training import checkpoints as checkpoints_lib
from tfps.cluster import config as cluster_lib
from tfps.cluster import options as options_lib
from tfps.training import chief as chief_lib
from tfps.training import dataset_fns
from tfps.keras import deltas
from tfps.keras import evaluable
from tfps.keras import evaluation
from tfps.training import exactly_once
from tfps.keras import steps as keras_steps
from tfps.training import modes
from tfps import run_records
from tfps.training import resharding
from tfps.cluster import roles
from tfps.training import runners
from tfps.training import strategy as strategy_lib
from tfps.training import tables
from tfps.errors import ArgumentTypeError, UsageError



@dataclasses.dataclass(frozen=True)
class FitOptions:
  """How `tfps.fit` runs, besides what it trains: its keyword options (see `fit`), checked."""

  exact_evaluation: bool = False
  steps_per_execution: Optional[int] = None
  log_every_secs: float = 10.0
  batch_size: Optional[int] = None
  keep_checkpoint_max: Optional[int] = 5
  verbose: int = 0
  delta_export_secs: Optional[float] = None
  seed: Optional[int] = None

  def __post_init__(self):
    checks.positive_int("steps_per_execution", self.steps_per_execution, allow_none=True)
    checks.positive_int("keep_checkpoint_max", self.keep_checkpoint_max, allow_none=True)  # a restart resumes from one
    checks.one_of("verbose", self.verbose, (0, 2, "auto"))  # under ParameterServerStrategy tf-keras has no progress bar (1)
    if self.seed is not None:
      checks.non_negative_int("seed", self.seed)


@dataclasses.dataclass(frozen=True)
class _Run:
  """What `fit` was asked to train, checked (`_check_run`)."""

  build_model: Callable[[], tf_keras.Model]
  train_dataset_fn: Callable
  epochs: int
  steps_per_epoch: int
  validation_dataset_fn: Optional[Callable]
  validation_steps: Optional[int]
  model_dir: Optional[str]
  callbacks: Tuple[tf_keras.callbacks.Callback, ...]
  options: FitOptions


def fit(build_model: Callable[[], tf_keras.Model], train_dataset_fn: Callable, *, epochs: int, steps_per_epoch: int,
        validation_dataset_fn: Optional[Callable] = None, validation_steps: Optional[int] = None,
        model_dir: Optional[str] = None, callbacks: Sequence[tf_keras.callbacks.Callback] = (), sync_mode=None,
        cluster: Optional[cluster_lib.ClusterConfig] = None,
        strategy_options: Optional[options_lib.StrategyOptions] = None, **options) -> tf_keras.callbacks.History:
  """Trains `build_model()` on the parameter-server cluster from its chief; returns the `History`.

  Call it on the chief only: on a ps, worker or evaluator task it raises a `UsageError` saying to dispatch the roles
  with `tfps.run_task` (ps and workers serve there; the evaluator runs `tfps.run_sidecar_evaluator`).

  Args:
    build_model: returns a compiled tf-keras model; called under the strategy scope, so its large variables
      (embedding tables) are sharded over the ps.
    train_dataset_fn: `fn(input_context) -> tf.data.Dataset` of batches, run on every worker; repeat it.
    epochs: epochs to train.
    steps_per_epoch: steps per epoch (required: a parameter-server dataset has no end).
    validation_dataset_fn: like `train_dataset_fn`, for evaluation after every epoch (and by the sidecar).
    validation_steps: evaluation steps; not needed with `exact_evaluation`.
    model_dir: checkpoints (one per epoch: a restarted chief resumes from it) and TensorBoard logs; None: nothing.
    callbacks: user callbacks, after tfps's own: epoch-level, or with `_supports_tf_logs` (TerminateOnNaN: by epoch).
    sync_mode: "async" (default), "sync" or "geo", or a `tfps.TrainingMode` (to set `geo_steps` or
      `replicas_to_aggregate`); a script passes `tfps.mode_from_flags()`.
    cluster: the cluster, seen from the chief; default: TF_CONFIG. A script passes the `cluster` `tfps.run_task`
      gives its `chief_fn`.
    strategy_options: a `tfps.StrategyOptions` (`num_shards`, `min_shard_bytes`, `connect_timeout_secs`,
      `lost_task_timeout_secs`); a script passes `tfps.strategy_options_from_flags()`. Its fields may also be given
      one by one (`num_shards=1`).
    **options: the `FitOptions`, each optional:
      exact_evaluation: evaluate a finite validation set so that every example counts exactly once.
      steps_per_execution: steps packed into one scheduled function; default: the model's if it set one, else 20.
      log_every_secs: seconds between progress lines (10).
      batch_size: examples per step, for the examples/s of the progress line (default: the dataset's static batch
        size; without either the line shows steps/s).
      keep_checkpoint_max: checkpoints kept in `model_dir/checkpoints` (5; None keeps all).
      verbose: tf-keras's verbosity (0: only tfps's progress lines; 2 or "auto": a line per epoch).
      delta_export_secs: seconds between exports of the changed rows to `model_dir/deltas`, within epochs too
        (None: none; docs/delta_export.md).
      seed: the same seed, the same initial weights (`_build`; None: unseeded), as the Estimator's `tf_random_seed`.
  """
  fit_options = _fit_options(options)  # what remains in `options`: strategy fields given one by one
  exports = deltas.delta_callbacks(build_model, train_dataset_fn, model_dir, fit_options.delta_export_secs)
  run = _Run(build_model, train_dataset_fn, epochs, steps_per_epoch, validation_dataset_fn, validation_steps,
             model_dir, (*map(callbacks_lib.epoch_level, callbacks), *exports), fit_options)
  _check_run(run)
  mode = modes.as_mode(sync_mode)
  strategy_options = options_lib.as_strategy_options(strategy_options, **options)
  config = chief_cluster(cluster)
  runners.check_settings(mode, run.options.steps_per_execution)
  _show_progress_lines()
  return _train(chief_lib.connect(config, mode, strategy_options), run)


def _show_progress_lines() -> None:
  if not _env.command_line_parsed() and logging.get_verbosity() < logging.INFO:
    logging.set_verbosity(logging.INFO)  # outside absl.app (a notebook), absl would hide the progress lines


_FIT_OPTIONS = tuple(field.name for field in dataclasses.fields(FitOptions))
# `Model.fit` arguments tfps.fit does not take, and what to do instead.
_MODEL_FIT_ONLY = {
    "class_weight": "weight examples in the dataset instead, as (features, labels, sample_weights) elements",
    "initial_epoch": "a chief started again on the same model_dir resumes after its last checkpoint's epoch itself",
    "validation_freq": "tfps.fit evaluates after every epoch; a sidecar evaluator (tfps.run_sidecar_evaluator) "
                       "evaluates without holding up training",
    "x": "give train_dataset_fn, a function of an input context that returns a repeated tf.data.Dataset",
    "validation_data": "give validation_dataset_fn, a function of an input context that returns a tf.data.Dataset",
}


def _fit_options(options: dict) -> FitOptions:
  """Takes `fit`'s `FitOptions` out of its keyword `options` (an unknown keyword is a `TypeError`, as Python's)."""
  unknown = sorted(set(options) - set(_FIT_OPTIONS) - set(options_lib.FIELDS))
  if unknown:
    hint = _MODEL_FIT_ONLY.get(unknown[0])
    raise ArgumentTypeError(f"fit() got an unexpected keyword argument {unknown[0]!r}" +
                            (f": {hint}" if hint else ""))
  return FitOptions(**{name: options.pop(name) for name in list(options) if name in _FIT_OPTIONS})


def chief_cluster(cluster: Optional[cluster_lib.ClusterConfig], what: str = "tfps.fit") -> cluster_lib.ClusterConfig:
  """The cluster seen from its chief (`cluster`, default TF_CONFIG); a `UsageError` on another task."""
  config = roles.resolve_cluster(cluster)
  if config.task_type != "chief":
    raise UsageError(f"{what} trains on the chief, and this task is {config.task_type}:{config.task_index}; "
                     "dispatch the roles with tfps.run_task(chief_fn, evaluator_fn=..., cluster=...): ps and workers "
                     "serve there, chief_fn calls tfps.fit, evaluator_fn calls tfps.run_sidecar_evaluator")
  return config


def _check_run(run: _Run) -> None:
  if not callable(run.build_model):
    raise ArgumentTypeError(f"`build_model` must be a function returning a compiled tf-keras model, got "
                            f"{run.build_model!r}")
  dataset_fns.check_dataset_fn(run.train_dataset_fn, "train_dataset_fn")
  if run.validation_dataset_fn is not None:
    dataset_fns.check_dataset_fn(run.validation_dataset_fn, "validation_dataset_fn")
  checks.positive_int("epochs", run.epochs)
  if run.model_dir is not None:
    checks.directory("model_dir", run.model_dir)
  if run.steps_per_epoch is None:
    raise UsageError("`steps_per_epoch` is required: under ParameterServerStrategy a training dataset repeats "
                     "forever, so tfps cannot tell where an epoch ends")
  checks.positive_int("steps_per_epoch", run.steps_per_epoch)
  if run.validation_dataset_fn is not None and not run.options.exact_evaluation:
    if run.validation_steps is None:
      raise UsageError("`validation_steps` is required with `validation_dataset_fn` unless exact_evaluation=True "
                       "(which evaluates a finite dataset exactly once)")
    checks.positive_int("validation_steps", run.validation_steps)


def build_model_in_scope(build_model: Callable, strategy) -> tf_keras.Model:
  """`build_model()` under `strategy.scope()`, checked to be a compiled tf-keras model."""
  with strategy.scope():
    model = build_model()
  if not isinstance(model, tf_keras.Model):
    module = type(model).__module__
    hint = (" It is a Keras 3 model: Keras 3 has no ParameterServerStrategy support; build it with `import tf_keras`."
            if module.startswith("keras") else "")
    raise ArgumentTypeError(f"`build_model` must return a tf-keras Model, got {type(model).__name__} from "
                            f"{module}.{hint}")
  if not _tf_private.is_compiled(model):
    raise UsageError("`build_model` returned a model that is not compiled; call model.compile(...) in build_model")
  return model


def _default_callbacks(run: _Run, batch_size: Optional[int]) -> List[tf_keras.callbacks.Callback]:
  model_dir, options = run.model_dir, run.options
  recorder = run_records.RunRecorder(model_dir, batch_size=batch_size) if model_dir else None
  result: List[tf_keras.callbacks.Callback] = [
      callbacks_lib.DynamicTableMetrics(),
      callbacks_lib.ProgressLogger(run.steps_per_epoch, run.epochs, batch_size, options.log_every_secs, recorder)]
  if model_dir:
    result += [
        callbacks_lib.EpochCheckpoint(model_dir, options.keep_checkpoint_max),
        tf_keras.callbacks.TensorBoard(os.path.join(model_dir, "logs"), profile_batch=0),
    ]
  return result


def _build(chief: chief_lib.Chief, run: _Run):
  """The model with every variable made (its optimizer's too, so a checkpoint restores whole) and its tables bound;
  and the chief's sample of the training input (its spec, maybe a batch). A `seed` goes to
  `tf_keras.utils.set_random_seed` first: TensorFlow's global seed, the seeds tf-keras initializers draw, Python's
  `random` and NumPy's."""
  if run.options.seed is not None:  # tf-keras too: its initializers do not follow TensorFlow's seed
    tf_keras.utils.set_random_seed(run.options.seed)
  model = build_model_in_scope(run.build_model, chief.strategy)
  sample = dataset_fns.make_dataset(run.train_dataset_fn, "train_dataset_fn")
  create_variables(chief, model, sample)
  return model, sample


def create_variables(chief: chief_lib.Chief, model: tf_keras.Model, sample: tf.data.Dataset) -> None:
  """Makes every variable of `model` (built on a batch of `sample` where its inputs are not declared) and of its
  optimizer, sharded over the ps, and binds its table layers (`Chief.create_variables`)."""

  def create():
    with chief.strategy.scope():
      evaluation.ensure_built(model, sample)
      variables = resharding.variables_so_far(model)
      if variables:  # else the first step makes them (a checkpoint restores them as they are made)
        resharding.create_optimizer_variables(model.optimizer, variables)
    return model.optimizer, tables.tables_of(model)

  chief.create_variables(create)


def _train(chief: chief_lib.Chief, run: _Run) -> tf_keras.callbacks.History:
  model, sample = _build(chief, run)
  finished = chief_lib.finished_run(run.model_dir, run.epochs * run.steps_per_epoch)
  if finished is not None:
    return _restore_finished(chief, model, finished, run.model_dir)
  initial_epoch = _resume(chief, model, run)
  dataset_fns.check_lasts(sample, "train_dataset_fn", (run.epochs - initial_epoch) * run.steps_per_epoch)
  runner = _build_runner(chief, model, run)
  iterator = dataset_fns.per_worker_iterator(chief.strategy, chief.coordinator, run.train_dataset_fn,
                                             "train_dataset_fn")
  batch_size = run.options.batch_size or dataset_fns.batch_size_of(sample)
  pauses = [callback for callback in run.callbacks if isinstance(callback, deltas.DeltaExport)]  # within epochs
  all_callbacks = ([keras_steps.drive_fit(model, runner, iterator, pauses)] + _default_callbacks(run, batch_size) +
                   list(run.callbacks))
  logging.info("Training on %s (%s): %d epochs x %d steps, %d steps per execution", chief.cluster.sizes(),
               chief.mode.describe(chief.num_workers, dataset_fns.batch_size_of(sample)), run.epochs,
               run.steps_per_epoch, _tf_private.steps_per_execution(model))
  return _fit(model, run, initial_epoch, _validation(chief, model, run), all_callbacks)


def _build_runner(chief: chief_lib.Chief, model: tf_keras.Model, run: _Run):
  steps_per_execution = run.options.steps_per_execution
  if steps_per_execution is None:
    model_steps = _tf_private.steps_per_execution(model)
    steps_per_execution = (model_steps if model_steps > 1 else
                           min(modes.DEFAULT_STEPS_PER_EXECUTION, run.steps_per_epoch))
  runner = chief.build_runner(keras_steps.keras_step(model), steps_per_execution)
  # Outside the strategy's scope its variable stays on the chief, where every use of it is: tf-keras (and tfps's train
  # function) read it before each scheduled function and pass the step count as an argument; on a ps each read would be
  # a round trip.
  _tf_private.set_steps_per_execution(model, min(runner.steps_per_execution, run.steps_per_epoch))
  exactly_once.check_functions_per_join(run.steps_per_epoch, _tf_private.steps_per_execution(model))
  return runner


def _validation(chief: chief_lib.Chief, model: tf_keras.Model, run: _Run):
  """What `Model.fit` evaluates after each epoch (None: nothing)."""
  validation_dataset_fn = run.validation_dataset_fn
  if validation_dataset_fn is None:
    return None
  evaluable.check_on_workers(model, run.options.exact_evaluation, "validation_dataset_fn")
  if run.options.exact_evaluation:
    # Its metrics are copied to the workers before any step: a model whose own train_step never updates the
    # compiled metrics (the retrieval model's) would have them unbuilt at the first evaluation.
    evaluation.ensure_metrics_built(model, validation_dataset_fn)
    validation_dataset_fn, shards = evaluation.plan_exact_evaluation(validation_dataset_fn, "validation_dataset_fn",
                                                                     chief.num_workers)
    _tf_private.set_exact_evaluation_shards(model, shards)
  return tf_keras.utils.experimental.DatasetCreator(validation_dataset_fn)


def _fit(model: tf_keras.Model, run: _Run, initial_epoch: int, validation, all_callbacks) -> tf_keras.callbacks.History:
  """tf-keras's `Model.fit`, its errors under ParameterServerStrategy said in one line."""
  ran_out, evaluating = _InputRanOut(), _Evaluating()
  logging_lib.getLogger("tensorflow").addHandler(ran_out)
  try:
    return model.fit(keras_steps.UNUSED_BY_FIT, epochs=run.epochs, steps_per_epoch=run.steps_per_epoch,
                     initial_epoch=initial_epoch, validation_data=validation,
                     validation_steps=None if run.options.exact_evaluation else run.validation_steps,
                     callbacks=[*all_callbacks, evaluating], verbose=run.options.verbose)
  except (tf.errors.OutOfRangeError, tf.errors.CancelledError) as e:
    # A dataset whose length was not known (`check_lasts`) ended: tf-keras then stops the epoch, and the functions
    # still pending (cancelled) or the next one raise.
    if evaluating.now:
      raise UsageError(f"a worker's validation input ended before `validation_steps` ({run.validation_steps}) "
                       "batches: make validation_dataset_fn's dataset repeat (`.repeat()`), or evaluate a finite set "
                       "once with exact_evaluation=True") from None
    if isinstance(e, tf.errors.OutOfRangeError) or ran_out.seen:
      raise UsageError("a worker's training input ended before its steps did: `train_dataset_fn` must return a "
                       "dataset that repeats (`.repeat()`)") from None
    raise
  except ValueError as e:
    if _tf_private.BATCH_CALLBACKS_REFUSED in str(e):
      raise UsageError(f"{e}. Under ParameterServerStrategy a callback may only use epoch-level hooks "
                       "(on_epoch_end, ...), or set `_supports_tf_logs = True` and handle remote values") from None
    raise
  finally:
    logging_lib.getLogger("tensorflow").removeHandler(ran_out)
    for callback in all_callbacks:
      if isinstance(callback, callbacks_lib.ProgressLogger):
        callback.stop()


class _Evaluating(tf_keras.callbacks.Callback):
  """Whether `fit` is evaluating now (between `on_test_begin` and `on_test_end`)."""

  def __init__(self):
    super().__init__()
    self.now = False

  def on_test_begin(self, logs=None):
    self.now = True

  def on_test_end(self, logs=None):
    self.now = False


class _InputRanOut(logging_lib.Handler):
  """Notes tf-keras's warning that a training input ended within an epoch (`_tf_private.INPUT_RAN_OUT`)."""

  def __init__(self):
    super().__init__()
    self.seen = False

  def emit(self, record):
    self.seen = self.seen or record.getMessage().startswith(_tf_private.INPUT_RAN_OUT)


def _restore_finished(chief: chief_lib.Chief, model, marker: dict, model_dir: str) -> tf_keras.callbacks.History:
  logging.info("Training already finished in %s (%d steps, %s): restored, not trained again. To train anew, use "
               "another model_dir or delete %s", model_dir, marker["step"], marker["last_checkpoint"],
               checkpoints_lib.final_marker_path(model_dir))
  chief.restore(marker["last_checkpoint"], tf.train.Checkpoint(model=model))
  history = tf_keras.callbacks.History()
  history.set_model(model)
  history.on_train_begin()
  history.history = {name: [value] for name, value in run_records.final_metrics(model_dir).items()}  # its last epoch's
  run_records.tell_launcher(model_dir)  # whose summary is that run's
  return history


def _resume(chief: chief_lib.Chief, model, run: _Run) -> int:
  """The epoch a run in `model_dir` goes on from (0: a new run), restored from its newest checkpoint on whatever
  number of ps and shards (`Chief.resume`): a chief started again after a failure, a finished run given more epochs, a
  run moved to another cluster. A checkpoint is written at every epoch's end, so a failure loses at most the epoch it
  falls in."""
  restored = chief.resume(run.model_dir, tf.train.Checkpoint(model=model))
  if restored is None:
    return 0
  step = int(model.optimizer.iterations.numpy())
  logging.info("Resumed from %s at epoch %d/%d (step %d)", restored, step // run.steps_per_epoch + 1, run.epochs, step)
  return step // run.steps_per_epoch


def evaluate(model: tf_keras.Model, dataset_fn: Callable, steps: Optional[int] = None, exact: bool = False) -> dict:
  """Evaluates a model `tfps.fit` trained, on the workers of its cluster; returns `{metric: float}`.

  With `exact=True` a finite dataset is evaluated so that every example counts exactly once (`steps` is not used).
  """
  if not isinstance(model, tf_keras.Model):
    raise ArgumentTypeError(f"`model` must be the tf-keras model tfps.fit trained (`history.model`), got "
                            f"{type(model).__name__}")
  checks.positive_int("steps", steps, allow_none=True)
  num_workers = strategy_lib.cluster_of(model.distribute_strategy).num_workers
  return evaluation.evaluate_on_cluster(model, dataset_fn, num_workers, steps=steps, exact=exact)
