"""tfps.layers.DynamicEmbedding on the in-process cluster: rows per raw id, admission, eviction, fallbacks, fit,
checkpoints, bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfps
from tfps.keras import callbacks as callbacks_lib
from tfps.training import tables

DIM = 8
SHARDED = 8192  # 8192 x 8 floats = 256 KiB: sharded over both ps by the default partitioner


@pytest.fixture(scope="module")
def strategy(cluster):
  strategy, coordinator = tfps.build_strategy(cluster)
  return strategy, coordinator


def make_layer(strategy, capacity=SHARDED, **options):
  with strategy.scope():
    layer = tfps.layers.DynamicEmbedding(capacity, DIM, **options)
    layer.build(None)
  return layer


def train_calls(coordinator, layer, batches):
  """Runs `layer(ids, training=True)` on the workers, one scheduled call per batch, all queued at once."""
  @tf.function
  def call(ids):
    return layer(ids, training=True)

  results = [coordinator.schedule(call, args=(tf.constant(ids, layer.key_dtype),)) for ids in batches]
  coordinator.join()
  return [r.fetch() for r in results]


def rows_of(layer, ids):
  return layer.rows_of(tf.constant(ids, layer.key_dtype)).numpy()


def test_distinct_raw_ids_get_distinct_rows_on_both_ps(strategy):
  _, coordinator = strategy
  layer = make_layer(strategy[0])
  rng = np.random.default_rng(0)
  ids = rng.choice(10**12, size=3000, replace=False).astype(np.int64)  # raw ids far beyond the capacity
  batches = [rng.choice(ids, size=256) for _ in range(40)] + [ids[i:i + 500] for i in range(0, 3000, 500)]
  train_calls(coordinator, layer, batches)  # concurrent calls from two workers
  rows = rows_of(layer, ids)
  assert (rows >= 0).all()
  assert len(set(rows.tolist())) == len(ids)  # no two ids share a row
  assert layer.table_metrics() == {"occupancy": 3000, "admitted": 3000, "evicted": 0, "fallbacks": 0}
  assert len(layer.shards) == 2
  for shard, rows_variable in zip(layer.shards, layer.embeddings.variables):  # each map sits with its rows
    assert shard.map.resource_handle.device == rows_variable.device
    assert shard.num_free.device == rows_variable.device
  per_shard = [shard.rows - int(shard.num_free.numpy()) for shard in layer.shards]
  assert min(per_shard) > 1200  # routed by hash of the id: both shards fill
  vectors = layer(tf.constant(ids[:50]))
  expected = tf.gather(tf.convert_to_tensor(layer.embeddings), rows[:50])
  np.testing.assert_allclose(vectors.numpy(), expected.numpy())


def test_a_table_below_the_sharding_threshold_with_num_shards_trains(strategy):
  """1000 x 8 floats (32 KB) stay whole on one ps; num_shards=2 maps over it share one critical section there."""
  _, coordinator = strategy
  layer = make_layer(strategy[0], capacity=1000, num_shards=2)
  assert not isinstance(layer.embeddings, tf.__internal__.distribute.ShardedVariable)
  rng = np.random.default_rng(1)
  ids = rng.choice(10**12, size=600, replace=False).astype(np.int64)
  train_calls(coordinator, layer, [rng.choice(ids, size=128) for _ in range(10)] + [ids[:300], ids[300:]])
  rows = rows_of(layer, ids)
  assert (rows >= 0).all() and len(set(rows.tolist())) == len(ids)  # no two ids share a row
  assert layer.table_metrics() == {"occupancy": 600, "admitted": 600, "evicted": 0, "fallbacks": 0}
  assert min(shard.rows - int(shard.num_free.numpy()) for shard in layer.shards) > 200  # both maps admit
  assert layer.shards[0].lock is layer.shards[1].lock


def _before(op):
  """Every op `op` waits for in its graph (inputs and control inputs, transitively)."""
  seen, todo = set(), [op]
  while todo:
    current = todo.pop()
    for parent in [tensor.op for tensor in current.inputs] + list(current.control_inputs):
      if parent not in seen:
        seen.add(parent)
        todo.append(parent)
  return seen


def test_a_function_holds_one_shard_lock_at_a_time(strategy):
  """Several calls in one function (a geo round's batches) take the shard locks in turn: each lock only once the lock
  taken before it in the function was let go, so the functions of two workers never wait on each other's locks (a
  geo round on the Estimator path held for 140 s before, until gRPC dropped its connection)."""
  _, coordinator = strategy
  layer = make_layer(strategy[0])

  @tf.function
  def round_of(batches):
    return [layer(ids, training=True) for ids in tf.unstack(batches)]

  batches = tf.constant(10**12 + 7919 * np.arange(4 * 64, dtype=np.int64).reshape(4, 64))
  graph = round_of.get_concrete_function(batches).graph
  takes = [op for op in graph.get_operations() if op.type == "MutexLock"]
  releases = [op for op in graph.get_operations() if op.type == "ConsumeMutexLock"]
  assert len(takes) == len(releases) == 8  # 4 batches x 2 shards
  for released, taken in zip(releases, takes[1:]):
    assert released in _before(taken), (released.name, taken.name)
  results = [coordinator.schedule(round_of, args=(batches + 7919 * 64 * k,)) for k in range(12)]
  coordinator.join()  # both workers, concurrently
  assert all(len(result.fetch()) == 4 for result in results)
  assert layer.table_metrics()["occupancy"] == 4 * 64 + 11 * 64


def test_a_step_run_again_inside_strategy_run_only_looks_up(strategy):
  """A runner's step calls the layer inside `strategy.run`, which traces it in a replica thread: the step's mark
  reaches the bookkeeping there, so a step run again with its mark neither ticks the clock nor counts sightings."""
  strategy, coordinator = strategy
  layer = make_layer(strategy, min_count=5)
  with strategy.scope():
    marks = tables.StepMarks(strategy)
  ids = np.array([10**12 + k for k in range(6)], np.int64)

  @tf.function
  def step(keys, mark):
    return strategy.run(marks.marked(lambda keys: layer(keys, training=True), tf.constant([3]), mark), args=(keys,))

  for mark in [1, 1, 2, 2, 2, 3]:  # steps 1 and 2 run again; 3 steps in all
    coordinator.schedule(step, args=(tf.constant(ids), tf.constant(mark, tf.int64)))
    coordinator.join()  # one at a time: a step is run again after its first run
  assert [int(shard.clock.numpy()) for shard in layer.shards] == [3, 3]
  sightings = sum(shard.counts.lookup(tf.constant(ids)).numpy() for shard in layer.shards)  # 0 where not kept
  assert sightings.tolist() == [3] * 6


def test_string_ids_and_admission_after_min_count(strategy):
  _, coordinator = strategy
  layer = make_layer(strategy[0], capacity=64, key_dtype=tf.string, min_count=3)
  train_calls(coordinator, layer, [["a", "b", "a"], ["a", "b"]])  # a: seen in 2 calls (repeats in a batch count once)
  assert (rows_of(layer, ["a", "b"]) == -1).all()
  np.testing.assert_array_equal(layer(tf.constant(["a"])).numpy(), np.zeros([1, DIM]))  # the default: zeros
  train_calls(coordinator, layer, [["a"]])
  assert rows_of(layer, ["a"])[0] >= 0 and rows_of(layer, ["b"])[0] == -1
  assert layer.table_metrics()["admitted"] == 1


def test_eviction_frees_rows_and_resets_them_and_their_slots_for_the_next_id(strategy):
  _, coordinator = strategy
  layer = make_layer(strategy[0], capacity=4, steps_to_live=2)  # small: one shard, so one clock
  optimizer = tf_keras.optimizers.legacy.Adagrad(0.1, initial_accumulator_value=0.25)
  with strategy[0].scope():
    layer.bind_optimizer(optimizer)
  accumulator = optimizer.get_slot(layer.embeddings, "accumulator")
  train_calls(coordinator, layer, [[1, 2, 3, 4]])
  old_rows = rows_of(layer, [1, 2, 3, 4])
  layer.embeddings.assign(tf.fill([4, DIM], 7.0))  # as if trained
  accumulator.assign(tf.fill([4, DIM], 9.0))
  train_calls(coordinator, layer, [[4], [4]])  # ids 1-3 last seen 2 calls ago; still live
  assert (rows_of(layer, [1, 2, 3]) >= 0).all()
  train_calls(coordinator, layer, [[4, 5]])  # now they are stale: evicted first, so 5 gets a row
  assert (rows_of(layer, [1, 2, 3]) == -1).all()
  assert layer.table_metrics() == {"occupancy": 2, "admitted": 5, "evicted": 3, "fallbacks": 0}
  row_5 = rows_of(layer, [5])[0]
  assert row_5 in old_rows[:3]
  fresh = layer.embeddings.numpy()[row_5]
  assert np.abs(fresh).max() <= 0.05  # redrawn, not the evicted id's trained 7.0
  assert (accumulator.numpy()[row_5] == 0.25).all()  # the optimizer's slot row starts again too
  assert (layer.embeddings.numpy()[rows_of(layer, [4])[0]] == 7.0).all()  # a live id's rows are untouched
  assert (accumulator.numpy()[rows_of(layer, [4])[0]] == 9.0).all()


def test_a_full_table_falls_back_to_the_default_and_counts(strategy):
  _, coordinator = strategy
  layer = make_layer(strategy[0], capacity=3)
  train_calls(coordinator, layer, [[1, 2, 3, 4, 5]])
  train_calls(coordinator, layer, [[5, 1]])
  rows = rows_of(layer, [1, 2, 3, 4, 5])
  assert sorted(rows[rows >= 0].tolist()) == [0, 1, 2] and (rows == -1).sum() == 2
  assert layer.table_metrics()["fallbacks"] == 2 + (1 if rows[4] == -1 else 0)
  assert layer.table_metrics()["occupancy"] == 3


def test_a_step_cancelled_after_its_admissions_counts_its_fallbacks_once(strategy):
  """A step whose first run got through admission (rows handed out, ids left without one) and was cancelled before
  its last writes runs again: the ids that found no row are counted in `fallbacks` once, by the run that finishes."""
  strategy, coordinator = strategy
  layer = make_layer(strategy, capacity=2)  # one shard
  with strategy.scope():
    marks = tables.StepMarks(strategy)

  @tf.function
  def step(keys, mark):
    return strategy.run(marks.marked(lambda keys: layer(keys, training=True), tf.constant([0]), mark), args=(keys,))

  shard = layer.shards[0]
  ids = tf.constant([1, 2, 3, 4, 5], tf.int64)
  with shard.placed():  # the cancelled first run: its admission's writes landed, its last writes did not
    shard._admit(ids, layer._row_shards[0], layer._fresh_rows, layer._slots(0), remove_counts=False)
  assert layer.table_metrics() == {"occupancy": 2, "admitted": 2, "evicted": 0, "fallbacks": 0}
  for _ in range(2):  # the step run again to its end, then once more (as if its result was lost): mark 1 both times
    coordinator.schedule(step, args=(ids, tf.constant(1, tf.int64)))
    coordinator.join()
  assert layer.table_metrics() == {"occupancy": 2, "admitted": 2, "evicted": 0, "fallbacks": 3}
  assert int(shard.clock.numpy()) == 1


def test_checkpoint_round_trip_restores_map_counts_and_rows(strategy, tmp_path):
  _, coordinator = strategy
  layer = make_layer(strategy[0], min_count=2)
  ids = np.arange(10**9, 10**9 + 600, dtype=np.int64)
  train_calls(coordinator, layer, [ids, ids[:400]])  # ids[400:] seen once: counted, not admitted
  path = tf.train.Checkpoint(layer=layer).save(str(tmp_path / "ckpt"))
  restored = make_layer(strategy[0], min_count=2)
  tf.train.Checkpoint(layer=restored).restore(path).assert_existing_objects_matched()
  np.testing.assert_array_equal(rows_of(restored, ids), rows_of(layer, ids))
  np.testing.assert_array_equal(tf.convert_to_tensor(restored.embeddings).numpy(),
                                tf.convert_to_tensor(layer.embeddings).numpy())
  assert restored.table_metrics() == layer.table_metrics() == {
      "occupancy": 400, "admitted": 400, "evicted": 0, "fallbacks": 0}
  train_calls(coordinator, restored, [ids[400:]])  # their counts came back: a second sighting admits them
  assert (rows_of(restored, ids) >= 0).all()


@pytest.mark.parametrize("kwargs, message", [
    (dict(capacity=0, dim=4), "`capacity` (0) must be a positive integer"),
    (dict(capacity=10, dim=4, min_count=0), "`min_count` (0) must be a positive integer"),
    (dict(capacity=10, dim=4, steps_to_live=0), "`steps_to_live` (0) must be a positive integer or None"),
    (dict(capacity=10, dim=4, key_dtype=tf.float32), "`key_dtype` (float32) must be int64 or string"),
])
def test_bad_arguments_get_one_line_errors(kwargs, message):
  with pytest.raises((ValueError, TypeError)) as error:
    tfps.layers.DynamicEmbedding(**kwargs)
  assert str(error.value) == message


def test_float_ids_get_one_line_error():
  layer = tfps.layers.DynamicEmbedding(10, 4)
  with pytest.raises(TypeError, match=r"ids of type float32 are not allowed; this table takes int32 or int64 ids"):
    layer(tf.constant([1.5]))


NUM_IDS, VOCAB = 4, 2000


def click_examples(rows, seed):
  """Raw ids (spread over 1e12) with planted weights; clicks follow a logistic model of them."""
  rng = np.random.default_rng(seed)
  weights = np.random.default_rng(0).normal(size=VOCAB).astype(np.float32) * 3
  index = np.minimum(rng.zipf(1.3, size=(rows, NUM_IDS)) - 1, VOCAB - 1)
  labels = (rng.random(rows) < 1 / (1 + np.exp(-weights[index].sum(axis=1)))).astype(np.float32)
  return {"ids": index.astype(np.int64) * 999_999_937 + 12_345}, labels


def build_dynamic_model():
  ids = tf_keras.Input((NUM_IDS,), dtype="int64", name="ids")
  embedded = tfps.layers.DynamicEmbedding(SHARDED, DIM, min_count=2, num_shards=2, name="dynamic")(ids)
  hidden = tf_keras.layers.Dense(16, activation="relu")(tf_keras.layers.Flatten()(embedded))
  model = tf_keras.Model({"ids": ids}, tf_keras.layers.Dense(1, activation="sigmoid")(hidden))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.2), "binary_crossentropy",
                metrics=[tf_keras.metrics.AUC(name="auc")])
  return model


def click_train_fn(input_context):
  features, labels = click_examples(8_000, seed=1 + input_context.input_pipeline_id)
  return tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(64, drop_remainder=True)


@pytest.fixture(scope="module")
def trained(cluster, tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("dynamic") / "run"
  with pytest.MonkeyPatch.context() as patch:
    lines = []
    patch.setattr(callbacks_lib.logging, "info", lambda text, *args: lines.append(text % args))
    history = tfps.fit(build_dynamic_model, click_train_fn, epochs=4, steps_per_epoch=40, cluster=cluster,
                       log_every_secs=60, model_dir=str(model_dir))
  return history, model_dir, "\n".join(lines)


def test_fit_trains_a_model_on_raw_ids_and_logs_table_metrics(trained):
  history, model_dir, log = trained
  losses = history.history["loss"]
  assert losses[-1] < losses[0] - 0.03
  assert history.history["auc"][-1] > 0.75  # learned per-id weights: the rows carry the signal
  layer = history.model.get_layer("dynamic")
  metrics = layer.table_metrics()
  assert 0 < metrics["occupancy"] == metrics["admitted"] <= VOCAB and metrics["fallbacks"] == 0
  assert history.history["dynamic/occupancy"][-1] == metrics["occupancy"]  # in the epoch logs: History, TensorBoard
  assert f"dynamic/occupancy {metrics['occupancy']:.4f}" in log  # and the epoch line
  assert list((model_dir / "logs" / "train").glob("events.out.tfevents.*"))


class _CountingTable(tf_keras.layers.Layer):
  """A table layer (`tables.is_table`) whose occupancy grows by one each time its metrics are read."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.reads = 0

  def call(self, inputs):
    return inputs

  def bind_optimizer(self, optimizer):
    del optimizer

  def table_metrics(self):
    self.reads += 1
    return {"occupancy": self.reads}


