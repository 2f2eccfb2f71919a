"""What cannot be evaluated on the cluster's workers, refused in one line before any step runs (tf-keras would fail
after an epoch of training: with its own ValueError for exact evaluation, or with a gRPC error naming a tensor it
could not copy to a worker)."""

import sys

import tf_keras

from tfps.errors import UsageError

_SIDECAR = "tfps.run_sidecar_evaluator, a plain process that runs the model's own metrics on each checkpoint"


def check_on_workers(model: tf_keras.Model, exact: bool, what: str) -> None:
  """Raises `UsageError` where `model`'s evaluation (exactly once with `exact`) cannot run on the workers: a
  TensorFlow Recommenders `FactorizedTopK` metric (its candidates are read on the chief), and, exactly once, a metric
  added with `add_metric` (tf-keras refuses it under ParameterServerStrategy). `what` names the evaluation asked for."""
  recommenders = sys.modules.get("tensorflow_recommenders")
  if recommenders is not None:
    top_k = [module.name for module in model.submodules if isinstance(module, recommenders.metrics.FactorizedTopK)]
    if top_k:
      raise UsageError(f"{what}: the model's tfrs.metrics.FactorizedTopK ({top_k[0]!r}) cannot run on the cluster's "
                       "workers (its candidates are read on the chief); train without it and measure top-K in the "
                       f"sidecar evaluator ({_SIDECAR}) or with tfps.models.evaluate_top_k")
  if exact:
    compiled = [metric for container in (model.compiled_loss, model.compiled_metrics) if container is not None
                for metric in container.metrics]
    added = [metric.name for metric in model.metrics if all(metric is not known for known in compiled)]
    if added:
      raise UsageError(f"{what}: the metric {added[0]!r}, added with add_metric, cannot be evaluated exactly once on "
                       "the workers (tf-keras refuses such metrics under ParameterServerStrategy); evaluate by steps "
                       f"(exact_evaluation=False), compile it as a metric, or evaluate in the sidecar ({_SIDECAR})")
