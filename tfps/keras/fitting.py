"""The Keras path: `tfps.fit` runs tf-keras `Model.fit` under ParameterServerStrategy with the defaults users need.

`tfps.fit` trains, on the chief. A script that serves every role calls `tfps.run_task(chief_fn, evaluator_fn=...)`:
ps and workers serve there, the chief's `chief_fn` calls `tfps.fit`, the evaluator's `evaluator_fn` calls
`tfps.run_sidecar_evaluator`. Every setting is an argument; nothing is read from flags.
"""

import logging as logging_lib
import os
from typing import Callable, List, Optional, Sequence

from absl import logging
import tensorflow as tf
import tf_keras

from tfps import _env
from tfps import _tf_private
from tfps import checks
from tfps.keras import callbacks as callbacks_lib
from tfps.training import checkpoints as checkpoints_lib
from tfps.cluster import config as cluster_lib
from tfps.training import dataset_fns
from tfps.keras import deltas
from tfps.keras import evaluation
from tfps.training import exactly_once
from tfps.keras import steps as keras_steps
from tfps.training import modes
from tfps import run_records
from tfps.training import resharding
from tfps.cluster import roles
from tfps.cluster import watchdog
from tfps.training import runners
from tfps.training import strategy as strategy_lib
from tfps.training import tables
from tfps.errors import ArgumentTypeError, UsageError

BACKUP_SUBDIR = "backup"


