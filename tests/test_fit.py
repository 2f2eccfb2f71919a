"""tfps.fit on the in-process cluster: learning, artifacts, exactly-once evaluation, sidecar, export, bad input."""

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

import numpy as np
import pytest

import tfps
from tfps import run_records
from tfps.report import series as series_lib
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import strategy as strategy_lib
import tensorflow as tf
import tf_keras

VOCAB, NUM_IDS = 50_000, 6  # a 50k x 8 float table (1.6 MB): sharded over both ps
EPOCHS, STEPS = 3, 60


def examples(rows, seed):
  """Ids with planted weights and one dense feature; clicks follow a logistic model of them."""
  rng = np.random.default_rng(seed)
  weights = np.random.default_rng(0).normal(size=VOCAB).astype(np.float32)
  ids = np.minimum(rng.zipf(1.3, size=(rows, NUM_IDS)) - 1, VOCAB - 1).astype(np.int64)
  dense = rng.normal(size=(rows, 1)).astype(np.float32)
  logits = weights[ids].sum(axis=1) + 2.0 * dense[:, 0]
  labels = (rng.random(rows) < 1 / (1 + np.exp(-logits))).astype(np.float32)
  return {"ids": ids, "dense_in": dense}, labels


class ExampleCount(tf_keras.metrics.Sum):
  """Counts the examples a metric sees."""

  def update_state(self, y_true, y_pred, sample_weight=None):
    return super().update_state(tf.cast(tf.shape(y_true)[0], tf.float32))


def build_model():
  ids = tf_keras.Input((NUM_IDS,), dtype="int64", name="ids")
  dense = tf_keras.Input((1,), name="dense_in")
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(VOCAB, 8, name="table")(ids))
  hidden = tf_keras.layers.Dense(16, activation="relu")(tf_keras.layers.Concatenate()([embedded, dense]))
  model = tf_keras.Model({"ids": ids, "dense_in": dense}, tf_keras.layers.Dense(1, activation="sigmoid")(hidden))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "binary_crossentropy",
                metrics=[tf_keras.metrics.AUC(name="auc"), ExampleCount(name="count")])
  return model


def train_fn(input_context):
  features, labels = examples(8_000, seed=1 + input_context.input_pipeline_id)
  return tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(8_000).repeat().batch(64, drop_remainder=True)


def eval_fn_of(rows, batch_size=100):
  def eval_fn(input_context):
    del input_context
    return tf.data.Dataset.from_tensor_slices(examples(rows, seed=99)).batch(batch_size)
  return eval_fn


@pytest.fixture(scope="module")
def trained(cluster, tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("fit") / "run")
  history = tfps.fit(build_model, train_fn, epochs=EPOCHS, steps_per_epoch=STEPS,
                     validation_dataset_fn=eval_fn_of(2_000), exact_evaluation=True, model_dir=model_dir,
                     cluster=cluster, log_every_secs=0)  # a progress line at every scheduled function's end
  return history, model_dir


def test_fit_learns_the_planted_signal(trained):
  history, _ = trained
  assert history.history["val_auc"][-1] > 0.75
  # Below the log loss of always predicting the validation click rate (the best a model without the signal can do).
  # (Not "the last epoch's training loss below the first's": the signal is learned within the first epoch, after
  # which the epoch losses differ only by noise.)
  rate = examples(2_000, seed=99)[1].mean()
  assert history.history["val_loss"][-1] < -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate)) - 0.05


def test_fit_shards_the_table_over_both_ps(trained):
  history, _ = trained
  table = history.model.get_layer("table").embeddings
  assert sorted(tf.DeviceSpec.from_string(v.device).task for v in table.variables) == [0, 1]


def test_fit_keeps_its_steps_per_execution_on_the_chief(trained):
  """tf-keras reads the variable before every scheduled function (and tfps once more): on a ps, each read is a round
  trip from the chief."""
  history, _ = trained
  variable = history.model._steps_per_execution  # pylint: disable=protected-access
  assert tf.DeviceSpec.from_string(variable.device).job == "chief", variable.device


def test_fit_places_each_metrics_variables_on_one_ps(trained):
  """The loss metric's `total` and `count` (made by compile) and the AUC's four variables (made as the step is traced)
  each on one ps, not one variable per ps in turn: one ps receives a metric's values each step, and no ps another's."""
  history, _ = trained
  devices = {metric.name: {variable.device for variable in metric.variables} for metric in history.model.metrics}
  assert {"loss", "auc"} <= set(devices), devices
  for name in ("loss", "auc"):
    assert len(devices[name]) == 1 and "/job:ps/" in devices[name].copy().pop(), (name, devices)


