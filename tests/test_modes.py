"""Training modes on the in-process cluster: sync equals single-process training on the workers' batches combined."""

import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import tfps
from tfps import run_records
from tfps.training import geo
import tensorflow as tf
import tf_keras

REPO = pathlib.Path(__file__).resolve().parents[1]
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
  # fit's loss is the mean of the steps' losses on the combined batch (it was that over the 2 workers)
  alone = build_model()
  assert history.history["loss"][0] == pytest.approx(
      np.mean([alone.train_on_batch(features, labels) for _ in range(STEPS)]), rel=1e-4)
  # The check can tell data apart: one worker's batch alone trains to another loss.
  assert abs(loss_of(trained_alone(*batch_of(0)), features, labels) - expected) > 1e-3


def build_model_with_a_lookup_table():
  """build_model with a StringLookup of a string feature: a lookup table, one copy per worker under the strategy."""
  word = tf_keras.Input((), dtype="string", name="word")
  model = build_model()
  looked_up = tf_keras.layers.Embedding(4, 2)(tf_keras.layers.StringLookup(vocabulary=["a", "b"])(word))
  output = tf_keras.layers.Dense(1)(tf_keras.layers.Concatenate()([model.output, looked_up]))
  model = tf_keras.Model(dict(model.input, word=word), output)
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.5), tf_keras.losses.BinaryCrossentropy(from_logits=True))
  return model


@pytest.mark.parametrize("sync_mode", ["sync", "geo"])
def test_sync_and_geo_train_a_model_with_a_lookup_table(cluster, sync_mode):
  """Their workers call the model inside a tf.cond, where TensorFlow never gave a lookup table's per-worker handle
  ("You must feed a value for placeholder tensor ... with dtype resource")."""
  def batches(input_context):
    features, labels = batch_of(0)
    features["word"] = np.array(["a", "b", "c", "a"] * (BATCH // 4))
    return tf.data.Dataset.from_tensors((features, labels)).repeat()

  history = tfps.fit(build_model_with_a_lookup_table, batches, epochs=1, steps_per_epoch=10, sync_mode=sync_mode,
                     cluster=cluster)
  assert int(history.model.optimizer.iterations.numpy()) == 10
  assert np.isfinite(history.history["loss"][0])


def model_fn(features, labels, mode):
  """build_model's network as a model_fn."""
  table = tf_keras.layers.Embedding(VOCAB, 8, embeddings_initializer=tf_keras.initializers.Constant(0.05))
  hidden = tf_keras.layers.Dense(8, activation="relu", kernel_initializer=tf_keras.initializers.GlorotUniform(seed=1))
  output = tf_keras.layers.Dense(1, kernel_initializer=tf_keras.initializers.GlorotUniform(seed=2))
  logits = output(hidden(tf.concat([tf.reshape(table(features["ids"]), [-1, NUM_IDS * 8]), features["dense_in"]],
                                   axis=1)))
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
  return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.Adagrad(0.5))


def test_sync_estimator_matches_single_process_on_the_combined_batch(cluster, tmp_path, info_log):
  estimator = tfps.Estimator(model_fn, model_dir=str(tmp_path), cluster=cluster,
                             config=tfps.RunConfig(sync_mode="sync", log_step_count_steps=10))
  estimator.train(per_worker_batches, max_steps=STEPS)
  assert f"Training from step 0 to {STEPS} (sync, 2 worker batches per step)" in info_log.text
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
  """One round of 5 steps on one worker leaves on the ps exactly what 5 steps of one process on that worker's batch
  give: the pull, the local steps (dense copies, cached rows of both table shards, Adagrad's slots) and the push."""
  history = tfps.fit(build_model, per_worker_batches, epochs=1, steps_per_epoch=5,
                     sync_mode=tfps.TrainingMode("geo", geo_steps=5), cluster=cluster)
  assert int(history.model.optimizer.iterations.numpy()) == 5
  features, _ = combined()
  predictions = history.model(features).numpy()
  gaps = [np.abs(predictions - trained_alone_on(worker, 5)(features).numpy()).max() for worker in (0, 1)]
  assert min(gaps) < 1e-5, gaps
  assert max(gaps) > 1e-3  # the two workers' batches train apart: the check tells which one ran


class StepsTraced(tf_keras.Model):
  """A functional model that counts the traces of its training step."""
  traces = 0

  def train_step(self, data):
    StepsTraced.traces += 1
    return super().train_step(data)


def ragged_model():
  ids = tf_keras.Input((None,), dtype="int64", ragged=True, name="ids")
  table = tf_keras.layers.Embedding(VOCAB, 4, embeddings_initializer=tf_keras.initializers.Constant(0.05),
                                    name="table")
  pooled = tf_keras.layers.Lambda(lambda rows: tf.reduce_mean(rows, axis=1))(table(ids))
  output = tf_keras.layers.Dense(1, kernel_initializer=tf_keras.initializers.GlorotUniform(seed=2))(pooled)
  model = StepsTraced({"ids": ids}, output)
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.5), tf_keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def ragged_batches(input_context=None):
  """10 examples of 1 to 4 ids each (two of them on both table shards), in batches of 4, 4 and 2, repeated."""
  del input_context
  rng = np.random.default_rng(5)
  ids = [rng.choice([3, 7, 11, 40_000, 45_000], size=1 + k % 4, replace=False) for k in range(10)]
  labels = (np.arange(10) % 3 == 0).astype(np.float32).reshape(-1, 1)
  return tf.data.Dataset.from_tensor_slices(({"ids": tf.ragged.constant(ids, dtype=tf.int64)}, labels)).batch(4).repeat()