def fit(build_model: Callable[[], tf_keras.Model], train_dataset_fn: Callable, *, epochs: int, steps_per_epoch: int,
        validation_dataset_fn: Optional[Callable] = None, validation_steps: Optional[int] = None,
        exact_evaluation: bool = False, model_dir: Optional[str] = None,
        callbacks: Sequence[tf_keras.callbacks.Callback] = (), steps_per_execution: Optional[int] = None,
        log_every_secs: float = 10.0, batch_size: Optional[int] = None, keep_checkpoint_max: Optional[int] = 5,
        sync_mode=None, cluster: Optional[cluster_lib.ClusterConfig] = None, num_shards: Optional[int] = None,
        min_shard_bytes: int = strategy_lib.DEFAULT_MIN_SHARD_BYTES, connect_timeout_secs: float = 60.0,
        lost_task_timeout_secs: float = watchdog.DEFAULT_TIMEOUT_SECS, verbose: int = 0,
        delta_export_secs: Optional[float] = None) -> tf_keras.callbacks.History:
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
    exact_evaluation: evaluate a finite validation set so that every example counts exactly once.
    model_dir: where checkpoints, the restart backup and TensorBoard logs go; None keeps nothing.
    callbacks: user callbacks, run after tfps's own (epoch-level only, or with `_supports_tf_logs`).
    steps_per_execution: steps packed into one scheduled function; default: the model's if it set one, else 20.
    log_every_secs: seconds between progress lines.
    batch_size: examples per step, for the examples/s of the progress line (default: the dataset's static batch
      size; without either the line shows steps/s).
    keep_checkpoint_max: checkpoints kept in `model_dir/checkpoints` (None keeps all).
    sync_mode: "async" (default), "sync" or "geo", or a `tfps.TrainingMode` (to set `geo_steps` or
      `replicas_to_aggregate`); a script passes `tfps.mode_from_flags()`.
    cluster: the cluster, seen from the chief; default: TF_CONFIG. A script passes the `cluster` `tfps.run_task`
      gives its `chief_fn`.
    num_shards: shards of each large variable (default: the number of ps).
    min_shard_bytes: variables smaller than this are not sharded (0 shards every variable with >= 2 rows).
    connect_timeout_secs: seconds to wait for every ps and worker to answer.
    lost_task_timeout_secs: seconds a ps may stay silent mid-run before training stops with an error naming it.
    verbose: tf-keras's verbosity (0: only tfps's progress lines).
    delta_export_secs: write a base export to `model_dir/deltas` when training starts, then a delta of the changed
      rows and the dense variables at the first epoch end this many seconds after the last (docs/delta_export.md).
  """
  _check_fit_args(build_model, train_dataset_fn, epochs, steps_per_epoch, validation_dataset_fn, validation_steps,
                  exact_evaluation, steps_per_execution)
  mode = modes.as_mode(sync_mode)
  callbacks = list(callbacks) + deltas.delta_callbacks(build_model, train_dataset_fn, model_dir, delta_export_secs)
  strategy_options = {"num_shards": checks.positive_int("num_shards", num_shards, allow_none=True),
                      "min_shard_bytes": checks.non_negative_int("min_shard_bytes", min_shard_bytes),
                      "connect_timeout_secs": checks.non_negative_number("connect_timeout_secs", connect_timeout_secs,
                                                                         "number of seconds"),
                      "lost_task_timeout_secs": checks.non_negative_number(
                          "lost_task_timeout_secs", lost_task_timeout_secs, "number of seconds")}
  config = roles.resolve_cluster(cluster)
  if config.task_type != "chief":
    raise UsageError(f"tfps.fit trains on the chief, and this task is {config.task_type}:{config.task_index}; "
                     "dispatch the roles with tfps.run_task(chief_fn, evaluator_fn=..., cluster=...): ps and workers "
                     "serve there, chief_fn calls tfps.fit, evaluator_fn calls tfps.run_sidecar_evaluator")
  mode.replicas(config.num_workers)  # fails early on more replicas than workers
  runners.check_settings(mode, steps_per_execution)
  if not _env.command_line_parsed() and logging.get_verbosity() < logging.INFO:
    logging.set_verbosity(logging.INFO)  # outside absl.app (a notebook), absl would hide the progress lines
  return _train(config, build_model, train_dataset_fn, epochs, steps_per_epoch, validation_dataset_fn,
                validation_steps, exact_evaluation, model_dir, list(callbacks), steps_per_execution, log_every_secs,
                batch_size, keep_checkpoint_max, verbose, mode, strategy_options)


def _check_fit_args(build_model, train_dataset_fn, epochs, steps_per_epoch, validation_dataset_fn, validation_steps,
                    exact_evaluation, steps_per_execution):
  if not callable(build_model):
    raise ArgumentTypeError(f"`build_model` must be a function returning a compiled tf-keras model, got "
                            f"{build_model!r}")
  dataset_fns.check_dataset_fn(train_dataset_fn, "train_dataset_fn")
  if validation_dataset_fn is not None:
    dataset_fns.check_dataset_fn(validation_dataset_fn, "validation_dataset_fn")
  checks.positive_int("epochs", epochs)
  if steps_per_epoch is None:
    raise UsageError("`steps_per_epoch` is required: under ParameterServerStrategy a training dataset repeats "
                     "forever, so tfps cannot tell where an epoch ends")
  checks.positive_int("steps_per_epoch", steps_per_epoch)
  if steps_per_execution is not None:
    checks.positive_int("steps_per_execution", steps_per_execution)
  if validation_dataset_fn is not None and not exact_evaluation:
    if validation_steps is None:
      raise UsageError("`validation_steps` is required with `validation_dataset_fn` unless exact_evaluation=True "
                       "(which evaluates a finite dataset exactly once)")
    checks.positive_int("validation_steps", validation_steps)


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
  if not model.compiled_loss and not getattr(model, "_is_compiled", False):
    raise ValueError("`build_model` returned a model that is not compiled; call model.compile(...) in build_model")
  return model


def _default_callbacks(model_dir, steps_per_epoch, epochs, batch_size, log_every_secs, keep_checkpoint_max):
  recorder = run_records.RunRecorder(model_dir, batch_size=batch_size) if model_dir else None
  result: List[tf_keras.callbacks.Callback] = [
      callbacks_lib.DynamicTableMetrics(),
      callbacks_lib.ProgressLogger(steps_per_epoch, epochs, batch_size, log_every_secs, recorder)]
  if model_dir:
    result += [
        tf_keras.callbacks.BackupAndRestore(os.path.join(model_dir, BACKUP_SUBDIR)),
        callbacks_lib.EpochCheckpoint(model_dir, keep_checkpoint_max),
        tf_keras.callbacks.TensorBoard(os.path.join(model_dir, "logs"), profile_batch=0),
    ]
  return result


def _train(config, build_model, train_dataset_fn, epochs, steps_per_epoch, validation_dataset_fn, validation_steps,
           exact_evaluation, model_dir, user_callbacks, steps_per_execution, log_every_secs, batch_size,
           keep_checkpoint_max, verbose, mode, strategy_options):
  strategy, coordinator = strategy_lib.build_strategy(config, **strategy_options)
  model = build_model_in_scope(build_model, strategy)
  sample = dataset_fns.make_dataset(train_dataset_fn, "train_dataset_fn")  # on the chief: its spec, maybe a batch
  with strategy.scope():  # restoring needs every variable: the model's and the optimizer's
    evaluation.ensure_built(model, sample)
    variables = resharding.variables_so_far(model)
    if variables:  # else the first step makes them (a checkpoint restores them as they are made)
      resharding.create_optimizer_variables(model.optimizer, variables)
    tables.bind_optimizers(model)  # admissions reset the slot rows of the rows they give out
  finished = _finished_run(model_dir, epochs * steps_per_epoch)
  if finished is not None:
    return _restore_finished(model, finished, strategy, model_dir)
  initial_epoch = _resume(model, strategy, model_dir, steps_per_epoch)
  dataset_fns.check_lasts(sample, "train_dataset_fn", (epochs - initial_epoch) * steps_per_epoch)
  if steps_per_execution is None:
    model_steps = _tf_private.steps_per_execution(model)
    steps_per_execution = model_steps if model_steps > 1 else min(modes.DEFAULT_STEPS_PER_EXECUTION, steps_per_epoch)
  with strategy.scope():
    runner = runners.build_runner(mode, keras_steps.keras_step(model), strategy=strategy, coordinator=coordinator,
                                  num_workers=config.num_workers, steps_per_execution=steps_per_execution)
  # Outside the strategy's scope its variable stays on the chief, where every use of it is: tf-keras (and tfps's train
  # function) read it before each scheduled function and pass the step count as an argument; on a ps each read would be
  # a round trip.
  _tf_private.set_steps_per_execution(model, min(runner.steps_per_execution, steps_per_epoch))
  exactly_once.check_functions_per_join(steps_per_epoch, _tf_private.steps_per_execution(model))
  iterator = dataset_fns.per_worker_iterator(strategy, coordinator, train_dataset_fn, "train_dataset_fn")
  runner_callback = keras_steps.drive_fit(model, runner, iterator)
  validation = None
  if validation_dataset_fn is not None:
    if exact_evaluation:
      # Its metrics are copied to the workers before any step: a model whose own train_step never updates the
      # compiled metrics (the retrieval model's) would have them unbuilt at the first evaluation.
      evaluation.ensure_metrics_built(model, validation_dataset_fn)
      validation_dataset_fn, shards = evaluation.plan_exact_evaluation(validation_dataset_fn, "validation_dataset_fn",
                                                                       config.num_workers)
      _tf_private.set_exact_evaluation_shards(model, shards)
    validation = tf_keras.utils.experimental.DatasetCreator(validation_dataset_fn)
  batch_size = batch_size or dataset_fns.batch_size_of(sample)
  all_callbacks = [runner_callback] + _default_callbacks(
      model_dir, steps_per_epoch, epochs, batch_size, log_every_secs, keep_checkpoint_max) + user_callbacks
  logging.info("Training on %s (%s): %d epochs x %d steps, %d steps per execution", config.sizes(),
               mode.describe(config.num_workers), epochs, steps_per_epoch, _tf_private.steps_per_execution(model))
  ran_out = _InputRanOut()
  logging_lib.getLogger("tensorflow").addHandler(ran_out)
  try:
    return model.fit(keras_steps.UNUSED_BY_FIT, epochs=epochs,
                     steps_per_epoch=steps_per_epoch, initial_epoch=initial_epoch, validation_data=validation,
                     validation_steps=None if exact_evaluation else validation_steps, callbacks=all_callbacks,
                     verbose=verbose)
  except (tf.errors.OutOfRangeError, tf.errors.CancelledError) as e:
    # A dataset whose length was not known (`check_lasts`) ended: tf-keras then stops the epoch, and the functions
    # still pending (cancelled) or the next one raise.
    if isinstance(e, tf.errors.OutOfRangeError) or ran_out.seen:
      raise UsageError("a worker's training input ended before its steps did: `train_dataset_fn` must return a "
                       "dataset that repeats (`.repeat()`)") from None
    raise
  except ValueError as e:
    if _tf_private.BATCH_CALLBACKS_REFUSED in str(e):
      raise ValueError(f"{e}. Under ParameterServerStrategy a callback may only use epoch-level hooks "
                       "(on_epoch_end, ...), or set `_supports_tf_logs = True` and handle remote values") from None
    raise
  finally:
    logging_lib.getLogger("tensorflow").removeHandler(ran_out)


class _InputRanOut(logging_lib.Handler):
  """Notes tf-keras's warning that a training input ended within an epoch (`_tf_private.INPUT_RAN_OUT`)."""

  def __init__(self):
    super().__init__()
    self.seen = False

  def emit(self, record):
    self.seen = self.seen or record.getMessage().startswith(_tf_private.INPUT_RAN_OUT)


