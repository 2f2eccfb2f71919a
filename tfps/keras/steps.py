"""The Keras path's step: a compiled tf-keras model as a `tfps.training.steps.Step`, and a runner put under
`Model.fit` (its train function, and the callback that settles the step counter at each epoch end)."""

import collections
from typing import Sequence

import tensorflow as tf
import tf_keras

from tfps import _tf_private
from tfps.training import steps as steps_lib
from tfps.training import tables


def keras_step(model: tf_keras.Model, metric_results: bool = True) -> steps_lib.Step:
  """The model's `train_step` as a Step; its optimizer counts the steps in `iterations`. Its outputs: the model's
  metric results (what `fit` logs), or with `metric_results=False` the function's summed loss and examples.

  The loss metric (`fit`'s "loss") is updated once per scheduled function instead of once per step: the update
  tf-keras's compiled loss makes in each step (the step's loss, weighted by its batch size) is held back, the step
  returns the weighted loss, the function sums it over its steps on the worker, and after them the metric takes the
  sum at once (weighted by the function's examples). The metric's ps receives one update per function, not two
  tensors per step, and the mean `fit` logs is the same. Where a step makes no such update, or more than one (a
  `train_step` or `compute_loss` of the user's own), each is made in its step as tf-keras makes it; and a
  `train_step` that reports a "loss" without updating the loss metric (TensorFlow Recommenders' models) has it go to
  the loss metric in the same way (the epoch's mean, where tf-keras logs the last step's), or, where the model tracks
  no loss metric, logged as the mean over the function's steps."""
  step = _KerasStep(model, metric_results)
  return steps_lib.Step(run=step.run, forward=step.forward, optimizer=lambda: model.optimizer,
                        variables=lambda: model.variables, trainable_variables=lambda: model.trainable_variables,
                        counter=model.optimizer.iterations, counts_itself=True, outputs=step.outputs,
                        tables=lambda: tables.tables_of(model), metric_variables=lambda: _metric_variables(model),
                        loss_is_a_sum=lambda: step.held_back or step.own_loss)


class _KerasStep:
  """`keras_step`'s functions, and what the trace of the step being built found: whether it held its loss metric's
  update back (`held_back`), or its train_step reported a "loss" with no update of the loss metric (`own_loss`)."""

  def __init__(self, model: tf_keras.Model, metric_results: bool):
    self.model, self.metric_results = model, metric_results
    self.held_back = self.own_loss = False

  def run(self, batch):
    updates, metric = [], _tf_private.loss_metric(self.model)
    with _tf_private.updates_held(metric, updates):
      logs = _train_step(self.model, batch)
    count = tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
    self.held_back = len(updates) == 1 and updates[0][1] is not None
    self.own_loss = self.metric_results and not updates and isinstance(logs, dict) and "loss" in logs
    if self.held_back:
      value, weight = updates[0]
      return tf.cast(value, tf.float32) * tf.cast(weight, tf.float32), count
    if self.own_loss:
      return tf.reduce_mean(tf.cast(logs["loss"], tf.float32)) * tf.cast(count, tf.float32), count
    for value, weight in updates:
      metric.update_state(value, sample_weight=weight)
    return (logs.get("loss", 0.0) if not self.metric_results else 0.0), count

  def forward(self, batch):
    features, _, _ = tf_keras.utils.unpack_x_y_sample_weight(batch)
    _call(self.model, features)

  def outputs(self, loss_sum, examples):
    model, updated, weight = self.model, [], tf.cast(examples, tf.float32)
    metric = _tf_private.loss_metric(model)
    logged = self.held_back or (self.own_loss and any(tracked is metric for tracked in model.metrics))
    if logged:
      updated = [metric.update_state(tf.math.divide_no_nan(loss_sum, weight), sample_weight=weight)]
    with tf.control_dependencies([loss_sum] + updated):
      if not self.metric_results:
        return tf.identity(loss_sum), tf.identity(examples)
      results = model.get_metrics_result()
      if self.own_loss and not logged:  # no loss metric fit logs: the function's mean
        results = {**results, "loss": tf.math.divide_no_nan(loss_sum, weight)}
      return results


