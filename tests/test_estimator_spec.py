"""The Estimator value types and argument conventions, without a cluster."""

import pytest

import tfps
import tensorflow as tf
import tf_keras

from tfps.estimator import calls
from tfps.estimator.spec import ModelFnError, validate_spec


def test_names_mirror_tf_estimator():
  assert (tfps.ModeKeys.TRAIN, tfps.ModeKeys.EVAL, tfps.ModeKeys.PREDICT) == ("train", "eval", "infer")
  for name in ("Estimator", "EstimatorSpec", "ModeKeys", "RunConfig", "TrainSpec", "EvalSpec", "train_and_evaluate"):
    assert getattr(tfps, name) is getattr(tfps.estimator, name)


@pytest.mark.parametrize("spec, message", [
    ({"loss": 1.0}, "must return a tfps.EstimatorSpec in mode 'train', got dict"),
    (tfps.EstimatorSpec("eval", loss=tf.constant(1.0)), "called with mode 'train' but returned .*mode='eval'"),
    (tfps.EstimatorSpec("train", optimizer=tf_keras.optimizers.legacy.SGD()), "no `loss` in mode 'train'"),
    (tfps.EstimatorSpec("train", loss=tf.ones([3])), r"`loss` of shape \(3,\) in mode 'train'"),
    (tfps.EstimatorSpec("train", loss=tf.constant(1.0)), "TRAIN needs a tf-keras optimizer"),
])
def test_validate_spec_names_what_is_wrong(spec, message):
  with pytest.raises(ModelFnError, match=message):
    validate_spec(spec, tfps.ModeKeys.TRAIN)


def test_validate_spec_eval_and_predict():
  with pytest.raises(ModelFnError, match="no `predictions` in mode 'infer'"):
    validate_spec(tfps.EstimatorSpec("infer"), tfps.ModeKeys.PREDICT)
  with pytest.raises(ModelFnError, match="no `loss` in mode 'eval'"):
    validate_spec(tfps.EstimatorSpec("eval"), tfps.ModeKeys.EVAL)
  pair = (tf.constant(1.0), tf.constant(1.0))
  with pytest.raises(ModelFnError, match=r"eval_metric_ops\['auc'\] is a tuple .*tf-keras Metric"):
    validate_spec(tfps.EstimatorSpec("eval", loss=tf.constant(1.0), eval_metric_ops={"auc": pair}), "eval")
  spec = tfps.EstimatorSpec("eval", loss=tf.constant(1.0), eval_metric_ops={"auc": tf_keras.metrics.AUC()})
  assert validate_spec(spec, "eval") is spec


def test_spec_refuses_tf1_only_arguments_with_advice():
  with pytest.raises(TypeError, match="train_op has no meaning in TF2; return `optimizer=`"):
    tfps.EstimatorSpec("train", loss=tf.constant(1.0), train_op=tf.constant(0))
  with pytest.raises(TypeError, match="session hooks"):
    tfps.EstimatorSpec("train", training_hooks=[object()])
  with pytest.raises(TypeError, match="unexpected argument 'bogus'"):
    tfps.EstimatorSpec("train", bogus=1)
  with pytest.raises(ModelFnError, match=r"`mode` \('training'\) must be one of"):
    tfps.EstimatorSpec("training")


@pytest.mark.parametrize("kwargs, message", [
    ({"save_checkpoints_steps": 0}, r"`save_checkpoints_steps` \(0\) must be a positive integer or None"),
    ({"keep_checkpoint_max": -1}, r"`keep_checkpoint_max` \(-1\) must be a positive integer"),
    ({"log_step_count_steps": 2.5}, r"`log_step_count_steps` \(2.5\)"),
    ({"steps_per_execution": True}, r"`steps_per_execution` \(True\)"),
    ({"tf_random_seed": "7"}, r"`tf_random_seed` \('7'\) must be a non-negative integer"),
])
def test_run_config_errors_quote_the_value(kwargs, message):
  with pytest.raises(ValueError, match=message):
    tfps.RunConfig(**kwargs)


def test_specs_check_their_fields():
  assert tfps.RunConfig().save_checkpoints_steps == 1000
  with pytest.raises(TypeError, match="TrainSpec `input_fn` must be callable, got str"):
    tfps.TrainSpec("data.csv")
  with pytest.raises(ValueError, match=r"`max_steps` \(0\)"):
    tfps.TrainSpec(lambda: None, max_steps=0)
  with pytest.raises(ValueError, match=r"`throttle_secs` \(-1\) must be a non-negative number"):
    tfps.EvalSpec(lambda: None, throttle_secs=-1)
  assert tfps.EvalSpec(lambda: None, name="holdout").eval_dir_name == "eval_holdout"


def test_estimator_arguments():
  with pytest.raises(ValueError, match="`model_dir` is None and config.model_dir is None"):
    tfps.Estimator(lambda features, labels, mode: None)
  with pytest.raises(TypeError, match="`model_fn` must be callable, got int"):
    tfps.Estimator(3, model_dir="/tmp/x")
  with pytest.raises(TypeError, match="model_fn takes argument 'session'"):
    tfps.Estimator(lambda features, session: None, model_dir="/tmp/x")
  assert tfps.Estimator(lambda f, labels: None, config=tfps.RunConfig(model_dir="/tmp/y")).model_dir == "/tmp/y"


@pytest.mark.parametrize("input_fn", [
    lambda: tf.data.Dataset.range(3),
    lambda params: tf.data.Dataset.range(params["n"]),
    lambda input_context: tf.data.Dataset.range(3 * input_context.num_input_pipelines),
    lambda mode, config=None: tf.data.Dataset.range(3 if mode == "train" else 0),
])
def test_input_fn_signatures(input_fn):
  dataset = calls.call_input_fn(input_fn, tfps.ModeKeys.TRAIN, {"n": 3}, tfps.RunConfig())
  assert list(dataset.as_numpy_iterator()) == [0, 1, 2]


def test_input_fn_errors():
  with pytest.raises(TypeError, match="input_fn must be a function that builds a tf.data.Dataset .* got"):
    calls.call_input_fn(tf.data.Dataset.range(3), "train", {}, None)
  with pytest.raises(TypeError, match="input_fn takes argument 'batch_size', which tfps cannot supply"):
    calls.call_input_fn(lambda batch_size: None, "train", {}, None)
  with pytest.raises(TypeError, match="must return a tf.data.Dataset of .* got list"):
    calls.call_input_fn(lambda: [1, 2], "train", {}, None)


def test_model_fn_gets_a_fresh_params_copy():
  seen = []

  def model_fn(features, params):
    params["touched"] = True
    seen.append(dict(params))

  params = {"lr": 1}
  calls.call_model_fn(model_fn, None, None, "train", params, None)
  assert params == {"lr": 1} and seen == [{"lr": 1, "touched": True}]
