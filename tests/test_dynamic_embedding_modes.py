"""tfps.layers.DynamicEmbedding in sync and geo mode, and on the Estimator path (in-process cluster)."""

import re

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfps
from test_exactly_once import async_runner
from test_modes import StepsTraced
from test_packing import _loop_body

NUM_IDS, CAPACITY, DIM, BATCH = 300, 8192, 8, 64  # 8192 x 8 floats: sharded over both ps
RAW = 10**12 + 7919 * np.arange(NUM_IDS, dtype=np.int64)  # raw ids, far beyond the capacity
LABELS = (np.random.default_rng(3).random(NUM_IDS) < 0.5).astype(np.float32)  # each id's own label


def build_model():
  ids = tf_keras.Input((1,), dtype="int64", name="ids")
  table = tfps.layers.DynamicEmbedding(CAPACITY, DIM, min_count=2, num_shards=2, name="ids_table")
  model = tf_keras.Model(ids, tf_keras.layers.Dense(1, activation="sigmoid")(tf_keras.layers.Flatten()(table(ids))))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.5), "binary_crossentropy", metrics=["accuracy"])
  return model


def dataset_fn(input_context=None):
  seed = input_context.input_pipeline_id if input_context else 0
  picks = np.random.default_rng(seed).integers(0, NUM_IDS, size=(4096,))
  return tf.data.Dataset.from_tensor_slices((RAW[picks, None], LABELS[picks])).repeat().batch(BATCH)


@pytest.mark.slow
def test_sync_mode_learns_each_raw_ids_label(cluster):
  # 2 x 30 steps of 2 worker batches: as many batches as the geo and bf16 runs' 2 x 60 (a sync step cost ~30 ms of
  # CPU; 2 x 20 steps measured occupancy 300 and accuracy 0.99).
  history = tfps.fit(build_model, dataset_fn, epochs=2, steps_per_epoch=30, sync_mode="sync", cluster=cluster)
  model = history.model
  assert history.history["ids_table/occupancy"][-1] == NUM_IDS, history.history  # every id seen twice: admitted
  assert history.history["ids_table/fallbacks"][-1] == 0
  predictions = model.predict(RAW[:, None], verbose=0)[:, 0]
  assert np.mean((predictions > 0.5) == LABELS) >= 0.95
  # Each step's two worker batches (and any batch computed for a slot another worker was late for) went through
  # the bookkeeping: a shard's clock is the number of gradient batches computed, at least two per step.
  clocks = [int(shard.clock.numpy()) for shard in model.get_layer("ids_table").shards]
  assert min(clocks) >= 2 * 60, clocks


def test_geo_mode_learns_each_raw_ids_label_with_one_row_per_id(cluster):
  # rounds of 5 steps: a round's steps are written out, so its function costs CPU per step of the round to trace
  history = tfps.fit(build_model, dataset_fn, epochs=2, steps_per_epoch=60,
                     sync_mode=tfps.TrainingMode("geo", geo_steps=5), cluster=cluster)
  model = history.model
  assert history.history["ids_table/occupancy"][-1] == NUM_IDS, history.history
  assert history.history["ids_table/fallbacks"][-1] == 0
  predictions = model.predict(RAW[:, None], verbose=0)[:, 0]
  assert np.mean((predictions > 0.5) == LABELS) >= 0.95
  layer = model.get_layer("ids_table")
  rows = layer.rows_of(tf.constant(RAW)).numpy()
  assert (rows >= 0).all() and len(set(rows.tolist())) == NUM_IDS  # distinct ids, distinct rows, on the ps's maps
  # The map stayed on the ps: each of the 120 batches did its bookkeeping once on each shard, in its round's discovery.
  assert [int(shard.clock.numpy()) for shard in layer.shards] == [120, 120]
  assert int(model.optimizer.iterations.numpy()) == 120


def model_fn(features, labels, mode, params):
  """A model_fn that builds its DynamicEmbedding on every call, as Estimator model_fns build their layers."""
  del params
  table = tfps.layers.DynamicEmbedding(CAPACITY, DIM, min_count=2, num_shards=2, name="ids_table")
  vectors = table(features["ids"], training=mode == tfps.ModeKeys.TRAIN)
  logits = tf_keras.layers.Dense(1, name="logits")(vectors)[:, 0]
  prob = tf.sigmoid(logits)
  if mode == tfps.ModeKeys.PREDICT:
    return tfps.EstimatorSpec(mode, predictions={"prob": prob})
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
  if mode == tfps.ModeKeys.EVAL:
    accuracy = tf_keras.metrics.BinaryAccuracy(name="accuracy")
    accuracy.update_state(labels, prob)
    return tfps.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})
  return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.Adagrad(0.5))


