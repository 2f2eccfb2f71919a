"""Ranking models for binary labels (Criteo click, MovieLens "liked"): Wide&Deep and DCN-v2.

Both are `tf_keras.Model`s called on a feature dict and returning logits `[batch, 1]`. They are plain Keras models,
not `tfrs.models.Model`s: the Keras loss and metrics then work unchanged under ParameterServerStrategy, including
exact evaluation (`pss_evaluation_shards`), which refuses models whose metrics are updated inside `train_step`.

The contract every tfps model keeps, for the Estimator-style path that drives its own loop:
`model.step_loss(features, labels, training)` returns the scalar loss to minimise (regularisation included).
"""

from typing import Mapping, Optional, Sequence

import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

from tfps import checks
from tfps.errors import UsageError
from tfps.models.layers import DynamicTables, FeatureEmbeddings, StackedEmbedding, check_spec, check_tables, mlp


class RankingModel(tf_keras.Model):
  """Base of the binary ranking models: subclasses implement `call(features, training)` returning logits [batch, 1].

  Compile with `tfps.models.compile_model` (binary cross-entropy on logits, AUC), or drive `step_loss` yourself.
  """

  def step_loss(self, features: Mapping[str, tf.Tensor], labels: tf.Tensor, training: bool = True) -> tf.Tensor:
    """Mean sigmoid cross-entropy of the batch plus the model's regularisation losses."""
    return self.loss_from_logits(self(features, training=training), labels)

  def loss_from_logits(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """`step_loss` for logits already computed: mean sigmoid cross-entropy plus regularisation losses."""
    labels = tf.reshape(tf.cast(labels, logits.dtype), tf.shape(logits))
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    return loss + tf.add_n(self.losses) if self.losses else loss


class WideDeep(RankingModel):
  """Wide&Deep: a linear model over one-hot ids and dense features, plus an MLP over embeddings and dense features.

  The wide part keeps one weight per id (a `[vocabulary, 1]` table per categorical feature, sharded like the deep
  tables where large); the two parts' logits are summed. `dynamic` (`tfps.models.layers.DynamicTables`) makes every
  wide and deep table a `DynamicEmbedding` keyed by the readers' ids. `stack_tables=True` keeps one wide and one deep
  table for all features (`tfps.models.layers.StackedEmbedding`): 2 lookups and updates per ps per step instead of 52.
  """

  def __init__(self, categorical: Mapping[str, int], dense: Mapping[str, int], *, embedding_dim: int = 16,
               deep_layers: Sequence[int] = (256, 128, 64), stack_tables: bool = False,
               dynamic: Optional[DynamicTables] = None, name: str = "wide_deep"):
    super().__init__(name=name)
    check_spec(categorical, dense)
    check_tables(stack_tables, dynamic)
    self.wide_stacked = (StackedEmbedding(categorical, 1, embeddings_initializer="zeros", name="wide_stacked")
                         if stack_tables and categorical else None)
    self.wide_ids = {} if self.wide_stacked else (
        {feature: (dynamic.table(size, 1, f"wide_{feature}", init_scale=0.0) if dynamic else
                   tf_keras.layers.Embedding(size, 1, embeddings_initializer="zeros", name=f"wide_{feature}"))
         for feature, size in categorical.items()})
    self.wide_dense = tf_keras.layers.Dense(1, kernel_initializer="zeros", name="wide_dense") if dense else None
    self.dense_widths = dict(dense)
    self.deep_inputs = FeatureEmbeddings(categorical, dense, embedding_dim, name="deep_features",
                                         stack_tables=stack_tables, dynamic=dynamic)
    self.deep = mlp(deep_layers, name="deep_mlp")
    self.deep_logit = tf_keras.layers.Dense(1, name="deep_logit")

  def call(self, features: Mapping[str, tf.Tensor], training: bool = False) -> tf.Tensor:
    deep = self.deep_logit(self.deep(self.deep_inputs(features), training=training))
    wide = [table(features[feature]) for feature, table in self.wide_ids.items()]
    if self.wide_stacked is not None:
      wide.append(tf.reduce_sum(self.wide_stacked(features), axis=1))
    if self.wide_dense is not None:
      dense = [tf.reshape(tf.cast(features[name], tf.float32), [-1, width])
               for name, width in self.dense_widths.items()]
      wide.append(self.wide_dense(tf.concat(dense, axis=1)))
    return deep + tf.add_n(wide)


class DCN(RankingModel):
  """DCN-v2: stacked `tfrs.layers.dcn.Cross` layers over the embeddings and dense features, then an MLP."""

  def __init__(self, categorical: Mapping[str, int], dense: Mapping[str, int], *, embedding_dim: int = 16,
               num_cross_layers: int = 3, projection_dim: Optional[int] = None,
               deep_layers: Sequence[int] = (256, 128), stack_tables: bool = False,
               dynamic: Optional[DynamicTables] = None, name: str = "dcn"):
    super().__init__(name=name)
    checks.positive_int("num_cross_layers", num_cross_layers)
    if projection_dim is not None and (not checks.is_int(projection_dim) or projection_dim < 1):
      raise UsageError(f"`projection_dim` ({projection_dim!r}) must be None (full-rank) or a positive integer")
    self.inputs_layer = FeatureEmbeddings(categorical, dense, embedding_dim, name="features",
                                          stack_tables=stack_tables, dynamic=dynamic)
    self.cross = [tfrs.layers.dcn.Cross(projection_dim=projection_dim, kernel_initializer="glorot_uniform",
                                        name=f"cross_{i}") for i in range(num_cross_layers)]
    self.deep = mlp(deep_layers, name="deep_mlp")
    self.logit = tf_keras.layers.Dense(1, name="logit")

  def call(self, features: Mapping[str, tf.Tensor], training: bool = False) -> tf.Tensor:
    x0 = self.inputs_layer(features)
    x = x0
    for layer in self.cross:
      x = layer(x0, x)
    return self.logit(self.deep(x, training=training))
