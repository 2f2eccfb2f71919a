"""The benchmark workload: Wide&Deep over in-memory Criteo-schema batches, legacy Adagrad (unless a driver picks
another optimizer), the same in every variant.

The input is generated once per worker and cached in memory (`NUM_DISTINCT_BATCHES` batches, repeated), so input
parsing is not what the benchmarks measure. Ids are log-uniform over each feature's vocabulary (heavy-tailed like
click logs: a batch touches few distinct rows of a large table).
"""

import dataclasses
import math
from typing import Callable, Dict, Optional

from tfps.data import schema

NUM_DISTINCT_BATCHES = 16
EMBEDDING_DIM = 16
DEEP_LAYERS = (256, 128, 64)
LEARNING_RATE = 0.05


@dataclasses.dataclass(frozen=True)
class Workload:
  """What every variant trains.

  Attributes:
    batch_size: examples per step (per worker).
    vocab_size: rows of each categorical feature's table.
    big_table_rows: rows of the first feature's (C1) table where > 0 (the table-size benchmark), else `vocab_size`.
    stack_tables: one deep and one wide table for all features (`WideDeep(stack_tables=True)`), else one per feature.
  """

  batch_size: int
  vocab_size: int = 100_000
  big_table_rows: int = 0
  stack_tables: bool = True

  def categorical(self) -> Dict[str, int]:
    sizes = {name: self.vocab_size for name in schema.CATEGORICAL_COLUMNS}
    if self.big_table_rows:
      sizes[schema.CATEGORICAL_COLUMNS[0]] = self.big_table_rows
    return sizes

  def dense(self) -> Dict[str, int]:
    return {schema.DENSE: len(schema.INTEGER_COLUMNS)}

  def dense_shapes(self) -> list:
    """The shapes of the model's dense variables: the wide kernel and bias, then each deep layer's kernel and bias
    (`DEEP_LAYERS`, then the logit's) over the embeddings and the dense features."""
    num_dense = len(schema.INTEGER_COLUMNS)
    shapes, fan_in = [[num_dense, 1], [1]], len(schema.CATEGORICAL_COLUMNS) * EMBEDDING_DIM + num_dense
    for units in DEEP_LAYERS + (1,):
      shapes += [[fan_in, units], [units]]
      fan_in = units
    return shapes

  def state_bytes(self) -> int:
    """Bytes of every trainable float32 variable plus its Adagrad accumulator (the state the ps hold).

    Per categorical feature of `v` rows: `v * (EMBEDDING_DIM + 1)` floats (deep table + wide table); plus the MLP
    and the wide dense weights; times 4 bytes; times 2 for the accumulators.
    """
    rows = sum(self.categorical().values())
    dense_params = sum(math.prod(shape) for shape in self.dense_shapes())
    return (rows * (EMBEDDING_DIM + 1) + dense_params) * 4 * 2


def _batch(index, batch_size: int, categorical: Dict[str, int]):
  """Batch `index` (a scalar tensor): `(features, labels)`, the same for the same index in every process."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (the drivers import this module without TensorFlow)
  seeds = [tf.stack([tf.cast(index, tf.int64), tf.constant(k, tf.int64)]) for k in range(len(categorical) + 2)]
  features = {schema.DENSE: tf.math.log1p(tf.random.stateless_uniform(
      [batch_size, len(schema.INTEGER_COLUMNS)], seeds[0], maxval=1000.0))}
  for k, (name, size) in enumerate(categorical.items()):
    exponent = tf.random.stateless_uniform([batch_size], seeds[k + 2], dtype=tf.float64)
    ids = tf.cast(tf.floor(tf.exp(exponent * tf.math.log(tf.cast(size, tf.float64)))), tf.int64) - 1
    features[name] = tf.clip_by_value(ids, 0, size - 1)
  logit = features[schema.DENSE][:, 0] - 3.5 + tf.cast(features[schema.CATEGORICAL_COLUMNS[1]] % 2, tf.float32)
  labels = tf.cast(tf.random.stateless_uniform([batch_size], seeds[1]) < tf.sigmoid(logit), tf.float32)
  return features, labels


def dataset(workload: Workload):
  """`NUM_DISTINCT_BATCHES` batches generated once, cached, repeated forever."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  categorical = workload.categorical()
  ds = tf.data.Dataset.range(NUM_DISTINCT_BATCHES).map(lambda i: _batch(i, workload.batch_size, categorical))
  return ds.cache().repeat().prefetch(tf.data.AUTOTUNE)


def dataset_fn(workload: Workload):
  """`input_context -> Dataset` for `tfps.fit` and `distribute_datasets_from_function`."""

  def fn(input_context=None):
    del input_context  # every worker trains on its own copy of the same in-memory batches
    return dataset(workload)

  return fn


def build_model(workload: Workload, optimizer: Optional[Callable[[float], object]] = None):
  """The compiled Wide&Deep model of `workload`, with a legacy Adagrad or `optimizer(LEARNING_RATE)`."""
  from tfps import models  # pylint: disable=g-import-not-at-top
  model = models.build_model("wide_deep", workload.categorical(), workload.dense(), embedding_dim=EMBEDDING_DIM,
                             deep_layers=DEEP_LAYERS, stack_tables=workload.stack_tables)
  chosen = "adagrad" if optimizer is None else optimizer(LEARNING_RATE)
  return models.compile_model(model, optimizer=chosen, learning_rate=LEARNING_RATE, metrics=[])


def build_model_fn(workload: Workload, optimizer: Optional[Callable[[float], object]] = None):
  """The same model and optimizer as an Estimator-style model_fn."""
  from tfps.models import model_fns  # pylint: disable=g-import-not-at-top
  model_fn = model_fns.build_model_fn("wide_deep", workload.categorical(), workload.dense(), optimizer="adagrad",
                                      learning_rate=LEARNING_RATE, embedding_dim=EMBEDDING_DIM,
                                      deep_layers=DEEP_LAYERS, stack_tables=workload.stack_tables)
  if optimizer is None:
    return model_fn

  def with_optimizer(features, labels, mode):
    spec = model_fn(features, labels, mode)
    if spec.optimizer is not None:
      spec.optimizer = optimizer(LEARNING_RATE)
    return spec

  return with_optimizer
