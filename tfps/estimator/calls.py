"""Calls a user's `input_fn` / `model_fn` with the arguments it names, as `tf.estimator` did."""

import inspect
from typing import Any, Callable, Mapping, Tuple

import tensorflow as tf

from tfps.errors import ArgumentTypeError

INPUT_FN_ARGS = ("params", "mode", "config", "input_context")
MODEL_FN_ARGS = ("labels", "mode", "params", "config")


def _named_args(fn: Callable, what: str, available: Mapping[str, Any], skip_first: bool) -> dict:
  try:
    parameters = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):  # a callable without a signature (some C extensions): call it bare
    return {}
  if skip_first:
    if not parameters or parameters[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                     inspect.Parameter.POSITIONAL_OR_KEYWORD):
      raise ArgumentTypeError(f"{what} must take `features` as its first argument; its signature is "
                              f"{inspect.signature(fn)}")
    parameters = parameters[1:]
  kwargs = {}
  for parameter in parameters:
    if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
      continue
    if parameter.name in available:
      kwargs[parameter.name] = available[parameter.name]
    elif parameter.default is inspect.Parameter.empty:
      raise ArgumentTypeError(f"{what} takes argument {parameter.name!r}, which tfps cannot supply; the arguments it "
                              f"can pass by name are: {', '.join(available)}")
  return kwargs


def check_model_fn(model_fn: Callable) -> None:
  """Raises `TypeError` if `model_fn` cannot be called as `model_fn(features, labels, mode, params, config)`."""
  if not callable(model_fn):
    raise ArgumentTypeError(f"`model_fn` must be callable, got {type(model_fn).__name__}")
  _named_args(model_fn, "model_fn", dict.fromkeys(MODEL_FN_ARGS), skip_first=True)


def call_model_fn(model_fn: Callable, features, labels, mode: str, params: dict, config) -> Any:
  """`model_fn(features, ...)` with whichever of labels, mode, params and config it names.

  `params` is a fresh copy on every call, so a model_fn that changes it cannot change later calls.
  """
  available = {"labels": labels, "mode": mode, "params": dict(params), "config": config}
  return model_fn(features, **_named_args(model_fn, "model_fn", available, skip_first=True))


def call_input_fn(input_fn: Callable, mode: str, params: dict, config,
                  input_context: tf.distribute.InputContext = None) -> tf.data.Dataset:
  """The dataset of `input_fn`, called with the arguments it names (`params`, `mode`, `config`, `input_context`)."""
  if not callable(input_fn):
    raise ArgumentTypeError(f"input_fn must be a function that builds a tf.data.Dataset (it runs on every worker), got "
                            f"{type(input_fn).__name__}; move the code that builds the dataset into a function")
  available = {"params": dict(params), "mode": mode, "config": config,
               "input_context": input_context or tf.distribute.InputContext()}
  dataset = input_fn(**_named_args(input_fn, "input_fn", available, skip_first=False))
  if not isinstance(dataset, tf.data.Dataset):
    raise ArgumentTypeError(f"input_fn must return a tf.data.Dataset of (features, labels) in mode {mode!r}, got "
                            f"{type(dataset).__name__}")
  return dataset


def split_element(element, mode: str) -> Tuple[Any, Any]:
  """`(features, labels)` of one dataset element; in PREDICT a bare `features` element is allowed too."""
  if isinstance(element, tuple) and len(element) == 2:
    return element
  if mode == "infer":
    return element, None
  raise ArgumentTypeError(f"input_fn's dataset must yield (features, labels) pairs in mode {mode!r}; got an element "
                          f"of type {type(element).__name__}")


def batch_size(features, labels) -> tf.Tensor:
  """The number of examples in a batch (first dimension of labels, else of the first feature), as int64."""
  first = labels if labels is not None else tf.nest.flatten(features)[0]
  return tf.cast(tf.shape(first)[0], tf.int64)