def test_metrics_made_where_every_variable_is_sharded_are_left_to_the_strategy(cluster):
  """With `min_shard_bytes=0` a metric's vector variables are sharded too: such a run is placed as the strategy places
  it (a sharded variable has no one device to place others with), and a scalar metric's still sit together."""
  strategy, _ = tfps.build_strategy(cluster, min_shard_bytes=0)
  with strategy.scope():
    auc = tf_keras.metrics.AUC(num_thresholds=200)
    copy = auc.__class__.from_config(auc.get_config())  # what tf-keras's evaluation does to compiled metrics
    mean = tf_keras.metrics.Mean()
  for metric in (auc, copy):  # four vectors of 200, each in two parts, one on each ps
    assert len(metric.variables) == 8 and len({v.device for v in metric.variables}) == 2, metric.variables
  assert len({v.device for v in mean.variables}) == 1


def test_fit_logs_the_mean_of_its_steps_losses_with_the_loss_metric_updated_once_per_function(cluster):
  """Every batch the same and nothing learned (learning rate 0): each step's loss is the same value, so the epoch's
  logged loss is that value exactly when the metric took each function's summed loss weighted by its examples (an
  update left out or weighted wrongly moves it)."""
  features, labels = examples(64, seed=3)
  bias = -0.7

  def build():
    ids = tf_keras.Input((NUM_IDS,), dtype="int64", name="ids")
    dense = tf_keras.Input((1,), name="dense_in")
    flat = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(VOCAB, 2)(ids))
    logit = tf_keras.layers.Dense(1, kernel_initializer="zeros", bias_initializer=tf_keras.initializers.Constant(bias))(
        tf_keras.layers.Concatenate()([flat, dense]))
    model = tf_keras.Model({"ids": ids, "dense_in": dense}, tf_keras.layers.Activation("sigmoid")(logit))
    model.compile(tf_keras.optimizers.legacy.SGD(0.0), "binary_crossentropy")
    return model

  def train(input_context):
    del input_context
    return tf.data.Dataset.from_tensors((features, labels)).repeat()

  history = tfps.fit(build, train, epochs=2, steps_per_epoch=7, cluster=cluster, steps_per_execution=3)
  p = 1 / (1 + np.exp(-bias))
  expected = -np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))
  np.testing.assert_allclose(history.history["loss"], [expected, expected], rtol=1e-5)


def test_a_learning_rate_a_callback_sets_reaches_every_ps(cluster):
  """The rate 0.1, 0 in the second epoch, 0.1 again in the third (`LearningRateScheduler`, on the chief between
  scheduled functions): in the second epoch no variable moves on either ps, in the third every one does. The rate's
  variable sits on one ps; the other reads a copy of it that each scheduled function sets
  (`tfps.training.rate_copies`), so a copy left behind freezes or moves that ps's variables when it should not."""
  weights = []

  class Weights(tf_keras.callbacks.Callback):

    def on_train_begin(self, logs=None):
      weights.append([tf.convert_to_tensor(v).numpy() for v in self.model.trainable_variables])

    def on_epoch_end(self, epoch, logs=None):
      self.on_train_begin()

  rates = tf_keras.callbacks.LearningRateScheduler(lambda epoch: [0.1, 0.0, 0.1][epoch])
  history = tfps.fit(build_model, train_fn, epochs=3, steps_per_epoch=6, cluster=cluster, steps_per_execution=3,
                     callbacks=[rates, Weights()])
  model = history.model
  rate = model.optimizer.learning_rate
  assert float(rate.numpy()) == pytest.approx(0.1)
  shards = [shard for variable in model.trainable_variables for shard in strategy_lib.shards_of(variable)]
  assert {tf.DeviceSpec.from_string(shard.device).task for shard in shards} == {0, 1}, [s.device for s in shards]
  assert tf.DeviceSpec.from_string(rate.device).job == "ps", rate.device
  names = [variable.name for variable in model.trainable_variables]
  for name, before, after_1, after_2, after_3 in zip(names, *weights):
    assert not np.array_equal(before, after_1), f"{name} did not move in epoch 1 (rate 0.1)"
    np.testing.assert_array_equal(after_1, after_2, err_msg=f"{name} moved in epoch 2 (rate 0)")
    assert not np.array_equal(after_2, after_3), f"{name} did not move in epoch 3 (rate 0.1 again)"


def test_fit_takes_the_strategy_options(cluster):
  """What a notebook sets without flags: one shard, and every variable of two rows or more sharded."""
  history = tfps.fit(build_model, train_fn, epochs=1, steps_per_epoch=2, cluster=cluster, num_shards=1)
  assert len(strategy_lib.shards_of(history.model.get_layer("table").embeddings)) == 1
  history = tfps.fit(build_model, train_fn, epochs=1, steps_per_epoch=2, cluster=cluster, min_shard_bytes=0)
  hidden = [layer for layer in history.model.layers if isinstance(layer, tf_keras.layers.Dense)][0]
  assert len(strategy_lib.shards_of(hidden.kernel)) == 2  # a 49 x 16 kernel, 3 KB: sharded too


