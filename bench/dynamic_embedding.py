"""Step time of `tfps.layers.DynamicEmbedding` against a fixed `tf_keras.layers.Embedding` of the same capacity.

Same model (8 id features into one table of `--capacity` rows x 16, an MLP of 64), same data (zipf ids; the fixed
table gets them hashed into its rows, the dynamic one raw), same in-process cluster (2 workers, 2 ps), `tfps.fit`
with 20 steps per execution; the two are interleaved `--repeats` times and each run's first epoch (tracing, warm-up)
is left out. Prints the examples/s of each and the ratio of their step times; writes `--json_out`.

  .venv/bin/python bench/dynamic_embedding.py      # about 1 minute here
  .venv/bin/python bench/dynamic_embedding.py --steps_per_epoch=300 --epochs=4 --repeats=3    # the results file
"""

import json
import os
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `tfps`

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position
import tf_keras  # pylint: disable=g-import-not-at-top,wrong-import-position

_CAPACITY = flags.DEFINE_integer("capacity", 200_000, "Rows of the table (both kinds).", lower_bound=1)
_DISTINCT = flags.DEFINE_integer("distinct_ids", 100_000, "Distinct raw ids in the data.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 512, "Examples per worker batch.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps_per_epoch", 100, "Steps per epoch.", lower_bound=1)
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Epochs per run; the first is not measured.", lower_bound=2)
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs of each kind, interleaved.", lower_bound=1)
_STEPS_TO_LIVE = flags.DEFINE_integer("steps_to_live", None, "The dynamic table's steps_to_live (default: none, no "
                                      "eviction scan).", lower_bound=1)
_JSON_OUT = flags.DEFINE_string("json_out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                         "dynamic_embedding.json"), "Results (JSON).")
NUM_FEATURES, DIM = 8, 16


class EpochTimes(tf_keras.callbacks.Callback):
  """Wall time of each epoch (the coordinator waits for an epoch's steps at its end)."""

  def __init__(self):
    super().__init__()
    self.times = []

  def on_epoch_begin(self, epoch, logs=None):
    self._start = time.monotonic()

  def on_epoch_end(self, epoch, logs=None):
    self.times.append(time.monotonic() - self._start)


def dataset_fn(dynamic):
  def fn(input_context):
    rng = np.random.default_rng(input_context.input_pipeline_id)
    index = np.minimum(rng.zipf(1.2, size=(20_000, NUM_FEATURES)), _DISTINCT.value)
    raw = index.astype(np.int64) * 1_000_003 + 17
    ids = raw if dynamic else raw % _CAPACITY.value
    labels = (rng.random(20_000) < 0.3).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat().batch(_BATCH.value,
                                                                                     drop_remainder=True)
  return fn


def build_model_fn(dynamic):
  def build():
    ids = tf_keras.Input((NUM_FEATURES,), dtype="int64", name="ids")
    if dynamic:
      table = tfps.layers.DynamicEmbedding(_CAPACITY.value, DIM, steps_to_live=_STEPS_TO_LIVE.value, name="table")
    else:
      table = tf_keras.layers.Embedding(_CAPACITY.value, DIM, name="table")
    hidden = tf_keras.layers.Dense(64, activation="relu")(tf_keras.layers.Flatten()(table(ids)))
    model = tf_keras.Model({"ids": ids}, tf_keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.05), "binary_crossentropy")
    return model
  return build


def main(argv):
  del argv
  cluster = tfps.testing.local_cluster(num_workers=2, num_ps=2)
  rates = {"fixed": [], "dynamic": []}
  for _ in range(_REPEATS.value):
    for kind in ("fixed", "dynamic"):
      times = EpochTimes()
      tfps.fit(build_model_fn(kind == "dynamic"), dataset_fn(kind == "dynamic"), epochs=_EPOCHS.value,
               steps_per_epoch=_STEPS.value, steps_per_execution=20, callbacks=[times], cluster=cluster,
               log_every_secs=600)
      measured = times.times[1:]
      rates[kind].append(len(measured) * _STEPS.value * _BATCH.value / sum(measured))
  fixed, dynamic = float(np.median(rates["fixed"])), float(np.median(rates["dynamic"]))
  result = {"capacity": _CAPACITY.value, "distinct_ids": _DISTINCT.value, "batch_size": _BATCH.value,
            "features": NUM_FEATURES, "dim": DIM, "steps_to_live": _STEPS_TO_LIVE.value,
            "steps_per_epoch": _STEPS.value, "epochs": _EPOCHS.value, "examples_per_sec": rates,
            "median_examples_per_sec": {"fixed": fixed, "dynamic": dynamic},
            "step_time_dynamic_vs_fixed": fixed / dynamic, "load_average": os.getloadavg()}
  print(json.dumps(result, indent=2))
  os.makedirs(os.path.dirname(_JSON_OUT.value), exist_ok=True)
  with open(_JSON_OUT.value, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  app.run(main)
