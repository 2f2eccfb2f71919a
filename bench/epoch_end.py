"""What an epoch's end costs in `tfps.fit` with a `model_dir`: its seconds and the bytes written, as one table grows.

Every role runs this script under `tfps-launch` (2 ps + 1 worker by default); the chief trains a one-table model
(`--rows` rows of dimension 16, legacy Adagrad: rows and accumulator, 128 bytes per row) for `--epochs` epochs of
`--steps` steps and writes, per epoch after the first, the seconds from one epoch's begin to the next and the bytes
under `model_dir` after the epoch's end (checkpoints kept: 1), to `--out`:

  .venv/bin/python -m tfps.cli.launch --num_ps=2 --num_workers=1 bench/epoch_end.py -- --rows=10000000 \\
      --out=/tmp/epoch_end.json
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position
import tf_keras  # pylint: disable=g-import-not-at-top,wrong-import-position

_ROWS = flags.DEFINE_integer("rows", 10**7, "Rows of the table.", lower_bound=1)
_EPOCHS = flags.DEFINE_integer("epochs", 4, "Epochs (the first is a warm-up).", lower_bound=2)
_STEPS = flags.DEFINE_integer("steps", 10, "Steps per epoch.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step.", lower_bound=1)
_SCRATCH = flags.DEFINE_string("scratch", tempfile.gettempdir(), "Where the model_dir is made (then removed).")
_OUT = flags.DEFINE_string("out", None, "Result JSON.", required=True)
DIM, IDS = 16, 8


def build_model():
  ids = tf_keras.Input((IDS,), dtype="int64", name="ids")
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(_ROWS.value, DIM, name="table")(ids))
  model = tf_keras.Model(ids, tf_keras.layers.Dense(1, activation="sigmoid")(embedded))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.05), "binary_crossentropy")
  return model


def dataset_fn(input_context):
  rng = np.random.default_rng(input_context.input_pipeline_id)
  ids = rng.integers(0, _ROWS.value, size=(64 * _BATCH.value, IDS))
  labels = (ids[:, 0] % 2).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((ids, labels)).repeat().batch(_BATCH.value, drop_remainder=True)


def folder_bytes(path: str) -> int:
  return int(subprocess.run(["du", "-sb", path], capture_output=True, text=True, check=True).stdout.split()[0])


class EpochEnds(tf_keras.callbacks.Callback):
  """Seconds from each epoch's begin to the next one's (the first epoch's end on), and the model_dir's bytes after
  each epoch's end (this callback runs after tfps.fit's own)."""

  def __init__(self, model_dir: str):
    super().__init__()
    self.model_dir = model_dir
    self.begins, self.bytes = [], []

  def on_epoch_begin(self, epoch, logs=None):
    self.begins.append(time.monotonic())

  def on_epoch_end(self, epoch, logs=None):
    self.bytes.append(folder_bytes(self.model_dir))

  def on_train_end(self, logs=None):
    self.begins.append(time.monotonic())


def train(cluster):
  model_dir = tempfile.mkdtemp(prefix="tfps_epoch_end_", dir=_SCRATCH.value)
  try:
    ends = EpochEnds(model_dir)
    tfps.fit(build_model, dataset_fn, epochs=_EPOCHS.value, steps_per_epoch=_STEPS.value, model_dir=model_dir,
             cluster=cluster, callbacks=[ends], keep_checkpoint_max=1)
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  epoch_secs = [b - a for a, b in zip(ends.begins, ends.begins[1:])][1:]
  result = {"rows": _ROWS.value, "table_bytes_with_slots": _ROWS.value * DIM * 4 * 2, "steps": _STEPS.value,
            "batch_size": _BATCH.value, "num_ps": cluster.num_ps, "epoch_secs": epoch_secs,
            "median_epoch_secs": statistics.median(epoch_secs), "model_dir_bytes_after_epoch": ends.bytes[1:]}
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  print("epoch_end:", json.dumps(result))


if __name__ == "__main__":
  tfps.run_main(lambda argv: tfps.run_task(train))
