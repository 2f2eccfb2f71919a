"""Evaluation of Keras models: on the cluster's workers (optionally exactly once), and by a sidecar evaluator.

The sidecar evaluator is a plain process (no cluster connection): the loop of `tfps.training.sidecar` follows the
checkpoints in `model_dir` and records each evaluation; here each checkpoint is read into an unsharded copy of the
model, and a copy of the best checkpoint is kept in `model_dir/best/`.
"""

import json
import os
from typing import Callable, Dict, List, Optional, Tuple

from absl import logging
import tensorflow as tf
import tf_keras

from tfps import _tf_private
from tfps import checks
from tfps.keras import evaluable
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import sidecar
from tfps.training import dataset_fns
from tfps.errors import UsageError

EXACT_SHARDS_PER_WORKER = 5  # tf-keras's own heuristic for pss_evaluation_shards="auto"
_MINIMIZED = ("loss", "error", "mse", "mae", "crossentropy")


check_finite = dataset_fns.check_finite  # one check, shared with the Estimator path


def plan_exact_evaluation(dataset_fn: Callable, name: str, num_workers: int) -> Tuple[Callable, int]:
  """`(dataset_fn for every worker, number of shards)` for an exactly-once evaluation.

  Every worker must see the whole evaluation set (a shard retried on another worker must read the same examples), so
  the returned function ignores the worker's input context. The set is split into a few shards per worker, so a slow
  or failed worker costs little. tf.data then shards it with its AUTO policy, which fails where it finds fewer files
  (or, for in-memory data, batches) than shards. So a set of known size gets at most one shard per batch, and a set
  read from files is presented as `shards` parts (`range(shards).flat_map(part i)`), which file sharding splits
  exactly.
  """
  dataset = dataset_fns.make_dataset(dataset_fn, name)
  check_finite(dataset, name)
  shards = max(1, num_workers) * EXACT_SHARDS_PER_WORKER
  batches = int(dataset.cardinality())
  if batches >= 0:
    return lambda input_context: dataset_fn(tf.distribute.InputContext()), max(1, min(shards, batches))

  def in_parts(input_context):
    del input_context
    return tf.data.Dataset.range(shards).flat_map(
        lambda part: dataset_fn(tf.distribute.InputContext()).shard(shards, part))
  return in_parts, shards


def to_floats(logs: Dict) -> Dict[str, float]:
  """Metric values (tensors, remote values, numpy) as Python floats."""
  result = {}
  for name, value in logs.items():
    if hasattr(value, "fetch"):
      value = value.fetch()
    result[name] = float(value)
  return result


def evaluate_on_cluster(model: tf_keras.Model, dataset_fn: Callable, num_workers: int, steps: Optional[int] = None,
                        exact: bool = False) -> Dict[str, float]:
  """Evaluates `model` (built under a ParameterServerStrategy) on the workers; returns `{metric: value}`."""
  dataset_fns.check_dataset_fn(dataset_fn, "dataset_fn")
  evaluable.check_on_workers(model, exact, "tfps.evaluate")
  shards = 0
  if exact:
    ensure_metrics_built(model, dataset_fn)
    dataset_fn, shards = plan_exact_evaluation(dataset_fn, "dataset_fn", num_workers)
  elif steps is None:
    raise UsageError("`steps` is required unless exact=True: under ParameterServerStrategy tfps cannot tell where a "
                     "dataset ends")
  _tf_private.set_exact_evaluation_shards(model, shards)
  try:
    logs = model.evaluate(tf_keras.utils.experimental.DatasetCreator(dataset_fn), steps=None if exact else steps,
                          return_dict=True, verbose=0)
  except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
    if exact:
      raise
    raise UsageError(f"a worker's evaluation input ended before `steps` ({steps}) batches: make dataset_fn's dataset "
                     "repeat (`.repeat()`), or evaluate a finite set once with exact=True") from None
  return to_floats(logs)


def is_better(metric: str, value: float, best: Optional[float], mode: str = "auto") -> bool:
  """Whether `value` of `metric` beats `best` (mode "min", "max", or "auto": min for losses and errors)."""
  checks.one_of("best_mode", mode, ("auto", "min", "max"))
  if best is None:
    return True
  if mode == "auto":
    mode = "min" if any(word in metric for word in _MINIMIZED) else "max"
  return value < best if mode == "min" else value > best


