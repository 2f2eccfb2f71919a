"""Table rows and their gradients cross the network as bfloat16 with `bf16_rows` (`tfps.training.wire`): a stacked
table and a tf-keras `Embedding`, each sharded over two ps, train to within bfloat16's rounding of the same steps in
one process in float32, and the rounding is there (what crosses is checked in `test_transfers_bench.py`)."""

import numpy as np
from test_row_updates import trained_on_cluster_and_in_one_process
import tfps
from tfps.models.layers import StackedEmbedding
from tfps.training import wire
import tensorflow as tf
import tf_keras


def test_crossed_rounds_float32_to_bfloat16_and_leaves_other_dtypes():
  values = tf.constant([1.0, 1.0 + 2.0 ** -10, 3.0 + 2.0 ** -8, -0.1, 3.0 + 2.0 ** -6])
  crossed = wire.crossed(values, destination=None)
  assert crossed.dtype == tf.float32
  np.testing.assert_array_equal(crossed.numpy(), tf.cast(tf.cast(values, tf.bfloat16), tf.float32).numpy())
  # 8 significant bits: 2^-10 of 1 and 2^-8 of 3 are gone, 2^-6 of 3 stays
  np.testing.assert_array_equal(crossed.numpy()[[1, 2, 4]], [1.0, 3.0, 3.0 + 2.0 ** -6])
  ids = tf.constant([3, 1], tf.int64)
  assert wire.crossed(ids, destination=None) is ids


def _within_rounding(counts, start, trained, local, rows_touched):
  # To bfloat16 and back: the rows of each shard, and each shard's gradient (2 casts without bf16_rows).
  assert counts["Cast"] >= 10, counts
  assert (trained[0] != start[0]).any()
  table, expected_table = trained[0], local[0]
  touched = np.flatnonzero((expected_table != start[0]).any(axis=1))
  assert len(touched) == rows_touched, touched
  # The rows and their gradients were rounded (relative 2^-8 at most per element): close to float32's result (measured
  # 1.7e-4 apart at most), but not equal to it (to 1e-6 without bf16_rows: test_distinct_rows.py, test_row_updates.py).
  np.testing.assert_allclose(table[touched], expected_table[touched], rtol=0, atol=2e-3)
  assert np.abs(table[touched] - expected_table[touched]).max() > 1e-6
  for got, expected in zip(trained[1:], local[1:]):
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-3)
  untouched = np.setdiff1d(np.arange(len(table)), touched)
  np.testing.assert_array_equal(table[untouched], start[0][untouched])


def test_a_stacked_table_on_two_ps_trains_within_bfloat16_rounding_of_one_process(cluster):
  features = {"a": tf.constant([1, 9_999, 1, 11_999], tf.int64), "b": tf.constant([0, 7_999, 7_999, 3], tf.int64)}
  labels = tf.constant([[1.0], [-1.0], [0.5], [2.0]])
  counts, (start, trained), local = trained_on_cluster_and_in_one_process(
      cluster, lambda: StackedEmbedding({"a": 12_000, "b": 8_000}, 4),
      lambda: {name: tf_keras.Input((), dtype="int64", name=name) for name in ("a", "b")}, features, labels,
      mode=tfps.TrainingMode(bf16_rows=True))
  _within_rounding(counts, start, trained, local, rows_touched=6)


def test_a_keras_embedding_on_two_ps_trains_within_bfloat16_rounding_of_one_process(cluster):
  """A tf-keras `Embedding` looked up with repeated ids (on both sides of the shards' border): its rows cross as
  bfloat16 too, and its gradient is still summed per row on the ps."""
  ids = tf.constant([[1, 2, 1], [19_999, 5, 10_001], [7, 7, 7], [10_000, 3, 2]], tf.int64)
  labels = tf.constant([[1.0], [-1.0], [0.5], [2.0]])
  counts, (start, trained), local = trained_on_cluster_and_in_one_process(
      cluster, lambda: tf_keras.layers.Embedding(20_000, 4), lambda: tf_keras.Input((3,), dtype="int64"), ids,
      labels, mode=tfps.TrainingMode(bf16_rows=True))
  assert counts["Unique"] >= 2, counts  # the optimizer's sum of each shard's repeated ids
  _within_rounding(counts, start, trained, local, rows_touched=8)
