"""Layers the tfps models share: per-feature embedding tables over a feature dict, and an MLP.

One table per categorical feature, not one shared hashed table. Each table is sized to its feature's vocabulary
(Criteo's C-features range from 3 to millions of ids), features never collide with each other, and the strategy's
partitioner (`tfps.training.strategy.ShardLargeVariables`) shards exactly the tables big enough to matter while small ones stay
whole on one ps. A single shared table would shard more evenly and cost one gather per shard per step instead of one
per table-shard, but it forces one embedding width and mixes every feature's collisions; per-feature tables are the
clearer default, and the lookup cost is paid on the ps side, where `tf.nn.embedding_lookup` on a `ShardedVariable`
gathers only the rows a batch needs from each shard (never the whole table).

With `dynamic` (`DynamicTables`, flag `--embedding=dynamic`) each feature's table is a `DynamicEmbedding` keyed by
the ids the reader gives (MovieLens's raw user and movie ids; Criteo's ids hashed into `--num_buckets`, which can then
be far larger than any table): no two live ids share a row, whatever the id space.

`stack_tables=True` (`StackedEmbedding`) keeps one table for all features instead, each feature's ids offset by the
rows of the features before it, so features still never collide. Under ParameterServerStrategy every table-shard
costs a gather and a sparse update crossing the network per step, a fixed cost that weighs most at small batches: on
Wide&Deep over the 26 Criteo features stacking cuts 104 such remote operations per ps and step to 4 (measured in
bench/results/NOTES.md).
"""

import dataclasses
import math
import sys
from typing import Dict, List, Mapping, Optional, Sequence

import tensorflow as tf
import tf_keras

from tfps import checks
from tfps.errors import UsageError

def check_spec(categorical: Mapping[str, int], dense: Mapping[str, int]) -> None:
  """Raises ValueError, quoting the entry, unless every vocabulary size and dense width is a positive int."""
  for kind, spec in (("categorical", categorical), ("dense", dense)):
    for name, size in spec.items():
      if not checks.is_int(size) or size < 1:
        raise UsageError(f"`{kind}` feature {name!r} has size {size!r}; sizes must be positive integers")
  if not categorical and not dense:
    raise ValueError("no features: give at least one categorical or dense feature")