class _BestCheckpoint:
  """Keeps a copy of the best checkpoint so far (by `best_metric`) in `model_dir/best/`, with `best.json`."""

  def __init__(self, model_dir: str, best_metric: Optional[str], best_mode: str):
    checks.one_of("best_mode", best_mode, ("auto", "min", "max"))
    self.best_dir = os.path.join(model_dir, "best")
    self.best_metric = best_metric
    self.best_mode = best_mode
    self.best = self._read_best()

  def _read_best(self) -> Optional[dict]:
    staging = self.best_dir + ".new"  # whole, where a sidecar stopped between `_keep_best`'s two renames
    if not tf.io.gfile.exists(self.best_dir) and tf.io.gfile.exists(os.path.join(staging, "best.json")):
      tf.io.gfile.rename(staging, self.best_dir)
    path = os.path.join(self.best_dir, "best.json")
    if not tf.io.gfile.exists(path):
      return None
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)

  def check_names(self, model: tf_keras.Model) -> None:
    """Refuses a `best_metric` the model does not report before any checkpoint is evaluated, where its names are
    known (a model evaluated by tf-keras's own `test_step`, its metrics built: `ensure_built(metrics=True)`)."""
    if self.best_metric is not None and type(model).test_step is tf_keras.Model.test_step:
      self._check(self.best_metric, model.metrics_names)

  @staticmethod
  def _check(metric: str, names) -> None:
    if metric not in names:
      raise UsageError(f"`best_metric` {metric!r} is not one of the model's metrics: {', '.join(sorted(names))}")

  def __call__(self, record: dict) -> None:
    path, metrics = record["checkpoint"], record["metrics"]
    metric = self.best_metric or ("auc" if "auc" in metrics else "loss")
    self._check(metric, metrics)
    previous = self.best if self.best is not None and self.best["metric"] == metric else None
    if self.best is not None and previous is None:  # an earlier sidecar's best by another metric: not comparable
      logging.info("The best checkpoint kept so far was chosen by %s; choosing by %s from now on",
                   self.best["metric"], metric)
      self.best = None
    if is_better(metric, metrics[metric], previous and previous["value"], self.best_mode):
      self._keep_best(path, metric, metrics[metric], record["step"])

  def _keep_best(self, path: str, metric: str, value: float, step: int) -> None:
    """Makes the new best folder beside the old one, then puts it in its place: a sidecar stopped at any moment
    leaves a whole best folder (or, for an instant between two renames, `best.new` alone). A checkpoint deleted before
    it was kept (training went `keep_checkpoint_max` checkpoints further meanwhile) leaves the best as it was."""
    staging, previous = self.best_dir + ".new", self.best_dir + ".old"
    for folder in (staging, previous):
      if tf.io.gfile.exists(folder):
        tf.io.gfile.rmtree(folder)
    try:
      checkpoints_lib.copy_checkpoint(path, staging)
    except tf.errors.NotFoundError as e:
      logging.warning("Not kept as the best: %s", e.message)
      return
    best = {"checkpoint": path, "copy": os.path.join(self.best_dir, os.path.basename(path)), "metric": metric,
            "value": value, "step": step}
    with tf.io.gfile.GFile(os.path.join(staging, "best.json"), "w") as f:
      json.dump(best, f)
    if tf.io.gfile.exists(self.best_dir):
      tf.io.gfile.rename(self.best_dir, previous)
    tf.io.gfile.rename(staging, self.best_dir)
    if tf.io.gfile.exists(previous):
      tf.io.gfile.rmtree(previous)
    self.best = best
    logging.info("New best checkpoint %s: %s %.4f", path, metric, value)


