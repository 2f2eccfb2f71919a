"""Online training on a stream (tfps.training.online) on the in-process cluster, on both paths and in async and sync
mode: every message applied exactly once (counted per message), the checkpoint's position, the offsets committed after
it, a run resumed from it (sources and their bad input: tests/test_stream_sources.py)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import online_stream
import tfps
from tfps.data.stream import batches as batches_lib
from tfps.data.stream import kafka
from tfps.estimator import online
from tfps.keras import online as keras_online
from tfps.training import stream_positions

BATCH = 8


def _batches(bootstrap, group, topic=online_stream.TOPIC, **kwargs):
  def make(positions):
    source = kafka.KafkaSource(bootstrap, topic, group_id=group, start="earliest",
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


def test_a_run_on_another_topic_is_refused_and_the_checkpoint_left_as_it_was(cluster, kafka_broker, tmp_path):
  online_stream.produce(kafka_broker, range(16), topic="first")
  assert online.train_on_stream(_estimator(cluster, tmp_path), _batches(kafka_broker, "g-first", "first"),
                                max_steps=2) == 2
  online_stream.produce(kafka_broker, range(16), topic="second")
  # Refused by the name check, or (where an offset of "first" is past the end of "second") by the source, naming it.
  with pytest.raises(tfps.TfpsError, match=r"ckpt-2 holds the position of 'kafka first@"):
    online.train_on_stream(_estimator(cluster, tmp_path), _batches(kafka_broker, "g-first", "second"), max_steps=4)
  assert stream_positions.read_positions(str(tmp_path), str(tmp_path / "checkpoints" / "ckpt-2")) == \
      online_stream.end_offsets(kafka_broker, "first")


@pytest.mark.parametrize("saved, reading, refused", [
    ("kafka clicks@h1:9092", "kafka clicks@h2:9092,h3:9092", False),
    ("kafka clicks@h1:9092", "kafka views@h1:9092", True),
    ("folder /data/a", "folder /mnt/a", False), ("folder /data/a", "kafka clicks@h1:9092", True),
])
def test_a_position_is_taken_only_by_the_stream_it_was_read_from(saved, reading, refused):
  check = lambda: stream_positions.check_same_stream("run/checkpoints/ckpt-3", {"stream": saved}, reading)
  if refused:
    with pytest.raises(tfps.UsageError, match=f"ckpt-3 holds the position of '{saved}', and this run reads "):
      check()
  else:
    check()


def test_a_stream_with_pipelined_updates_is_refused_in_one_line_before_connecting(tmp_path):
  estimator = tfps.Estimator(online_stream.model_fn, model_dir=str(tmp_path),
                             config=tfps.RunConfig(pipelined_updates=True))
  with pytest.raises(tfps.UsageError, match=r"training on a stream needs pipelined_updates=False \(given True\)"):
    online.train_on_stream(estimator, make_batches=None)


def _keras_run(cluster, bootstrap, topic, model_dir, max_steps, **kwargs):
  return keras_online.train_on_stream(online_stream.build_keras_model, _batches(bootstrap, topic, topic),
                                      model_dir=str(model_dir), max_steps=max_steps, cluster=cluster,
                                      steps_per_execution=4, checkpoint_every_steps=6, log_every_steps=3, **kwargs)


def test_the_keras_path_applies_each_message_once_and_a_new_run_reads_on_from_the_checkpoint(
    cluster, kafka_broker, tmp_path):
  online_stream.produce(kafka_broker, range(96), topic="keras")
  assert _keras_run(cluster, kafka_broker, "keras", tmp_path, 12) == 12
  latest = str(tmp_path / "checkpoints" / "ckpt-12")
  np.testing.assert_array_equal(online_stream.counts_in(latest)[:97], np.append(np.ones(96), 0))
  ends = online_stream.end_offsets(kafka_broker, "keras")
  assert stream_positions.read_positions(str(tmp_path), latest) == ends
  assert online_stream.committed(kafka_broker, "keras", "keras") == ends
  assert "lag_messages 0" in (tmp_path / "loss.log").read_text().splitlines()[-1]
  online_stream.produce(kafka_broker, range(96, 144), topic="keras")  # a chief started again: the next 48 messages
  assert _keras_run(cluster, kafka_broker, "keras", tmp_path, 18) == 18
  latest = str(tmp_path / "checkpoints" / "ckpt-18")
  np.testing.assert_array_equal(online_stream.counts_in(latest)[:145], np.append(np.ones(144), 0))
  assert stream_positions.read_positions(str(tmp_path), latest) == online_stream.end_offsets(kafka_broker, "keras")


@pytest.mark.parametrize("path, mode, rate", [
    ("estimator", {"sync_mode": "sync"}, 2.0), ("keras", {"sync_mode": "sync"}, 2.0),
    ("estimator", {"sync_mode": "geo", "geo_steps": 3}, 1.0), ("keras", {"sync_mode": "geo", "geo_steps": 3}, 1.0),
], ids=["estimator-sync", "keras-sync", "estimator-geo", "keras-geo"])
def test_sync_and_geo_modes_apply_each_message_once(cluster, kafka_broker, tmp_path, path, mode, rate):
  """Sync: a step averages the gradients of 2 batches (one per worker), so SGD at rate 2 adds 1 per application. Geo:
  a round trains 3 given batches on a worker's local copy and pushes the difference."""
  topic = f"{path}-{mode['sync_mode']}"
  online_stream.produce(kafka_broker, range(96), topic=topic)  # 12 batches
  steps = 6 if mode["sync_mode"] == "sync" else 12  # a sync step takes one batch per worker
  if path == "keras":
    step = keras_online.train_on_stream(
        lambda: online_stream.build_keras_model(rate), _batches(kafka_broker, topic, topic), model_dir=str(tmp_path),
        max_steps=steps, cluster=cluster, sync_mode=tfps.TrainingMode(**mode), checkpoint_every_steps=6,
        log_every_steps=6)
  else:
    config = tfps.RunConfig(steps_per_execution=2, save_checkpoints_steps=6, log_step_count_steps=6, **mode)
    estimator = tfps.Estimator(online_stream.counting_model_fn(rate), model_dir=str(tmp_path), config=config,
                               cluster=cluster)
    step = online.train_on_stream(estimator, _batches(kafka_broker, topic, topic), max_steps=steps)
  assert step == steps
  latest = str(tmp_path / "checkpoints" / f"ckpt-{steps}")
  np.testing.assert_array_equal(online_stream.counts_in(latest)[:97], np.append(np.ones(96), 0))
  assert stream_positions.read_positions(str(tmp_path), latest) == online_stream.end_offsets(kafka_broker, topic)