def train_input_fn(params, input_context=None):
  del params
  return dataset_fn(input_context).map(lambda ids, labels: ({"ids": ids[:, 0]}, labels))


def eval_input_fn(params):
  del params
  return tf.data.Dataset.from_tensor_slices(({"ids": RAW}, LABELS)).batch(BATCH)


@pytest.mark.slow
def test_estimator_path_trains_checkpoints_and_exports_the_table(cluster, tmp_path):
  config = tfps.RunConfig(save_checkpoints_steps=100, steps_per_execution=10)
  calls = []

  def counted_model_fn(features, labels, mode, params):
    calls.append(mode)
    return model_fn(features, labels, mode, params)

  estimator = tfps.Estimator(counted_model_fn, model_dir=str(tmp_path / "model"), config=config, cluster=cluster)
  results = tfps.train_and_evaluate(estimator, tfps.TrainSpec(train_input_fn, max_steps=200),
                                    tfps.EvalSpec(eval_input_fn, steps=None, throttle_secs=0))
  # TRAIN calls: 1 in the trace that makes the variables (made eagerly: 2 when that trace made them, and was traced
  # again), 1 in the scratch trace that finds the tables a step gathers from, 1 in the step's function.
  assert calls.count("train") == 3, calls
  assert results["global_step"] == 200
  assert results["accuracy"] >= 0.95, results  # evaluated on the workers: lookups of the ps's maps
  table, = estimator.distributed_model().model.variables.tables  # one table, though model_fn ran in several traces
  assert table.table_metrics()["occupancy"] == NUM_IDS
  # The table's metrics end each step-log line (steps 100 and 200) and go to TensorBoard beside the loss.
  lines = (tmp_path / "model" / "loss.log").read_text().splitlines()
  assert [line.split(" | ")[0] for line in lines] == ["step 100", "step 200"]
  assert lines[-1].endswith(f"| ids_table/occupancy {NUM_IDS} | ids_table/admitted {NUM_IDS} | ids_table/evicted 0 "
                            "| ids_table/fallbacks 0"), lines
  scalars = {}
  for events in (tmp_path / "model").glob("events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(str(events)):
      for value in event.summary.value:
        scalars.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
  assert sorted(scalars["ids_table/occupancy"])[-1] == (200, NUM_IDS), scalars.keys()
  assert sorted(scalars["ids_table/fallbacks"])[-1] == (200, 0.0)
  assert {"ids_table/admitted", "ids_table/evicted", "loss"} <= set(scalars)
  # A plain process restores the checkpoint (rows, maps) into a model of its own and evaluates it alike.
  local = estimator.evaluate(eval_input_fn)
  assert local["accuracy"] == pytest.approx(results["accuracy"], abs=1e-6)
  exported = estimator.export_saved_model(str(tmp_path / "export"),
                                          lambda: {"ids": tf.TensorSpec([None], tf.int64)})
  served = tf.saved_model.load(exported).signatures["serving_default"](ids=tf.constant(np.append(RAW, 5)))
  prob = list(served.values())[0].numpy()
  assert np.mean((prob[:-1] > 0.5) == LABELS) == pytest.approx(results["accuracy"], abs=1e-6)


@pytest.mark.slow
def test_estimator_path_in_geo_mode_learns_each_raw_ids_label_with_exact_clocks(cluster, tmp_path):
  """Geo on the Estimator path: the model_fn's table finds its rows on the ps in each round's discovery (once per
  batch and shard), and the rounds train local copies of those rows."""
  config = tfps.RunConfig(save_checkpoints_steps=1000, sync_mode="geo", geo_steps=5)
  calls = []

  def counted_model_fn(features, labels, mode, params):
    calls.append(mode)
    return model_fn(features, labels, mode, params)

  estimator = tfps.Estimator(counted_model_fn, model_dir=str(tmp_path / "model"), config=config, cluster=cluster)
  results = tfps.train_and_evaluate(estimator, tfps.TrainSpec(train_input_fn, max_steps=160),
                                    tfps.EvalSpec(eval_input_fn, steps=None, throttle_secs=0))
  assert results["global_step"] == 160
  # TRAIN calls: 1 in the trace that makes the variables, 1 in the scratch trace that finds the tables the step looks
  # up (`GeoRunner._tables_of`), 10 in the round's function (5 discoveries, 5 steps). Variables and the table's records
  # made in a first trace had each traced twice (24 calls).
  assert calls.count("train") == 12, calls
  assert results["accuracy"] >= 0.95, results
  table, = estimator.distributed_model().model.variables.tables
  assert table.table_metrics()["occupancy"] == NUM_IDS
  assert table.table_metrics()["fallbacks"] == 0
  # Each of the 160 batches did its bookkeeping once on each shard, in its round's discovery.
  assert [int(shard.clock.numpy()) for shard in table.shards] == [160, 160]


def test_geo_push_skips_rows_given_to_another_id_during_the_round():
  """A geo round's cached rows are pushed as differences, except rows whose id changed on the ps since the pull
  (evicted and given to another id: that id's fresh row must not get the old id's training)."""
  from tfps.training import geo_copies, ps_records  # pylint: disable=import-outside-toplevel
  rows = tf.Variable(tf.zeros([6, 2]))
  owners = tf.Variable([10, 11, 12, 13, 14, 15], dtype=tf.int64)  # the id each row belongs to
  table = geo_copies.TouchedRows(rows, tf.constant([4, 1, 3, 1]), lambda shard: [], geo_copies.LocalNames(),
                     owners=lambda k, local: tf.gather(owners, local))
  (_, handle, local_ids, *_), = table.caches
  assert local_ids.numpy().tolist() == [1, 3, 4]
  tf.raw_ops.AssignVariableOp(resource=handle, value=tf.ones([3, 2]))  # the round trained all three rows
  owners.scatter_update(tf.IndexedSlices(tf.constant([99], tf.int64), [3]))  # row 3 evicted, given to id 99
  records = ps_records.PsRecords()
  for _ in range(2):  # the round's push, then the same push run again (its worker died before the round's record)
    once = records.once_per_ps(tf.constant([0], tf.int64), tf.constant(1, tf.int64))
    once.run_all(table.updates())
    once.records()
    assert rows.numpy()[:, 0].tolist() == [0, 1, 0, 0, 1, 0]


def test_pipelined_updates_refuse_a_table_layer_in_one_line(cluster):
  """A row given to a new id could take the delayed update of the id it held before."""
  with pytest.raises(tfps.UsageError, match=r"^`pipelined_updates` \(True\) cannot train table layers \(ids_table\)"):
    tfps.fit(build_model, dataset_fn, epochs=1, steps_per_epoch=5, cluster=cluster,
             sync_mode=tfps.TrainingMode(pipelined_updates=True))


def test_bf16_rows_send_the_table_rows_as_bfloat16(cluster):
  """Each row shard's gathered rows are cast to bfloat16 on its ps (the gradients are cast on the worker)."""
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = build_model()
    model.get_layer("ids_table").bind_optimizer(model.optimizer)
    runner = async_runner(model, coordinator, mode=tfps.TrainingMode(bf16_rows=True))
  iterator = iter(dataset_fn())
  body = _loop_body(runner.function.get_concrete_function(iterator, tf.constant(5, tf.int64), tf.constant(0, tf.int64)))
  shards = model.get_layer("ids_table").embeddings.variables
  narrowed = [node for node in body.node_def if node.op == "Cast" and re.search(r"tfps_bf16_out(_\d+)?$", node.name)]
  assert sorted(node.device for node in narrowed if "/job:ps/" in node.device) == sorted(
      shard.device for shard in shards)


def test_bf16_rows_learn_each_raw_ids_label(cluster):
  history = tfps.fit(build_model, dataset_fn, epochs=2, steps_per_epoch=60, cluster=cluster,
                     sync_mode=tfps.TrainingMode(bf16_rows=True))
  assert history.history["ids_table/occupancy"][-1] == NUM_IDS, history.history
  predictions = history.model.predict(RAW[:, None], verbose=0)[:, 0]
  assert np.mean((predictions > 0.5) == LABELS) >= 0.95


def _counting_model():
  ids = tf_keras.Input((1,), dtype="int64", name="ids")
  table = tfps.layers.DynamicEmbedding(CAPACITY, DIM, min_count=2, num_shards=2, name="ids_table")
  model = StepsTraced(ids, tf_keras.layers.Dense(1, activation="sigmoid")(tf_keras.layers.Flatten()(table(ids))))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.5), "binary_crossentropy", metrics=["accuracy"])
  return model


@pytest.mark.parametrize("mode, traces", [("async", 2), ("geo", 2)])
def test_a_step_with_table_layers_and_compiled_metrics_is_traced_once_per_function(cluster, mode, traces):
  """Neither the table layers' bookkeeping records nor tf-keras's compiled metrics are made in a trace (a tf.function
  whose first trace makes a variable is traced twice): async traces its step once to find the tables it gathers rows
  from and once in its function; geo's round of 2 steps traces each once. Before, 4 and 4."""
  StepsTraced.traces = 0
  settings = dict(sync_mode=tfps.TrainingMode("geo", geo_steps=2)) if mode == "geo" else dict(steps_per_execution=2)
  history = tfps.fit(_counting_model, dataset_fn, epochs=1, steps_per_epoch=4, cluster=cluster, **settings)
  assert StepsTraced.traces == traces
  assert 0.0 <= history.history["accuracy"][-1] <= 1.0 and history.history["ids_table/occupancy"][-1] > 0
