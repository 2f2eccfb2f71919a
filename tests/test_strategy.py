"""The strategy shards embedding tables over every ps; small variables stay whole."""

import os
import subprocess
import sys

import portpicker
import pytest

import tfps
from tfps.cluster import config as cluster_lib
from tfps.training import strategy as strategy_lib
import tensorflow as tf  # after tfps: tf-keras is selected
import tf_keras


def ps_devices(variable):
  return sorted({tf.DeviceSpec.from_string(v.device).task for v in getattr(variable, "variables", [variable])})


def test_embedding_table_is_sharded_over_every_ps(cluster):
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    embedding = tf_keras.layers.Embedding(100_000, 16)  # 6.4 MB: over min_shard_bytes
    embedding.build((None,))
    dense = tf_keras.layers.Dense(8)
    dense.build((None, 16))
  table = embedding.embeddings
  assert len(table.variables) == cluster.num_ps
  assert ps_devices(table) == list(range(cluster.num_ps))
  assert all("/job:ps/" in v.device for v in table.variables)
  assert sum(v.shape[0] for v in table.variables) == 100_000
  assert not hasattr(dense.kernel, "variables")  # a small kernel is one whole variable on one ps
  assert "/job:ps/" in dense.kernel.device
  assert isinstance(coordinator, tf.distribute.experimental.coordinator.ClusterCoordinator)


def test_lookups_on_the_sharded_table_run_on_workers(cluster):
  strategy, coordinator = tfps.build_strategy(cluster, num_shards=2, min_shard_bytes=0)
  with strategy.scope():
    table = tf.Variable(tf.reshape(tf.range(20.0), (10, 2)))

  @tf.function
  def lookup():
    return tf.nn.embedding_lookup(table, tf.constant([0, 9]))

  result = coordinator.schedule(lookup)
  coordinator.join()
  assert len(table.variables) == 2
  assert result.fetch().tolist() == [[0.0, 1.0], [18.0, 19.0]]


@pytest.mark.parametrize("shape,min_bytes,num_shards,expected", [
    ((100_000, 16), 256 << 10, 2, [2, 1]),
    ((64, 16), 256 << 10, 2, [1, 1]),  # 4 KiB: whole
    ((64, 16), 0, 2, [2, 1]),
    ((1, 16), 0, 4, [1, 1]),  # one row cannot be split
    ((3, 4), 0, 8, [3, 1]),  # at most one shard per row
    ((), 0, 2, []),
])
def test_partitioner(shape, min_bytes, num_shards, expected):
  partitioner = strategy_lib.ShardLargeVariables(num_shards, min_bytes)
  assert partitioner(tf.TensorShape(shape), tf.float32) == expected


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_shards=0), "`num_shards` (0) must be a positive integer"),
    (dict(num_shards=2, min_shard_bytes=-1), "`min_shard_bytes` (-1) must be a non-negative integer"),
])
def test_partitioner_rejects_bad_arguments(kwargs, message):
  with pytest.raises(ValueError) as info:
    strategy_lib.ShardLargeVariables(**kwargs)
  assert str(info.value) == message


def test_unreachable_ps_is_named_within_the_timeout():
  port = portpicker.pick_unused_port()
  config = cluster_lib.from_hosts(ps_hosts=f"127.0.0.1:{port}", worker_hosts="127.0.0.1:1")
  with pytest.raises(tfps.UnreachableTaskError, match=rf"task ps:0 at 127.0.0.1:{port} did not answer within 0.5s"):
    strategy_lib.wait_for_tasks(config, timeout_secs=0.5)


def test_strategy_only_on_the_chief(cluster):
  with pytest.raises(ValueError, match="not on task worker:0"):
    tfps.build_strategy(cluster.for_task("worker", 0))


def test_import_tfps_is_light_and_selects_tf_keras():
  code = ("import sys, tfps, tfps.cluster.launch, tfps.cluster.config; assert 'tensorflow' not in sys.modules; "
          "import os; print(os.environ['TF_USE_LEGACY_KERAS'], os.environ['GRPC_FAIL_FAST'])")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ["1", "use_caller"]


def test_import_tfps_adds_grpc_keepalive_to_the_users_grpc_options():
  code = "import os, tfps; print(os.environ['TF_GRPC_DEFAULT_OPTIONS'])"
  env = dict(os.environ, TF_GRPC_DEFAULT_OPTIONS="grpc.keepalive_time_ms=20000,grpc.max_receive_message_length=7")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == ("grpc.keepalive_time_ms=20000,grpc.max_receive_message_length=7,"
                                   "grpc.keepalive_timeout_ms=5000,grpc.min_reconnect_backoff_ms=2000,"
                                   "grpc.max_reconnect_backoff_ms=5000")


def test_tensorflow_already_running_keras_3_is_refused():
  code = "import tensorflow as tf; tf.keras.layers; import tfps"
  env = {"PATH": "/usr/bin", "TF_CPP_MIN_LOG_LEVEL": "3"}
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
  assert result.returncode != 0
  assert ("tfps.errors.KerasVersionError: TensorFlow was imported with Keras 3 (keras._tf_keras.keras) active "
          "before tfps") in result.stderr
