"""The training run `bench/worker_kills.py` and `tests/test_chaos.py` kill tasks in: every role of a `tfps.fit`
cluster (under tfps-launch).

Beside its embedding and MLP, the model counts on every ps the steps whose update reached that ps
(`tfps.testing.applied_steps.StepCounters`: one counter per ps, its Adagrad accumulator grows by exactly 1 per step
applied there); the chief logs where each counter lives, and the final checkpoint holds the counts.
"""

from absl import flags
import numpy as np

import tfps
from tfps.testing import applied_steps
import tensorflow as tf
import tf_keras

tfps.define_flags()  # the cluster (tfps-launch's TF_CONFIG, or --job_name, --ps_hosts, ... on test hosts)
tfps.define_mode_flags()  # e.g. --pipelined_updates
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Checkpoints and backups.", required=True)
_EPOCHS = flags.DEFINE_integer("epochs", 4, "Epochs.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps_per_epoch", 100, "Steps per epoch.", lower_bound=1)

VOCAB, NUM_IDS, INITIAL_ACCUMULATOR = 2000, 8, 0.1


def build_model() -> tf_keras.Model:
  ids = tf_keras.Input((NUM_IDS,), dtype="int64", name="ids")
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(VOCAB, 8, name="table")(ids))
  hidden = applied_steps.StepCounters(name="counters")(tf_keras.layers.Dense(16, activation="relu")(embedded))
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
  mode, strategy_options = tfps.mode_from_flags(), tfps.strategy_options_from_flags()

  def train(cluster):
    tfps.fit(build_model, train_dataset_fn, epochs=_EPOCHS.value, steps_per_epoch=_STEPS.value,
             model_dir=_MODEL_DIR.value, cluster=cluster, sync_mode=mode, strategy_options=strategy_options)

  # The cluster: tfps-launch's TF_CONFIG, a pod's (tests/test_k8s_runs.py) or the flags; ps and workers end with the run.
  tfps.run_task(train, cluster=tfps.config_from_flags(), model_dir=_MODEL_DIR.value, **tfps.server_options_from_flags())


if __name__ == "__main__":
  tfps.run_main(main)
