"""The Estimator path on the in-process cluster: learning, step log, checkpoints, exact evaluation, predict, export."""

import json
import random
import re
import statistics
import subprocess
import sys
import types

import numpy as np
import pytest

import tfps
import tensorflow as tf
import tf_keras

from tfps.training import checkpoints as checkpoints_lib
from tfps.training import loop
from tfps.estimator import evaluation, synthetic
from tfps.estimator.spec import ModelFnError

MAX_STEPS = 300
EVAL_EXAMPLES = 1000
BATCH = 64
LOG_LINE = re.compile(r"^step (\d+) \| loss ([0-9.]+) \| ([0-9.,]+) steps/s \| ([0-9,]+) ex/s \| eta \S+$")


@pytest.fixture(scope="module")
def trained(cluster, tmp_path_factory):
  """A synthetic model trained for MAX_STEPS steps with inline evaluation after every checkpoint."""
  model_dir = tmp_path_factory.mktemp("estimator")
  config = tfps.RunConfig(save_checkpoints_steps=100, keep_checkpoint_max=2, log_step_count_steps=50,
                          steps_per_execution=5)
  estimator = tfps.Estimator(synthetic.model_fn, model_dir=str(model_dir), config=config, cluster=cluster,
                             params={"batch_size": BATCH, "eval_examples": EVAL_EXAMPLES})
  results = tfps.train_and_evaluate(estimator, tfps.TrainSpec(synthetic.train_input_fn, max_steps=MAX_STEPS),
                                    tfps.EvalSpec(synthetic.eval_input_fn, steps=None, throttle_secs=0))
  return estimator, results, evaluation.read_results(estimator.model_dir)  # before other tests evaluate more


def test_learns_the_synthetic_task(trained):
  _, results, records = trained
  assert results["global_step"] == MAX_STEPS
  assert results["auc"] >= 0.95, results
  assert results["examples"] == EVAL_EXAMPLES and results["examples_counted"] == EVAL_EXAMPLES
  assert [r["step"] for r in records] == [100, 200, 300]
  assert [r["checkpoint_number"] for r in records] == [100, 200, 300]
  assert all(r["metrics"]["examples_counted"] == EVAL_EXAMPLES for r in records)
  assert records[0]["metrics"]["loss"] > records[-1]["metrics"]["loss"]
  assert records[-1]["checkpoint"].endswith("checkpoints/ckpt-300")


def test_run_records(trained):
  estimator, results, records = trained
  progress = [json.loads(line) for line in open(f"{estimator.model_dir}/run/progress.jsonl", encoding="utf-8")]
  with open(f"{estimator.model_dir}/loss.log", encoding="utf-8") as log:
    logged = [(int(m.group(1)), float(m.group(2))) for m in map(LOG_LINE.match, log)]
  train = [r for r in progress if r["kind"] == "train"]
  assert [(r["step"], round(r["metrics"]["loss"], 4)) for r in train] == logged
  assert all(r["examples_per_sec"] > 0 for r in train)
  rates = [r["examples_per_sec"] for r in train]  # the first line's clock starts once its function is traced
  assert rates[0] > 0.3 * statistics.median(rates), rates  # with the trace it was below a fifth of the median
  validation = [r for r in progress if r["kind"] == "validation"]
  assert [(r["step"], r["metrics"]["auc"]) for r in validation] == [
      (r["step"], pytest.approx(r["metrics"]["auc"])) for r in records]
  summary = json.loads(open(f"{estimator.model_dir}/run/summary.json", encoding="utf-8").read())
  assert summary["steps"] == MAX_STEPS and summary["steps_this_run"] == MAX_STEPS
  assert summary["examples_per_sec"] == pytest.approx(MAX_STEPS * BATCH / summary["wall_secs"], rel=0.05)
  assert summary["final_metrics"]["val_auc"] == pytest.approx(results["auc"])
  assert summary["final_metrics"]["loss"] == pytest.approx(logged[-1][1], abs=1e-4)


