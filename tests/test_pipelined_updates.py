"""`pipelined_updates`: each ps applies a step's updates while the worker computes the next step, from parameters
without the previous step's updates (one step of delay); each step is still applied and counted once."""

import threading
import time

import numpy as np
import pytest
import tfps
from tfps.errors import UsageError
from tfps.training import runners
from tfps.training import steps as steps_lib
import tensorflow as tf
import tf_keras

from test_exactly_once import async_runner
import test_fit

PIPELINED = tfps.TrainingMode(pipelined_updates=True)


def build(vocabulary=10):
  """Ids -> an embedding (sparse gradients) and a dense feature -> two dense layers (dense gradients)."""
  ids = tf_keras.Input((2,), dtype=tf.int64)
  dense = tf_keras.Input((3,))
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(vocabulary, 4)(ids))
  hidden = tf_keras.layers.Dense(4, activation="tanh")(tf_keras.layers.Concatenate()([embedded, dense]))
  model = tf_keras.Model([ids, dense], tf_keras.layers.Dense(1)(hidden))
  model.compile(tf_keras.optimizers.legacy.SGD(0.1), "mse")
  return model


def batches(count):
  """`count` different batches of 8 examples."""
  rng = np.random.default_rng(7)
  return [((rng.integers(0, 10, (8, 2)), rng.normal(size=(8, 3)).astype(np.float32)),
           rng.normal(size=(8, 1)).astype(np.float32)) for _ in range(count)]


def delayed_sgd(model, data, learning_rate=0.1):
  """In one process: step i's gradients taken on the weights before step i - 1's update, applied after it."""
  loss_fn = tf_keras.losses.MeanSquaredError()

  def gradients(batch):
    features, labels = batch
    with tf.GradientTape() as tape:
      loss = loss_fn(labels, model(features, training=True))
    return [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]

  pending = gradients(data[0])
  for batch in data[1:]:
    computed = gradients(batch)
    for variable, gradient in zip(model.trainable_variables, pending):
      variable.assign_sub(learning_rate * gradient)
    pending = computed
  for variable, gradient in zip(model.trainable_variables, pending):
    variable.assign_sub(learning_rate * gradient)


def whole_weights(model):
  """Each layer's weights as arrays, a sharded variable's shards joined."""
  return [tf.concat(list(weight.variables), 0).numpy() if hasattr(weight, "variables") else weight.numpy()
          for layer in model.layers for weight in (
              [layer.embeddings] if isinstance(layer, tf_keras.layers.Embedding) else layer.weights)]


@pytest.mark.parametrize("unrolled_steps", [1, 3])
def test_each_step_is_applied_once_one_step_late_on_sharded_variables(cluster, unrolled_steps):
  """Embedding rows (sparse gradients, the table sharded) and dense layers, on 2 ps: the weights after 12 steps (two
  functions of 5 steps and one of 2) are those of the same delayed steps in one process; also with 3 steps traced
  per loop iteration (`unrolled_steps`: a function of 5 steps computes its first, runs one iteration of 3 and one
  left over)."""
  data = batches(12)
  strategy, coordinator = tfps.build_strategy(cluster, min_shard_bytes=8_000)
  with strategy.scope():
    model = build(vocabulary=1_000)
    runner = async_runner(model, coordinator, mode=tfps.TrainingMode(pipelined_updates=True,
                                                                     unrolled_steps=unrolled_steps))
  assert type(model.layers[1].embeddings).__name__ == "ShardedVariable"
  local = build(vocabulary=1_000)
  for mine, theirs in zip(local.trainable_variables, whole_weights(model)):
    mine.assign(theirs)
  initial = whole_weights(model)
  signature = ((tf.TensorSpec((8, 2), tf.int64), tf.TensorSpec((8, 3))), tf.TensorSpec((8, 1)))
  for start, steps in ((0, 5), (5, 5), (10, 2)):
    # a fresh iterator per function, at its first batch: either worker may run it
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda start=start: tf.data.Dataset.from_generator(lambda: iter(data[start:]), output_signature=signature)))
    coordinator.schedule(runner.function,
                         args=(iterator, tf.constant(steps, tf.int64), runner.progress.next_sequence()))
    coordinator.join()
    delayed_sgd(local, data[start:start + steps])
  assert int(model.optimizer.iterations.numpy()) == 12
  for trained, expected, start in zip(whole_weights(model), whole_weights(local), initial):
    assert trained.shape == expected.shape
    assert abs(trained - expected).max() < 1e-5, (trained, expected)
    assert abs(trained - start).max() > 1e-3  # every variable moved
  loops = [op for op in runner.function.get_concrete_function(iterator, tf.constant(5, tf.int64), tf.constant(
      0, tf.int64)).graph.get_operations() if op.type in ("While", "StatelessWhile")]
  assert len(loops) == (2 if unrolled_steps > 1 else 1), loops


