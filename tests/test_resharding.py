"""Checkpoints carried over to another number of shards (in process: the ps count is fixed, the shard count is not),
and checkpoints that do not fit refused before any step. Other ps counts: tests/test_resharding_processes.py."""

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

from fixtures import reshard_model
from fixtures.reshard_model import build_model, dataset
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfps
from tfps import _tf_private
from tfps import models
from tfps.errors import CheckpointMismatchError
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import initialization
from tfps.training import resharding


def _built(cluster, num_shards, optimizer="adagrad", embedding_dim=4):
  strategy, _ = tfps.build_strategy(cluster, num_shards=num_shards, min_shard_bytes=0)
  with strategy.scope():
    model = build_model(optimizer, embedding_dim)
    model(next(iter(dataset()))[0])
    resharding.create_optimizer_variables(model.optimizer, model.trainable_variables)
  return strategy, model


def _state(model, scratch) -> dict:
  """Every value the model and its optimizer hold, whole, by checkpoint key (which names no shard)."""
  reader = tf.train.load_checkpoint(tf.train.Checkpoint(model=model).write(str(scratch)))
  return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
          if key != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def _first_loss(model) -> float:
  history = model.fit(tf_keras.utils.experimental.DatasetCreator(dataset), epochs=1, steps_per_epoch=1, verbose=0)
  return history.history["loss"][0]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", sorted(reshard_model.OPTIMIZERS))
def test_model_and_slots_carry_over_to_other_shard_counts(cluster, tmp_path, monkeypatch, optimizer):
  monkeypatch.setattr(initialization, "MIN_BYTES", 64)  # every table and slot created in place, as large ones are
  strategy, model = _built(cluster, 3, optimizer)
  model.fit(tf_keras.utils.experimental.DatasetCreator(dataset), epochs=1, steps_per_epoch=3, verbose=0)
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
  saved = _state(model, tmp_path / "saved")
  slots = [key for key in saved if "table/embeddings/.OPTIMIZER_SLOT" in key or "optimizer/_variables" in key]
  assert slots and all(np.abs(saved[key]).sum() > 0 for key in slots)  # trained, not at their initial values
  losses = {3: _first_loss(model)}  # the step after the checkpoint, on the shards it was saved from
  for num_shards in (1, 2):
    strategy, model = _built(cluster, num_shards, optimizer)
    tables = models.embedding_tables(model).values()
    assert all(len(getattr(t, "variables", [t])) == num_shards for t in tables)
    with strategy.scope():
      resharding.restore(path, tf.train.Checkpoint(model=model))
    restored = _state(model, tmp_path / f"restored{num_shards}")
    assert restored.keys() == saved.keys()
    for name, value in saved.items():
      np.testing.assert_array_equal(restored[name], value, err_msg=f"{name} on {num_shards} shards")
    assert int(model.optimizer.iterations.numpy()) == 3
    losses[num_shards] = _first_loss(model)
  assert abs(losses[1] - losses[3]) < 1e-6 and abs(losses[2] - losses[3]) < 1e-6, losses


class _StopAfterFirstEpoch(tf_keras.callbacks.Callback):
  def on_epoch_end(self, epoch, logs=None):
    if epoch == 0:
      raise RuntimeError("the chief stopped")


class _StateAtStart(tf_keras.callbacks.Callback):
  """Records the model's state as training starts (after tfps.fit restored it)."""

  def __init__(self, scratch):
    super().__init__()
    self.scratch, self.state = scratch, None

  def on_train_begin(self, logs=None):
    self.state = _state(self.model, self.scratch)


