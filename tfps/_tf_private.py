"""SHIM: the only place tfps touches private TensorFlow / tf-keras internals.

Each function names why no public way exists. Check them on every TensorFlow / tf-keras upgrade.
"""

import contextlib

import tensorflow as tf


def set_steps_per_execution(model, steps: int) -> None:
  """Sets the steps packed into one scheduled function of an already compiled tf-keras model.

  tf-keras takes `steps_per_execution` only in `compile()`, and the user's `build_model` compiles; recompiling would
  lose the user's compile arguments. Must run under the model's strategy scope (it creates a variable there).
  """
  model._configure_steps_per_execution(steps)  # pylint: disable=protected-access


def steps_per_execution(model) -> int:
  """The compiled model's steps per execution (1 where the user did not choose)."""
  variable = getattr(model, "_steps_per_execution", None)
  return 1 if variable is None else int(tf.keras.backend.get_value(variable))


def set_exact_evaluation_shards(model, shards: int) -> None:
  """Turns on tf-keras's exactly-once evaluation under ParameterServerStrategy (`pss_evaluation_shards` in compile).

  Like `steps_per_execution`, tf-keras reads it only from `compile()`. 0 turns it off.
  """
  model._pss_evaluation_shards = shards  # pylint: disable=protected-access


def exact_evaluation_shards(model) -> int:
  """The model's `pss_evaluation_shards` (0: exact evaluation off)."""
  return getattr(model, "_pss_evaluation_shards", 0) or 0


@contextlib.contextmanager
def swapped_handle(variable, handle):
  """While tracing: every op on `variable` (reads, the optimizer's updates) uses `handle` instead of its own.

  This is how geo training runs the user's step unchanged on worker-local copies: tf-keras layers and optimizers
  hold their variables, and a variable's ops take its `_handle`; TensorFlow has no public way to redirect them.
  """
  variable = unwrapped(variable)
  original = variable._handle  # pylint: disable=protected-access
  variable._handle = handle  # pylint: disable=protected-access
  try:
    yield
  finally:
    variable._handle = original  # pylint: disable=protected-access


def unwrapped(variable):
  """The variable itself: ParameterServerStrategy hands out its variables wrapped in a `CachingVariable`, which
  passes every op to the wrapped one (`_v`)."""
  return variable.__dict__.get("_v", variable)


def create_optimizer_slots(optimizer, variables) -> None:
  """Creates a tf-keras legacy optimizer's slots (and hyperparameters) for `variables` now, under the strategy scope.

  They are otherwise made by its first `apply_gradients`, which geo training runs on worker-local copies.
  """
  optimizer._create_all_weights(variables)  # pylint: disable=protected-access


def uninitialized_variable(**kwargs):
  """A resource variable with its handle but no value yet (`UninitializedVariable`, which TensorFlow itself uses when
  restoring a SavedModel); the caller assigns its value.

  `tf.Variable` assigns its initial value from a tensor the caller still holds, so the variable's memory is a copy
  of it, and on a remote ps the initializer's intermediate results stay alive too: creating a 400 MB variable raised a
  ps's peak RSS by 1.24 GB. TensorFlow has no public way to create a variable without that initial tensor.
  """
  from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-import-not-at-top
  return resource_variable_ops.UninitializedVariable(**kwargs)
