"""tfps.fit on models `Model.fit` trains as they are written: Python control flow on tensors in a layer (autograph), and
TensorFlow Recommenders models, whose steps compute their loss in `compute_loss` (with or without a `call`)."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

import tfps
from tfps import models


class SignFlip(tf_keras.layers.Layer):
  """Python `if` on a tensor: tf-keras's fit converts it with autograph."""

  def call(self, x):
    if tf.reduce_sum(x) > 0:
      return x
    return -x


def build_sign_flip():
  x = tf_keras.Input((3,), name="x")
  model = tf_keras.Model({"x": x}, tf_keras.layers.Dense(1, activation="sigmoid")(SignFlip()(x)))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "binary_crossentropy")
  return model


def sign_flip_data(input_context):
  del input_context
  x = np.random.default_rng(0).normal(size=(256, 3)).astype("float32")
  return tf.data.Dataset.from_tensor_slices(({"x": x}, (x[:, 0] > 0).astype("float32"))).repeat().batch(32)


@pytest.mark.parametrize("sync_mode", ["async", "sync", "geo"])
def test_a_layer_with_python_control_flow_on_tensors_trains_in_every_mode(cluster, sync_mode):
  history = tfps.fit(build_sign_flip, sign_flip_data, epochs=1, steps_per_epoch=4, cluster=cluster,
                     sync_mode=sync_mode)
  assert np.isfinite(history.history["loss"][0]) and history.history["loss"][0] > 0


USERS = 500


class TwoTower(tfrs.models.Model):
  """As the TensorFlow Recommenders tutorials write one: towers, a retrieval task, `compute_loss`, no `call`."""

  def __init__(self):
    super().__init__()
    self.user = tf_keras.Sequential([tf_keras.layers.Embedding(USERS, 8), tf_keras.layers.Dense(8)])
    self.item = tf_keras.Sequential([tf_keras.layers.Embedding(USERS, 8), tf_keras.layers.Dense(8)])
    self.task = tfrs.tasks.Retrieval()

  def compute_loss(self, features, training=False):
    return self.task(self.user(features["user"]), self.item(features["item"]))


class TwoTowerWithCall(TwoTower):

  def call(self, features, training=False):
    return self.user(features["user"], training=training), self.item(features["item"], training=training)


def pairs(input_context):
  users = np.random.default_rng(input_context.input_pipeline_id).integers(0, USERS, 4000)
  return tf.data.Dataset.from_tensor_slices({"user": users, "item": (users * 7) % USERS}).repeat().batch(
      32, drop_remainder=True)


def held_out(input_context):
  del input_context
  users = np.arange(230)  # batches of 50, the last of 30
  return tf.data.Dataset.from_tensor_slices({"user": users, "item": (users * 7) % USERS}).batch(50)


def _held_out_loss(model) -> float:
  """The model's own loss over `held_out`, as `Model.evaluate` means it: per batch, weighted by its examples."""
  losses = [(float(model.compute_loss(batch)), int(batch["user"].shape[0])) for batch in held_out(None)]
  return sum(loss * size for loss, size in losses) / sum(size for _, size in losses)


@pytest.mark.parametrize("model_class", [TwoTower, TwoTowerWithCall])
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "steps"])
def test_a_tensorflow_recommenders_model_trains_and_logs_its_own_loss(cluster, model_class, exact):
  def build():
    model = model_class()
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.5))
    return model

  validation = dict(exact_evaluation=True) if exact else dict(validation_steps=5)
  history = tfps.fit(build, pairs, epochs=2, steps_per_epoch=20, cluster=cluster,
                     validation_dataset_fn=held_out if exact else lambda context: held_out(context).repeat(),
                     **validation)
  losses = history.history["loss"]
  # In-batch softmax over 32 pairs: 32 * ln 32 = 110.9 (a sum over the batch) for a model that learned nothing.
  assert 0 < losses[1] < min(losses[0], 32 * np.log(32)), losses
  if exact:  # every held-out pair once, each batch's loss weighted by its pairs: the trained model's own loss
    np.testing.assert_allclose(history.history["val_loss"][-1], _held_out_loss(history.model), rtol=1e-4)
  else:
    assert 0 < history.history["val_loss"][-1] < 50 * np.log(50) + 1