def test_step_log_and_checkpoints(trained):
  estimator, _, _ = trained
  with open(f"{estimator.model_dir}/loss.log", encoding="utf-8") as log:
    lines = [LOG_LINE.match(line.strip()) for line in log]
  assert all(lines), lines
  assert [int(m.group(1)) for m in lines] == list(range(50, MAX_STEPS + 1, 50))
  losses = [float(m.group(2)) for m in lines]
  assert losses[-1] < losses[0]
  assert all(float(m.group(3).replace(",", "")) > 0 and int(m.group(4).replace(",", "")) > 0 for m in lines)
  paths = checkpoints_lib.list_checkpoints(estimator.model_dir)
  assert [checkpoints_lib.checkpoint_number(p) for p in paths] == [200, 300]  # keep_checkpoint_max=2
  marker = checkpoints_lib.read_final_marker(estimator.model_dir)
  assert marker == {"last_checkpoint": paths[-1], "step": MAX_STEPS}


class _Ran:
  """What a scheduled function of `_EventRunner` gives: loss 0.5 and 64 examples per step."""

  def __init__(self, steps):
    self.steps = steps

  def fetch(self):
    return 0.5 * self.steps, 64 * self.steps


class _EventRunner:
  """A runner on no cluster (2 workers, 5 steps per function): `events` holds each scheduled function's steps and
  each join of the coordinator, in order."""

  steps_per_execution, num_workers = 5, 2

  def __init__(self):
    self.events = []
    self.coordinator = self  # its join is the coordinator's
    self.step = types.SimpleNamespace(counter=None)  # the loop reads the counter only in `run`

  def join(self):
    self.events.append("join")

  def begin(self):
    pass

  def schedule(self, iterator, num_steps):
    del iterator
    self.events.append(num_steps)
    return _Ran(num_steps)

  def settle(self):
    return 0


@pytest.mark.parametrize("steps, first, events, measured", [
    (50, True, [5, 5, "join"] + [5] * 8 + ["join"], (10, 640)),  # a function per worker ran before the clock
    (10, True, [5, "join", 5, "join"], (5, 320)),  # one function is left to measure
    (5, True, [5, "join"], None),  # a single function: measured with its trace
    (50, False, [5] * 10 + ["join"], None),
])
def test_a_runs_first_line_is_measured_after_each_worker_ran_its_first_function(tmp_path, steps, first, events,
                                                                                 measured):
  """A worker's first run of a function prepares it (seconds, no step): within the first line's interval it made
  the line read half the others' rate."""
  runner = _EventRunner()
  train_loop = loop.TrainLoop(runner=runner, iterator=None, checkpoint_manager=None, config=loop.LoopConfig(),
                              model_dir=str(tmp_path))
  loss_sum, examples, not_measured = train_loop._run_chunk(steps, first)  # pylint: disable=protected-access
  assert runner.events == events
  assert (not_measured if not_measured is None else not_measured[1:]) == measured
  counted = steps - (measured or (0,))[0]
  assert (loss_sum, examples) == (0.5 * counted, 64 * counted)


def test_variables_created_once_embedding_sharded(trained):
  estimator, _, _ = trained
  created = estimator.distributed_model().model.variables.created
  assert [tuple(v.shape) for v in created] == [(5000, 16), (100, 16), (34, 16), (16,), (16, 1), (1,)]
  assert len(created[0].variables) == 2  # the 320 KB user table, sharded over both ps
  assert all(isinstance(v, tf.Variable) or len(v.variables) == 1 for v in created[1:])


@pytest.mark.parametrize("shards, steps, expected", [(3, None, EVAL_EXAMPLES), (4, 5, 5 * BATCH)])
def test_inline_evaluation_counts_each_example_once(trained, shards, steps, expected):
  estimator, _, _ = trained
  results = estimator.distributed_model().evaluate(synthetic.eval_input_fn, steps, num_shards=shards)
  assert results["examples"] == expected and results["examples_counted"] == expected


def test_local_evaluate_matches_inline(trained):
  estimator, results, _ = trained
  local = estimator.evaluate(synthetic.eval_input_fn)
  assert local["global_step"] == MAX_STEPS and local["examples_counted"] == EVAL_EXAMPLES
  for name in ("loss", "auc", "accuracy"):
    assert local[name] == pytest.approx(results[name], abs=1e-6)