@dataclasses.dataclass(frozen=True)
class DynamicTables:
  """How the models build `DynamicEmbedding` tables (one per categorical feature, and per wide feature).

  Attributes:
    capacity: the most rows of one feature's table. A feature whose id space is smaller gets that many rows, plus,
      when the table is sharded, 4 standard deviations of slack per shard: ids go to shards by hash, not evenly
      (measured on MovieLens with 2 shards of exactly the id space: 51 of 943 users found their shard full).
    min_count, steps_to_live: the tables' admission and eviction (`DynamicEmbedding`).
    num_shards, min_shard_bytes: the strategy's (`tfps.build_strategy`: by default the number of ps, 256 KiB); a
      table's `num_shards` is what its partitioner makes of it, so that a copy built outside the strategy (serving
      export, sidecar evaluation) reads the training checkpoint.
  """

  capacity: int
  min_count: int = 1
  steps_to_live: Optional[int] = None
  num_shards: int = 1
  min_shard_bytes: Optional[int] = None  # None: the strategy's default

  def table(self, vocabulary: int, dim: int, name: str, init_scale: float = 0.05) -> tf_keras.layers.Layer:
    # Imported here: a model with hashed tables (bench/plain_pss_train.py's peer among others) loads none of tfps's
    # training machinery.
    from tfps.models.dynamic_embedding import DynamicEmbedding  # pylint: disable=import-outside-toplevel
    from tfps.training import strategy as strategy_lib  # pylint: disable=import-outside-toplevel
    min_shard_bytes = strategy_lib.DEFAULT_MIN_SHARD_BYTES if self.min_shard_bytes is None else self.min_shard_bytes
    partitioner = strategy_lib.ShardLargeVariables(self.num_shards, min_shard_bytes)
    capacity = min(vocabulary, self.capacity)
    shards = partitioner([capacity, dim], tf.float32)[0]
    if shards > 1 and capacity == vocabulary:
      per_shard = -(-vocabulary // shards)
      capacity = min(self.capacity, shards * (per_shard + 4 * math.ceil(math.sqrt(per_shard)) + 4))
      shards = partitioner([capacity, dim], tf.float32)[0]
    return DynamicEmbedding(capacity, dim, min_count=self.min_count, steps_to_live=self.steps_to_live,
                            init_scale=init_scale, num_shards=shards, name=name)


def check_tables(stack_tables: bool, dynamic: Optional[DynamicTables]) -> None:
  if stack_tables and dynamic is not None:
    raise UsageError("`stack_tables` and dynamic tables (--embedding=dynamic) exclude each other: a dynamic table "
                     "keeps one id map per feature")


class StackedEmbedding(tf_keras.layers.Layer):
  """One embedding table for several categorical features; feature `k`'s ids are offset by the rows of features
  `0..k-1`, so each feature keeps rows of its own.

  `call(features)` returns `[batch, len(vocab_sizes), output_dim]`, features in the order of `vocab_sizes`; ids are
  `[batch]` tensors in `0..vocab-1` (the readers' hashed ids). Each distinct id of a batch is looked up once.
  """

  def __init__(self, vocab_sizes: Mapping[str, int], output_dim: int, embeddings_initializer="uniform",
               name: str = "stacked_embedding", **kwargs):
    super().__init__(name=name, **kwargs)
    check_spec(vocab_sizes, {})
    self.vocab_sizes = dict(vocab_sizes)
    offsets, total = [], 0
    for size in self.vocab_sizes.values():
      offsets.append(total)
      total += size
    self.offsets = offsets
    self.table = _DistinctIdsTable(total, output_dim, embeddings_initializer=embeddings_initializer, name=name)

  def call(self, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
    # One add of every feature's offset (one op a step, not one per feature).
    ids = tf.stack([tf.reshape(tf.cast(features[feature], tf.int64), [-1]) for feature in self.vocab_sizes],
                   axis=1) + tf.constant(self.offsets, tf.int64)
    # Looks up each distinct id once: under ParameterServerStrategy only distinct rows cross the network, and the
    # gradient reaches the ps already summed per row (the sum runs here, on the worker, not again on the ps).
    unique_ids, positions = tf.unique(tf.reshape(ids, [-1]))
    rows = tf.gather(self.table(unique_ids), positions)
    return tf.reshape(rows, [-1, len(self.offsets), self.table.output_dim])


class _DistinctIdsTable(tf_keras.layers.Embedding):
  """A tf-keras `Embedding` called with distinct ids only (`StackedEmbedding`'s). While async training traces a step,
  it gathers from each shard itself and marks the ids it gathers (`tfps.training.distinct_rows`), so the optimizer
  on the ps applies the gradient without summing it per row again; elsewhere it is tf-keras's own `Embedding`."""

  def call(self, inputs):
    # Only async training turns marking on (`tfps.training.distinct_rows.applying`), so where that module was never
    # loaded (a model trained without tfps: bench's plain peer) the table looks up as tf-keras does, loading none of it.
    distinct_rows = sys.modules.get("tfps.training.distinct_rows")
    if distinct_rows is None or not distinct_rows.active():
      return super().call(inputs)
    rows = distinct_rows.lookup(self.embeddings, inputs)
    return rows if self.compute_dtype == self.variable_dtype else tf.cast(rows, self.compute_dtype)


class FeatureEmbeddings(tf_keras.layers.Layer):
  """Looks up one embedding table per categorical feature of a feature dict and appends the dense features.

  `call(features)` returns a `[batch, len(categorical) * dim + sum(dense widths)]` float32 tensor: the embeddings in
  the order of `categorical`, then the dense features in the order of `dense`. `embeddings(features)` returns the
  `[batch, dim]` embeddings alone. `stack_tables=True` keeps every feature's rows in one `StackedEmbedding` table
  (named `embedding_stacked`) instead of one table per feature (`embedding_<feature>`).
  """

  def __init__(self, categorical: Mapping[str, int], dense: Mapping[str, int], embedding_dim: int,
               name: str = "features", stack_tables: bool = False, dynamic: Optional[DynamicTables] = None,
               **kwargs):
    super().__init__(name=name, **kwargs)
    check_spec(categorical, dense)
    checks.positive_int("embedding_dim", embedding_dim)
    check_tables(stack_tables, dynamic)
    self.categorical = dict(categorical)
    self.dense = dict(dense)
    self.embedding_dim = embedding_dim
    self.stacked = (StackedEmbedding(self.categorical, embedding_dim, name="embedding_stacked")
                    if stack_tables and self.categorical else None)
    self.tables: Dict[str, tf_keras.layers.Layer] = {} if self.stacked else {
        feature: (dynamic.table(size, embedding_dim, f"embedding_{feature}") if dynamic else
                  tf_keras.layers.Embedding(size, embedding_dim, name=f"embedding_{feature}"))
        for feature, size in self.categorical.items()}

  def embeddings(self, features: Mapping[str, tf.Tensor]) -> List[tf.Tensor]:
    if self.stacked:
      return tf.unstack(self.stacked(features), axis=1)
    return [self.tables[feature](features[feature]) for feature in self.categorical]

  def call(self, features: Mapping[str, tf.Tensor]) -> tf.Tensor:
    dense = [tf.reshape(tf.cast(features[name], tf.float32), [-1, width]) for name, width in self.dense.items()]
    if self.stacked:
      embedded = [tf.reshape(self.stacked(features), [-1, len(self.categorical) * self.embedding_dim])]
    else:
      embedded = self.embeddings(features)
    return tf.concat(embedded + dense, axis=1)


def mlp(layer_sizes: Sequence[int], name: str, final_activation: str = "relu") -> tf_keras.Sequential:
  """Dense layers of `layer_sizes`, ReLU between them and `final_activation` after the last."""
  checks.positive_ints("layer_sizes", layer_sizes)
  layers = [tf_keras.layers.Dense(size, activation="relu" if i < len(layer_sizes) - 1 else final_activation)
            for i, size in enumerate(layer_sizes)]
  return tf_keras.Sequential(layers, name=name)