def test_fit_writes_checkpoints_tensorboard_and_final_marker(trained):
  _, model_dir = trained
  assert [os.path.basename(p) for p in checkpoints_lib.list_checkpoints(model_dir)] == ["ckpt-1", "ckpt-2", "ckpt-3"]
  assert list(pathlib.Path(model_dir, "logs", "train").glob("events.out.tfevents.*"))
  assert list(pathlib.Path(model_dir, "logs", "validation").glob("events.out.tfevents.*"))
  final = checkpoints_lib.read_final_marker(model_dir)
  assert final["step"] == EPOCHS * STEPS
  assert final["last_checkpoint"].endswith("ckpt-3")


def test_fit_again_in_a_finished_model_dir_restores_instead_of_training(trained, cluster, info_log):
  """What a chief restarted after its run ended finds (a ps died while it exited): the run is not repeated."""
  history, model_dir = trained
  again = tfps.fit(build_model, train_fn, epochs=EPOCHS, steps_per_epoch=STEPS, model_dir=model_dir, cluster=cluster)
  assert f"Training already finished in {model_dir} ({EPOCHS * STEPS} steps" in info_log.text
  # The finished run's last epoch, as its run summary holds it (a script's "Final:" line).
  assert again.history == {name: [value] for name, value in run_records.final_metrics(model_dir).items()}
  np.testing.assert_allclose(again.history["val_auc"], history.history["val_auc"][-1:], rtol=1e-6)
  assert int(again.model.optimizer.iterations.numpy()) == EPOCHS * STEPS
  features, _ = examples(50, seed=9)
  np.testing.assert_allclose(again.model(features).numpy(), history.model(features).numpy(), atol=1e-6)
  assert checkpoints_lib.read_final_marker(model_dir)["step"] == EPOCHS * STEPS
  assert tfps.evaluate(again.model, eval_fn_of(35, 10), exact=True)["count"] == 35  # the restored model evaluates


def test_inline_exact_evaluation_counts_every_example_once(trained):
  history, _ = trained
  assert history.history["val_count"] == [2_000.0] * EPOCHS


@pytest.mark.parametrize("rows,batch_size", [(1_003, 10), (35, 10), (7, 100)])
def test_tfps_evaluate_exact_counts(trained, rows, batch_size):
  history, _ = trained
  result = tfps.evaluate(history.model, eval_fn_of(rows, batch_size), exact=True)
  assert result["count"] == rows


def build_two_task_model():
  """Two outputs (click, and a second task on the same ids), weighted losses, a regularizer, metrics per output
  weighted by each example's sample weight, and a StringLookup of a string feature (a lookup table per worker)."""
  ids = tf_keras.Input((NUM_IDS,), dtype="int64", name="ids")
  dense = tf_keras.Input((1,), name="dense_in")
  word = tf_keras.Input((), dtype="string", name="word")
  looked_up = tf_keras.layers.Embedding(5, 2)(tf_keras.layers.StringLookup(vocabulary=["a", "b", "c"])(word))
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(VOCAB, 8, name="table")(ids))
  hidden = tf_keras.layers.Dense(16, activation="relu", kernel_regularizer=tf_keras.regularizers.l2(1e-3))(
      tf_keras.layers.Concatenate()([embedded, dense, looked_up]))
  outputs = {name: tf_keras.layers.Dense(1, activation="sigmoid", name=name)(hidden) for name in ("click", "other")}
  model = tf_keras.Model({"ids": ids, "dense_in": dense, "word": word}, outputs)
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), {"click": "binary_crossentropy", "other": "mse"},
                loss_weights={"click": 1.0, "other": 0.5},
                weighted_metrics={"click": [tf_keras.metrics.AUC(name="auc"), ExampleCount(name="count")],
                                  "other": [tf_keras.metrics.MeanAbsoluteError(name="mae")]})
  return model


def two_task_fn_of(rows, repeat):
  def dataset_fn(input_context):
    del input_context
    features, labels = examples(rows, seed=7)
    features["word"] = np.array(["a", "b", "c", "z"])[np.arange(rows) % 4]
    weights = np.linspace(0.5, 1.5, rows).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((features, {"click": labels, "other": 1 - labels}, weights))
    return (dataset.repeat() if repeat else dataset).batch(64)
  return dataset_fn


