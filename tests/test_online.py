"""Online training on a stream (tfps.training.online) on the in-process cluster: every message applied exactly once,
the checkpoint's position, the offsets committed after it (sources and their bad input: tests/test_stream_sources.py)."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import online_stream
import tfps
from tfps.data.stream import batches as batches_lib
from tfps.data.stream import kafka
from tfps.estimator import online
from tfps.training import stream_positions

BATCH = 8


def _batches(bootstrap, group, **kwargs):
  def make(positions):
    source = kafka.KafkaSource(bootstrap, online_stream.TOPIC, group_id=group, start="earliest",
                               positions=positions, connect_timeout_secs=10)
    return batches_lib.StreamBatches(source, online_stream.SPEC, batch_size=BATCH, **kwargs)
  return make


def _estimator(cluster, model_dir):
  config = tfps.RunConfig(steps_per_execution=4, save_checkpoints_steps=6, log_step_count_steps=3)
  return tfps.Estimator(online_stream.model_fn, model_dir=str(model_dir), config=config, cluster=cluster)


def test_each_message_is_applied_once_and_the_checkpoint_holds_its_offsets(cluster, kafka_broker, tmp_path):
  online_stream.produce(kafka_broker, range(96))
  ends = online_stream.end_offsets(kafka_broker)
  step = online.train_on_stream(_estimator(cluster, tmp_path), _batches(kafka_broker, "g1"), max_steps=12)
  assert step == 12
  latest = tfps.Estimator(online_stream.model_fn, model_dir=str(tmp_path)).latest_checkpoint()
  counts = online_stream.counts_in(latest)
  np.testing.assert_array_equal(counts[:96], np.ones(96))
  assert not counts[96:].any()
  assert stream_positions.read_positions(str(tmp_path), latest) == ends
  assert online_stream.committed(kafka_broker, "g1") == ends


@pytest.mark.parametrize("mode", [{"sync_mode": "sync"}, {"pipelined_updates": True}], ids=["sync", "pipelined"])
def test_a_stream_in_another_mode_is_refused_in_one_line_before_connecting(tmp_path, mode):
  estimator = tfps.Estimator(online_stream.model_fn, model_dir=str(tmp_path), config=tfps.RunConfig(**mode))
  with pytest.raises(tfps.UsageError, match="training on a stream needs sync_mode=async without pipelined_updates"):
    online.train_on_stream(estimator, make_batches=None)


def _dynamic_model_fn(features, labels, mode):
  """One DynamicEmbedding built on every call, as Estimator model_fns build their layers; 8192 rows of 8 floats
  (256 KiB), so the strategy shards it over both ps as its `num_shards` says."""
  table = tfps.layers.DynamicEmbedding(8192, 8, num_shards=2, name="ids_table")
  logits = tf_keras.layers.Dense(1)(table(features["id"], training=mode == tfps.ModeKeys.TRAIN))[:, 0]
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
  return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.Adagrad(0.5))


@pytest.mark.slow  # ~30 s: most of it tracing the table
def test_a_dynamic_table_trains_on_a_stream_and_admits_each_message_id_once(cluster, kafka_broker, tmp_path):
  online_stream.produce(kafka_broker, range(1000, 1048), topic="dynamic")
  config = tfps.RunConfig(steps_per_execution=2, save_checkpoints_steps=6, log_step_count_steps=6)
  estimator = tfps.Estimator(_dynamic_model_fn, model_dir=str(tmp_path), config=config, cluster=cluster)

  def make(positions):
    source = kafka.KafkaSource(kafka_broker, "dynamic", group_id="dynamic", start="earliest", positions=positions)
    return batches_lib.StreamBatches(source, online_stream.SPEC, batch_size=BATCH)

  assert online.train_on_stream(estimator, make, max_steps=6) == 6
  last = (tmp_path / "loss.log").read_text().splitlines()[-1]
  assert "ids_table/admitted 48 |" in last, last  # each of the 48 message ids admitted once