def test_the_bundled_retrieval_model_logs_its_loss_and_its_exact_held_out_loss(cluster):
  def build():
    model = models.build_retrieval({"user": USERS, "item": USERS}, {}, candidate_features=("item",),
                                   candidate_id="item", embedding_dim=8, layer_sizes=(8,))
    return models.compile_model(model, learning_rate=0.5)

  with_label = lambda dataset_fn: lambda context: dataset_fn(context).map(lambda f: (f, tf.zeros_like(f["user"])))
  history = tfps.fit(build, with_label(pairs), epochs=2, steps_per_epoch=20, cluster=cluster,
                     validation_dataset_fn=with_label(held_out), exact_evaluation=True)
  losses = history.history["loss"]
  assert 0 < losses[1] < min(losses[0], 32 * np.log(32)), losses  # read 0.0: the untouched loss metric was logged
  np.testing.assert_allclose(history.history["val_loss"][-1], _held_out_loss(history.model), rtol=1e-4)


class TwoTowerTopK(TwoTower):
  """With the tutorials' top-K metrics: `FactorizedTopK` over every item, computed when not training."""

  def __init__(self):
    super().__init__()
    candidates = tf.data.Dataset.from_tensor_slices(np.arange(USERS)).batch(100).map(self.item)
    self.task = tfrs.tasks.Retrieval(metrics=tfrs.metrics.FactorizedTopK(candidates=candidates, ks=(1, 10)))

  def compute_loss(self, features, training=False):
    return self.task(self.user(features["user"]), self.item(features["item"]), compute_metrics=not training)


def build_top_k():
  model = TwoTowerTopK()
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.5))
  return model


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "steps"])
def test_top_k_metrics_are_refused_on_the_workers_before_training(cluster, tmp_path, exact):
  """tf-keras failed after an epoch: its ValueError on `add_metric` (exact), a gRPC error on a tensor it could not copy
  to a worker (by steps)."""
  validation = dict(exact_evaluation=True) if exact else dict(validation_steps=2)
  with pytest.raises(tfps.UsageError, match=r"^validation_dataset_fn: the model's tfrs.metrics.FactorizedTopK "
                     r"\('factorized_top_k'\) cannot run on the cluster's workers \(its candidates are read on the "
                     r"chief\); train without it and measure top-K in the sidecar evaluator"):
    tfps.fit(build_top_k, pairs, epochs=1, steps_per_epoch=5, cluster=cluster, model_dir=str(tmp_path / "run"),
             validation_dataset_fn=held_out if exact else lambda context: held_out(context).repeat(), **validation)
  assert not (tmp_path / "run" / "checkpoints").exists() or not list((tmp_path / "run" / "checkpoints").glob("ckpt-*"))


def test_top_k_metrics_are_measured_by_the_sidecar_on_the_trained_checkpoints(cluster, tmp_path):
  model_dir = str(tmp_path / "run")
  tfps.fit(build_top_k, pairs, epochs=1, steps_per_epoch=10, cluster=cluster, model_dir=model_dir)
  records = tfps.run_sidecar_evaluator(build_top_k, held_out, model_dir, poll_secs=0.1, idle_timeout_secs=30)
  metrics = records[-1]["metrics"]
  assert {"factorized_top_k/top_1_categorical_accuracy", "factorized_top_k/top_10_categorical_accuracy"} <= set(metrics)
  assert 0 <= metrics["factorized_top_k/top_1_categorical_accuracy"] <= metrics[
      "factorized_top_k/top_10_categorical_accuracy"] <= 1


class MeanInput(tf_keras.layers.Layer):
  """Reports the mean of its input with `add_metric`."""

  def call(self, x):
    self.add_metric(tf.reduce_mean(x), name="mean_input")
    return x


def test_a_metric_added_with_add_metric_is_refused_for_exact_evaluation_before_training(cluster):
  def build():
    x = tf_keras.Input((3,), name="x")
    model = tf_keras.Model({"x": x}, tf_keras.layers.Dense(1, activation="sigmoid")(MeanInput()(x)))
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "binary_crossentropy")
    return model

  finite = lambda context: sign_flip_data(context).take(4)
  with pytest.raises(tfps.UsageError, match=r"^validation_dataset_fn: the metric 'mean_input', added with add_metric, "
                     r"cannot be evaluated exactly once on the workers .*; evaluate by steps \(exact_evaluation=False\)"):
    tfps.fit(build, sign_flip_data, epochs=1, steps_per_epoch=2, cluster=cluster, validation_dataset_fn=finite,
             exact_evaluation=True)
  history = tfps.fit(build, sign_flip_data, epochs=1, steps_per_epoch=2, cluster=cluster,
                     validation_dataset_fn=sign_flip_data, validation_steps=2)
  assert "val_mean_input" in history.history
