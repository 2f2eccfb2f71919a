"""The Estimator path drives the same async runner as tfps.fit, with every exactly-once rule: a step's updates wait
until all its gradients are on their ps, and a step run again skips the updates a ps applied already."""

import threading
import time

import tensorflow as tf
import tf_keras

import held_gradients
import tfps

ARMED, ENTERED, RELEASE = threading.Event(), threading.Event(), threading.Event()


def _wait(gradient):
  if ARMED.is_set():
    ENTERED.set()
    RELEASE.wait(120)
  return gradient


_gate = held_gradients.gate(_wait)  # the gradient waits (in the worker) for RELEASE while ARMED is set


def model_fn(features, labels, mode):
  hidden = tf_keras.layers.Dense(4)(features["x"])
  predictions = tf_keras.layers.Dense(1)(_gate(hidden))
  loss = tf.reduce_mean(tf.square(predictions - labels))
  return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.Adagrad(0.1))


def input_fn():
  return tf.data.Dataset.from_tensors(({"x": tf.ones((4, 2))}, tf.ones((4, 1)))).repeat()


def _trained_one_step(cluster, model_dir):
  """The estimator's distributed model after one step (which creates the variables and the per-ps records), and a
  per-worker iterator of `input_fn`."""
  estimator = tfps.Estimator(model_fn, model_dir=str(model_dir), cluster=cluster,
                             config=tfps.RunConfig(steps_per_execution=5))
  estimator.train(input_fn, max_steps=1)
  model = estimator.distributed_model()
  iterator = iter(model.coordinator.create_per_worker_dataset(input_fn))
  return model, iterator


def _values(model):
  return {variable.name: variable.numpy() for variable in model.model.variables.created}


def test_no_update_of_an_estimator_step_lands_before_all_its_gradients_are_on_the_ps(cluster, tmp_path):
  model, iterator = _trained_one_step(cluster, tmp_path)
  runner = model.runner
  before, seq = _values(model), runner.progress.position
  ARMED.set()
  try:
    runner.begin()
    runner.schedule(iterator, 1)
    assert ENTERED.wait(60)  # the first layer's gradients are held; the last layer's are computed
    deadline = time.monotonic() + 2  # ample for the ps to apply what has arrived (milliseconds)
    while time.monotonic() < deadline:
      assert all((value == before[name]).all() for name, value in _values(model).items())
      assert int(model.global_step.numpy()) == 1
      assert int(runner.progress.variable[seq].numpy()) == seq * runner.progress.stride
      time.sleep(0.1)
  finally:
    ARMED.clear()
    RELEASE.set()
  model.coordinator.join()
  assert runner.settle() == 2
  assert int(runner.progress.variable[seq].numpy()) == seq * runner.progress.stride + 1
  assert all((value != before[name]).any() for name, value in _values(model).items())
  assert "apply_gradients" not in vars(model.model.optimizer)  # the hold-back was only there while tracing


def test_an_estimator_step_run_again_skips_the_updates_a_ps_applied_already(cluster, tmp_path):
  """A dead worker's step can reach one ps and not the other; run again, it updates only the ps it had not reached."""
  model, iterator = _trained_one_step(cluster, tmp_path)
  runner = model.runner
  records = runner.progress.ps_records.vectors
  devices = sorted(records)
  assert len(devices) == 2  # the variables are spread over both ps
  reached, seq = devices[0], runner.progress.position
  variables = model.model.variables.created
  before = _values(model)
  # The function of sequence number `seq` ran its first step on `reached` only, then its worker died.
  mark = seq * runner.progress.stride + 1
  records[reached].scatter_update(tf.IndexedSlices(tf.constant([mark], tf.int64), tf.constant([seq])))
  runner.schedule(iterator, 1)
  model.coordinator.join()
  assert {variable.device for variable in variables} == set(devices)
  for variable in variables:
    unchanged = (variable.numpy() == before[variable.name]).all()
    assert unchanged == (variable.device == reached), variable.name
  assert int(runner.progress.variable[seq].numpy()) == mark  # the step is recorded once it is whole
  assert {device: int(vector[seq].numpy()) for device, vector in records.items()} == {d: mark for d in devices}