def test_a_rerun_function_applies_only_the_steps_it_had_not_applied(cluster):
  """As after a worker failure: a function run again starts after the steps its first run applied (and recorded), and
  one that had applied them all (its worker died before returning) changes nothing."""
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
    model.compile(tf_keras.optimizers.legacy.SGD(0.01), "mse")
    runner = async_runner(model, coordinator, mode=PIPELINED)
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((tf.ones((4, 2)), tf.ones((4, 1)))).repeat()))

  def run(seq, steps=5):
    coordinator.schedule(runner.function, args=(iterator, tf.constant(steps, tf.int64), tf.constant(seq, tf.int64)))
    coordinator.join()
    return int(model.optimizer.iterations.numpy())

  assert run(seq=0) == 5
  assert int(runner.progress.variable[0].numpy()) == 5
  # Function seq 3 applied 2 of its 5 steps, on every ps, and recorded them; then its worker died.
  for vector in [runner.progress.variable] + list(runner.progress.ps_records.vectors.values()):
    vector.scatter_update(tf.IndexedSlices(tf.constant([3 * 5 + 2], tf.int64), tf.constant([3])))
  assert run(seq=3) == 5 + 3
  assert int(runner.progress.variable[3].numpy()) == 3 * 5 + 5
  weights = [w.numpy() for w in model.weights]
  # Run once more after it completed: its last step is computed again and not applied. (tf-keras counts that step in
  # `iterations` all the same, as a step applied but not recorded; the counter is settled from the records at each
  # epoch end, test_exactly_once.py.)
  run(seq=3)
  assert all((w.numpy() == before).all() for w, before in zip(model.weights, weights))
  assert int(runner.progress.variable[3].numpy()) == 3 * 5 + 5
  model.optimizer.iterations.assign(8)
  assert run(seq=4, steps=1) == 5 + 3 + 1  # a function of one step: computed, then applied after the loop
  assert run(seq=5, steps=2) == 5 + 3 + 1 + 2
  assert int(runner.progress.variable[5].numpy()) == 5 * 5 + 2
  assert all((w.numpy() != before).all() for w, before in zip(model.weights, weights))


def test_a_step_that_does_not_apply_its_gradients_once_is_refused_in_one_line(cluster):
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    weight = tf.Variable(1.0)
    optimizer = tf_keras.optimizers.legacy.SGD(0.1)

  def twice(batch):
    for _ in range(2):
      optimizer.apply_gradients([(tf.reduce_sum(batch), weight)])
    return tf.constant(0.0), tf.constant(1, tf.int64)

  step = steps_lib.Step(run=twice, forward=twice, optimizer=lambda: optimizer, variables=lambda: [weight],
                        trainable_variables=lambda: [weight], counter=optimizer.iterations, counts_itself=True)
  runner = runners.build_runner(PIPELINED, step, strategy=strategy, coordinator=coordinator, num_workers=2,
                                steps_per_execution=2)
  iterator = iter(coordinator.create_per_worker_dataset(lambda: tf.data.Dataset.from_tensors(tf.ones([2])).repeat()))
  with pytest.raises(UsageError, match=r"^`pipelined_updates` \(True\) needs a step that applies its gradients with "
                                       r"one `optimizer.apply_gradients` call; this one made 2$"):
    runner.schedule(iterator, 2)
  assert float(weight.numpy()) == 1.0


def test_a_ps_starts_a_steps_updates_only_once_the_next_steps_ids_are_there(cluster):
  """Step 0's updates wait on each ps for step 1's reads there, an embedding lookup awaiting the ids the worker sends:
  a worker that dies before sending them leaves step 0 unapplied on that ps, not applied to the dense layers alone,
  which the re-run would apply again (the table's update waits for the lookup in any case)."""
  data = batches(2)
  strategy, coordinator = tfps.build_strategy(cluster, min_shard_bytes=8_000)
  with strategy.scope():
    model = build(vocabulary=1_000)
    runner = async_runner(model, coordinator, steps_per_execution=2, mode=PIPELINED)
  assert type(model.layers[1].embeddings).__name__ == "ShardedVariable"  # a shard, and so a lookup, on each ps
  second_batch = threading.Event()

  def held_back():
    yield data[0]
    second_batch.wait()
    yield data[1]

  signature = ((tf.TensorSpec((8, 2), tf.int64), tf.TensorSpec((8, 3))), tf.TensorSpec((8, 1)))
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_generator(held_back, output_signature=signature)))
  dense = [layer.kernel for layer in model.layers if isinstance(layer, tf_keras.layers.Dense)]
  initial = [kernel.numpy() for kernel in dense]
  runner.schedule(iterator, 2)
  try:
    deadline = time.monotonic() + 3  # step 0's gradients reach the ps within milliseconds
    while time.monotonic() < deadline:
      assert all((kernel.numpy() == start).all() for kernel, start in zip(dense, initial)), "step 0 applied in part"
      time.sleep(0.05)
  finally:
    second_batch.set()
    coordinator.join()
  assert int(model.optimizer.iterations.numpy()) == 2
  assert all((kernel.numpy() != start).any() for kernel, start in zip(dense, initial))


def test_pipelined_fit_learns_the_planted_signal_to_the_level_test_fit_checks_of_the_default(cluster):
  """test_fit.py's model, data and bound (2 workers, the table sharded over both ps), every gradient one step late."""
  history = tfps.fit(test_fit.build_model, test_fit.train_fn, epochs=test_fit.EPOCHS, steps_per_epoch=test_fit.STEPS,
                     validation_dataset_fn=test_fit.eval_fn_of(2_000), exact_evaluation=True, cluster=cluster,
                     sync_mode=PIPELINED)
  assert int(history.model.optimizer.iterations.numpy()) == test_fit.EPOCHS * test_fit.STEPS
  assert history.history["val_auc"][-1] > 0.75