def ensure_built(model: tf_keras.Model, dataset: tf.data.Dataset, metrics: bool = False) -> None:
  """Builds a model whose inputs are not declared (a subclassed model) by calling it on one batch of `dataset`, and on
  that batch its compiled metrics: those the compile named (tf-keras would build them in the first step's trace, and a
  tf.function whose first trace makes variables is traced twice), or with `metrics` its container even if empty."""
  container = model.compiled_metrics
  metrics = container is not None and not container.built and (metrics or _tf_private.has_unbuilt_metrics(model))
  if model.built and not metrics:
    return
  batch = next(iter(dataset.take(1)))
  x, y, _ = tf_keras.utils.unpack_x_y_sample_weight(batch)
  if _has_call(model):
    outputs = model(x)
  else:  # built by its test_step (its steps compute the loss: TensorFlow Recommenders' `compute_loss`)
    model.test_step(batch)
    model.reset_metrics()
    outputs = None
  if metrics:
    if outputs is None or y is None:  # a model with a loss of its own: the containers only hold its exact "loss"
      outputs = y = tf.zeros(())
    container.build(outputs, y)
    if not model.compiled_loss.built:  # its per-output loss metrics too, as a first step would make them
      model.compiled_loss.build(outputs)


def _has_call(model: tf_keras.Model) -> bool:
  """Whether the model computes outputs: a functional model, or a subclass with a `call` of its own (a model of
  TensorFlow Recommenders may have none, its steps calling `compute_loss`)."""
  return type(model).call is not tf_keras.Model.call


def ensure_metrics_built(model: tf_keras.Model, dataset_fn: Callable) -> None:
  """Builds the compiled metrics of a model that has run no step (e.g. restored from a finished run) on one batch.

  tf-keras builds them at a model's first step, but its exactly-once evaluation copies them to the workers before any
  step, and fails on unbuilt ones.
  """
  if model.compiled_metrics is None or model.compiled_metrics.built:
    return
  dataset = dataset_fns.make_dataset(dataset_fn, "dataset_fn")  # only then: the chief reads one batch
  with model.distribute_strategy.scope():
    ensure_built(model, dataset, metrics=True)


def run_sidecar_evaluator(build_model: Callable[[], tf_keras.Model], dataset_fn: Callable, model_dir: str, *,
                          steps: Optional[int] = None, best_metric: Optional[str] = None, best_mode: str = "auto",
                          evaluate_every_checkpoint: bool = False, poll_secs: float = 1.0,
                          idle_timeout_secs: Optional[float] = sidecar.DEFAULT_IDLE_TIMEOUT_SECS) -> List[dict]:
  """Evaluates the checkpoints of `model_dir` as they appear until the final one; returns one record per evaluation.

  The loop and the records (`metrics.jsonl`: checkpoint, checkpoint_number, step, metrics, time) are
  `tfps.training.sidecar`'s, shared with the Estimator path; this adds a copy of the best checkpoint in
  `model_dir/best/`.

  Args:
    build_model: returns the compiled tf-keras model (built here without any strategy).
    dataset_fn: `fn(input_context) -> Dataset` of evaluation batches; finite unless `steps` is given.
    model_dir: the training run's model_dir.
    steps: evaluation steps per checkpoint; None evaluates the whole (finite) dataset.
    best_metric: metric that picks the best checkpoint (default: auc if the model has it, else loss).
    best_mode: "min", "max", or "auto" (min for losses and errors).
    evaluate_every_checkpoint: evaluate every checkpoint in order, not only the newest.
    poll_secs: seconds between looks at `model_dir`.
    idle_timeout_secs: raise `TimeoutError` when no new checkpoint appears for this long (None: wait forever).
  """
  dataset_fns.check_dataset_fn(dataset_fn, "dataset_fn")
  dataset = dataset_fns.make_dataset(dataset_fn, "dataset_fn")
  if steps is None:
    check_finite(dataset, "dataset_fn")
  best = _BestCheckpoint(model_dir, best_metric, best_mode)
  model = build_model()
  ensure_built(model, dataset, metrics=best_metric is not None)
  best.check_names(model)

  def evaluate(path: str) -> Dict[str, float]:
    tf.train.Checkpoint(model=model).read(path).expect_partial()
    return to_floats(model.evaluate(dataset, steps=steps, return_dict=True, verbose=0))

  return sidecar.follow_checkpoints(model_dir, evaluate, evaluate_every_checkpoint=evaluate_every_checkpoint,
                                    poll_secs=poll_secs, idle_timeout_secs=idle_timeout_secs, after_record=best)
