"""A model_fn's unsharded variables in this process, restored from checkpoints: evaluate, predict, export.

No cluster is needed. TensorFlow cannot load a SavedModel holding sharded variables (TF issue 60560), and a
checkpoint stores a sharded variable as one full tensor, so restoring into plain variables here gives both a sidecar
evaluator and an export that loads with plain `tf.saved_model.load`.
"""

import os
import time
from typing import Callable, Dict, Iterator, Optional

import tensorflow as tf

from tfps import _tf_private
from tfps.errors import ArgumentTypeError, UsageError
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import deltas
from tfps.estimator import calls
from tfps.estimator import variables as variables_lib
from tfps.estimator.evaluation import ShardedEvaluation
from tfps.estimator.model import ModelFnModel
from tfps.estimator.spec import ModeKeys


def latest_checkpoint(model_dir: str, checkpoint_path: Optional[str] = None, required: bool = True) -> Optional[str]:
  """`checkpoint_path`, or the newest checkpoint of `model_dir`; if there is none, None or (`required`) `ValueError`."""
  path = checkpoint_path or tf.train.latest_checkpoint(checkpoints_lib.checkpoint_dir(model_dir))
  if not path and required:
    raise UsageError(f"no checkpoint in model_dir {model_dir!r}; train first or pass checkpoint_path")
  return path


class LocalModel:
  """One model_fn model in this process; a first traced call creates its variables, then they are restored.

  The first call is traced (never run), as on the cluster, so that code which creates variables only outside
  functions (e.g. a tf_keras.Model's step counters) creates the same variables here as there.
  """

  def __init__(self, model_fn: Callable, params: dict, config):
    self._global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    self.model = ModelFnModel(model_fn, params, config, self._global_step)
    self._checkpoint = None
    self._built = False

  def build(self, element_spec, mode: str) -> None:
    """Creates the variables by tracing one model_fn call on a batch of `element_spec`, unless already created."""
    if not self._built:
      def first_call(element):
        with tf.variable_creator_scope(variables_lib.made_eagerly):  # traced once
          self.model(*calls.split_element(element, mode), mode)

      tf.function(first_call, autograph=False).get_concrete_function(element_spec)
      self._built = True

  def restore(self, checkpoint_path: str) -> int:
    """Loads `checkpoint_path` into the (already created) variables; returns its global step."""
    if self._checkpoint is None:
      self._checkpoint = tf.train.Checkpoint(model=self.model.variables,
                                             **{checkpoints_lib.STEP_KEY: self._global_step})
    self._checkpoint.restore(checkpoint_path).expect_partial().assert_existing_objects_matched()
    return int(self._global_step.numpy())

  def evaluation(self, input_fn, steps: Optional[int]) -> ShardedEvaluation:
    """An evaluation run here, as one shard (the variables are created now)."""
    dataset = calls.call_input_fn(input_fn, ModeKeys.EVAL, self.model.params, self.model.config)
    self.build(dataset.element_spec, ModeKeys.EVAL)
    return ShardedEvaluation(self.model, input_fn, steps, num_shards=1)

  def evaluate(self, input_fn, steps: Optional[int], checkpoint_path: str) -> Dict[str, object]:
    """The metrics of `checkpoint_path` on `input_fn` (plus `global_step`)."""
    evaluation = self.evaluation(input_fn, steps)
    step = self.restore(checkpoint_path)
    return dict(evaluation.run_locally(), global_step=step)

  def predict(self, input_fn, checkpoint_path: str, yield_single_examples: bool = True) -> Iterator:
    """Yields the predictions of `checkpoint_path` for `input_fn`'s dataset, per example or per batch."""
    dataset = calls.call_input_fn(input_fn, ModeKeys.PREDICT, self.model.params, self.model.config)

    def predict_batch(element):
      features, _ = calls.split_element(element, ModeKeys.PREDICT)
      return self.model(features, None, ModeKeys.PREDICT).predictions

    self.build(dataset.element_spec, ModeKeys.PREDICT)
    function = tf.function(predict_batch, autograph=False).get_concrete_function(dataset.element_spec)
    self.restore(checkpoint_path)
    for element in dataset:
      predictions = tf.nest.map_structure(lambda t: t.numpy(), function(element))
      if not yield_single_examples:
        yield predictions
        continue
      flat = tf.nest.flatten(predictions)
      for index in range(len(flat[0])):
        yield tf.nest.map_structure(lambda array, i=index: array[i], predictions)

  def export(self, export_dir_base: str, serving_input_fn, checkpoint_path: str) -> str:
    """Writes a SavedModel of the PREDICT graph to a new timestamped folder in `export_dir_base`; returns it."""
    specs = serving_input_fn() if callable(serving_input_fn) else serving_input_fn
    if not isinstance(specs, dict) or not all(isinstance(s, tf.TensorSpec) for s in specs.values()):
      raise ArgumentTypeError("serving_input_receiver_fn must be (or return) a dict of feature name -> tf.TensorSpec, "
                              f"got {specs!r:.100}")
    export_dir = os.path.join(export_dir_base, str(int(time.time())))
    while os.path.exists(export_dir):
      export_dir = os.path.join(export_dir_base, str(int(export_dir.rsplit(os.sep, 1)[-1]) + 1))
    self.save_serving(export_dir, specs, lambda: self.restore(checkpoint_path))
    return export_dir

  def save_serving(self, folder: str, specs: Dict[str, tf.TensorSpec], load: Callable[[], object]) -> None:
    """Writes to `folder` a SavedModel of the PREDICT graph on the features `specs` (name -> `tf.TensorSpec`) with
    the values `load()` puts into the variables once they are created.

    Its `serving_default` signature takes the features by name and returns the `predictions` dict (a bare tensor as
    `output`); `delta_variables` lists the model variables in creation order (what delta exports ship,
    `tfps.training.deltas.MODULE_VARIABLES`)."""
    names = sorted(specs)
    signature = [tf.TensorSpec(specs[name].shape, specs[name].dtype, name=name) for name in names]

    def serve(*tensors):
      predictions = self.model(dict(zip(names, tensors)), None, ModeKeys.PREDICT).predictions
      return predictions if isinstance(predictions, dict) else {"output": predictions}

    self.build(dict(zip(names, signature)), ModeKeys.PREDICT)
    module = tf.Module()
    module.model_variables = self.model.variables
    module.global_step = self._global_step  # a model_fn may read it (`tf.compat.v1.train.get_global_step()`)
    setattr(module, deltas.MODULE_VARIABLES, list(self.model.variables.model_variables()))
    module.serve = tf.function(serve, input_signature=signature, autograph=False)
    resources = []
    with _tf_private.resources_made(resources):  # the lookup tables the model_fn makes (a StringLookup's), kept
      concrete = _tf_private.traced_as_saved(module.serve)
    module.resources = resources
    load()
    tf.saved_model.save(module, folder, signatures={"serving_default": concrete})
