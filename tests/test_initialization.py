"""Large variables are created in place on their ps (tfps/training/initialization.py): right values, one copy in memory."""

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfps
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import initialization

REPO = pathlib.Path(__file__).resolve().parents[1]
ROWS = 2 * initialization.MIN_BYTES // (16 * 4)  # each of the 2 shards is just at the threshold


def test_a_large_table_and_its_optimizer_state_are_built_in_place_with_their_initializers_values(cluster, tmp_path):
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    layer = tf_keras.layers.Embedding(ROWS, 16, embeddings_initializer=tf_keras.initializers.RandomUniform(-0.05, 0.05))
    layer.build((None,))
    small = tf.Variable(tf_keras.initializers.Constant(3.0)((10, 4)))
    optimizer = tf_keras.optimizers.legacy.Adagrad(0.1, initial_accumulator_value=0.25)

  @tf.function
  def step():  # the accumulator is created while this is traced, as in training
    strategy.run(lambda: optimizer.apply_gradients(
        [(tf.IndexedSlices(tf.ones([1, 16]), tf.constant([7])), layer.embeddings.variables[0])]))
  with strategy.scope():  # as in tf-keras's fit, which traces its train function under the scope
    coordinator.schedule(step)
    coordinator.join()
  shards = layer.embeddings.variables
  assert [shard.device.split("/")[1] for shard in shards] == ["job:ps", "job:ps"]
  assert {shard.device for shard in shards} == {"/job:ps/replica:0/task:0/device:CPU:0",
                                                 "/job:ps/replica:0/task:1/device:CPU:0"}
  values = np.concatenate([shard.numpy() for shard in shards])
  assert values.shape == (ROWS, 16)
  initial = np.delete(values, 7, axis=0)  # row 7 took the step
  assert -0.05 <= initial.min() < -0.049 and 0.049 < initial.max() <= 0.05
  assert abs(initial.std() - 0.1 / np.sqrt(12)) < 1e-3  # uniform over [-0.05, 0.05]
  accumulator = optimizer.get_slot(shards[0], "accumulator").numpy()
  assert accumulator[7].tolist() == [1.25] * 16 and np.all(np.delete(accumulator, 7, axis=0) == 0.25)
  assert np.all(small.numpy() == 3.0)

  # Checkpoints save and restore the table as any other variable.
  path = tf.train.Checkpoint(table=layer.embeddings).write(str(tmp_path / "ckpt"))
  shards[0].assign(tf.zeros_like(shards[0]))
  tf.train.Checkpoint(table=layer.embeddings).read(path).assert_consumed()
  np.testing.assert_array_equal(np.concatenate([shard.numpy() for shard in shards]), values)


@pytest.mark.slow
def test_a_ps_holds_one_copy_of_its_table_while_it_is_created(tmp_path, subprocess_env):
  """A 400 MB table (and its Adagrad state) on one ps of real processes: its peak RSS stays within 1.2x of the
  state plus the same ps's RSS before the table existed (TensorFlow's own creation peaked at 3.1x the table)."""
  process = subprocess.Popen([sys.executable, str(REPO / "tests" / "ps_peak_rss.py"), str(tmp_path / "peak.json")],
                             cwd=REPO, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
  try:
    output, _ = process.communicate(timeout=300)
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(process.pid, signal.SIGKILL)  # the ps and worker it started, were it stopped early
  assert process.returncode == 0, output[-3000:]
  peak = json.loads((tmp_path / "peak.json").read_text())
  state = peak["table_bytes"] * 2  # the table and its accumulator
  assert peak["after_bytes"] - peak["before_bytes"] >= 0.9 * state, peak  # the state really lives on that ps
  assert peak["peak_bytes"] - peak["before_bytes"] <= 1.2 * state, peak


def test_a_large_table_restored_on_creation_gets_the_checkpointed_values(cluster, tmp_path):
  strategy, _ = tfps.build_strategy(cluster)
  with strategy.scope():
    saved = tf_keras.layers.Embedding(ROWS, 16)
    saved.build((None,))
  path = tf.train.Checkpoint(layer=saved).write(str(tmp_path / "ckpt"))
  with strategy.scope():
    restored = tf_keras.layers.Embedding(ROWS, 16)
    status = tf.train.Checkpoint(layer=restored).read(path)  # before the table exists: restored as it is created
    restored.build((None,))
  status.assert_consumed()
  np.testing.assert_array_equal(np.concatenate([shard.numpy() for shard in restored.embeddings.variables]),
                                np.concatenate([shard.numpy() for shard in saved.embeddings.variables]))


def test_an_estimator_whose_table_is_created_in_place_trains(cluster, tmp_path):
  """The Estimator path builds its tables while its train function is traced (the slots too)."""
  from tfps.estimator import synthetic  # pylint: disable=g-import-not-at-top
  dim = initialization.MIN_BYTES // (4 * synthetic.NUM_USERS) + 1  # the user table is just over the threshold
  estimator = tfps.Estimator(synthetic.model_fn, model_dir=str(tmp_path / "run"), cluster=cluster,
                             config=tfps.RunConfig(save_checkpoints_steps=20, steps_per_execution=5),
                             params={"batch_size": 32, "embedding_dim": dim})
  estimator.train(synthetic.train_input_fn, max_steps=20)
  assert checkpoints_lib.read_final_marker(str(tmp_path / "run"))["step"] == 20
  reader = tf.train.load_checkpoint(str(tmp_path / "run" / "checkpoints"))
  tables = [shape for shape in reader.get_variable_to_shape_map().values() if len(shape) == 2 and shape[1] == dim]
  assert sum(rows for rows, _ in tables) == 2 * (synthetic.NUM_USERS + synthetic.NUM_ITEMS)  # with accumulators