def test_exact_evaluation_of_a_model_with_two_outputs_sample_weights_and_a_lookup_table(cluster, tmp_path):
  """Exactly-once evaluation on the workers reports what a plain process's evaluation of the same checkpoint does
  (tf-keras's own shard function failed on such a model: a metric given both outputs, weights unmatched to them, a
  lookup table never fed; and its loss left out the loss weights and the regularizer)."""
  model_dir = str(tmp_path / "run")
  history = tfps.fit(build_two_task_model, two_task_fn_of(4_000, repeat=True), epochs=2, steps_per_epoch=20,
                     validation_dataset_fn=two_task_fn_of(1_000, repeat=False), exact_evaluation=True,
                     model_dir=model_dir, cluster=cluster)
  on_workers = {name[len("val_"):]: values[-1] for name, values in history.history.items() if name.startswith("val_")}
  assert set(on_workers) == {"loss", "click_loss", "other_loss", "click_auc", "click_count", "other_mae"}
  assert on_workers["click_count"] == pytest.approx(sum(np.linspace(0.5, 1.5, 1_000)))  # each example once, weighted
  plain = tfps.run_sidecar_evaluator(build_two_task_model, two_task_fn_of(1_000, repeat=False), model_dir,
                                     idle_timeout_secs=60, poll_secs=0.1)[-1]["metrics"]
  assert plain.keys() == on_workers.keys()
  for name, value in plain.items():
    assert on_workers[name] == pytest.approx(value, rel=1e-4), name
  assert on_workers["click_auc"] > 0.6


def test_tfps_evaluate_with_steps(trained):
  history, _ = trained
  repeated = lambda ctx: eval_fn_of(1_000)(ctx).repeat()
  result = tfps.evaluate(history.model, repeated, steps=4)
  assert result["count"] == 400  # 4 steps of 100


def test_run_records(trained):
  history, model_dir = trained
  progress = [json.loads(line) for line in open(os.path.join(model_dir, "run", "progress.jsonl"))]
  epoch_ends = [r for r in progress if r["kind"] == "train" and "auc" in r["metrics"]]
  assert [r["step"] for r in epoch_ends] == [STEPS, 2 * STEPS, 3 * STEPS]
  assert [r["metrics"]["auc"] for r in epoch_ends] == pytest.approx(history.history["auc"])
  validation = [r for r in progress if r["kind"] == "validation"]
  assert [r["step"] for r in validation] == [STEPS, 2 * STEPS, 3 * STEPS]
  assert [r["metrics"]["auc"] for r in validation] == pytest.approx(history.history["val_auc"])
  lines = [r for r in progress if "examples_per_sec" in r]  # the progress lines (log_every_secs=0), epoch ends
  assert len(lines) > len(epoch_ends) and all(r["examples_per_sec"] > 0 and 0 < r["step"] <= EPOCHS * STEPS
                                               for r in lines)
  assert all("examples_per_sec" in r for r in epoch_ends)
  summary = json.loads(pathlib.Path(model_dir, "run", "summary.json").read_text())
  assert summary["steps"] == EPOCHS * STEPS and summary["steps_this_run"] == EPOCHS * STEPS
  assert summary["examples_per_sec"] == pytest.approx(EPOCHS * STEPS * 64 / summary["wall_secs"])
  assert summary["final_metrics"]["val_auc"] == pytest.approx(history.history["val_auc"][-1])
  assert summary["final_metrics"]["loss"] == pytest.approx(history.history["loss"][-1])
  assert summary["tensorboard"] == os.path.join(model_dir, "logs")


def copy_run(model_dir, tmp_path):
  copy = tmp_path / "run"
  shutil.copytree(model_dir, copy, ignore=shutil.ignore_patterns("eval", "best"))
  # the state file names absolute paths; point it at the copy
  state = copy / "checkpoints" / "checkpoint"
  state.write_text(state.read_text().replace(str(model_dir), str(copy)))
  final = checkpoints_lib.read_final_marker(str(copy))
  checkpoints_lib.write_final_marker(str(copy), final["last_checkpoint"].replace(str(model_dir), str(copy)),
                                     step=final["step"])
  return copy