@pytest.mark.parametrize("options, error", [
    ({"model_dir": None}, r"`model_dir` \(None\) is required: each checkpoint there holds the stream position"),
    ({"sync_mode": tfps.TrainingMode(pipelined_updates=True)}, r"needs pipelined_updates=False \(given True\)"),
    ({"sync_mode": "sync", "steps_per_execution": 4}, r"`steps_per_execution` \(4\) applies to sync_mode=async only"),
    ({"epochs": 2}, r"unexpected keyword argument 'epochs' \(a stream has no epochs; it takes steps_per_execution"),
    ({"checkpoint_every_secs": 0}, r"`checkpoint_every_secs` \(0\) must be a positive number or None"),
    ({"log_every_steps": 0}, r"`log_every_steps` \(0\) must be a positive integer"),
], ids=["no-model-dir", "pipelined", "sync-steps-per-execution", "epochs", "zero-secs", "zero-log-steps"])
def test_a_keras_stream_run_it_cannot_honour_is_refused_in_one_line_before_connecting(tmp_path, options, error):
  options = {"model_dir": str(tmp_path), **options}
  with pytest.raises((tfps.UsageError, TypeError), match=error):
    keras_online.train_on_stream(online_stream.build_keras_model, lambda positions: None, **options)


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


def test_the_online_script_refuses_pipelined_updates_in_one_line_before_any_role_runs(tmp_path, subprocess_env):
  spec = tmp_path / "clicks.spec.json"
  spec.write_text(json.dumps(online_stream.SPEC.to_dict()))
  result = subprocess.run(
      [sys.executable, "scripts/train_online.py", "--stream=folder", f"--stream_folder={tmp_path}", "--data=csv",
       f"--feature_spec={spec}", "--path=keras", "--pipelined_updates"],
      cwd=pathlib.Path(__file__).resolve().parents[1], env=subprocess_env, capture_output=True, text=True,
      timeout=120, check=False)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == ("train_online.py: training on a stream needs pipelined_updates="
                                                    "False (given True): pipelined steps take their batches from the "
                                                    "workers' own input, not from the chief")
  assert "Traceback" not in result.stderr
