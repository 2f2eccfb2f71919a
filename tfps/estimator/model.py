"""`ModelFnModel`: a user's model_fn bound to its params, config and one set of variables; what a step is."""

import contextlib
from typing import Callable, Optional, Tuple

import tensorflow as tf

from tfps import _tf_private
from tfps.errors import UsageError
from tfps.estimator import calls
from tfps.training import steps as steps_lib
from tfps.estimator.spec import EstimatorSpec, ModeKeys, validate_spec
from tfps.estimator.variables import ModelFnVariables


class ModelFnModel:
  """Calls a model_fn on its own variables and turns its TRAIN spec into a training step.

  One instance lives in one place: under a ParameterServerStrategy scope for training and inline evaluation (its
  variables on the ps), or in a plain process for evaluation, prediction and export (unsharded copies).
  """

  def __init__(self, model_fn: Callable, params: dict, config, global_step: Optional[tf.Variable] = None):
    """`global_step`: the run's step counter, what `tf.compat.v1.train.get_global_step()` gives model_fn."""
    calls.check_model_fn(model_fn)
    self.model_fn = model_fn
    self.params = dict(params)
    self.config = config
    self.variables = ModelFnVariables()
    self.optimizer = None
    self.global_step = global_step

  def __call__(self, features, labels, mode: str) -> EstimatorSpec:
    """The validated EstimatorSpec of `model_fn(features, labels, mode, ...)` on this model's variables."""
    with _global_step_of(self.global_step):
      try:
        spec = self.variables.call(
            lambda: calls.call_model_fn(self.model_fn, features, labels, mode, self.params, self.config), mode)
      except ValueError as e:
        if "No variables to optimize" not in str(e):
          raise
        raise UsageError(f"model_fn called a TF1 optimizer's minimize() ({e}): tfps takes the gradients of the loss "
                         "and applies them; return EstimatorSpec(mode, loss=loss, optimizer=optimizer) instead of a "
                         "train_op") from None
    spec = validate_spec(spec, mode)
    if mode == ModeKeys.TRAIN and self.optimizer is None:
      _check_hyperparameters(spec.optimizer)
      self.optimizer = spec.optimizer  # model_fn builds a new optimizer on every trace; the first one is kept
    return spec

  def train_step(self, batch) -> Tuple[tf.Tensor, tf.Tensor]:
    """One training step on `batch` (replica context): returns `(loss, number of examples)`."""
    features, labels = calls.split_element(batch, ModeKeys.TRAIN)
    with tf.GradientTape() as tape:
      loss = self(features, labels, ModeKeys.TRAIN).loss
    variables = self.variables.trainable_variables_flat()
    gradients = tape.gradient(loss, variables)
    pairs = [(g, v) for g, v in zip(gradients, variables) if g is not None]
    if not pairs:
      raise UsageError("the TRAIN loss of model_fn depends on none of its trainable variables; nothing to train")
    self.optimizer.apply_gradients(pairs)
    return loss, calls.batch_size(features, labels)

  def forward(self, batch) -> None:
    """The TRAIN-mode model_fn call alone on `batch` (replica context), no gradients."""
    features, labels = calls.split_element(batch, ModeKeys.TRAIN)
    self(features, labels, ModeKeys.TRAIN)

  def step(self, global_step: tf.Variable) -> steps_lib.Step:
    """This model's training step for the runners; the runner counts the steps in `global_step`."""
    return steps_lib.Step(run=self.train_step, forward=self.forward, optimizer=lambda: self.optimizer,
                          variables=self.variables.model_variables,
                          trainable_variables=self.variables.trainable_variables_flat, counter=global_step,
                          counts_itself=False, tables=lambda: list(self.variables.tables))

  def checkpoint_objects(self) -> dict:
    """What a checkpoint of this model holds: the model variables (and the optimizer, once a TRAIN call made one)."""
    return {"model": self.variables, **({"optimizer": self.optimizer} if self.optimizer is not None else {})}


def _check_hyperparameters(optimizer) -> None:
  """Raises where the optimizer's learning rate is a tensor of the model_fn's trace (one computed from the global
  step): only the first TRAIN trace's optimizer is kept, and later traces cannot read that trace's tensors."""
  rate = _tf_private.learning_rate_given(optimizer)
  if tf.is_tensor(rate) and tf.is_symbolic_tensor(rate) and not isinstance(rate, tf.Variable):
    raise UsageError(f"the optimizer's learning rate is a tensor model_fn computed ({rate.name}): it belongs to one "
                     "trace of model_fn, and tfps traces it more than once. Give a number or a tf_keras.optimizers."
                     "schedules.LearningRateSchedule (e.g. ExponentialDecay, for tf.compat.v1.train.exponential_decay),"
                     " which reads the optimizer's step")


@contextlib.contextmanager
def _global_step_of(step: Optional[tf.Variable]):
  """Inside, `tf.compat.v1.train.get_global_step()` and `get_or_create_global_step()` give `step` (the run's own
  counter, which the runner advances): TF1 model_fns read the training step from the graph's GLOBAL_STEP collection.
  The collection is put back afterwards."""
  if step is None:
    yield
    return
  collection = tf.compat.v1.get_default_graph().get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_STEP)
  saved = list(collection)
  collection[:] = [step]
  try:
    yield
  finally:
    collection[:] = saved