def test_sidecar_evaluates_every_checkpoint_and_keeps_the_best(trained, tmp_path):
  copy = copy_run(trained[1], tmp_path)
  results = tfps.run_sidecar_evaluator(build_model, eval_fn_of(2_000), str(copy), evaluate_every_checkpoint=True,
                                       poll_secs=0.1, idle_timeout_secs=30)
  assert [r["checkpoint_number"] for r in results] == [1, 2, 3]
  assert [r["step"] for r in results] == [STEPS, 2 * STEPS, 3 * STEPS]  # the optimizer step, as on the Estimator path
  assert all(r["metrics"]["count"] == 2_000 for r in results)
  lines = [json.loads(line) for line in (copy / "eval" / "metrics.jsonl").read_text().splitlines()]
  assert lines == results
  assert set(lines[0]) == {"checkpoint", "checkpoint_number", "step", "metrics", "time"}
  best = json.loads((copy / "best" / "best.json").read_text())
  assert best["metric"] == "auc"
  assert best["value"] == max(r["metrics"]["auc"] for r in results)
  assert (copy / "best" / (os.path.basename(best["checkpoint"]) + ".index")).exists()
  assert list((copy / "eval").glob("events.out.tfevents.*"))
  # Kept as hard links of the checkpoint's files (no bytes copied), which outlive the checkpoint's deletion.
  kept = sorted((copy / "best").glob("ckpt-*"))
  assert kept and all(path.stat().st_ino == (copy / "checkpoints" / path.name).stat().st_ino for path in kept)
  values = {key: tf.train.load_variable(best["checkpoint"], key) for key, _ in tf.train.list_variables(best["copy"])}
  for path in (copy / "checkpoints").glob(os.path.basename(best["checkpoint"]) + ".*"):
    path.unlink()
  assert best["copy"] == str(copy / "best" / os.path.basename(best["checkpoint"]))
  for key, value in values.items():
    np.testing.assert_array_equal(tf.train.load_variable(best["copy"], key), value, err_msg=key)


def test_a_checkpoint_deleted_before_it_is_kept_as_the_best_leaves_the_best_as_it_was(tmp_path, caplog):
  from tfps.keras import evaluation  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path / "run"
  paths = [tf.train.Checkpoint(v=tf.Variable(float(n))).write(str(model_dir / "checkpoints" / f"ckpt-{n}"))
           for n in (1, 2)]
  keep = evaluation._BestCheckpoint(str(model_dir), "auc", "auto")  # pylint: disable=protected-access
  keep({"checkpoint": paths[0], "metrics": {"auc": 0.7}, "step": 10})
  for path in (model_dir / "checkpoints").glob("ckpt-2.*"):
    path.unlink()  # training went keep_checkpoint_max checkpoints further while it was evaluated
  keep({"checkpoint": paths[1], "metrics": {"auc": 0.8}, "step": 20})
  assert "Not kept as the best: no files of checkpoint" in caplog.text
  best = json.loads((model_dir / "best" / "best.json").read_text())
  assert (best["checkpoint"], best["value"]) == (paths[0], 0.7)
  assert tf.train.load_variable(best["copy"], "v/.ATTRIBUTES/VARIABLE_VALUE") == 1.0
  assert sorted(path.name for path in tmp_path.glob("run/best*")) == ["best"]  # no staging folder left
  # a sidecar started again reads it; one stopped between the two renames left best.new, taken as the best
  (model_dir / "best").rename(model_dir / "best.new")
  assert evaluation._BestCheckpoint(str(model_dir), "auc", "auto").best == best  # pylint: disable=protected-access
  # one that chooses by another metric does not compare a loss with that AUC: its first checkpoint is the best
  by_loss = evaluation._BestCheckpoint(str(model_dir), "loss", "auto")  # pylint: disable=protected-access
  by_loss({"checkpoint": paths[0], "metrics": {"auc": 0.7, "loss": 0.9}, "step": 10})
  assert {key: by_loss.best[key] for key in ("metric", "value")} == {"metric": "loss", "value": 0.9}


def test_resuming_from_a_damaged_checkpoint_is_one_line(cluster, trained, tmp_path):
  """A newest checkpoint with a file missing: TensorFlow's NotFoundError (a traceback, and tfps-launch restarted the
  cluster 3 times, each failing alike)."""
  copy = copy_run(trained[1], tmp_path)
  (copy / "checkpoints" / "ckpt-3.index").unlink()
  with pytest.raises(tfps.UsageError, match=rf"^checkpoint {copy}/checkpoints/ckpt-3 cannot be read \(.*\): its files "
                     rf"are missing or damaged; to go on from the one before, delete its all_model_checkpoint_paths "
                     rf"line in {copy}/checkpoints/checkpoint and point model_checkpoint_path there at the one "
                     rf"before$"):
    tfps.fit(build_model, train_fn, epochs=EPOCHS + 1, steps_per_epoch=STEPS, model_dir=str(copy), cluster=cluster)
  state = copy / "checkpoints" / "checkpoint"  # as the line says: the run goes on from ckpt-2
  state.write_text("".join(line.replace("ckpt-3", "ckpt-2") for line in state.read_text().splitlines(True)
                           if not line.startswith("all_model_checkpoint_paths") or "ckpt-3" not in line))
  assert checkpoints_lib.list_checkpoints(str(copy))[-1].endswith("ckpt-2")


