"""Data of the dynamic-embedding measurements (`bench/dynamic_embedding_measured.py`): raw ids, never hashed here.

* MovieLens 100K (`u1.base` / `u1.test`) through tfps's reader: the raw `user_id` and `movie_id` of each rating.
* Generated Criteo-schema rows (13 integer features, 26 categorical ones) with a planted signal as in
  `tfps/data/synthetic.py`, made on the fly in `tf.data` so that ten million distinct ids need no files: the id of
  column `c` has rank `k` in 1..`vocab_per_column` drawn from a power law `k ** -zipf_exponent` (heavy-tailed) and is
  the raw int64 `c << 40 | k`; the label is Bernoulli(sigmoid(bias + I1..I4 effects + per-id effects of C1..C6)),
  each id's effect a fixed function of the id (uniform, variance 1). Row `r` of a split is the same in every process
  (stateless random numbers seeded by the split's seed and the batch's first row), so the chief can count the distinct
  ids the workers will read.
"""

import dataclasses
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from tfps.data import movielens

NUM_DENSE, NUM_CATEGORICAL = 13, 26
SIGNAL_DENSE, SIGNAL_CATEGORICAL = 4, 6
_EFFECT_BITS = 20
_GOLDEN = 0x9E3779B97F4A7C15  # Fibonacci hashing: the top bits of id * this are a well-spread function of the id


@dataclasses.dataclass(frozen=True)
class GeneratedCriteo:
  """What to generate.

  Attributes:
    rows: rows of the split (one pass; training repeats it).
    vocab_per_column: distinct ranks each categorical column draws from.
    zipf_exponent: exponent of the rank distribution (> 0, != 1).
    seed: the split's seed (training and test use different ones).
    bias: the planted model's bias (about 27% positives with the defaults).
  """

  rows: int
  vocab_per_column: int = 1_000_000
  zipf_exponent: float = 0.8
  seed: int = 0
  bias: float = -1.5

  def _rows(self, first: tf.Tensor, size: tf.Tensor) -> Tuple[Dict[str, tf.Tensor], tf.Tensor]:
    seed = tf.stack([tf.constant(self.seed, tf.int64), first])
    uniform = tf.random.stateless_uniform([size, NUM_CATEGORICAL + 1], seed=seed)
    gaussian = tf.random.stateless_normal([size, NUM_DENSE], seed=seed + 1)
    power = 1.0 - self.zipf_exponent  # inverse CDF of the continuous power law on [1, vocab + 1)
    top = float(self.vocab_per_column + 1) ** power
    ranks = tf.floor((1.0 + uniform[:, :NUM_CATEGORICAL] * (top - 1.0)) ** (1.0 / power))
    ranks = tf.clip_by_value(tf.cast(ranks, tf.int64), 1, self.vocab_per_column)
    ids = tf.bitwise.left_shift(tf.range(NUM_CATEGORICAL, dtype=tf.int64), 40)[None, :] | ranks
    dense = tf.floor(tf.exp(gaussian + 1.5))
    mixed = tf.cast(ids[:, :SIGNAL_CATEGORICAL], tf.uint64) * tf.constant(_GOLDEN, tf.uint64)  # wraps: a hash
    effects = tf.bitwise.right_shift(mixed, tf.constant(64 - _EFFECT_BITS, tf.uint64))
    effects = (tf.cast(effects, tf.float32) / (1 << _EFFECT_BITS) - 0.5) * np.sqrt(12.0)
    dense_signs = tf.constant([0.5, -0.4, 0.3, -0.5])
    logits = (self.bias + tf.reduce_sum(effects, axis=1)
              + tf.reduce_sum((tf.math.log1p(dense[:, :SIGNAL_DENSE]) - 1.5) * dense_signs, axis=1))
    labels = tf.cast(uniform[:, -1] < tf.sigmoid(logits), tf.float32)
    return {"categorical": ids, "integer": tf.math.log1p(dense)}, labels

  def dataset_fn(self, batch_size: int, repeat: bool) -> Callable:
    """`fn(input_context)`: batches of `({"categorical": int64 [b, 26], "integer": float32 [b, 13]}, label [b])`; each
    worker reads every `num_input_pipelines`-th batch of the split."""
    def fn(input_context: Optional[tf.distribute.InputContext]):
      starts = tf.data.Dataset.range(0, self.rows, batch_size)
      if input_context is not None:
        starts = starts.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
      if repeat:
        starts = starts.repeat()
      batches = starts.map(lambda first: self._rows(first, tf.minimum(tf.constant(batch_size, tf.int64), self.rows - first)),
                           num_parallel_calls=2, deterministic=True)
      return batches.prefetch(2)
    return fn

  def distinct_ids(self, batch_size: int = 65536) -> int:
    """Distinct categorical ids over the split's rows (counted here, in numpy)."""
    chunks = [features["categorical"].numpy().ravel()
              for features, _ in self.dataset_fn(batch_size, repeat=False)(None)]
    ids = np.sort(np.concatenate(chunks))  # np.unique takes ~70x longer than a sort here (numpy 2.4)
    return int(ids.size and 1 + np.count_nonzero(ids[1:] != ids[:-1]))


def movielens_dataset_fn(data_dir: str, split: str, batch_size: int, repeat: bool, seed: int) -> Callable:
  """`fn(input_context)`: MovieLens batches of `({"user_id", "movie_id"} raw int64, liked)`."""
  read = movielens.movielens_dataset_fn(data_dir, split, batch_size=batch_size, repeat=repeat, seed=seed,
                                        shuffle_buffer=100_000 if repeat else 0, drop_remainder=repeat)

  def fn(input_context):
    return read(input_context).map(
        lambda features, label: ({"user_id": tf.cast(features["user_id"], tf.int64),
                                  "movie_id": tf.cast(features["movie_id"], tf.int64)}, label))
  return fn