def test_a_long_geo_round_traces_a_bounded_number_of_steps_and_takes_ragged_batches_of_any_size(cluster, monkeypatch):
  """A round of 12 steps on ragged batches of 4, 4 and 2 examples leaves what 12 steps of one process on them give;
  with rounds of at least 10 steps trained in a loop of 5 per iteration (`UNROLLED_STEPS`, here 5), its function was
  traced once (a first trace that made variables would be made again), and the step in it 7 times, not 12: 10 steps
  in the loop, then the 2 left."""
  monkeypatch.setattr(geo, "UNROLLED_STEPS", 5)
  StepsTraced.traces = 0
  history = tfps.fit(ragged_model, ragged_batches, epochs=1, steps_per_epoch=12,
                     sync_mode=tfps.TrainingMode("geo", geo_steps=12), cluster=cluster)
  assert StepsTraced.traces == 7
  assert int(history.model.optimizer.iterations.numpy()) == 12
  alone = ragged_model()
  for features, labels in ragged_batches().take(12):
    alone.train_on_batch(features, labels)
  features = next(iter(ragged_batches().unbatch().batch(10)))[0]
  np.testing.assert_allclose(history.model(features).numpy(), alone(features).numpy(), atol=1e-5)


def test_geo_fit_learns_with_rounds_on_both_workers_and_records_progress_within_epochs(cluster, tmp_path):
  history = tfps.fit(build_model, per_worker_batches, epochs=2, steps_per_epoch=100,
                     sync_mode=tfps.TrainingMode("geo", geo_steps=5), cluster=cluster, model_dir=str(tmp_path),
                     log_every_secs=0.05)
  features, labels = combined()
  assert int(history.model.optimizer.iterations.numpy()) == 200
  assert loss_of(history.model, features, labels) < 0.5 * loss_of(trained_alone(features, labels, steps=0),
                                                                 features, labels)
  # The step moves at each round's push (5 steps), read by the progress thread between the epochs' ends too.
  train = [r for r in run_records.read_run(str(tmp_path))["progress"] if r["kind"] == "train"]
  within = [r["step"] for r in train if r["step"] % 100]
  assert within and all(step % 5 == 0 for step in within), [r["step"] for r in train]


def test_pipelined_fit_and_estimator_learn_on_both_workers_each_step_counted_once(cluster, tmp_path, info_log):
  """Updates applied one step late (`pipelined_updates`) still train, on both paths, and count every step once."""
  features, labels = combined()
  untrained = loss_of(trained_alone(features, labels, steps=0), features, labels)
  history = tfps.fit(build_model, per_worker_batches, epochs=2, steps_per_epoch=45, cluster=cluster,
                     sync_mode=tfps.TrainingMode(pipelined_updates=True, unrolled_steps="auto"), steps_per_execution=10)
  assert "(async, updates pipelined, 4 steps per loop iteration (auto: batch 32))" in info_log.text
  assert int(history.model.optimizer.iterations.numpy()) == 90
  assert loss_of(history.model, features, labels) < 0.5 * untrained
  estimator = tfps.Estimator(model_fn, model_dir=str(tmp_path), cluster=cluster,
                             config=tfps.RunConfig(pipelined_updates=True, log_step_count_steps=10,
                                                   steps_per_execution=10))
  estimator.train(per_worker_batches, max_steps=45)
  assert "Training from step 0 to 45 (async, updates pipelined)" in info_log.text  # one step per loop iteration
  results = estimator.evaluate(lambda: tf.data.Dataset.from_tensors((features, labels)), steps=None)
  assert results["global_step"] == 45
  assert results["loss"] < 0.5 * untrained