def test_sidecar_newest_only_and_skips_a_deleted_checkpoint(trained, tmp_path, caplog):
  copy = copy_run(trained[1], tmp_path)
  for path in (copy / "checkpoints").glob("ckpt-3.*"):
    path.unlink()  # deleted while the evaluator reads: skipped, not a crash
  results = tfps.run_sidecar_evaluator(build_model, eval_fn_of(500), str(copy), evaluate_every_checkpoint=True,
                                       poll_secs=0.1, idle_timeout_secs=30)
  assert [r["checkpoint_number"] for r in results] == [1, 2]
  assert f"Skipping checkpoint {copy}/checkpoints/ckpt-3" in caplog.text
  newest = tfps.run_sidecar_evaluator(build_model, eval_fn_of(500), str(copy), poll_secs=0.1, idle_timeout_secs=30)
  assert newest == []  # only the newest (ckpt-3) was due, and it is gone


def test_export_loads_and_serves_without_a_cluster(trained, tmp_path):
  history, model_dir = trained
  (tmp_path / "a_file").write_text("x")  # refused in one line before anything is built (was TensorFlow's error)
  with pytest.raises(tfps.UsageError, match=r"^`export_dir` \('.*a_file'\) is a file, not a directory$"):
    tfps.export_saved_model(build_model, str(tmp_path / "a_file"), model=history.model)
  export_dir = str(tmp_path / "export")
  tfps.export_saved_model(build_model, export_dir, model=history.model)
  features, _ = examples(5, seed=7)
  plain = build_model()
  tf.train.Checkpoint(model=plain).read(checkpoints_lib.list_checkpoints(model_dir)[-1]).expect_partial()
  expected = plain.predict(features, verbose=0)[:, 0].tolist()
  np.savez(tmp_path / "features.npz", **features)
  code = f"""
import json, numpy as np, os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf, tf_keras
features = dict(np.load({str(tmp_path / 'features.npz')!r}))
loaded = tf.saved_model.load({export_dir!r})
serving = loaded.signatures["serving_default"]
out = list(serving(**{{k: tf.constant(v) for k, v in features.items()}}).values())[0].numpy()[:, 0].tolist()
model = tf_keras.models.load_model({export_dir!r}, compile=False)
print(json.dumps([out, model.predict(features, verbose=0)[:, 0].tolist()]))
"""
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert result.returncode == 0, result.stderr[-2000:]
  served, keras_loaded = json.loads(result.stdout.strip().splitlines()[-1])
  np.testing.assert_allclose(served, expected, rtol=1e-5)
  np.testing.assert_allclose(keras_loaded, expected, rtol=1e-5)


class BatchCallback(tf_keras.callbacks.Callback):
  def on_train_batch_end(self, batch, logs=None):
    pass


def uncompiled():
  return tf_keras.Sequential([tf_keras.Input((1,)), tf_keras.layers.Dense(1)])


def keras3_model():
  import keras  # pylint: disable=g-import-not-at-top
  return keras.Sequential()


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(steps_per_epoch=None), ValueError, "`steps_per_epoch` is required"),
    (dict(steps_per_epoch=0), ValueError, "`steps_per_epoch` (0) must be a positive integer"),
    (dict(epochs=0), ValueError, "`epochs` (0) must be a positive integer"),
    (dict(train_dataset_fn=tf.data.Dataset.range(3)), TypeError, "`train_dataset_fn` must be a function"),
    (dict(train_dataset_fn=lambda: None), TypeError, "`train_dataset_fn` must take one argument"),
    (dict(validation_dataset_fn=eval_fn_of(100)), ValueError, "`validation_steps` is required"),
    (dict(train_dataset_fn=lambda ctx: train_fn(ctx).take(5), steps_per_epoch=6), ValueError,
     "`train_dataset_fn` returns a dataset that ends after 5 batches, and training takes 6 steps; each worker reads"),
    (dict(train_dataset_fn=lambda ctx: train_fn(ctx).take(5).filter(lambda *_: True), steps_per_epoch=30), ValueError,
     "a worker's training input ended before its steps did: `train_dataset_fn` must return a dataset that repeats"),
    (dict(build_model=uncompiled), ValueError, "not compiled; call model.compile"),
    (dict(build_model=keras3_model), TypeError, "It is a Keras 3 model"),
    (dict(callbacks=[BatchCallback()]), ValueError, "Batch-level `Callback`s are not supported"),
    (dict(validation_dataset_fn=lambda ctx: eval_fn_of(100)(ctx).repeat(), exact_evaluation=True), ValueError,
     "exact evaluation needs a finite dataset"),
    (dict(steps_per_execution=-2), ValueError, "`steps_per_execution` (-2) must be a positive integer"),
    (dict(num_shards=0), ValueError, "`num_shards` (0) must be a positive integer or None"),
    (dict(min_shard_bytes=-1), ValueError, "`min_shard_bytes` (-1) must be a non-negative integer"),
    (dict(seed=-1), ValueError, "`seed` (-1) must be a non-negative integer"),
    (dict(keep_checkpoint_max=0), ValueError, "`keep_checkpoint_max` (0) must be a positive integer or None"),
    (dict(verbose=1), ValueError, "`verbose` (1) must be one of 0, 2, auto"),
    (dict(class_weight={0: 1.0, 1: 2.0}), TypeError,
     "unexpected keyword argument 'class_weight': weight examples in the dataset instead"),
    (dict(validation_dataset_fn=eval_fn_of(300), validation_steps=50), ValueError,
     "a worker's validation input ended before `validation_steps` (50) batches: make validation_dataset_fn's"),
])
def test_bad_fit_arguments_get_clear_errors(cluster, kwargs, error, message):
  args = dict(build_model=build_model, train_dataset_fn=train_fn, epochs=1, steps_per_epoch=2, cluster=cluster)
  args.update(kwargs)
  with pytest.raises(error) as info:
    tfps.fit(args.pop("build_model"), args.pop("train_dataset_fn"), **args)
  assert message in str(info.value)
  assert isinstance(info.value, tfps.TfpsError)  # a script's tfps.run_main prints it as one line


