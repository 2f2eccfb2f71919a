"""Serving export: a SavedModel of a trained model with its sharded variables merged.

TensorFlow cannot load a SavedModel that holds sharded variables (issue 60560), so the export rebuilds the model
outside any strategy, restores the trained values into it (checkpoints store sharded variables whole), and saves that.
"""

import os
import tempfile
import threading
from typing import Any, Callable, Optional

from absl import logging
import tensorflow as tf
import tf_keras

from tfps import checks
from tfps.errors import ArgumentTypeError, CheckpointMismatchError, UsageError
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import dataset_fns


def _source_checkpoint(model, model_dir, checkpoint, scratch_dir) -> str:
  given = [name for name, value in (("model", model), ("model_dir", model_dir), ("checkpoint", checkpoint))
           if value is not None]
  if len(given) != 1:
    raise UsageError(f"give exactly one of `model`, `model_dir`, `checkpoint` to export from; got {given or 'none'}")
  if model is not None:
    return tf.train.Checkpoint(model=model).write(os.path.join(scratch_dir, "ckpt"))
  if model_dir is not None:
    paths = checkpoints_lib.list_checkpoints(model_dir)
    if not paths:
      raise UsageError(f"no checkpoint in {checkpoints_lib.checkpoint_dir(model_dir)!r} to export")
    return paths[-1]
  if not tf.io.gfile.exists(f"{checkpoint}.index"):
    raise UsageError(f"`checkpoint` ({checkpoint!r}) is not a checkpoint (no {checkpoint}.index); give a checkpoint's "
                     "path (model_dir/checkpoints/ckpt-N), or `model_dir` to export its newest")
  return checkpoint


def export_saved_model(build_model: Callable[[], tf_keras.Model], export_dir: str, *,
                       model: Optional[tf_keras.Model] = None, model_dir: Optional[str] = None,
                       checkpoint: Optional[str] = None, dataset_fn: Optional[Callable] = None) -> str:
  """Writes a SavedModel of the trained model to `export_dir`, loadable with no cluster; returns `export_dir`.

  It loads with `tf.saved_model.load(export_dir)` (serving signature `serving_default`) and with
  `tf_keras.models.load_model(export_dir)`.

  Args:
    build_model: the function that built the trained model; called here outside any strategy.
    export_dir: where to write the SavedModel.
    model: the trained model (e.g. `history.model` from `tfps.fit`); or else
    model_dir: export the newest checkpoint of this training run; or else
    checkpoint: export this checkpoint path.
    dataset_fn: gives one batch to build a model whose inputs are not declared (subclassed models).
  """
  if not callable(build_model) or isinstance(build_model, tf_keras.Model):
    raise ArgumentTypeError(f"`build_model` must be the function that built the model (called here outside any "
                            f"strategy), got {type(build_model).__name__}; the trained model goes in `model=`")
  checks.directory("export_dir", export_dir)
  with tempfile.TemporaryDirectory() as scratch_dir:
    source = _source_checkpoint(model, model_dir, checkpoint, scratch_dir)
    outside_strategies(lambda: _save_plain(build_model, source, export_dir, dataset_fn))
  return export_dir


def outside_strategies(run: Callable[[], Any]) -> Any:
  """`run()` where no strategy is in scope (a callback of `Model.fit` runs in its strategy's scope, and a model built
  there would place its variables and table locks on the ps): in a thread of its own, as a scope is per thread.
  Returns what `run()` returns."""
  if not tf.distribute.has_strategy():
    return run()
  returned, failed = [], []

  def target():
    try:
      returned.append(run())
    except BaseException as e:  # pylint: disable=broad-except  (raised again in the caller's thread)
      failed.append(e)

  thread = threading.Thread(target=target, name="tfps-outside-strategies")
  thread.start()
  thread.join()
  if failed:
    raise failed[0]
  return returned[0]


def _save_plain(build_model, source: str, export_dir: str, dataset_fn) -> None:
  """Builds the model outside any strategy, restores checkpoint `source` into it, and saves it to `export_dir`."""
  plain = build_model()
  if not plain.built:
    if dataset_fn is None:
      raise UsageError("`build_model` returns a model with undeclared inputs; pass `dataset_fn` so tfps can build "
                       "it with one batch")
    features = next(iter(dataset_fns.make_dataset(dataset_fn, "dataset_fn").take(1)))
    plain(features[0] if isinstance(features, tuple) else features)
  try:
    tf.train.Checkpoint(model=plain).read(source).expect_partial().assert_existing_objects_matched()
  except (AssertionError, ValueError) as e:
    first = str(e).strip().split("\n")[0]
    raise CheckpointMismatchError(f"checkpoint {source} does not fit the model `build_model` returns: {first}") from None
  plain.save(export_dir, include_optimizer=False)
  logging.info("Exported %s to %s", source, export_dir)