def test_predict(trained):
  estimator, results, _ = trained
  predictions = list(estimator.predict(synthetic.predict_input_fn))
  assert len(predictions) == EVAL_EXAMPLES and set(predictions[0]) == {"prob", "logits"}
  probs = np.array([p["prob"] for p in predictions])
  labels = np.concatenate([y for _, y in synthetic.eval_input_fn({"eval_examples": EVAL_EXAMPLES})
                           .as_numpy_iterator()])
  assert np.mean((probs > 0.5) == labels) == pytest.approx(results["accuracy"], abs=1e-6)


@pytest.mark.slow
def test_export_loads_with_plain_tensorflow(trained, tmp_path, subprocess_env):
  estimator, _, _ = trained
  export_dir = estimator.export_saved_model(tmp_path / "export", synthetic.serving_input_fn)
  features = {"user": [1, 4999, 7], "item": [0, 99, 50], "dense": [[0.5, -0.5], [0.0, 0.0], [-1.0, 1.0]]}
  expected = list(estimator.predict(lambda: tf.data.Dataset.from_tensors(
      {"user": tf.constant(features["user"], tf.int64), "item": tf.constant(features["item"], tf.int64),
       "dense": tf.constant(features["dense"], tf.float32)})))
  code = (f"import json, tensorflow as tf\nmodel = tf.saved_model.load({str(export_dir)!r})\n"
          f"f = {features!r}\n"
          "out = model.signatures['serving_default'](user=tf.constant(f['user'], tf.int64), "
          "item=tf.constant(f['item'], tf.int64), dense=tf.constant(f['dense'], tf.float32))\n"
          "print(json.dumps(out['prob'].numpy().tolist()))\n")
  env = {k: v for k, v in subprocess_env.items() if k != "TF_CONFIG"}
  done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                        check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  probs = json.loads(done.stdout.strip().splitlines()[-1])
  assert probs == pytest.approx([float(p["prob"]) for p in expected], abs=1e-5)


def _wrap(transform):
  """synthetic.model_fn with its spec replaced by `transform(spec, mode)`."""
  def model_fn(features, labels, mode, params):
    return transform(synthetic.model_fn(features, labels, mode, params), mode)
  return model_fn


def _new_variable_on_later_calls(first: bool):
  calls = []

  def model_fn(features, labels, mode, params):
    calls.append(mode)

    def extra():
      if len(calls) > 1:
        tf.compat.v1.get_variable("extra", [3], initializer=tf.compat.v1.zeros_initializer())

    if first:
      extra()
    spec = synthetic.model_fn(features, labels, mode, params)
    extra()
    return spec
  return model_fn


def _variable_from_a_computed_tensor(features, labels, mode, params):
  tf.compat.v1.get_variable("scale", initializer=tf.fill([1], 0.25) * 2.0)
  return synthetic.model_fn(features, labels, mode, params)


@pytest.mark.parametrize("model_fn, error, message", [
    (_wrap(lambda spec, mode: tfps.EstimatorSpec(mode, optimizer=spec.optimizer)), ModelFnError,
     "no `loss` in mode 'train'"),
    (_wrap(lambda spec, mode: {"loss": spec.loss}), ModelFnError,
     "must return a tfps.EstimatorSpec in mode 'train', got dict"),
    (_wrap(lambda spec, mode: tfps.EstimatorSpec(mode, loss=spec.loss)), ModelFnError,
     "TRAIN needs a tf-keras optimizer"),
    (_new_variable_on_later_calls(first=False), ModelFnError, "created a new variable 'extra' .* on a later call"),
    (_new_variable_on_later_calls(first=True), ModelFnError,
     "variable #0 is 'extra' .* but the first call created 'synthetic/user_embedding.* in the same order"),
    (_variable_from_a_computed_tensor, ModelFnError,
     r"^model_fn variable 'scale' starts from '.*mul:0', a tensor model_fn computes, but get_variable .* or a "
     "constant$"),
])
def test_bad_model_fn_in_training(cluster, tmp_path, model_fn, error, message):
  estimator = tfps.Estimator(model_fn, model_dir=str(tmp_path), cluster=cluster)
  with pytest.raises(error, match=message):
    estimator.train(synthetic.train_input_fn, max_steps=1)