def test_geo_estimator_round_matches_single_process_on_one_worker_batch(cluster, tmp_path):
  estimator = tfps.Estimator(model_fn, model_dir=str(tmp_path), cluster=cluster,
                             config=tfps.RunConfig(sync_mode="geo", geo_steps=5, log_step_count_steps=10))
  estimator.train(per_worker_batches, max_steps=5)
  features, labels = combined()
  results = estimator.evaluate(lambda: tf.data.Dataset.from_tensors((features, labels)), steps=None)
  assert results["global_step"] == 5
  gaps = [abs(results["loss"] - loss_of(trained_alone_on(worker, 5), features, labels)) for worker in (0, 1)]
  assert min(gaps) < 1e-5, gaps
  estimator.train(per_worker_batches, max_steps=60)  # rounds on both workers
  assert estimator.evaluate(lambda: tf.data.Dataset.from_tensors((features, labels)), steps=None)["loss"] < \
      results["loss"]


@pytest.mark.parametrize("mode, message", [
    (dict(sync_mode="fast"), "`sync_mode` ('fast') must be one of async, sync, geo"),
    (dict(sync_mode="async", geo_steps=5), "`geo_steps` (5) applies only to sync_mode=geo, not async"),
    (dict(sync_mode="geo", replicas_to_aggregate=2), "`replicas_to_aggregate` (2) applies only to sync_mode=sync"),
    (dict(sync_mode="geo", geo_steps=0), "`geo_steps` (0) must be a positive integer"),
    (dict(sync_mode="geo", packed_reads=True), "`packed_reads` (True) applies only to sync_mode=async, not geo"),
    (dict(packed_reads="no"), "`packed_reads` ('no') must be True or False"),
    (dict(sync_mode="sync", lockfree_row_updates=True),
     "`lockfree_row_updates` (True) applies only to sync_mode=async"),
    (dict(lockfree_row_updates=1), "`lockfree_row_updates` (1) must be True or False"),
    (dict(sync_mode="geo", pipelined_updates=True), "`pipelined_updates` (True) applies only to sync_mode=async"),
    (dict(sync_mode="sync", unrolled_steps=4),
     "`unrolled_steps` (4) applies only to sync_mode=async, not sync_mode=sync"),
    (dict(unrolled_steps=0), "`unrolled_steps` (0) must be a positive integer, \"auto\" or None"),
    (dict(unrolled_steps="4"), "`unrolled_steps` ('4') must be a positive integer, \"auto\" or None"),
    (dict(sync_mode="geo", bf16_rows=True), "`bf16_rows` (True) applies only to sync_mode=async, not geo"),
    (dict(bf16_rows="yes"), "`bf16_rows` ('yes') must be True or False"),
    (dict(sync_mode="sync", records_lock=False), "`records_lock` (False) applies only to sync_mode=async, not sync"),
    (dict(records_lock="off"), "`records_lock` ('off') must be True or False"),
])
def test_modes_that_make_no_sense_are_refused(mode, message):
  with pytest.raises(tfps.UsageError, match=re.escape(message)):
    tfps.TrainingMode(**mode)
  with pytest.raises(tfps.UsageError, match=re.escape(message)):
    tfps.RunConfig(**mode)


def test_a_mode_names_the_switches_set_otherwise_than_by_default_in_the_run_log_line():
  assert tfps.TrainingMode().describe(2) == "async"
  assert tfps.TrainingMode(packed_reads=True).describe(2) == "async"  # the default
  assert tfps.TrainingMode(pipelined_updates=True).describe(2) == "async, updates pipelined"
  assert tfps.TrainingMode(unrolled_steps=4, packed_reads=False, lockfree_row_updates=True, bf16_rows=True).describe(
      2) == ("async, 4 steps per loop iteration, dense variables read one by one, row updates without a lock, rows as "
             "bfloat16")
  assert tfps.TrainingMode(records_lock=False).describe(2) == "async, no records lock"
  assert tfps.TrainingMode("sync").describe(2) == "sync, 2 worker batches per step"
  assert tfps.TrainingMode("geo").describe(2) == "geo, 10 local steps per push"
  # With "auto" the run's start line gives a worker's static batch size: the steps per loop iteration chosen for it.
  auto = tfps.TrainingMode(unrolled_steps="auto")
  assert auto.describe(2, 256) == "async, 4 steps per loop iteration (auto: batch 256)"
  assert auto.describe(2, 4096) == "async, 1 step per loop iteration (auto: batch 4096)"
  assert auto.describe(2, None) == "async, 1 step per loop iteration (auto: batch size not static)"
  assert tfps.TrainingMode().describe(2, 256) == tfps.TrainingMode(unrolled_steps=1).describe(2, 256) == "async"
  assert tfps.TrainingMode("sync").describe(2, 256) == "sync, 2 worker batches per step"