def test_terminate_on_nan_stops_at_the_end_of_the_first_epoch_whose_loss_is_not_finite(cluster, caplog):
  def diverging():
    model = build_model()
    model.compile(tf_keras.optimizers.legacy.SGD(1e30), "binary_crossentropy")
    return model

  history = tfps.fit(diverging, train_fn, epochs=3, steps_per_epoch=5, cluster=cluster,
                     callbacks=[tf_keras.callbacks.TerminateOnNaN()])
  assert len(history.history["loss"]) == 1 and not np.isfinite(history.history["loss"][0]), history.history
  assert "Epoch 1: invalid loss nan, terminating training" in caplog.text


@pytest.mark.parametrize("call,error,message", [
    (lambda model: tfps.evaluate(model, eval_fn_of(300), steps="3"), ValueError,
     "`steps` ('3') must be a positive integer"),
    (lambda model: tfps.evaluate(build_model, eval_fn_of(300), exact=True), TypeError,
     "`model` must be the tf-keras model tfps.fit trained"),
    (lambda model: tfps.evaluate(model, eval_fn_of(300), steps=20), ValueError,
     "a worker's evaluation input ended before `steps` (20) batches"),
    (lambda model: tfps.export_saved_model(model, "/nonexistent/export", model=model), TypeError,
     "`build_model` must be the function that built the model"),
    (lambda model: tfps.export_saved_model(build_model, "/nonexistent/export", checkpoint="/nonexistent/ckpt-1"),
     ValueError, "`checkpoint` ('/nonexistent/ckpt-1') is not a checkpoint"),
    (lambda model: tfps.export_saved_model(uncompiled, "/nonexistent/export", model=model), ValueError,
     "does not fit the model `build_model` returns"),
])
def test_bad_evaluate_and_export_arguments_get_clear_errors(trained, call, error, message):
  history, _ = trained
  with pytest.raises(error) as info:
    call(history.model)
  assert message in str(info.value) and isinstance(info.value, tfps.TfpsError)


def test_a_finite_training_dataset_with_a_batch_for_every_step_trains(cluster):
  """Each worker reads its own copy: a copy that holds every step's batch can never run out."""
  history = tfps.fit(build_model, lambda ctx: train_fn(ctx).take(8), epochs=2, steps_per_epoch=4, cluster=cluster)
  assert int(history.model.optimizer.iterations.numpy()) == 8


class InitialWeights(tf_keras.callbacks.Callback):
  """Holds the model's weights when training begins (read from the ps)."""

  def on_train_begin(self, logs=None):
    self.weights = self.model.get_weights()


def test_seed_gives_the_same_initial_weights(cluster):
  def initial_weights(seed):
    held = InitialWeights()
    tfps.fit(build_model, train_fn, epochs=1, steps_per_epoch=1, seed=seed, callbacks=[held], cluster=cluster)
    return held.weights

  first, again, other = initial_weights(7), initial_weights(7), initial_weights(8)
  assert len(first) == len(again) == len(other) == 6
  assert all(np.array_equal(a, b) for a, b in zip(first, again))
  assert not any(np.array_equal(a, b) for a, b in zip(first, other) if a.any())  # the biases start at 0 in both