@pytest.mark.slow
def test_a_chief_stopped_mid_run_resumes_from_its_last_checkpoint_on_another_shard_count(cluster, tmp_path, info_log):
  """What a chief started again after a failure does: the checkpoint of the last epoch it ended, saved on 3 shards,
  restored into 1 shard with every value as saved, and training goes on at the next epoch."""
  def fit(num_shards, callback):
    return tfps.fit(lambda: build_model("keras_adam"), dataset, epochs=2, steps_per_epoch=2, model_dir=str(tmp_path),
                    cluster=cluster, callbacks=[callback], steps_per_execution=2,
                    strategy_options={"num_shards": num_shards, "min_shard_bytes": 0})

  with pytest.raises(RuntimeError, match="the chief stopped"):
    fit(3, _StopAfterFirstEpoch())
  [last] = checkpoints_lib.list_checkpoints(str(tmp_path))
  assert checkpoints_lib.is_registered(str(tmp_path), 1) and not checkpoints_lib.is_registered(str(tmp_path), 2)
  saved = tf.train.load_checkpoint(last)
  at_start = _StateAtStart(tmp_path / "at_start")
  history = fit(1, at_start)
  assert history.epoch == [1]
  assert f"Resumed from {last} at epoch 2/2 (step 2)" in info_log.text
  iterations = at_start.state.pop("model/optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")
  assert iterations == checkpoints_lib.checkpoint_step(last) == 2  # saved once, as the checkpoint's step
  assert len(at_start.state) > 2  # every other value of the model and its optimizer, as the checkpoint holds it
  for name, value in at_start.state.items():
    np.testing.assert_array_equal(value, saved.get_tensor(name), err_msg=name)
  assert checkpoints_lib.read_final_marker(str(tmp_path))["step"] == 4


def test_a_checkpoint_of_another_model_is_refused_before_anything_is_restored(cluster, tmp_path):
  strategy, model = _built(cluster, 2)
  model.fit(tf_keras.utils.experimental.DatasetCreator(dataset), epochs=1, steps_per_epoch=1, verbose=0)
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))

  strategy, wider = _built(cluster, 2, embedding_dim=5)
  before = _state(wider, tmp_path / "before")
  with pytest.raises(CheckpointMismatchError) as error, strategy.scope():
    resharding.restore(path, tf.train.Checkpoint(model=wider))
  message = str(error.value)
  assert "\n" not in message
  assert ("model/deep_inputs/stacked/table/embeddings has shape [800, 4] in the checkpoint and [800, 5] in the model"
          in message)
  for name, value in _state(wider, tmp_path / "after").items():
    np.testing.assert_array_equal(value, before[name])

  strategy, other = _built(cluster, 2, optimizer="adam")
  with pytest.raises(CheckpointMismatchError, match=r"model/optimizer/beta_1 is in the model but not in the "
                     r"checkpoint.*keeps slots \['accumulator'\] in the checkpoint and \['m', 'v'\] in the model"):
    resharding.check_compatible(path, tf.train.Checkpoint(model=other))


def _fit(cluster, model_dir, epochs, build=build_model):
  return tfps.fit(build, dataset, epochs=epochs, steps_per_epoch=4, model_dir=str(model_dir), cluster=cluster,
                  steps_per_execution=2)


def test_fit_goes_on_from_the_newest_checkpoint_and_refuses_another_model(cluster, tmp_path):
  _fit(cluster, tmp_path, epochs=1)
  history = _fit(cluster, tmp_path, epochs=2)
  assert history.epoch == [1]  # resumed after the first epoch, not trained from fresh values
  assert checkpoints_lib.read_final_marker(str(tmp_path))["step"] == 8  # every step counted once
  kept = checkpoints_lib.list_checkpoints(str(tmp_path))

  with pytest.raises(CheckpointMismatchError, match=r"ckpt-2 does not fit this model: .*\[800, 4\] in the checkpoint "
                     r"and \[800, 6\] in the model"):
    _fit(cluster, tmp_path, epochs=3, build=lambda: build_model(embedding_dim=6))
  assert checkpoints_lib.list_checkpoints(str(tmp_path)) == kept  # no step ran


def test_a_resume_of_a_model_with_many_variables_says_nothing_of_retracing(cluster, tmp_path, caplog):
  """Each piece is read by one function traced per dtype, device and shape: TensorFlow's retracing warning came at
  every resume of a model with more than a few variable shapes."""
  def build():
    model = tf_keras.Sequential([tf_keras.Input((8,)), *[tf_keras.layers.Dense(8 + i) for i in range(12)],
                                 tf_keras.layers.Dense(1)])
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "mse")
    return model

  def data(input_context):
    del input_context
    return tf.data.Dataset.from_tensors((tf.ones([16, 8]), tf.ones([16, 1]))).repeat()

  tfps.fit(build, data, epochs=1, steps_per_epoch=2, model_dir=str(tmp_path), cluster=cluster)
  history = tfps.fit(build, data, epochs=2, steps_per_epoch=2, model_dir=str(tmp_path), cluster=cluster)
  assert history.epoch == [1] and "retracing" not in caplog.text


