"""Training modes on the in-process cluster: sync equals single-process training on the workers' batches combined."""

import numpy as np

import tfps
import tensorflow as tf
import tf_keras

VOCAB, NUM_IDS, BATCH, STEPS = 50_000, 4, 32, 50  # the table (1.6 MB) is sharded over both ps


def batch_of(worker):
  rng = np.random.default_rng(worker)
  ids = rng.integers(0, 2_000, size=(BATCH, NUM_IDS)).astype(np.int64)
  dense = rng.normal(size=(BATCH, 2)).astype(np.float32)
  labels = (rng.random(BATCH) < 0.5).astype(np.float32).reshape(-1, 1)
  return {"ids": ids, "dense_in": dense}, labels


def combined():
  (f0, y0), (f1, y1) = batch_of(0), batch_of(1)
  return {k: np.concatenate([f0[k], f1[k]]) for k in f0}, np.concatenate([y0, y1])


def build_model():
  ids = tf_keras.Input((NUM_IDS,), dtype="int64", name="ids")
  dense = tf_keras.Input((2,), name="dense_in")
  table = tf_keras.layers.Embedding(VOCAB, 8, embeddings_initializer=tf_keras.initializers.Constant(0.05),
                                    name="table")
  hidden = tf_keras.layers.Dense(8, activation="relu", kernel_initializer=tf_keras.initializers.GlorotUniform(seed=1))(
      tf_keras.layers.Concatenate()([tf_keras.layers.Flatten()(table(ids)), dense]))
  output = tf_keras.layers.Dense(1, kernel_initializer=tf_keras.initializers.GlorotUniform(seed=2))(hidden)
  model = tf_keras.Model({"ids": ids, "dense_in": dense}, output)
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.5),
                tf_keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def per_worker_batches(input_context):
  """Worker w's dataset repeats batch_of(w) (worker 0's where no worker runs it: the chief's sample)."""
  del input_context
  try:
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
  except RuntimeError:
    worker = 0
  stacked = tf.nest.map_structure(lambda a, b: tf.stack([a, b]), batch_of(0), batch_of(1))
  return tf.data.Dataset.from_tensors(tf.nest.map_structure(lambda t: tf.gather(t, worker), stacked)).repeat()


def loss_of(model, features, labels):
  logits = model(features).numpy()
  return float(np.mean(np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))))


def trained_alone(features, labels, steps=STEPS):
  """One process, no strategy: `steps` steps on `features, labels` as one batch. (Built after the cluster is
  connected: models made before live on a device the connected process no longer has.)"""
  model = build_model()
  for _ in range(steps):
    model.train_on_batch(features, labels)
  return model


def test_sync_fit_matches_single_process_on_the_combined_batch(cluster):
  history = tfps.fit(build_model, per_worker_batches, epochs=1, steps_per_epoch=STEPS, sync_mode="sync",
                     cluster=cluster)
  features, labels = combined()
  assert int(history.model.optimizer.iterations.numpy()) == STEPS
  table = history.model.get_layer("table").embeddings
  assert len(table.variables) == 2  # the sparse gradients went through a sharded table
  expected = loss_of(trained_alone(features, labels), features, labels)
  assert abs(loss_of(history.model, features, labels) - expected) < 1e-4
  # The check can tell data apart: one worker's batch alone trains to another loss.
  assert abs(loss_of(trained_alone(*batch_of(0)), features, labels) - expected) > 1e-3


def model_fn(features, labels, mode):
  """build_model's network as a model_fn."""
  table = tf_keras.layers.Embedding(VOCAB, 8, embeddings_initializer=tf_keras.initializers.Constant(0.05))
  hidden = tf_keras.layers.Dense(8, activation="relu", kernel_initializer=tf_keras.initializers.GlorotUniform(seed=1))
  output = tf_keras.layers.Dense(1, kernel_initializer=tf_keras.initializers.GlorotUniform(seed=2))
  logits = output(hidden(tf.concat([tf.reshape(table(features["ids"]), [-1, NUM_IDS * 8]), features["dense_in"]],
                                   axis=1)))
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
  return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.Adagrad(0.5))


def test_sync_estimator_matches_single_process_on_the_combined_batch(cluster, tmp_path, caplog):
  caplog.set_level("INFO")
  estimator = tfps.Estimator(model_fn, model_dir=str(tmp_path), cluster=cluster,
                             config=tfps.RunConfig(sync_mode="sync", log_step_count_steps=10))
  estimator.train(per_worker_batches, max_steps=STEPS)
  assert f"Training from step 0 to {STEPS} (sync, 2 worker batches per step)" in caplog.text
  features, labels = combined()
  results = estimator.evaluate(lambda: tf.data.Dataset.from_tensors((features, labels)), steps=None)
  expected = loss_of(trained_alone(features, labels), features, labels)
  assert results["global_step"] == STEPS
  assert abs(results["loss"] - expected) < 1e-4


def trained_alone_on(worker, steps):
  model = build_model()
  for _ in range(steps):
    model.train_on_batch(*batch_of(worker))
  return model


def test_geo_round_trains_a_local_copy_and_pushes_its_difference(cluster):
  """One round of 10 steps on one worker leaves on the ps exactly what 10 steps of one process on that worker's batch
  give: the pull, the local steps (dense copies, cached rows of both table shards, Adagrad's slots) and the push."""
  history = tfps.fit(build_model, per_worker_batches, epochs=1, steps_per_epoch=10,
                     sync_mode=tfps.TrainingMode("geo", geo_steps=10), cluster=cluster)
  assert int(history.model.optimizer.iterations.numpy()) == 10
  features, _ = combined()
  predictions = history.model(features).numpy()
  gaps = [np.abs(predictions - trained_alone_on(worker, 10)(features).numpy()).max() for worker in (0, 1)]
  assert min(gaps) < 1e-5, gaps
  assert max(gaps) > 1e-3  # the two workers' batches train apart: the check tells which one ran


def test_geo_fit_learns_with_rounds_on_both_workers(cluster):
  history = tfps.fit(build_model, per_worker_batches, epochs=2, steps_per_epoch=50, sync_mode="geo",
                     cluster=cluster)
  features, labels = combined()
  assert int(history.model.optimizer.iterations.numpy()) == 100
  assert loss_of(history.model, features, labels) < 0.5 * loss_of(trained_alone(features, labels, steps=0),
                                                                 features, labels)
