"""How tfps drives tf-keras `Model.fit` under ParameterServerStrategy in each training mode: the train function it
installs in place of tf-keras's own, and the user's `train_step` seen as a step of the mode's loop."""

from typing import Callable

import tensorflow as tf
import tf_keras

from tfps import _tf_private


def set_train_function(model: tf_keras.Model, run: Callable[[object, int], object]) -> None:
  """`model.fit` calls `run(iterator, steps)` for each execution of `steps` (its steps per execution) steps and takes
  what it returns (a RemoteValue of the metric results) as the logs."""
  def make_train_function(force=False):
    if model.train_function is None or force:
      model.train_function = lambda iterator: run(iterator, _tf_private.steps_per_execution(model))
    return model.train_function

  model.make_train_function = make_train_function
  model.train_function = None


def step_fn(model: tf_keras.Model) -> Callable:
  """The model's `train_step` as `fn(batch) -> (loss, number of examples)`."""
  def step(batch):
    logs = model.train_step(batch)
    return logs["loss"], tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
  return step
