"""tfps.testing.applied_steps on the in-process cluster (2 ps): each ps's counter counts the steps applied there, read
from a checkpoint; one more update on one ps shows on that ps alone; counters that share a ps are refused."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfps
from tfps.testing import applied_steps
from tfps.training import checkpoints as checkpoints_lib

STEPS = 5


def build_model():
  ids = tf_keras.Input((2,), dtype="int64", name="ids")
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(50, 4, name="table")(ids))
  model = tf_keras.Model(ids, tf_keras.layers.Dense(1)(applied_steps.StepCounters(name="counters")(embedded)))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), tf_keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def dataset_fn(input_context):
  del input_context
  return tf.data.Dataset.from_tensors((np.array([[1, 2]], np.int64), np.array([1.0], np.float32))).repeat()


def test_each_ps_counts_its_applied_steps_and_one_more_update_shows_there_alone(cluster, tmp_path, info_log):
  model_dir = str(tmp_path / "run")
  model = tfps.fit(build_model, dataset_fn, epochs=1, steps_per_epoch=STEPS, model_dir=model_dir,
                   cluster=cluster).model
  final = checkpoints_lib.read_final_marker(model_dir)
  log = info_log.text
  assert applied_steps.applied_per_ps(final["last_checkpoint"], log) == {"ps:0": STEPS, "ps:1": STEPS}

  # A step applied twice on ps:1 alone: its counter's accumulator grows once more, as the optimizer's update does.
  counters = model.get_layer("counters").counters
  on_ps1 = [counter for counter in counters if "/task:1/" in counter.embeddings.device]
  model.optimizer.get_slot(on_ps1[0].embeddings, "accumulator").assign_add([[1.0]])
  again = tf.train.Checkpoint(model=model).save(str(tmp_path / "again" / "ckpt"))
  assert applied_steps.applied_per_ps(again, log) == {"ps:0": STEPS, "ps:1": STEPS + 1}

  with pytest.raises(ValueError, match="counters share a ps"):
    applied_steps.applied_per_ps(again, log.replace("/task:1/", "/task:0/"))
  with pytest.raises(ValueError, match=r"no placement logged for counters \[0, 1\]"):
    applied_steps.applied_per_ps(again, "")