def _tf1_minimize(spec, mode):
  if mode == tfps.ModeKeys.TRAIN:
    tf.compat.v1.train.AdagradOptimizer(0.1).minimize(spec.loss, tf.compat.v1.train.get_global_step())
  return spec


def _rate_of_the_global_step(spec, mode):
  rate = tf.compat.v1.train.exponential_decay(0.1, tf.compat.v1.train.get_global_step(), 100, 0.9)
  return tfps.EstimatorSpec(mode, loss=spec.loss, optimizer=tf_keras.optimizers.legacy.Adagrad(rate),
                            predictions=spec.predictions)


def _pairs_of_arrays(params):
  return np.zeros((4, 2)), np.zeros(4)


@pytest.mark.parametrize("model_fn, input_fn, message", [
    (_wrap(_tf1_minimize), synthetic.train_input_fn,
     r"^model_fn called a TF1 optimizer's minimize\(\) \(No variables to optimize.\): tfps takes the gradients of "
     r"the loss and applies them; return EstimatorSpec\(mode, loss=loss, optimizer=optimizer\) instead"),
    (_wrap(_rate_of_the_global_step), synthetic.train_input_fn,
     r"^the optimizer's learning rate is a tensor model_fn computed \(.*ExponentialDecay.*\): it belongs to one "
     "trace of model_fn.*schedules.LearningRateSchedule"),
    (synthetic.model_fn, _pairs_of_arrays, r"^input_fn must return a tf.data.Dataset of \(features, labels\) in mode "
     "'train', got tuple$"),
])
def test_tf1_habits_and_a_wrong_input_fn_get_one_line_errors_in_training(cluster, tmp_path, model_fn, input_fn,
                                                                         message):
  estimator = tfps.Estimator(model_fn, model_dir=str(tmp_path), cluster=cluster)
  with pytest.raises(tfps.TfpsError, match=message):
    estimator.train(input_fn, max_steps=1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(params=[1, 2]), r"^`params` must be a dict \(passed to model_fn and input_fn\), got list$"),
    (dict(warm_start_from="/nonexistent/run"), r"^`warm_start_from` \('/nonexistent/run'\) is neither a checkpoint "
                                                r"nor a model_dir with checkpoints$"),
    (dict(warm_start_from=3), r"^`warm_start_from` must be a model_dir or a checkpoint path, got int$"),
])
def test_bad_estimator_arguments_get_one_line_errors(tmp_path, kwargs, message):
  with pytest.raises(tfps.TfpsError, match=message):
    tfps.Estimator(synthetic.model_fn, model_dir=str(tmp_path), **kwargs)


def test_a_run_warm_started_from_another_starts_at_its_variables_with_a_new_step_and_optimizer(trained, tmp_path):
  estimator, _, _ = trained
  source = estimator.latest_checkpoint()
  warm = tfps.Estimator(synthetic.model_fn, model_dir=str(tmp_path), config=tfps.RunConfig(steps_per_execution=1),
                        cluster=estimator.distributed_model().cluster, warm_start_from=estimator.model_dir,
                        params={"batch_size": BATCH})
  warm.train(synthetic.train_input_fn, max_steps=1)
  after = warm.latest_checkpoint()
  assert after.endswith("ckpt-1")  # the step starts anew
  table = "model/created/0/.ATTRIBUTES/VARIABLE_VALUE"  # the user table, 5,000 rows (the first variable made)
  accumulator = "model/created/0/.OPTIMIZER_SLOT/optimizer/accumulator/.ATTRIBUTES/VARIABLE_VALUE"
  before, now = tf.train.load_variable(source, table), tf.train.load_variable(after, table)
  # One step of 64 examples moves few rows: the others hold the source's values.
  assert np.all(before == now, axis=1).mean() > 0.9
  assert not np.all(before == now)
  trained_slots, new_slots = tf.train.load_variable(source, accumulator), tf.train.load_variable(after, accumulator)
  untouched = np.all(before == now, axis=1)
  assert np.all(new_slots[untouched] == np.float32(0.1))  # Adagrad's start, not the source's accumulators
  assert np.mean(trained_slots[untouched] != np.float32(0.1)) > 0.5