def test_table_metrics_reach_every_epochs_logs_from_one_walk_of_the_model(monkeypatch):
  walks = []
  tables_of = tables.tables_of
  monkeypatch.setattr(tables, "tables_of", lambda model: walks.append(model) or tables_of(model))
  model = tf_keras.Sequential([tf_keras.Input((2,)), _CountingTable(name="table"), tf_keras.layers.Dense(1)])
  callback = callbacks_lib.DynamicTableMetrics()
  callback.set_model(model)
  for epoch in range(3):
    logs = {"loss": 0.5}
    callback.on_epoch_end(epoch, logs)
    assert logs == {"loss": 0.5, "table/occupancy": epoch + 1}  # read from the table at every epoch's end
  assert walks == [model]  # the model's submodules walked once, not every epoch


def test_export_serves_raw_ids_without_a_cluster(trained, tmp_path):
  history, _, _ = trained
  export_dir = str(tmp_path / "export")
  tfps.export_saved_model(build_dynamic_model, export_dir, model=history.model)
  features, _ = click_examples(20, seed=7)
  features["ids"][0] = [5, 6, 7, 8]  # never seen: they read the default
  expected = history.model(features).numpy()[:, 0]  # the cluster's answer (rows and maps on the ps)
  np.save(tmp_path / "ids.npy", features["ids"])
  code = f"""
import json, numpy as np, os
import tensorflow as tf
loaded = tf.saved_model.load({export_dir!r})
ids = tf.constant(np.load({str(tmp_path / 'ids.npy')!r}))
print(json.dumps(list(loaded.signatures["serving_default"](ids=ids).values())[0].numpy()[:, 0].tolist()))
"""
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "3", "TF_USE_LEGACY_KERAS": "1"})
  assert result.returncode == 0, result.stderr[-2000:]
  served = json.loads(result.stdout.strip().splitlines()[-1])
  np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
  assert len(set(np.round(served, 6))) > 10  # the rows differ per id: not one default answer


