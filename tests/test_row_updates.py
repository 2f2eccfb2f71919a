"""A legacy Adagrad updates a batch's table rows all at once (`_tf_private.adagrad_rows_at_once`): the same values as
TensorFlow's sparse kernel, bit for bit, in one process and on the cluster; under a lock of each table shard's own
(async training's default), so two workers updating the same rows lose no update, or without it
(`lockfree_row_updates`)."""

import collections
import contextlib
import re

import numpy as np
import pytest
from test_exactly_once import async_runner
import tfps
from tfps import _tf_private
import tensorflow as tf
import tf_keras

KERNEL = "ResourceSparseApplyAdagradV2"


def _applied(optimizer, variable, gradients, rows_at_once, locked=True):
  @tf.function
  def apply(gradient):
    with _tf_private.adagrad_rows_at_once(optimizer, locked) if rows_at_once else contextlib.nullcontext():
      optimizer.apply_gradients([(gradient, variable)])
  for gradient in gradients:
    apply(gradient)
  return set(op_counts(apply.get_concrete_function(gradients[0])))


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_rows_at_once_equal_the_kernel_bit_for_bit(index_dtype):
  start = tf.random.stateless_normal([1000, 16], [1, 2])
  ids = tf.constant([3, 7, 3, 999, 0, 7], index_dtype)  # duplicates: the optimizer sums them first
  gradients = [tf.IndexedSlices(tf.random.stateless_normal([6, 16], [3, step]), ids,
                               tf.constant([1000, 16], index_dtype)) for step in range(3)]
  results = []
  for rows_at_once, locked in ((False, True), (True, True), (True, False)):
    optimizer, variable = tf_keras.optimizers.legacy.Adagrad(0.1), tf.Variable(start)
    op_types = _applied(optimizer, variable, gradients, rows_at_once, locked)
    assert (KERNEL in op_types) is not rows_at_once and ("ResourceScatterUpdate" in op_types) is rows_at_once
    assert ("MutexLock" in op_types) is (rows_at_once and locked)
    results.append((variable.numpy(), optimizer.get_slot(variable, "accumulator").numpy()))
  (kernel_weights, kernel_slots), *rows = results
  for rows_weights, rows_slots in rows:
    assert (kernel_weights == rows_weights).all() and (kernel_slots == rows_slots).all()
  assert (kernel_weights != start.numpy()).any()


def test_another_optimizer_keeps_its_own_update():
  class MyAdagrad(tf_keras.optimizers.legacy.Adagrad):  # a subclass may rely on the kernel: left alone
    pass
  for optimizer in (MyAdagrad(0.1), tf_keras.optimizers.legacy.SGD(0.1)):
    with _tf_private.adagrad_rows_at_once(optimizer):
      assert "_resource_apply_sparse" not in vars(optimizer)


def op_counts(concrete) -> collections.Counter:
  """How many ops of each type a traced function holds, with the functions it calls (loop bodies, conditions)."""
  graph_def = concrete.graph.as_graph_def()
  counts = collections.Counter(node.op for node in graph_def.node)
  for function in graph_def.library.function:
    counts.update(node.op for node in function.node_def)
  return counts


def trained_on_cluster_and_in_one_process(cluster, table, inputs, features, labels, mode=None):
  """5 async steps on the cluster of a model made of `table()` (a new table layer of 320 KB: sharded over both ps) on
  `inputs()`, a dense layer and a legacy Adagrad, and the same 5 steps in one process from the same weights.

  Returns `(counts, cluster, local)`: `op_counts` of the traced step function, and each model's weights (the table
  whole, then the dense layer's), the cluster's with its weights before the steps first."""
  def build():
    given = inputs()
    model = tf_keras.Model(given, tf_keras.layers.Dense(1)(tf_keras.layers.Flatten()(table()(given))))
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "mse")
    return model

  def table_of(model):  # the tf-keras Embedding layer, the model's own or inside its table layer
    return next(layer for layer in model.submodules if isinstance(layer, tf_keras.layers.Embedding))

  def weights(trained):
    embeddings, dense = table_of(trained).embeddings, trained.layers[-1]
    shards = getattr(embeddings, "variables", [embeddings])
    return [tf.concat(shards, 0).numpy(), *dense.get_weights()], {shard.device for shard in shards}

  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = build()
    runner = async_runner(model, coordinator, mode=mode)
  start, devices = weights(model)
  assert len(devices) == 2, devices  # both ps hold rows
  local = build()
  table_of(local).set_weights(start[:1])
  local.layers[-1].set_weights(start[1:])
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((features, labels)).repeat()))
  args = (iterator, tf.constant(5, tf.int64), runner.progress.next_sequence())
  counts = op_counts(runner.function.get_concrete_function(*args))
  coordinator.schedule(runner.function, args=args)
  coordinator.join()
  for _ in range(5):
    local.train_on_batch(features, labels)
  return counts, (start, weights(model)[0]), weights(local)[0]


