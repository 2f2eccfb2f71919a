"""The tfps models as Estimator-style `model_fn`s (for `tfps.estimator.Estimator`).

`build_model_fn(name, categorical, dense, ...)` returns `model_fn(features, labels, mode)` that builds the model
(the Estimator hands the first call's variables back to every later call), and returns an `EstimatorSpec`:

* TRAIN: `loss` = `model.step_loss(...)` and the optimizer;
* EVAL: the loss, and for ranking models an `auc` metric;
* PREDICT: ranking models `{"logits", "probabilities"}` of shape [batch, 1]; retrieval `{"query_embedding"}`.
"""

from typing import Callable, Mapping

import tensorflow as tf
import tf_keras

from tfps import checks
from tfps.models import OPTIMIZERS, build_model
from tfps.models.ranking import RankingModel


def build_model_fn(name: str, categorical: Mapping[str, int], dense: Mapping[str, int], *,
                   optimizer: str = "adagrad", learning_rate: float = 0.05, **options) -> Callable:
  """A `model_fn` training model `name` (see `tfps.models.build_model` for `options`) with a named optimizer."""
  checks.one_of("optimizer", optimizer, OPTIMIZERS)
  build_model(name, categorical, dense, **options)  # fail here, not inside the first trace, on bad options

  def model_fn(features, labels, mode):
    from tfps import estimator  # pylint: disable=g-import-not-at-top  (the Estimator path imports tfps.models)
    model = build_model(name, categorical, dense, **options)
    training = mode == estimator.ModeKeys.TRAIN
    if mode == estimator.ModeKeys.PREDICT:
      outputs = model(features)
      if isinstance(model, RankingModel):
        return estimator.EstimatorSpec(mode, predictions={"logits": outputs, "probabilities": tf.sigmoid(outputs)})
      return estimator.EstimatorSpec(mode, predictions={"query_embedding": outputs})
    if not isinstance(model, RankingModel):
      loss = model.step_loss(features, labels, training=training)
      metrics = {}
    else:
      logits = model(features, training=training)
      loss = model.loss_from_logits(logits, labels)
      metrics = {}
      if not training:
        metrics["auc"] = tf_keras.metrics.AUC(from_logits=True, name="auc")
        metrics["auc"].update_state(tf.reshape(labels, [-1, 1]), logits)
    if training:
      return estimator.EstimatorSpec(mode, loss=loss, optimizer=OPTIMIZERS[optimizer](learning_rate=learning_rate))
    return estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)

  return model_fn
