"""The training run `bench/worker_kills.py` kills workers in: every role of a `tfps.fit` cluster (under tfps-launch).

Beside its embedding and MLP, the model has one scalar weight whose gradient is exactly 1 at every step, so its
Adagrad accumulator (initially 0.1) grows by exactly 1 each time a step's update reaches it: the chief writes that
count, and the optimizer's `iterations`, to `--counts_json` when training ends.
"""

import json

from absl import flags
import numpy as np

import tfps
import tensorflow as tf
import tf_keras

tfps.define_mode_flags()  # e.g. --pipelined_updates
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Checkpoints and backups.", required=True)
_COUNTS = flags.DEFINE_string("counts_json", None, "Where the chief writes the final counts.", required=True)
_EPOCHS = flags.DEFINE_integer("epochs", 4, "Epochs.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps_per_epoch", 100, "Steps per epoch.", lower_bound=1)

VOCAB, NUM_IDS, INITIAL_ACCUMULATOR = 2000, 8, 0.1


class AppliedSteps(tf_keras.layers.Layer):
  """Passes its input through; adds a loss whose gradient with respect to its one weight is exactly 1."""

  def build(self, input_shape):
    self.weight = self.add_weight(name="applied_steps", shape=(), initializer="zeros")

  def call(self, inputs):
    self.add_loss(self.weight - tf.stop_gradient(self.weight))  # value 0, gradient 1
    return inputs


def build_model() -> tf_keras.Model:
  ids = tf_keras.Input((NUM_IDS,), dtype="int64", name="ids")
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(VOCAB, 8, name="table")(ids))
  hidden = AppliedSteps(name="applied")(tf_keras.layers.Dense(16, activation="relu")(embedded))
  hidden = AppliedSteps(name="applied_b")(hidden)  # created next: on the next ps when there are several
  model = tf_keras.Model(ids, tf_keras.layers.Dense(1, activation="sigmoid")(hidden))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.1, initial_accumulator_value=INITIAL_ACCUMULATOR),
                "binary_crossentropy")
  return model


def train_dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
  rng = np.random.default_rng(input_context.input_pipeline_id)
  ids = rng.integers(0, VOCAB, size=(4096, NUM_IDS))
  labels = (ids.sum(axis=1) % 2).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((ids, labels)).repeat().batch(32, drop_remainder=True)


def main(argv):
  del argv
  # The cluster: tfps-launch's TF_CONFIG, or a pod's (tests/test_k8s_runs.py); ps and workers end with the run.
  tfps.run_task(train, model_dir=_MODEL_DIR.value)


def train(cluster):
  history = tfps.fit(build_model, train_dataset_fn, epochs=_EPOCHS.value, steps_per_epoch=_STEPS.value,
                     model_dir=_MODEL_DIR.value, cluster=cluster, sync_mode=tfps.mode_from_flags())
  model = history.model
  applied = {}
  for name in ("applied", "applied_b"):
    weight = model.get_layer(name).weight
    accumulator = model.optimizer.get_slot(weight, "accumulator")
    applied[f"{name} on {weight.device.split('/')[3]}"] = round(float(accumulator.numpy()) - INITIAL_ACCUMULATOR)
  counts = {"iterations": int(model.optimizer.iterations.numpy()),
            "applied_steps": max(applied.values()),
            "applied_by_weight": applied,
            "iterations_ps": model.optimizer.iterations.device.split("/")[3],
            "asked_steps": _EPOCHS.value * _STEPS.value}
  with open(_COUNTS.value, "w", encoding="utf-8") as out:
    json.dump(counts, out)


if __name__ == "__main__":
  tfps.run_main(main)