@pytest.mark.parametrize("lockfree", [False, True])
def test_a_sharded_table_trains_as_in_one_process(cluster, lockfree):
  """An async step on the cluster (the table sharded over both ps) updates the rows at once, under the table's lock
  (the default) or without it (`lockfree_row_updates`), and either way ends where the same steps in one process
  (TensorFlow's kernel) leave it."""
  ids = tf.constant([[1, 2, 1], [19_999, 5, 10_001], [7, 7, 7], [10_000, 3, 2]], tf.int64)
  labels = tf.constant([[1.0], [-1.0], [0.5], [2.0]])
  counts, (start, trained), local = trained_on_cluster_and_in_one_process(
      cluster, lambda: tf_keras.layers.Embedding(20_000, 4), lambda: tf_keras.Input((3,), dtype="int64"), ids,
      labels, mode=tfps.TrainingMode(lockfree_row_updates=lockfree))
  rows_ops = sorted(t for t in counts if re.match("Resource(Sparse|Scatter)|Mutex", t))
  # The table's lock is made in the step (a `MutexV2` shared by name); each ps's records lock is made before it.
  assert KERNEL not in counts and ("MutexV2" in counts) is not lockfree, rows_ops
  assert (trained[0] != start[0]).any()
  for got, expected in zip(trained, local):
    assert abs(got - expected).max() < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("lockfree", [False, True])
def test_two_workers_updating_the_same_rows_lose_no_update(cluster, lockfree):
  """Both workers update the same 4,000 rows (on both ps) in every step, each row's gradient 1: every accumulator
  grows by exactly 1 per step applied. Each ps applies one step's updates at a time (the lock it holds from its
  decision on a step to its record, `ps_records.OncePerPs`), so none is lost without the table's own lock either
  (`lockfree_row_updates`); before that lock, this run lost thousands of them without the table's (two workers read
  a row's accumulator before either wrote it back)."""
  rows, scheduled, steps = 4_000, 16, 20
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    inputs = tf_keras.Input((rows,), dtype="int64")
    embedded = tf_keras.layers.Embedding(10 * rows, 4)(inputs)  # 640 KB: sharded over both ps
    model = tf_keras.Model(inputs, tf_keras.layers.Lambda(lambda rows: tf.reduce_sum(rows, [1, 2]))(embedded))
    model.compile(tf_keras.optimizers.legacy.Adagrad(1e-6), lambda labels, outputs: outputs)  # d loss / d row = 1
    runner = async_runner(model, coordinator, steps_per_execution=steps,
                          mode=tfps.TrainingMode(lockfree_row_updates=lockfree))
  table = model.layers[1].embeddings
  assert len({shard.device for shard in table.variables}) == 2, table
  ids = tf.constant(np.arange(rows)[None] * 7, tf.int64)  # one example of 4,000 distinct ids, spread over the table
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((ids, tf.zeros([1]))).repeat()))
  for _ in range(scheduled):
    coordinator.schedule(runner.function, args=(iterator, tf.constant(steps, tf.int64),
                                                runner.progress.next_sequence()))
  coordinator.join()
  assert int(model.optimizer.iterations.numpy()) == scheduled * steps
  expected = np.float32(0.1)  # the initial accumulator, then + 1.0 per step, in float32 as the ps adds it
  for _ in range(scheduled * steps):
    expected = np.float32(expected + np.float32(1.0))
  accumulator = model.optimizer.get_slot(table, "accumulator")
  grown = tf.concat(accumulator.variables, 0).numpy()[np.arange(rows) * 7]
  short = int((grown != expected).sum())
  assert short == 0, f"{short} of {grown.size} accumulator entries missed updates (lowest {grown.min()}, {expected})"
