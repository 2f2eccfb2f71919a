"""Checks on the dataset functions users give: `fn(input_context) -> tf.data.Dataset`, run on every worker."""

import inspect
from typing import Callable, Optional

import tensorflow as tf

from tfps.errors import ArgumentTypeError, UsageError


def check_dataset_fn(fn: Callable, name: str) -> None:
  """Raises a clear error unless `fn` is a function that can take an input context."""
  if isinstance(fn, tf.data.Dataset):
    raise ArgumentTypeError(f"`{name}` must be a function (input_context) -> tf.data.Dataset that builds the "
                            "dataset, since it runs on every worker; got a Dataset built on the chief. Move the code "
                            "that builds it into a function")
  if not callable(fn):
    raise ArgumentTypeError(f"`{name}` must be a function (input_context) -> tf.data.Dataset, got {fn!r}")
  try:
    inspect.signature(fn).bind(tf.distribute.InputContext())
  except TypeError:
    raise ArgumentTypeError(f"`{name}` must take one argument, a tf.distribute.InputContext (e.g. `def {name}"
                            "(input_context):`)") from None
  except ValueError:  # builtins without a signature: let TensorFlow decide
    pass


def make_dataset(fn: Callable, name: str, input_context: Optional[tf.distribute.InputContext] = None
                 ) -> tf.data.Dataset:
  """`fn(input_context)` (a one-pipeline context by default), checked to be a Dataset."""
  dataset = fn(input_context or tf.distribute.InputContext())
  if not isinstance(dataset, tf.data.Dataset):
    raise ArgumentTypeError(f"`{name}` returned {type(dataset).__name__}, not a tf.data.Dataset")
  return dataset


def check_finite(dataset: tf.data.Dataset, name: str) -> None:
  """Raises unless `dataset` is finite (exactly-once evaluation of a repeated dataset never ends)."""
  if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
    raise UsageError(f"exact evaluation needs a finite dataset, but `{name}` returns a repeated (infinite) one; "
                     "remove .repeat() from it")


def batch_size_of(dataset: tf.data.Dataset) -> Optional[int]:
  """The static batch size of `dataset`, or None where it is not static."""
  spec = tf.nest.flatten(dataset.element_spec)[0]
  return spec.shape[0] if spec.shape.rank else None