def test_num_shards_other_than_the_partitioners_is_an_error(strategy):
  with pytest.raises(ValueError, match=r"`num_shards` \(3\) differs from the 2 shard\(s\) the strategy's partitioner "
                                       r"made of the 8192-row table"):
    make_layer(strategy[0], num_shards=3)


def test_an_unseen_id_goes_between_steps_to_live_and_one_tenth_more_calls():
  layer = tfps.layers.DynamicEmbedding(8, 2, steps_to_live=20)  # outside a strategy: scans every 2 calls
  layer(tf.constant([1, 2], tf.int64), training=True)  # clock 1
  gone_at = None
  for clock in range(2, 30):
    layer(tf.constant([2], tf.int64), training=True)
    if gone_at is None and layer.rows_of(tf.constant([1], tf.int64)).numpy()[0] == -1:
      gone_at = clock
  assert 21 <= gone_at <= 23  # last seen at 1: stale from clock 22 on, found at the next even clock
  assert layer.table_metrics() == {"occupancy": 1, "admitted": 2, "evicted": 1, "fallbacks": 0}


def test_a_checkpoint_of_dynamic_tables_in_other_shard_counts_is_refused_in_one_line(tmp_path):
  """Each shard's map holds the ids hashed to it: a checkpoint restores only into as many shards (2 saved here, then
  1 and 3 asked for), refused before anything is restored."""
  from tfps.training import resharding  # pylint: disable=g-import-not-at-top

  def model(num_shards):
    built = tf_keras.Sequential([tfps.layers.DynamicEmbedding(90, DIM, num_shards=num_shards, name="ids_table")])
    built(tf.constant([1, 2], tf.int64), training=True)
    return built

  path = tf.train.Checkpoint(model=model(2)).write(str(tmp_path / "ckpt"))
  resharding.check_compatible(path, tf.train.Checkpoint(model=model(2)))  # the same layout fits
  for num_shards in (1, 3):
    with pytest.raises(tfps.CheckpointMismatchError) as raised:
      resharding.check_compatible(path, tf.train.Checkpoint(model=model(num_shards)))
    message = str(raised.value)
    assert "\n" not in message
    assert (f"dynamic table 'ids_table' (model/layer_with_weights-0) in 2 shard(s) and this run makes {num_shards} "
            in message), message
    assert "resume with the number of ps (and --num_shards) the checkpoint was saved with" in message
