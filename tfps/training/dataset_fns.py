"""The dataset functions users give, `fn(input_context) -> tf.data.Dataset`, run on every worker: checks, and the
per-worker iterators training takes its batches from."""

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


def check_lasts(dataset: tf.data.Dataset, name: str, steps: int) -> None:
  """Raises where `dataset` is known to end before `steps` batches: under ParameterServerStrategy each worker reads its
  own copy of a training dataset for as many of the steps as it is given, up to all of them."""
  batches = int(dataset.cardinality())
  if 0 <= batches < steps:
    raise UsageError(f"`{name}` returns a dataset that ends after {batches} batches, and training takes {steps} "
                     "steps; each worker reads its own copy of it for as many of them as it is given: repeat it "
                     "(`.repeat()`)")


def batch_size_of(dataset: tf.data.Dataset) -> Optional[int]:
  """The static batch size of `dataset`, or None where it is not static."""
  return static_batch_size(dataset.element_spec)


def static_batch_size(element_spec) -> Optional[int]:
  """The static batch size of batches of `element_spec` (the leading dimension of its first component), or None."""
  spec = tf.nest.flatten(element_spec)[0]
  return spec.shape[0] if spec.shape.rank else None


def per_worker_iterator(strategy: tf.distribute.Strategy, coordinator, fn: Callable, name: str):
  """An iterator over `fn`'s dataset on every worker, for the scheduled functions of `coordinator` to take batches from
  with `next(iterator)`; `fn` runs on each worker under `strategy`'s scope, with the input context that
  ParameterServerStrategy gives each worker (one input pipeline per worker).

  With one replica per worker (ParameterServerStrategy's own case without GPUs) the dataset is not wrapped as a
  distributed dataset: a distributed iterator of ParameterServerStrategy takes each batch as an optional inside two
  conditionals (partial-batch handling, for batches split over several replicas), ~130 ops more per step on the
  worker. A batch and the end of the input reach a step as they would through it.
  """
  def per_worker_dataset():
    if strategy.num_replicas_in_sync > 1:  # each replica gets its own part of a batch
      return strategy.distribute_datasets_from_function(lambda input_context: make_dataset(fn, name, input_context))
    return make_dataset(fn, name)  # the default context is ParameterServerStrategy's: 1 pipeline, id 0, 1 replica

  with strategy.scope():  # tfps readers split their files between the workers of the strategy in scope
    return iter(coordinator.create_per_worker_dataset(per_worker_dataset))
