"""Delta exports of a stream run on the Keras path (`tfps.keras.online.train_on_stream(..., delta_export_secs=T)`):
each delta ships exactly the rows of the stream span its manifest names, with their write times, and a base plus its
deltas equals the full export at the same step (the Estimator path's: tests/test_estimator_deltas.py)."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import online_stream
import tfps
from tfps.keras import online
from tfps.training import deltas

from test_deltas import chain
from test_estimator_deltas import folder_stream, line_of


def _sample(input_context):
  del input_context
  return tf.data.Dataset.from_tensors({"id": tf.zeros([8], tf.int64), "price": tf.zeros([8])})


@pytest.fixture(scope="module")
def keras_stream_run(cluster, tmp_path_factory):
  """The Keras counting model trained on a folder stream of 64 messages (2 slices), a delta after every 2 steps of 8."""
  root = tmp_path_factory.mktemp("keras_stream_deltas")
  stream, make = folder_stream(root)
  assert online.train_on_stream(online_stream.build_keras_model, make, model_dir=str(root / "run"), max_steps=8,
                                cluster=cluster, steps_per_execution=2, log_every_steps=2,
                                checkpoint_every_steps=100, delta_export_secs=0, min_shard_bytes=0) == 8
  full = tfps.export_saved_model(online_stream.build_keras_model, str(root / "full"), model_dir=str(root / "run"),
                                 dataset_fn=_sample)
  return str(root / "run" / "deltas"), full, f"folder {stream}"


def _weights(path):
  return [weight.numpy() for weight in tf_keras.models.load_model(path, compile=False).weights]


def test_each_keras_stream_delta_ships_the_rows_of_its_span_and_the_chain_equals_the_full_export(
    keras_stream_run, tmp_path):
  folder, full, name = keras_stream_run
  base, delta_paths = chain(folder)
  assert deltas.read_manifest(base)["stream"] == {"name": name, "to": {}}  # the stream's start
  spans = []
  for path in delta_paths:
    stream = deltas.read_manifest(path)["stream"]
    assert stream["name"] == name and stream["written"]["oldest"] <= stream["written"]["newest"]
    spans.append((line_of(stream["from"]), line_of(stream["to"])))
    with np.load(os.path.join(path, deltas.TENSORS)) as tensors:  # the rows of exactly those examples, once each
      assert sorted(tensors["0/ids"].tolist()) == list(range(*spans[-1]))
      np.testing.assert_array_equal(tensors["0/rows"], np.ones((spans[-1][1] - spans[-1][0], 1)))
  assert spans == [(0, 16), (16, 32), (32, 48), (48, 64)]  # 2 steps of 8 examples each
  applied = tfps.delta.apply(base, delta_paths, str(tmp_path / "served"))
  assert deltas.read_manifest(applied)["step"] == 8
  got, want = _weights(applied), _weights(full)
  assert len(got) == len(want) == 1
  np.testing.assert_allclose(got[0], want[0], atol=1e-6, rtol=0)
  np.testing.assert_array_equal(got[0][:, 0], (np.arange(online_stream.MAX_MESSAGES) < 64).astype(np.float32))


def test_a_negative_delta_interval_is_refused_in_one_line_before_connecting(tmp_path):
  with pytest.raises(tfps.UsageError, match=r"`delta_export_secs` \(-1\) must be a non-negative number of seconds"):
    online.train_on_stream(online_stream.build_keras_model, lambda positions: None, model_dir=str(tmp_path),
                           delta_export_secs=-1)