def test_tfps_evaluate_exact_counts_a_dataset_read_from_files(trained, tmp_path):
  # Fewer files than shards: tf.data's file sharding alone would fail; tfps splits the set into parts.
  features, labels = examples(1_003, seed=5)
  path = tmp_path / "eval.csv"
  rows = [",".join(map(str, [*ids, dense[0], label])) for ids, dense, label in
          zip(features["ids"], features["dense_in"], labels)]
  path.write_text("\n".join(rows) + "\n")

  def file_fn(input_context):
    del input_context
    defaults = [tf.constant(0, tf.int64)] * NUM_IDS + [tf.constant(0.0), tf.constant(0.0)]
    def parse(*columns):
      return {"ids": tf.stack(columns[:NUM_IDS], axis=-1), "dense_in": tf.stack([columns[NUM_IDS]], -1)}, columns[-1]
    return tf.data.experimental.CsvDataset(str(path), defaults).batch(50).map(parse)

  assert tfps.evaluate(trained[0].model, file_fn, exact=True)["count"] == 1_003


def test_progress_is_measured_with_a_current_optimizer_whose_step_is_a_tensor_while_a_step_is_traced(cluster, info_log):
  """A current tf-keras optimizer's `iterations` is a tensor of the trace while the training function is traced (the
  step copies on each ps): the progress thread, polling every 0.05 s through the trace, reads the step counter itself
  and goes on (it ended at its first poll within the trace, and no line came)."""
  def build():
    model = build_model()
    model.compile(tf_keras.optimizers.Adagrad(0.1), "binary_crossentropy")
    return model

  tfps.fit(build, train_fn, epochs=1, steps_per_epoch=300, steps_per_execution=10, log_every_secs=0.05,
           cluster=cluster)
  lines = [r.getMessage() for r in info_log.records if r.getMessage().startswith("epoch 1/1 | step")]
  assert len(lines) >= 3, lines


def test_progress_is_measured_while_steps_run_and_plotted_record_by_record(cluster, info_log, tmp_path):
  """fit schedules an epoch's functions long before they run: progress comes from the step on the ps, every interval,
  and tfps-report plots each record."""
  steps = 400
  tfps.fit(build_model, train_fn, epochs=1, steps_per_epoch=steps, steps_per_execution=10, log_every_secs=0.25,
           cluster=cluster, model_dir=str(tmp_path))
  lines = [r.getMessage() for r in info_log.records if r.getMessage().startswith("epoch 1/1 | step")]
  assert len(lines) >= 3, lines  # one every 0.25 s while the steps run
  assert all(" ex/s | eta " in line for line in lines)  # 64 examples a step: the dataset's static batch size
  shown = [int(line.split(" | step ")[1].split("/")[0]) for line in lines]
  losses = [line.split(" | loss ")[1].split(" ")[0] for line, step in zip(lines, shown) if step >= 10]
  assert len(losses) >= 2 and all(loss.startswith("0.") for loss in losses), lines  # a function that ran: its loss
  assert shown == sorted(set(shown)) and 0 < shown[0] and shown[-1] <= steps
  assert any(r.getMessage().startswith("epoch 1/1 done | loss ") for r in info_log.records)
  run = run_records.read_run(str(tmp_path))
  train = [r for r in run["progress"] if r["kind"] == "train"]
  recorded = [r["step"] for r in train]  # every 0.25 s too (at least the lines' steps), and the epoch's end
  assert set(shown) <= set(recorded) and len(recorded) > len(shown) and recorded[-1] == steps
  # The clock starts once the first steps ran: the first interval's rate holds no trace (seconds, where an interval
  # is 0.25 s: with it, the first record was below a tenth of the others' median).
  rates = [r["examples_per_sec"] for r in train[:-1]]
  assert rates[0] > 0.3 * statistics.median(rates), rates
  speed, = series_lib.build_series(run).panels["examples/s"]
  assert speed.steps == [r["step"] for r in train] and len(speed.values) == len(train)


FIT_SCRIPT = pathlib.Path(__file__).parent / "fixtures" / "fit_script.py"


@pytest.mark.slow
@pytest.mark.parametrize("args,task,message", [
    (["--epochs=0"], "chief", "fit_script.py: `epochs` (0) must be a positive integer"),
    (["--epochs=1"], "worker", "fit_script.py: tfps.fit trains on the chief, and this task is worker:0; dispatch the "
                               "roles with tfps.run_task(chief_fn, evaluator_fn=..., cluster=...)"),
])
def test_a_script_prints_a_bad_fit_call_as_one_line(args, task, message, tmp_path):
  tf_config = {"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, "task": {"type": task, "index": 0}}
  env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run([sys.executable, str(FIT_SCRIPT), *args], capture_output=True, text=True, timeout=180,
                          env=env, cwd=tmp_path)
  assert result.returncode == 2, result.stderr[-2000:]
  lines = [line for line in result.stderr.splitlines() if line.startswith("fit_script.py:")]
  assert len(lines) == 1 and lines[0].startswith(message), result.stderr[-2000:]
  assert "Traceback" not in result.stderr
