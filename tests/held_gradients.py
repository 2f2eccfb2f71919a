"""A layer function whose gradient is held in the worker (the test decides how long): a step's other gradients reach
the ps first, as when a worker dies while sending its gradients."""

import tensorflow as tf


def gate(wait):
  """Identity whose gradient passes through `wait(gradient) -> gradient` (a Python function, run in the worker)."""
  @tf.custom_gradient
  def gated(x):
    def gradient(upstream):
      waited = tf.py_function(wait, [upstream], upstream.dtype)
      waited.set_shape(upstream.shape)
      return waited
    return tf.identity(x), gradient
  return gated