def _estimator(cluster, model_dir, num_shards, loss_file, embedding_dim=4):
  config = tfps.RunConfig(steps_per_execution=1, save_checkpoints_steps=100, log_step_count_steps=1)
  return tfps.Estimator(reshard_model.build_model_fn("adagrad", embedding_dim, loss_file), model_dir=str(model_dir),
                        config=config, cluster=cluster,
                        strategy_options={"num_shards": num_shards, "min_shard_bytes": 0})


@pytest.mark.slow
def test_estimator_resumes_on_other_shard_counts_with_the_same_first_loss(cluster, tmp_path):
  first = tmp_path / "first"
  _estimator(cluster, first, 3, tmp_path / "losses").train(dataset, max_steps=3)
  losses = {}
  for num_shards in (3, 1, 2):
    model_dir, loss_file = tmp_path / f"on{num_shards}", tmp_path / f"losses{num_shards}"
    shutil.copytree(first, model_dir)
    estimator = _estimator(cluster, model_dir, num_shards, loss_file)
    estimator.train(dataset, max_steps=4)
    assert checkpoints_lib.checkpoint_number(estimator.latest_checkpoint()) == 4
    logged = loss_file.read_text().split()
    assert len(logged) == 1, logged  # the one step left, run once
    losses[num_shards] = float(logged[0])
  assert abs(losses[1] - losses[3]) < 1e-6 and abs(losses[2] - losses[3]) < 1e-6, losses

  with pytest.raises(CheckpointMismatchError, match=r"ckpt-4 does not fit this model: .*\[800, 4\] in the checkpoint "
                     r"and \[800, 3\] in the model"):
    _estimator(cluster, tmp_path / "on1", 2, tmp_path / "unused", embedding_dim=3).train(dataset, max_steps=5)


def test_sharded_tables_are_read_piece_by_piece_and_tensorflow_leaves_them_alone(cluster, tmp_path):
  strategy, model = _built(cluster, 2)
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
  saved = _state(model, tmp_path / "saved")
  tables = list(models.embedding_tables(model).values())
  assert tables and all(_tf_private.is_sharded_variable(t) for t in tables)
  with strategy.scope():
    for table in tables:
      table.assign(tf.zeros(table.shape))
    with _tf_private.restored_elsewhere(tables):  # TensorFlow's own read: it must not restore (so hold) them
      tf.train.Checkpoint(model=model).read(path).expect_partial()
    assert all(not np.any(table.numpy()) for table in tables)
    resharding.restore(path, tf.train.Checkpoint(model=model))
  for name, value in _state(model, tmp_path / "restored").items():
    np.testing.assert_array_equal(value, saved[name], err_msg=name)


@pytest.mark.slow  # three TensorFlow processes of its own: ~40 s at load 10
def test_a_restore_on_as_many_ps_leaves_each_ps_one_copy_of_its_share(tmp_path, subprocess_env):
  """A 160 MB table and its Adagrad accumulator saved from 2 ps of real processes, overwritten and restored on them:
  the rows read back are the saved ones, each ps holds its share once after the restore (it held 2.1x with
  TensorFlow's oneDNN allocator, which keeps replaced tensors' memory) and peaked at its share and one piece more
  (2.0x when a piece was read on the other ps or as another spelling of its saved slice)."""
  script = pathlib.Path(__file__).parent / "ps_restore_rss.py"
  process = subprocess.Popen([sys.executable, str(script), str(tmp_path / "rss.json")], env=subprocess_env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
  try:
    output, _ = process.communicate(timeout=300)
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(process.pid, signal.SIGKILL)  # its ps and worker, were it stopped early
  assert process.returncode == 0, output[-3000:]
  rss = json.loads((tmp_path / "rss.json").read_text())
  assert rss["shards"] == 2 and rss["rows_equal"], rss
  share = rss["share_bytes"]  # per ps: half the table and half the accumulator
  for before, after, peak in zip(rss["before_bytes"], rss["after_bytes"], rss["peak_bytes"]):
    assert 0.9 * share <= after - before <= 1.25 * share, rss
    assert peak - before <= 1.75 * share, rss
