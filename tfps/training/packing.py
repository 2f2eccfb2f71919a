"""Fewer transfers per step: tensors that cross between a worker and one ps together travel packed in one tensor.

Each tensor crossing between processes is one gRPC `RecvTensor` call with its own rendezvous, and on a recommender's
small dense layers that per-tensor cost, not the bytes, is most of what a ps spends per step. Both training paths use
these helpers through `tfps.training.asynchronous.AsyncRunner`:

- `transferred`: a list of tensors of one dtype moved to another device in one tensor (the dense gradients of a ps go
  there this way, `tfps.training.ps_records`).
- `PackedReads.reading`: while a step is traced, the small dense variables of each ps are read in one transfer per step:
  at the step's first read of any of them, all of that ps's are read and concatenated on the ps, and split on the
  worker; every whole read (`tf.convert_to_tensor`, `value()`, what tf-keras layers do) of one of them returns its
  part. The reads are the variables' own `ReadVariableOp`s, made where the step's first read is, so each step reads
  the latest values and tf.function still orders them before the step's updates. The gradient tapes see each part
  the step uses as its variable's read, and nothing of the concatenation and split: gradients reach the variables as
  they do unpacked (on the worker, then packed per ps by `transferred`), and a table read whole (a lookup from its
  value) keeps its sparse gradient. The step's tables, the variables it gathers rows from (`gathered`), are never
  part of a pack. A whole read after an op that may write the variable (one made since the packed read, in the same
  graph) reads the variable itself, as it would unpacked. Variables, checkpoints and everything outside the traced
  step are unchanged.
"""

import contextlib
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import tensorflow as tf

from tfps import _tf_private
from tfps.training import strategy as strategy_lib

# The largest variable (or shard) read packed: parts as small as tfps's unsharded dense weights.
MAX_PACKED_BYTES = 512 * 1024
# Ops that take a variable's handle and only read the variable; any other op taking it may write it.
_READS_ONLY = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape", "VarIsInitializedOp"})
# Ops that read some rows of a variable: a variable a step reads this way (a table) is not read whole in a pack.
_GATHERS = frozenset({"ResourceGather", "ResourceGatherNd"})


def transferred(tensors: Sequence[tf.Tensor], destination: Optional[str],
                source: Optional[str] = None) -> Tuple[tf.Tensor, List[tf.Tensor]]:
  """In a tf.function: `(packed, parts)`, `tensors` (fully defined shapes, one dtype) concatenated on device `source`
  and split again on `destination` (None: where the caller's ops run), so that one tensor crosses between the two.
  `packed` is the tensor on `destination`; `parts` are `tensors` there, in order and shape. A vector (a bias) is
  packed and unpacked as it is: no reshape on either side."""
  with strategy_lib.on_device(source):
    packed = tf.concat([_reshaped(tensor, [-1]) for tensor in tensors], 0)
  with strategy_lib.on_device(destination):
    packed = tf.identity(packed, name="tfps_packed_in")
    parts = tf.split(packed, [tensor.shape.num_elements() for tensor in tensors])
    return packed, [_reshaped(part, tensor.shape) for part, tensor in zip(parts, tensors)]


def _reshaped(tensor: tf.Tensor, shape) -> tf.Tensor:
  """`tf.reshape(tensor, shape)`, or `tensor` itself where it is a vector and `shape` one too (a reshape op each step
  on the ps otherwise)."""
  tensor = tf.convert_to_tensor(tensor)
  return tensor if tensor.shape.rank == 1 and len(shape) == 1 else tf.reshape(tensor, shape)


def packable(variable) -> bool:
  """Whether `variable` (a variable or a shard) is read packed: trainable, floating, of known shape, at most
  `MAX_PACKED_BYTES`."""
  return (variable.trainable and variable.dtype.is_floating and variable.shape.is_fully_defined()
          and variable.shape.num_elements() * variable.dtype.size <= MAX_PACKED_BYTES)


class PackedReads:
  """Reads the small dense variables of each ps in one transfer per step (see the module docstring)."""

  @contextlib.contextmanager
  def reading(self, variables: Iterable[tf.Variable], tables: Iterable[tf.Variable] = ()):
    """While a step is traced: every whole read of one of `variables` (or of a shard of one) that is `packable` returns
    its part of its ps's packed read, made once per graph being traced (a step, a loop body, a branch).

    The `tables` (variables or shards the step gathers rows from, `gathered`) are not part of a pack: read whole
    every step, a small table would cost more than its rows; a whole read of one is its own read."""
    groups: Dict[Tuple[str, tf.DType], list] = {}
    seen = {strategy_lib.variable_id(part) for table in tables for part in strategy_lib.shards_of(table)}
    for variable in variables:
      for part in strategy_lib.shards_of(variable):
        part = _tf_private.unwrapped(part)
        if id(part) not in seen and packable(part):
          seen.add(id(part))
          groups.setdefault((part.device, part.dtype), []).append(part)
    groups = {key: parts for key, parts in groups.items() if len(parts) > 1}  # one variable alone gains nothing
    packs: Dict[tuple, Dict[int, tf.Tensor]] = {}

    def read(part, key):
      graph = tf.compat.v1.get_default_graph()
      if (graph, key) not in packs:
        members = groups[key]
        with _tf_private.reads_unrecorded():  # each part the step uses is recorded below, alone
          with tf.device(key[0]):
            values = [_tf_private.own_value(member) for member in members]
          _, parts = transferred(values, destination=None, source=key[0])
        packs[(graph, key)] = ({id(member): value for member, value in zip(members, parts)},
                               {id(member): _handle_users(member, graph) for member in members})
      values, users = packs[(graph, key)]
      if any(op.type not in _READS_ONLY for op in _handle_users(part, graph) - users[id(part)]):
        return _tf_private.own_value(part)  # written since the packed read (or may have been)
      _tf_private.record_read(part, values[id(part)])
      return values[id(part)]

    with contextlib.ExitStack() as reads:
      for key, parts in groups.items():
        for part in parts:
          reads.enter_context(_tf_private.reading_through(part, lambda part=part, key=key: read(part, key)))
      yield


def _handle_users(variable, graph) -> frozenset:
  """The ops of `graph` (being traced) that take `variable`'s handle so far."""
  handle = variable.handle
  if hasattr(graph, "capture"):  # a function's graph: the handle is captured as one of its inputs
    handle = graph.capture(handle)
  return frozenset(handle.consumers())


def gathered(graph, variables: Iterable[tf.Variable]) -> list:
  """The parts (variables or shards) of `variables` whose rows `graph`, a traced step, gathers: its tables."""
  return [part for variable in variables for part in strategy_lib.shards_of(variable)
          if any(op.type in _GATHERS for op in _handle_users(_tf_private.unwrapped(part), graph))]
