"""Counting the steps a ps applied: one counter on every ps, incremented through the optimizer's own update.

`StepCounters` is a tf-keras layer to put in a model under test (a functional model's layer, or a layer built inside
a `model_fn`). It holds one tf-keras `Embedding` of one scalar row per ps, created one after another, so that
ParameterServerStrategy's round-robin placement puts one on each ps; each step looks the row up and adds a loss term
whose value is 0 and whose gradient with respect to the row is exactly 1. Under a tf-keras legacy Adagrad optimizer
the row's accumulator then grows by exactly 1 (1 squared) each time a step's update reaches that ps: in async and sync
mode (the update on the ps), and in geo mode (a table's accumulator rows are pushed to the ps as their difference).
A counter is the training itself, never a step counter the code under test sets.

At build the layer logs one line per counter naming its device (`placed_counters` reads them back from a log), and
`applied_per_ps` reads the counts from a checkpoint: a test asserts each ps's count, e.g.
`applied_per_ps(checkpoint, log) == {"ps:0": 400, "ps:1": 400}`.
"""

import re
from typing import Dict, Optional

from absl import logging
import tensorflow as tf
import tf_keras

from tfps import _tf_private
from tfps.training import strategy as strategy_lib

NAME = "applied_steps"  # the counters' layer names: applied_steps_0, applied_steps_1, ...
_PLACED = re.compile(rf"Applied-step counter {NAME}_(\d+) on /job:ps/replica:0/task:(\d+)/")
_VARIABLE = re.compile(rf"(?:^|/){NAME}_(\d+)/embeddings(?::0)?$")  # a counter's variable name


class StepCounters(tf_keras.layers.Layer):
  """Passes its input through; counts on each ps the steps whose update reached it (see the module docstring).

  Args:
    num_ps: the ps tasks of the cluster (one counter each); default: those of the current
      strategy (one tfps built: `tfps.fit` and the Estimator path build under theirs), 1 outside any.
  """

  def __init__(self, num_ps: Optional[int] = None, **kwargs):
    super().__init__(**kwargs)
    if num_ps is None:
      num_ps = strategy_lib.cluster_of(tf.distribute.get_strategy()).num_ps if tf.distribute.has_strategy() else 1
    self.num_ps = num_ps
    for index in range(num_ps):  # attributes, not a list: Keras tracks each as a layer of its own
      setattr(self, f"{NAME}_{index}", tf_keras.layers.Embedding(1, 1, embeddings_initializer="zeros",
                                                                  name=f"{NAME}_{index}"))

  @property
  def counters(self):
    """The counters' Embedding layers, counter 0 first."""
    return [getattr(self, f"{NAME}_{index}") for index in range(self.num_ps)]

  def build(self, input_shape):
    for counter in self.counters:  # one after another: round-robin over the ps
      with tf.name_scope(counter.name):  # its variable's name (checkpoints keep it) names the counter
        counter.build((None,))
      logging.info("Applied-step counter %s on %s", counter.name, counter.embeddings.device)
    super().build(input_shape)

  def call(self, inputs):
    rows = tf.concat([counter(tf.zeros([1], tf.int64)) for counter in self.counters], axis=0)
    self.add_loss(tf.reduce_sum(rows - tf.stop_gradient(rows)))  # value 0, gradient 1 for each counter's row
    return inputs


def placed_counters(log: str) -> Dict[int, str]:
  """`{counter index: "ps:N"}` from the lines `StepCounters` logged (a chief's log); the last line of each counter
  counts (a chief started again logs them again)."""
  return {int(index): f"ps:{task}" for index, task in _PLACED.findall(log)}


def applied_counts(checkpoint: str, initial_accumulator: float = 0.1) -> Dict[int, float]:
  """`{counter index: steps applied}` in `checkpoint` (a path, of either training path): each counter's Adagrad
  accumulator less its initial value (0.1 is tf-keras's default), not rounded. The counters are found by their
  variables' names in the checkpoint's object graph (the Estimator path's keys name no layer)."""
  graph = _tf_private.checkpoint_object_graph(checkpoint)
  counter_nodes = {}
  for node_id, node in enumerate(graph.nodes):
    for attribute in node.attributes:
      match = _VARIABLE.search(attribute.full_name)
      if match:
        counter_nodes[node_id] = int(match.group(1))
  reader, counts = tf.train.load_checkpoint(checkpoint), {}
  for node in graph.nodes:
    for slot in node.slot_variables:
      if slot.original_variable_node_id in counter_nodes and slot.slot_name == "accumulator":
        key = graph.nodes[slot.slot_variable_node_id].attributes[0].checkpoint_key
        counts[counter_nodes[slot.original_variable_node_id]] = (float(reader.get_tensor(key).reshape(-1)[0])
                                                                 - initial_accumulator)
  return counts


def applied_per_ps(checkpoint: str, log: str, initial_accumulator: float = 0.1) -> Dict[str, object]:
  """`{"ps:N": steps applied there}`, each counter's count (`applied_counts`) under the ps its log line names
  (`placed_counters`): an int where the count is within 0.01 of one, else the float read. Raises `ValueError` where a
  counter's placement is not in `log`, two counters share a ps, or the checkpoint holds no counter."""
  counts, placed = applied_counts(checkpoint, initial_accumulator), placed_counters(log)
  if not counts:
    raise ValueError(f"no {NAME} counter's accumulator in {checkpoint}")
  missing = sorted(set(counts) - set(placed))
  if missing:
    raise ValueError(f"no placement logged for counters {missing}; logged: {placed}")
  if len({placed[index] for index in counts}) != len(counts):
    raise ValueError(f"counters share a ps: {placed}")
  per_ps = {}
  for index, count in sorted(counts.items()):
    per_ps[placed[index]] = round(count) if abs(count - round(count)) < 0.01 else count
  return per_ps