def test_async_reads_dense_variables_packed_by_default_and_only_there():
  assert tfps.TrainingMode().packed_reads is True and tfps.RunConfig().training_mode.packed_reads is True
  assert tfps.TrainingMode(pipelined_updates=True).packed_reads is True
  assert tfps.TrainingMode(packed_reads=False).packed_reads is False
  assert tfps.RunConfig(packed_reads=False).training_mode.packed_reads is False
  for mode in ("sync", "geo"):  # nothing to pack there; saying False is allowed
    assert tfps.TrainingMode(mode).packed_reads is False
    assert tfps.TrainingMode(mode, packed_reads=False).packed_reads is False


def test_each_ps_takes_the_records_lock_by_default_and_async_may_drop_it_on_both_paths():
  assert tfps.TrainingMode().records_lock is True and tfps.RunConfig().training_mode.records_lock is True
  assert tfps.TrainingMode(records_lock=False).records_lock is False
  assert tfps.RunConfig(records_lock=False).training_mode.records_lock is False  # the Estimator path's mode
  for mode in ("sync", "geo"):  # always locked there; saying True is allowed
    assert tfps.TrainingMode(mode, records_lock=True).records_lock is True


def test_async_runs_one_step_per_loop_iteration_by_default_chooses_with_auto_and_unrolls_only_there():
  assert tfps.TrainingMode().unrolled_steps == 1 and tfps.RunConfig().training_mode.unrolled_steps == 1
  assert tfps.TrainingMode(unrolled_steps=1) == tfps.TrainingMode()
  assert tfps.TrainingMode(unrolled_steps=4).unrolled_steps == 4
  assert tfps.TrainingMode(pipelined_updates=True).unrolled_steps == 1
  assert [tfps.TrainingMode().steps_per_iteration(20, size) for size in (64, 4096, None)] == [1, 1, 1]
  auto = tfps.TrainingMode(unrolled_steps="auto")
  assert [auto.steps_per_iteration(20, size) for size in (64, 1024, 1025, None)] == [4, 4, 1, 1]
  assert auto.steps_per_iteration(3, 64) == 3  # at most the steps per execution
  assert tfps.TrainingMode(unrolled_steps=2).steps_per_iteration(20, 4096) == 2
  assert tfps.TrainingMode(pipelined_updates=True, unrolled_steps=4).describe(1) == (
      "async, updates pipelined, 4 steps per loop iteration")
  for mode in (tfps.TrainingMode("sync"), tfps.TrainingMode("geo")):
    assert mode.unrolled_steps is None, mode


def test_sync_with_more_replicas_than_workers_or_steps_per_execution_is_refused(cluster, tmp_path):
  with pytest.raises(tfps.UsageError, match=re.escape("`replicas_to_aggregate` (3) is more than the 2 workers")):
    tfps.fit(build_model, per_worker_batches, epochs=1, steps_per_epoch=5, cluster=cluster,
             sync_mode=tfps.TrainingMode("sync", replicas_to_aggregate=3))
  with pytest.raises(tfps.UsageError, match="`steps_per_execution` .4. applies to sync_mode=async only"):
    tfps.fit(build_model, per_worker_batches, epochs=1, steps_per_epoch=5, cluster=cluster, sync_mode="geo",
             steps_per_execution=4)
  with pytest.raises(tfps.UsageError, match=re.escape("`replicas_to_aggregate` (3) is more than the 2 workers")):
    tfps.Estimator(model_fn, model_dir=str(tmp_path), cluster=cluster,
                   config=tfps.RunConfig(sync_mode="sync", replicas_to_aggregate=3)).train(per_worker_batches, 1)


def test_sync_with_one_replica_per_step_uses_one_batch_per_update(cluster):
  history = tfps.fit(build_model, per_worker_batches, epochs=1, steps_per_epoch=20, cluster=cluster,
                     sync_mode=tfps.TrainingMode("sync", replicas_to_aggregate=1))
  assert int(history.model.optimizer.iterations.numpy()) == 20
  features, _ = combined()
  predictions = history.model(features).numpy()
  # Each update used one worker's batch alone: the result is not that of the two batches averaged.
  assert np.abs(predictions - trained_alone(*combined(), steps=20)(features).numpy()).max() > 1e-3


@pytest.mark.parametrize("args, message", [
    (["--sync_mode=fast"], "`sync_mode` ('fast') must be one of async, sync, geo"),
    (["--sync_mode=geo", "--pipelined_updates"], "`pipelined_updates` (True) applies only to sync_mode=async, not geo"),
])
def test_a_script_given_a_bad_mode_says_so_in_one_line(args, message, subprocess_env):
  """A bad value and a flag its mode does not take, from a script's command line (each mode's refusals:
  `test_modes_that_make_no_sense_are_refused`; the flags' reading of them: tests/test_flags.py)."""
  result = subprocess.run([sys.executable, "scripts/train_keras.py", *args], cwd=REPO, env=subprocess_env,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == f"train_keras.py: {message}"
  assert "Traceback" not in result.stderr
