"""Exactly-once evaluation of a model_fn in EVAL mode, on the workers or in this process.

The (finite) evaluation dataset is split into `num_shards` shards. One function run evaluates one whole shard with
fresh function-local metric variables and returns partial sums: the loss sum, the batch and example counts and the
metric states. A run retried after a worker failure starts its shard again from zero, so every example counts exactly
once. The coordinator (or this process) adds the partial sums and computes each metric's result on a clone of it.
"""

import dataclasses
import os
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from tfps.errors import UsageError
from tfps.training import dataset_fns
from tfps.training import sidecar
from tfps.estimator import calls
from tfps.estimator.model import ModelFnModel
from tfps.estimator.spec import ModeKeys, ModelFnError

METRICS_FILE = sidecar.METRICS_FILE


@dataclasses.dataclass(frozen=True)
class _MetricLayout:
  name: str
  metric_class: type
  config: dict
  state_indices: tuple


class ShardedEvaluation:
  """Evaluates `input_fn`'s dataset (its first `steps` batches, or all of it) as `num_shards` exact shards."""

  def __init__(self, model: ModelFnModel, input_fn, steps: Optional[int], num_shards: int):
    self._model = model
    self._input_fn = input_fn
    self._steps = steps
    self._num_shards = num_shards
    self._layout: List[_MetricLayout] = []
    self._function = None

  def _dataset(self) -> tf.data.Dataset:
    dataset = calls.call_input_fn(self._input_fn, ModeKeys.EVAL, self._model.params, self._model.config)
    return dataset if self._steps is None else dataset.take(self._steps)

  def concrete_function(self):
    """The traced shard function `f(shard_index) -> partial sums`; the model's variables must exist already."""
    if self._function is None:
      dataset_fns.check_finite(self._dataset(), "input_fn (with steps=None)")
      function = tf.function(self._evaluate_shard, autograph=False)  # a model_fn's errors surface unwrapped
      self._function = function.get_concrete_function(tf.TensorSpec([], tf.int64))
    return self._function

  def _evaluate_shard(self, shard_index):
    iterator = iter(self._dataset().shard(self._num_shards, shard_index))
    with self._model.variables.metric_scope() as metric_locals:

      def body(element, loss_sum, batches, examples):
        features, labels = calls.split_element(element.get_value(), ModeKeys.EVAL)
        spec = self._model(features, labels, ModeKeys.EVAL)
        self._record_layout(spec.eval_metric_ops, metric_locals.created)
        return (iterator.get_next_as_optional(), loss_sum + tf.cast(spec.loss, tf.float64), batches + 1,
                examples + calls.batch_size(features, labels))

      start = (iterator.get_next_as_optional(), tf.constant(0.0, tf.float64), tf.constant(0, tf.int64),
               tf.constant(0, tf.int64))
      _, loss_sum, batches, examples = tf.while_loop(lambda element, *_: element.has_value(), body, start,
                                                     parallel_iterations=1)
      states = [variable.read_value() for variable in metric_locals.created]
    return {"loss_sum": loss_sum, "batches": batches, "examples": examples, "states": states}

  def _record_layout(self, metric_ops: dict, local_variables: list) -> None:
    index_of = {id(variable): index for index, variable in enumerate(local_variables)}
    layout = []
    for name, metric in sorted(metric_ops.items()):
      indices = tuple(index_of.get(id(variable)) for variable in metric.variables)
      if None in indices:
        raise ModelFnError(f"eval_metric_ops[{name!r}] was not created inside model_fn; create a new metric object on "
                           "every model_fn call (its state must start from zero for each evaluation)")
      layout.append(_MetricLayout(name, type(metric), metric.get_config(), indices))
    self._layout = layout

  def run_on_cluster(self, coordinator) -> Dict[str, object]:
    """Evaluates every shard on the workers (one scheduled function per shard) and returns the results."""
    function = self.concrete_function()
    remote = [coordinator.schedule(function, args=(tf.constant(index, tf.int64),))
              for index in range(self._num_shards)]
    coordinator.join()
    return self._aggregate([value.fetch() for value in remote])

  def run_locally(self) -> Dict[str, object]:
    """Evaluates every shard in this process and returns the results."""
    function = self.concrete_function()
    partials = [tf.nest.map_structure(lambda t: t.numpy(), function(tf.constant(index, tf.int64)))
                for index in range(self._num_shards)]
    return self._aggregate(partials)

  def _aggregate(self, partials: list) -> Dict[str, object]:
    batches = int(sum(p["batches"] for p in partials))
    if batches == 0:
      raise UsageError("the evaluation dataset yielded no batches")
    results = {"loss": float(sum(p["loss_sum"] for p in partials)) / batches,
               "examples": int(sum(p["examples"] for p in partials))}
    states = [np.sum([p["states"][i] for p in partials], axis=0) for i in range(len(partials[0]["states"]))]
    for layout in self._layout:
      clone = layout.metric_class.from_config(layout.config)
      if len(clone.variables) != len(layout.state_indices):
        raise ModelFnError(f"eval_metric_ops[{layout.name!r}] ({layout.metric_class.__name__}) creates its state "
                           "lazily and cannot be added up across shards; use a metric that creates its state when "
                           "constructed")
      for variable, index in zip(clone.variables, layout.state_indices):
        variable.assign(states[index])
      results[layout.name] = np.asarray(clone.result()).tolist()
    return results


def write_results(model_dir: str, eval_dir_name: str, results: Dict[str, object], global_step: int,
                  checkpoint_path: Optional[str] = None) -> dict:
  """Appends `results` to `model_dir/<eval_dir_name>/metrics.jsonl` and writes them as TensorBoard scalars there
  (the records of `tfps.training.sidecar`, shared with the Keras path); returns the record."""
  metrics = {name: value for name, value in results.items() if name != "global_step"}
  return sidecar.write_evaluation(os.path.join(model_dir, eval_dir_name), checkpoint_path, global_step, metrics)


def read_results(model_dir: str, eval_dir_name: str = "eval") -> List[dict]:
  """The evaluation records written so far under `model_dir`, oldest first."""
  return sidecar.read_evaluations(model_dir, eval_dir_name)