def test_model_fn_with_a_metric_in_train_mode(cluster, tmp_path):
  def model_fn(features, labels, mode, params):
    spec = synthetic.model_fn(features, labels, mode, params)
    if mode == tfps.ModeKeys.TRAIN:
      tf_keras.metrics.Mean(name="train_loss").update_state(spec.loss)  # as model_fns that log a training metric do
    return spec

  estimator = tfps.Estimator(model_fn, model_dir=str(tmp_path), cluster=cluster,
                             config=tfps.RunConfig(log_step_count_steps=10))
  estimator.train(synthetic.train_input_fn, max_steps=20)
  assert estimator.distributed_model().global_step.numpy() == 20
  assert len(estimator.distributed_model().model.variables.created) == 6  # the metric's state is not model state


def test_bad_model_fn_in_predict_and_eval(trained):
  estimator, _, _ = trained
  bad_predict = tfps.Estimator(_wrap(lambda spec, mode: tfps.EstimatorSpec(mode, loss=spec.loss)),
                               model_dir=estimator.model_dir)
  with pytest.raises(ModelFnError, match="no `predictions` in mode 'infer'"):
    next(bad_predict.predict(synthetic.predict_input_fn))
  bad_eval = tfps.Estimator(_wrap(lambda spec, mode: tfps.EstimatorSpec(tfps.ModeKeys.PREDICT, predictions={})),
                            model_dir=estimator.model_dir)
  with pytest.raises(ModelFnError, match="called with mode 'eval' but returned EstimatorSpec\\(mode='infer'\\)"):
    bad_eval.evaluate(synthetic.eval_input_fn)


def test_a_plain_process_traces_model_fn_once_to_make_its_variables(trained, tmp_path):
  """evaluate, predict and export in a plain process: one model_fn call makes the variables (made eagerly, so that
  trace is not traced again), one more builds what runs (export: traced as the saver traces, which then takes it)."""
  estimator, _, _ = trained
  calls = []
  counted = tfps.Estimator(_wrap(lambda spec, mode: calls.append(mode) or spec), model_dir=estimator.model_dir)
  counted.evaluate(synthetic.eval_input_fn, steps=2)
  assert calls == ["eval", "eval"]
  calls.clear()
  next(counted.predict(synthetic.predict_input_fn))
  assert calls == ["infer", "infer"]
  calls.clear()
  counted.export_saved_model(str(tmp_path), synthetic.serving_input_fn)
  assert calls == ["infer"] * 2


def _lookup_model_fn(features, labels, mode):
  """A model_fn with a StringLookup (a lookup table it makes in each call) on a string feature."""
  word = tf_keras.layers.Embedding(4, 2)(tf_keras.layers.StringLookup(vocabulary=["a", "b"])(features["word"]))
  logits = tf_keras.layers.Dense(1)(word)
  if mode == tfps.ModeKeys.PREDICT:
    return tfps.EstimatorSpec(mode, predictions={"logit": logits})
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
  return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.Adagrad(0.5))


def test_a_model_fn_with_a_lookup_table_trains_and_exports_a_savedmodel_that_serves(cluster, tmp_path):
  """The export keeps the tables the model_fn makes: the saver traced the serving function again and made new ones
  that no saved object held ("... not reachable from root")."""
  def input_fn(mode, input_context=None):
    words, labels = np.array(["a", "b", "c"] * 20), np.array([[1.0], [0.0], [0.0]] * 20, np.float32)
    return tf.data.Dataset.from_tensor_slices(({"word": words}, labels)).repeat().batch(6)

  estimator = tfps.Estimator(_lookup_model_fn, model_dir=str(tmp_path / "run"), cluster=cluster)
  estimator.train(input_fn, max_steps=30)
  path = estimator.export_saved_model(str(tmp_path / "export"), {"word": tf.TensorSpec([None], tf.string)})
  served = tf.saved_model.load(path).signatures["serving_default"](word=tf.constant(["a", "b", "c"]))["logit"]
  assert served.shape == (3, 1)
  assert served[0, 0] > 0 > served[1, 0]  # "a" learned as a click, "b" as none