# The model's code as tf-keras's `fit` traces it, with autograph: Python control flow on tensors in its layers' `call`
# (`if tf.reduce_sum(x) > 0:`; TensorFlow Recommenders' tasks) and in a `train_step` of the user's is converted. The
# runners' functions are traced without autograph (their own code is graph code); these are converted functions, so
# while they run, the layers tf-keras calls are converted as under `fit`.
@tf.autograph.to_graph
def _train_step(model, batch):
  return model.train_step(batch)


@tf.autograph.to_graph
def _call(model, features):
  return model(features, training=True)


def _metric_variables(model: tf_keras.Model) -> list:
  """The variables of the model's loss metric and of its metrics built so far (compiled metrics are built by the
  first step)."""
  metrics = [_tf_private.loss_metric(model), *model.metrics]
  return list({id(v): v for metric in metrics if metric is not None for v in metric.variables}.values())


def drive_fit(model: tf_keras.Model, runner: steps_lib.Runner, iterator,
              pauses: Sequence = ()) -> tf_keras.callbacks.Callback:
  """Makes `model.fit` run each execution (of the model's steps per execution) through `runner`, on batches of the
  per-worker `iterator` (`tfps.training.dataset_fns.per_worker_iterator`; the one `fit` passes is not used: give
  `fit` `UNUSED_BY_FIT`); returns the callback that must come first in the fit's callbacks (it settles the step
  counter before any other reads it).

  `pauses`: work done within an epoch with no step in flight (a delta export), each with `due() -> bool` and
  `run()` (`PausingTrainFunction`)."""
  train = PausingTrainFunction(model, runner, iterator, pauses) if pauses else (
      lambda unused: runner.schedule(iterator, _tf_private.steps_per_execution(model)))
  _tf_private.replace_train_function(model, train)
  return RunnerEpochs(runner)


class PausingTrainFunction:
  """The train function `drive_fit` gives `fit` with pauses: before an execution where one is due, the executions
  scheduled so far are waited for and the step counter settled, the due ones run, and the execution is scheduled after
  them.

  `fit` schedules an epoch's executions as fast as the coordinator's queue takes them (hundreds), so a pause checked at
  scheduling time could come an epoch late. Here the chief keeps at most `2 * AHEAD` executions per worker scheduled
  beyond those known finished: once it has that many, it waits for the `AHEAD`-th last (one wait per `AHEAD`
  executions; each worker keeps work queued meanwhile). A pause comes at most that many executions late.
  """

  AHEAD = 4

  def __init__(self, model: tf_keras.Model, runner: steps_lib.Runner, iterator, pauses: Sequence):
    self._model, self._runner, self._iterator, self._pauses = model, runner, iterator, pauses
    self._scheduled = collections.deque()  # what the executions not known finished return

  def __call__(self, unused):
    runner = self._runner
    ahead = self.AHEAD * runner.num_workers
    if len(self._scheduled) >= 2 * ahead:
      for _ in range(ahead - 1):
        self._scheduled.popleft()
      self._scheduled.popleft().fetch()  # waits for that execution
    due = [pause for pause in self._pauses if pause.due()]
    if due:
      runner.coordinator.join()
      self._scheduled.clear()
      runner.settle()
      for pause in due:
        pause.run()
      runner.begin()
    result = runner.schedule(self._iterator, _tf_private.steps_per_execution(self._model))
    self._scheduled.append(result)
    return result


# What `model.fit` is given as its training data where `drive_fit` gives the steps their batches: tf-keras builds an
# iterator of it on every worker that nothing reads.
UNUSED_BY_FIT = tf_keras.utils.experimental.DatasetCreator(
    lambda input_context: tf.data.Dataset.from_tensors(0).repeat())


class RunnerEpochs(tf_keras.callbacks.Callback):
  """Calls `runner.begin()` at each epoch's start and `runner.settle()` at its end (every function has ended then),
  before the callbacks after it (checkpoints) read the step counter."""

  def __init__(self, runner: steps_lib.Runner):
    super().__init__()
    self._runner = runner

  def on_epoch_begin(self, epoch, logs=None):
    self._runner.begin()

  def on_epoch_end(self, epoch, logs=None):
    self._runner.settle()