def _finished_run(model_dir: Optional[str], total_steps: int) -> Optional[dict]:
  """The FINAL marker of a run in `model_dir` that already trained `total_steps` steps (None: train).

  This is what a chief restarted after training ended (its ps died while it was exiting) finds: training is not
  repeated, as an Estimator does not train past `max_steps` again.
  """
  if not model_dir:
    return None
  marker = checkpoints_lib.read_final_marker(model_dir)
  if marker is None or marker.get("step", -1) < total_steps or not marker.get("last_checkpoint"):
    return None
  return marker


def _restore_finished(model, marker: dict, strategy, model_dir: str) -> tf_keras.callbacks.History:
  logging.info("Training already finished in %s (%d steps, %s): restored, not trained again. To train anew, use "
               "another model_dir or delete %s", model_dir, marker["step"], marker["last_checkpoint"],
               checkpoints_lib.final_marker_path(model_dir))
  with strategy.scope():
    resharding.restore(marker["last_checkpoint"], tf.train.Checkpoint(model=model))
  history = tf_keras.callbacks.History()
  history.set_model(model)
  history.on_train_begin()
  return history


def _resume(model, strategy, model_dir: Optional[str], steps_per_epoch: int) -> int:
  """Where a run in `model_dir` goes on from, on whatever number of ps and shards: the epoch to start at.

  A restart backup (a chief that died) is checked against the model here and restored by `BackupAndRestore`; without
  one, the newest checkpoint (a finished run given more epochs, a run moved to another cluster) is checked and
  restored here. A checkpoint that does not fit raises `CheckpointMismatchError` before any step.
  """
  if not model_dir:
    return 0
  backup = _newest_backup(model_dir)
  if backup is not None:
    resharding.check_compatible(backup, tf.train.Checkpoint(model=model))
    return 0  # BackupAndRestore sets the epoch
  saved = checkpoints_lib.list_checkpoints(model_dir)
  if not saved:
    return 0
  with strategy.scope():
    resharding.restore(saved[-1], tf.train.Checkpoint(model=model))
  step = int(model.optimizer.iterations.numpy())
  logging.info("Resumed from %s at step %d (epoch %d)", saved[-1], step, step // steps_per_epoch + 1)
  return step // steps_per_epoch


def _newest_backup(model_dir: str) -> Optional[str]:
  """The checkpoint `BackupAndRestore` would restore from `model_dir/backup` (the chief's own folder), or None."""
  for folder in (os.path.join(model_dir, BACKUP_SUBDIR, "chief"), os.path.join(model_dir, BACKUP_SUBDIR)):
    if tf.io.gfile.isdir(folder) and tf.train.latest_checkpoint(folder):
      return tf.train.latest_checkpoint(folder)
  return None


def evaluate(model: tf_keras.Model, dataset_fn: Callable, steps: Optional[int] = None, exact: bool = False) -> dict:
  """Evaluates a model `tfps.fit` trained, on the workers of its cluster; returns `{metric: float}`.

  With `exact=True` a finite dataset is evaluated so that every example counts exactly once (`steps` is not used).
  """
  num_workers = strategy_lib.cluster_of(model.distribute_strategy).num_workers
  return evaluation.evaluate_on_cluster(model, dataset_fn, num_workers, steps=steps, exact=exact)