def test_training_without_max_steps_ends_with_the_input(cluster, tmp_path):
  estimator = tfps.Estimator(synthetic.model_fn, model_dir=str(tmp_path), cluster=cluster,
                             params={"batch_size": 50, "eval_examples": 1000})  # 20 batches on each worker
  estimator.train(synthetic.eval_input_fn)
  step = int(estimator.distributed_model().global_step.numpy())
  assert 20 <= step <= 40
  assert checkpoints_lib.read_final_marker(str(tmp_path))["step"] == step
  assert estimator.latest_checkpoint().endswith(f"ckpt-{step}")


def _keras_model_fn(features, labels, mode):
  """A model_fn building a tf_keras.Model (its initializers draw their seeds from tf-keras, not from TensorFlow)."""
  inputs = tf.concat([tf.cast(tf.stack([features["user"], features["item"]], axis=1), tf.float32) / 1000.0,
                      features["dense"]], axis=1)
  model = tf_keras.Sequential([tf_keras.layers.Dense(8, activation="relu"), tf_keras.layers.Dense(1)])
  logits = model(inputs)[:, 0]
  if mode == tfps.ModeKeys.PREDICT:
    return tfps.EstimatorSpec(mode, predictions={"logits": logits})
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
  return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.SGD(0.1))


def test_model_fn_building_a_keras_model(cluster, tmp_path):
  """A tf_keras.Model built inside model_fn (its step counters exist only outside functions) trains and restores."""
  estimator = tfps.Estimator(_keras_model_fn, model_dir=str(tmp_path), cluster=cluster)
  estimator.train(synthetic.train_input_fn, max_steps=20)
  results = estimator.evaluate(synthetic.eval_input_fn, steps=3)
  assert results["global_step"] == 20 and results["examples"] == 3 * 64 and np.isfinite(results["loss"])
  assert np.isfinite(next(estimator.predict(synthetic.predict_input_fn))["logits"])


def test_model_fn_variables_made_from_tensors_of_the_trace_start_at_their_values_and_train(cluster, tmp_path):
  """`get_variable(initializer=tf.constant(...))`, as TF1 model_fns write: the variable is made outside the traced
  model_fn (where the trace's tensors cannot be used) from the constant's value. A `tf.Variable` of a computed tensor
  is lifted out of the function by TensorFlow, as before."""
  def model_fn(features, labels, mode, params):
    scale = tf.compat.v1.get_variable("scale", initializer=tf.constant([0.5]))
    shift = tf.Variable(tf.random.normal([1], seed=1), name="shift")
    spec = synthetic.model_fn(features, labels, mode, params)
    if mode != tfps.ModeKeys.TRAIN:
      return spec
    return tfps.EstimatorSpec(mode, loss=spec.loss * scale[0] + 0.01 * shift[0] ** 2, optimizer=spec.optimizer)

  estimator = tfps.Estimator(model_fn, model_dir=str(tmp_path), cluster=cluster)
  estimator.distributed_model().prepare(synthetic.train_input_fn)  # creates the variables, runs no step
  scale, = [v for v in estimator.distributed_model().model.variables.created if "scale" in v.name]
  shift, = [v for v in estimator.distributed_model().model.variables.created if "shift" in v.name]
  assert scale.numpy().tolist() == [0.5]
  start = shift.numpy()[0]
  estimator.train(synthetic.train_input_fn, max_steps=10)
  assert estimator.distributed_model().global_step.numpy() == 10
  assert scale.numpy()[0] != 0.5 and shift.numpy()[0] != start  # trained: the loss depends on both
  assert np.isfinite(estimator.evaluate(synthetic.eval_input_fn, steps=2)["loss"])  # in a plain process too


def _step_reading_model_fn(features, labels, mode, params):
  """A TF1 model_fn that reads the training step from the graph, as model_fns that schedule or log by it do."""
  step = tf.compat.v1.train.get_or_create_global_step()
  spec = synthetic.model_fn(features, labels, mode, params)
  if mode == tfps.ModeKeys.PREDICT:
    prob = spec.predictions["prob"]
    return tfps.EstimatorSpec(mode, predictions={"prob": prob, "step": tf.fill(tf.shape(prob), step)})
  if mode == tfps.ModeKeys.EVAL:
    seen = tf_keras.metrics.Mean(name="step_seen")
    seen.update_state(tf.cast(step, tf.float32))
    return tfps.EstimatorSpec(mode, loss=spec.loss, eval_metric_ops=dict(spec.eval_metric_ops, step_seen=seen))
  return tfps.EstimatorSpec(mode, loss=spec.loss + 0.0 * tf.cast(step, tf.float32), optimizer=spec.optimizer)


