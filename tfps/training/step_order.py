"""What runs after what on each ps, in a tf.function: one op per ps after the updates, or the reads, traced so far of
given variables (what a step's record and a ps's decision wait for: `tfps.training.ps_records`)."""

from typing import Dict, Iterable, List

import tensorflow as tf

from tfps.training import strategy as strategy_lib


def after_updates(variables: Iterable[tf.Variable]) -> List[tf.Operation]:
  """In a tf.function: one op per ps that runs after the updates so far (in program order) of every one of
  `variables` on it. A record made after these is made after the whole step."""
  by_device = {}
  for variable in variables:
    for part in strategy_lib.shards_of(variable):
      # Any op taking the variable's handle is ordered after the variable's earlier updates by tf.function's automatic
      # control dependencies; this one reads nothing but the shape.
      by_device.setdefault(part.device, []).append(tf.raw_ops.VariableShape(input=part.handle))
  return grouped(by_device)


def after_reads(variables: Iterable[tf.Variable]) -> Dict[str, tf.Operation]:
  """In a tf.function: for each ps, one op (on it) that runs after every op traced so far in the current graph that
  takes the handle of one of `variables` on that ps (in a loop body: that iteration's reads of them, an embedding
  lookup among them, which also waits for the ids the worker sends)."""
  graph = tf.compat.v1.get_default_graph()
  by_device = {}
  for variable in variables:
    for part in strategy_lib.shards_of(variable):
      handle = _captured(graph, part.handle)
      if handle is not None and handle.consumers():
        by_device.setdefault(part.device, []).extend(handle.consumers())
  return dict(zip(sorted(by_device), grouped(by_device)))


def _captured(graph, tensor):
  """`tensor` (a variable's handle) as `graph`, a function graph maybe nested in others, captured it (directly, or
  as the graph around it did); None where it did not."""
  captures = getattr(graph, "captures", None)
  if captures is None:
    return None
  outer = _captured(getattr(graph, "outer_graph", None), tensor)
  for external, internal in captures:
    if external is tensor or (outer is not None and external is outer):
      return internal
  return None


def grouped(by_device: Dict[str, list]) -> List[tf.Operation]:
  """One op on each device that runs after that device's ops."""
  groups = []
  for device, ops in sorted(by_device.items()):
    with tf.device(device):
      groups.append(tf.group(*ops))
  return groups
