"""Keras path example: one absl script for every role of a parameter-server cluster.

Locally, all roles at once:
  tfps-launch --num_ps=1 --num_workers=2 --evaluator scripts/train_keras.py -- --model_dir=/tmp/run
Per role (seed style), on each host:
  python scripts/train_keras.py --job_name=ps --task_index=0 --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 \
      --chief_hosts=h3:2222 --model_dir=/shared/run
The model: a sharded embedding over hashed ids plus an MLP, learning a planted click signal it generates.
"""

from absl import flags
import numpy as np

import tfps
from tfps.testing import applied_steps
import tensorflow as tf
import tf_keras

tfps.define_flags()
tfps.define_mode_flags()
_MODEL_DIR = flags.DEFINE_string("model_dir", "/tmp/tfps_keras", "Checkpoints, TensorBoard logs, evaluations.")
_EPOCHS = flags.DEFINE_integer("epochs", 4, "Epochs.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps_per_epoch", 100, "Steps per epoch.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 128, "Batch size per worker.", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_size", 100_000, "Rows of the embedding table.", lower_bound=2)
_EXACT = flags.DEFINE_boolean("exact_evaluation", True, "Evaluate the finite eval set exactly once per epoch.")
_EVERY = flags.DEFINE_boolean("evaluate_every_checkpoint", False, "On the evaluator task: evaluate every checkpoint "
                              "in order, not only the newest.")
_SEED = flags.DEFINE_integer("seed", None, "Seed of the model's initial values (tfps.fit's seed): the same at every "
                             "launch (docs/repeatability.md); unset: other ones at each launch.", lower_bound=0)
_COUNT = flags.DEFINE_boolean("count_applied_steps", False, "Count on every ps the steps applied there (a counter per "
                              "ps, in the checkpoints: tfps.testing.applied_steps), to check a run under failures.")

NUM_IDS, NUM_DENSE = 8, 4


def make_examples(rows: int, seed: int, vocab_size: int):
  """Features and a planted label: each id has a hidden weight; clicks follow their sum plus a dense term."""
  rng = np.random.default_rng(seed)
  weights = np.random.default_rng(0).normal(size=vocab_size).astype(np.float32)
  ids = np.minimum(rng.zipf(1.3, size=(rows, NUM_IDS)) - 1, vocab_size - 1).astype(np.int64)
  dense = rng.normal(size=(rows, NUM_DENSE)).astype(np.float32)
  logits = weights[ids].sum(axis=1) + 2.0 * dense[:, 0]
  labels = (rng.random(rows) < 1 / (1 + np.exp(-logits))).astype(np.float32)
  return {"ids": ids, "dense_features": dense}, labels


def build_model() -> tf_keras.Model:
  ids = tf_keras.Input((NUM_IDS,), dtype="int64", name="ids")
  dense = tf_keras.Input((NUM_DENSE,), name="dense_features")
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(_VOCAB.value, 8, name="table")(ids))
  hidden = tf_keras.layers.Dense(32, activation="relu")(tf_keras.layers.Concatenate()([embedded, dense]))
  if _COUNT.value:
    hidden = applied_steps.StepCounters(tfps.config_from_flags().num_ps, name="counters")(hidden)
  model = tf_keras.Model({"ids": ids, "dense_features": dense}, tf_keras.layers.Dense(1, activation="sigmoid")(hidden))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "binary_crossentropy",
                metrics=[tf_keras.metrics.AUC(name="auc")])
  return model


def train_dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
  features, labels = make_examples(20_000, seed=1 + input_context.input_pipeline_id, vocab_size=_VOCAB.value)
  return (tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(20_000).repeat()
          .batch(_BATCH.value, drop_remainder=True).prefetch(2))


def eval_dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
  features, labels = make_examples(4_000, seed=1000, vocab_size=_VOCAB.value)
  dataset = tf.data.Dataset.from_tensor_slices((features, labels))
  return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id).batch(500)


def main(argv):
  del argv
  mode, strategy_options = tfps.mode_from_flags(), tfps.strategy_options_from_flags()  # bad settings fail on any task

  def train(cluster):
    return tfps.fit(build_model, train_dataset_fn, epochs=_EPOCHS.value, steps_per_epoch=_STEPS.value,
                    validation_dataset_fn=eval_dataset_fn, validation_steps=None if _EXACT.value else 4,
                    exact_evaluation=_EXACT.value, model_dir=_MODEL_DIR.value, cluster=cluster, sync_mode=mode,
                    strategy_options=strategy_options, seed=_SEED.value)

  def evaluate(cluster):
    del cluster  # the sidecar reads checkpoints; it never connects to the cluster
    return tfps.run_sidecar_evaluator(build_model, eval_dataset_fn, _MODEL_DIR.value,
                                      steps=None if _EXACT.value else 4, evaluate_every_checkpoint=_EVERY.value)

  tfps.run_task(train, evaluate, cluster=tfps.config_from_flags(), model_dir=_MODEL_DIR.value,
                **tfps.server_options_from_flags())


if __name__ == "__main__":
  tfps.run_main(main, arguments=False)