def test_get_global_step_in_model_fn_is_the_runs_step(cluster, tmp_path):
  """`tf.compat.v1.train.get_or_create_global_step()` gives the run's own step (it made a variable of the model_fn's
  that stayed 0), on the cluster, in a plain process after a checkpoint, and in an export."""
  estimator = tfps.Estimator(_step_reading_model_fn, model_dir=str(tmp_path / "model"), cluster=cluster)
  results = tfps.train_and_evaluate(estimator, tfps.TrainSpec(synthetic.train_input_fn, max_steps=30),
                                    tfps.EvalSpec(synthetic.eval_input_fn, steps=2, throttle_secs=0))
  assert results["global_step"] == 30 and results["step_seen"] == 30, results
  assert len(estimator.distributed_model().model.variables.created) == 6  # synthetic.model_fn's: no step of its own
  assert estimator.evaluate(synthetic.eval_input_fn, steps=2)["step_seen"] == 30
  assert next(estimator.predict(synthetic.predict_input_fn))["step"] == 30
  exported = estimator.export_saved_model(str(tmp_path / "export"), synthetic.serving_input_fn)
  served = tf.saved_model.load(exported).signatures["serving_default"](
      user=tf.constant([1], tf.int64), item=tf.constant([2], tf.int64), dense=tf.zeros([1, 2]))
  assert served["step"].numpy().tolist() == [30]


def test_a_seed_gives_the_same_initial_values_whatever_python_random_holds(cluster, tmp_path):
  """`tf_random_seed` fixes the initial values of tf-keras layers, whose initializers draw their seeds from Python's
  `random` unless tf-keras is seeded (a forked task reseeds `random`: each launch drew other values)."""
  def initial_values(seed, python_seed):
    random.seed(python_seed)  # another launch: another state of Python's generator
    config = tfps.RunConfig(tf_random_seed=seed)
    estimator = tfps.Estimator(_keras_model_fn, model_dir=str(tmp_path / f"{seed}-{python_seed}"), config=config,
                               cluster=cluster)
    estimator.distributed_model().prepare(synthetic.train_input_fn)  # creates the variables, runs no step
    return [np.concatenate([np.ravel(part.numpy()) for part in getattr(v, "variables", [v])])
            for v in estimator.distributed_model().model.variables.created]

  state = random.getstate()
  try:
    first, again, other = initial_values(5, 1), initial_values(5, 2), initial_values(6, 1)
  finally:
    random.setstate(state)
  kernels = [index for index, values in enumerate(first) if values.any()]  # the biases start at zero
  assert len(first) == 4 and len(kernels) == 2
  assert all(np.array_equal(a, b) for a, b in zip(first, again))
  assert not any(np.array_equal(first[index], other[index]) for index in kernels)


def test_throttle_secs_spaces_inline_evaluations(cluster, tmp_path):
  estimator = tfps.Estimator(synthetic.model_fn, model_dir=str(tmp_path), cluster=cluster,
                             config=tfps.RunConfig(save_checkpoints_steps=50, log_step_count_steps=50))
  results = tfps.train_and_evaluate(estimator, tfps.TrainSpec(synthetic.train_input_fn, max_steps=150),
                                    tfps.EvalSpec(synthetic.eval_input_fn, steps=2, throttle_secs=3600))
  # the first checkpoint is evaluated, the next ones are throttled, and the final step is always evaluated
  assert [r["step"] for r in evaluation.read_results(str(tmp_path))] == [50, 150]
  assert results["global_step"] == 150 and results["examples"] == 2 * 64


def test_evaluation_of_an_endless_input_needs_steps(trained):
  estimator, _, _ = trained
  with pytest.raises(ValueError, match=r"finite dataset, but `input_fn \(with steps=None\)` returns a repeated"):
    estimator.evaluate(synthetic.train_input_fn)
  assert estimator.evaluate(synthetic.train_input_fn, steps=2)["examples"] == 2 * BATCH
