"""A stacked table's gradient reaches the ps already summed per row and is applied there without being summed again
(`tfps.training.distinct_rows`): the same values as with the sum, one `Unique` (the layer's, on the worker) per step
instead of one more per table shard, and nothing changed for ids that were not marked."""

import contextlib

import numpy as np
from test_row_updates import op_counts
from test_row_updates import trained_on_cluster_and_in_one_process
from tfps.models.layers import StackedEmbedding
from tfps.training import distinct_rows
from tfps.training import modes
import tensorflow as tf
import tf_keras


def _stacked_step(optimizer, unsummed):
  """`(step, layer)`: a traced step of a stacked table of 2 features, trained by a legacy Adagrad, with or without the
  marks of `distinct_rows.applying`."""
  layer = StackedEmbedding({"a": 50, "b": 30}, 4)
  features = {"a": tf.constant([1, 1, 7, 49, 0], tf.int64), "b": tf.constant([2, 2, 2, 29, 0], tf.int64)}
  layer(features)  # built eagerly, where tf-keras's own Embedding looks up
  layer.table.embeddings.assign(tf.random.stateless_normal([80, 4], [2, 3]))
  weights = tf.random.stateless_normal([5, 2, 4], [4, 5])

  @tf.function
  def step():
    with distinct_rows.applying(optimizer) if unsummed else contextlib.nullcontext():
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer(features) * weights))
      gradients = tape.gradient(loss, layer.trainable_variables)
      optimizer.apply_gradients(zip(gradients, layer.trainable_variables))

  return step, layer


def test_a_stacked_table_updated_unsummed_ends_where_the_summed_update_does_bit_for_bit():
  results, uniques = [], []
  for unsummed in (False, True):
    optimizer = tf_keras.optimizers.legacy.Adagrad(0.1)
    step, layer = _stacked_step(optimizer, unsummed)
    for _ in range(3):
      step()
    uniques.append(op_counts(step.get_concrete_function())["Unique"])
    results.append((layer.table.embeddings.numpy(),
                    optimizer.get_slot(layer.table.embeddings, "accumulator").numpy()))
  assert uniques == [2, 1]  # the layer's own; the optimizer's sum is gone
  (summed_weights, summed_slots), (weights, slots) = results
  assert (summed_weights == weights).all() and (summed_slots == slots).all()


def test_only_ids_marked_by_a_lookup_and_kept_element_for_element_are_distinct():
  table = tf.Variable(tf.random.stateless_normal([10, 2], [1, 1]))
  verdicts = {}

  @tf.function
  def trace():
    with distinct_rows.applying(tf_keras.optimizers.legacy.SGD(0.1)):
      with tf.GradientTape() as tape:
        total = tf.reduce_sum(distinct_rows.lookup(table, tf.constant([3, 1, 8], tf.int64)))
      ids = tape.gradient(total, table).indices
      verdicts["gradient"] = distinct_rows.is_distinct(ids)
      verdicts["reshaped"] = distinct_rows.is_distinct(tf.identity(tf.reshape(ids, [-1, 1])))
      verdicts["repeated"] = distinct_rows.is_distinct(tf.concat([ids, ids], 0))
      verdicts["other"] = distinct_rows.is_distinct(tf.constant([3, 1, 8], tf.int64))
    with tf.GradientTape() as tape:
      total = tf.reduce_sum(distinct_rows.lookup(table, tf.constant([3, 1, 8], tf.int64)))  # outside `applying`
    verdicts["unmarked"] = distinct_rows.is_distinct(tape.gradient(total, table).indices)

  trace()
  assert verdicts == {"gradient": True, "reshaped": True, "repeated": False, "other": False, "unmarked": False}
  assert not distinct_rows.active()


def test_a_stacked_table_sharded_over_two_ps_trains_unsummed_as_in_one_process(cluster):
  """An async step on the cluster (the stacked table sharded over both ps, ids on both sides of the shards' border)
  gathers per shard with marked ids, sums nothing on the ps, and ends where the same steps in one process leave it."""
  features = {"a": tf.constant([1, 9_999, 1, 11_999], tf.int64), "b": tf.constant([0, 7_999, 7_999, 3], tf.int64)}
  labels = tf.constant([[1.0], [-1.0], [0.5], [2.0]])
  counts, (start, trained), local = trained_on_cluster_and_in_one_process(
      cluster, lambda: StackedEmbedding({"a": 12_000, "b": 8_000}, 4),
      lambda: {name: tf_keras.Input((), dtype="int64", name=name) for name in ("a", "b")}, features, labels)
  unrolled = modes.TrainingMode().unrolled(len(labels))  # steps in the function: those unrolled, and those left over
  traced = 1 if unrolled == 1 else unrolled + 1
  # One Unique per step (the layer's) and two DynamicPartitions (its ids and their positions).
  assert counts["Unique"] == traced and counts["DynamicPartition"] == 2 * traced, counts
  assert (trained[0] != start[0]).any()
  for got, expected in zip(trained, local):
    np.testing.assert_allclose(got, expected, atol=1e-6)
