"""ModelFnVariables without a cluster: one set of variables across calls and traces, metric state per run."""

import re

import pytest

import tfps  # pylint: disable=unused-import  # selects tf-keras before TensorFlow
import tensorflow as tf
import tf_keras

from tfps.estimator.spec import ModelFnError
from tfps.estimator.variables import ModelFnVariables


def tf1_style_forward(x):
  """Variables the three ways Estimator code makes them, one with a TF1 partitioner."""
  with tf.compat.v1.variable_scope("net", partitioner=tf.compat.v1.fixed_size_partitioner(2)):
    w = tf.compat.v1.get_variable("w", [4, 3])
    h = tf.compat.v1.layers.dense(tf.matmul(x, w), 5, name="hidden")
    return tf_keras.layers.Dense(2)(h)


def test_every_call_and_trace_gets_the_first_calls_variables():
  store = ModelFnVariables()
  x = tf.ones([2, 4])
  first = store.call(lambda: tf1_style_forward(x), "train")  # eager, like a local model's build
  names = [v.name for v in store.created]
  # The unnamed tf-keras layer is named by a process-wide counter: `dense`, or `dense_N` after other tests' layers.
  assert [re.sub(r"^net/dense_\d+/", "net/dense/", name) for name in names] == [
      "net/w:0", "net/hidden/kernel:0", "net/hidden/bias:0", "net/dense/kernel:0", "net/dense/bias:0"]

  @tf.function
  def traced(x):
    return store.call(lambda: tf1_style_forward(x), "eval")

  assert traced(x).numpy() == pytest.approx(first.numpy())
  assert traced(x + 0).numpy() == pytest.approx(first.numpy())
  assert [v.name for v in store.created] == names and len(store.trainable_variables_flat()) == 5


def test_later_calls_may_not_create_or_reorder_variables():
  store = ModelFnVariables()
  store.call(lambda: tf.compat.v1.get_variable("a", [2]), "train")
  with pytest.raises(ModelFnError, match=r"created a new variable 'b' \(shape \(3,\)\) in mode 'eval' on a later"):
    store.call(lambda: (tf.compat.v1.get_variable("a", [2]), tf.compat.v1.get_variable("b", [3])), "eval")
  with pytest.raises(ModelFnError, match="variable #0 is 'c' .* but the first call created 'a:0'"):
    store.call(lambda: tf.compat.v1.get_variable("c", [2]), "infer")


def test_metric_state_starts_from_zero_on_every_run():
  store = ModelFnVariables()

  def count(batch):
    metric = tf_keras.metrics.Sum()
    metric.update_state(tf.ones_like(batch))

  @tf.function(autograph=False)
  def evaluate():
    iterator = iter(tf.data.Dataset.range(10).batch(3))
    with store.metric_scope() as metrics:
      def body(element):
        store.call(lambda: count(element.get_value()), "eval")
        return (iterator.get_next_as_optional(),)
      tf.while_loop(lambda element: element.has_value(), body, (iterator.get_next_as_optional(),))
      return [v.read_value() for v in metrics.created]

  assert [float(v) for v in evaluate()] == [10.0]
  assert [float(v) for v in evaluate()] == [10.0]
  assert not store.created  # metric state is not model state
