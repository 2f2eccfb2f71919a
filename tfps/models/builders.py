"""The model builders behind `tfps.models` (imported from there, with TensorFlow, on first use): `build_model` by
name, `compile_model`, `embedding_tables`, the optimizers by name."""

from typing import Callable, Dict, Mapping, Optional, Sequence, Union

import tensorflow as tf
import tf_keras

from tfps.models.layers import DynamicTables
from tfps.models.ranking import DCN, RankingModel, WideDeep
from tfps.models.retrieval import TwoTowerRetrieval

OPTIMIZERS = {"adagrad": tf_keras.optimizers.legacy.Adagrad, "adam": tf_keras.optimizers.legacy.Adam,
              "sgd": tf_keras.optimizers.legacy.SGD}


def build_wide_deep(categorical: Mapping[str, int], dense: Mapping[str, int], **options) -> WideDeep:
  """Wide&Deep; `options`: `embedding_dim` (16), `deep_layers` ((256, 128, 64)), `stack_tables` (False)."""
  return WideDeep(categorical, dense, **options)


def build_dcn(categorical: Mapping[str, int], dense: Mapping[str, int], **options) -> DCN:
  """DCN-v2; `options`: `embedding_dim` (16), `num_cross_layers` (3), `projection_dim` (None), `deep_layers`,
  `stack_tables` (False: one table per feature; True: one for all, fewer lookups per step under PSS)."""
  return DCN(categorical, dense, **options)


def build_retrieval(categorical: Mapping[str, int], dense: Mapping[str, int], *,
                    candidate_features: Sequence[str] = ("movie_id", "movie_genres"), candidate_id: str = "movie_id",
                    embedding_dim: int = 32, layer_sizes: Sequence[int] = (64, 32),
                    dynamic: Optional[DynamicTables] = None) -> TwoTowerRetrieval:
  """Two-tower retrieval: `candidate_features` feed the candidate tower, every other feature the query tower;
  `dynamic`: `DynamicEmbedding` tables keyed by raw ids in both towers."""
  known = set(categorical) | set(dense)
  unknown = [name for name in candidate_features if name not in known]
  if unknown:
    raise ValueError(f"`candidate_features` names {unknown[0]!r}, not a feature; features: {', '.join(sorted(known))}")

  def split(spec, in_candidate):
    return {name: size for name, size in spec.items() if (name in candidate_features) == in_candidate}

  return TwoTowerRetrieval((split(categorical, False), split(dense, False)),
                           (split(categorical, True), split(dense, True)), candidate_id=candidate_id,
                           embedding_dim=embedding_dim, layer_sizes=layer_sizes, dynamic=dynamic)


def embedding_tables(model: tf_keras.Model) -> Dict[str, tf.Variable]:
  """Every embedding table of `model` by layer name (`embedding_C1`, `wide_C1`, ...): `ShardedVariable`s where the
  strategy's partitioner sharded them."""
  return {layer.name: layer.embeddings for layer in model.submodules if isinstance(layer, tf_keras.layers.Embedding)}


MODELS: Dict[str, Callable[..., tf_keras.Model]] = {
    "wide_deep": build_wide_deep, "dcn": build_dcn, "retrieval": build_retrieval}


def build_model(name: str, categorical: Mapping[str, int], dense: Mapping[str, int], **options) -> tf_keras.Model:
  """The model `name` ("wide_deep", "dcn" or "retrieval") over the given features; see each builder's options."""
  if name not in MODELS:
    raise ValueError(f"model {name!r} is not one of {', '.join(MODELS)}")
  return MODELS[name](categorical, dense, **options)


def compile_model(model: tf_keras.Model, *, optimizer: Union[str, tf_keras.optimizers.legacy.Optimizer] = "adagrad",
                  learning_rate: float = 0.05, **compile_options) -> tf_keras.Model:
  """Compiles `model` for `fit`: ranking models with binary cross-entropy on logits and AUC; retrieval with its task.

  Args:
    model: from `build_model`.
    optimizer: "adagrad", "adam", "sgd" (tf-keras legacy optimizers, as measured under PSS) or an optimizer.
    learning_rate: for a named optimizer.
    **compile_options: passed to `Model.compile` (e.g. `steps_per_execution`, `pss_evaluation_shards`).
  """
  if isinstance(optimizer, str):
    if optimizer not in OPTIMIZERS:
      raise ValueError(f"`optimizer` ({optimizer!r}) must be one of {', '.join(OPTIMIZERS)} or an optimizer")
    optimizer = OPTIMIZERS[optimizer](learning_rate=learning_rate)
  if isinstance(model, RankingModel):
    compile_options.setdefault("loss", tf_keras.losses.BinaryCrossentropy(from_logits=True))
    compile_options.setdefault("metrics", [tf_keras.metrics.AUC(from_logits=True, name="auc")])
  model.compile(optimizer=optimizer, **compile_options)
  return model
