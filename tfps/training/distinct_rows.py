"""Sparse gradients known to hold each table row once reach the ps without being summed per row there.

A tf-keras legacy optimizer sums the duplicate ids of every sparse gradient before applying it (`Unique` and
`UnsortedSegmentSum`, on the variable's ps). A table looked up with distinct ids already gives a gradient with one slice
per row, and the sum changes nothing but costs the ps CPU in every step (bench/results/distinct_rows/NOTES.md: `Unique`
alone was 3.9% of the ps's CPU samples). While async training traces a step (`applying`), a table layer that looks up
distinct ids through `lookup` marks the ids each shard gathers, and the optimizer applies a gradient whose ids are
marked without the sum. Anywhere else (geo, sync, pipelined updates, one process, serving), `active()` is False and the
layer looks up as tf-keras does.

With `bf16_rows` (`tfps.training.wire`) every table lookup of the step sends its rows to the worker as bfloat16: a
distinct-ids table's through `lookup` (a `DynamicEmbedding` shard's through `gather`, its ids made and marked on its
ps), and each tf-keras `Embedding` layer's through `lookup` too, with its ids as they are (duplicates included, so
not marked: its gradient is summed per row on the ps as before).

Marks live per graph and name the exact tensors a gather reads: a gradient's ids are recognised through the ops that
keep a tensor's elements (`Identity`, `Reshape`, ...) from a marked tensor, and through nothing else, so ids that
were not marked (another layer's, or rows summed elsewhere) are summed as before.
"""

import contextlib
from typing import List, Optional
import weakref

import numpy as np
import tensorflow as tf

from tfps import _tf_private
from tfps.training import strategy as strategy_lib
from tfps.training import wire

# Ops whose output holds exactly the elements of their first input (none added, none repeated).
_ELEMENTS_KEPT = frozenset({"Identity", "Reshape", "Squeeze", "ExpandDims"})
_MOST_HOPS = 16

_active = weakref.WeakKeyDictionary()  # graph whose step async training is tracing -> rows cross as bfloat16
_marks = weakref.WeakKeyDictionary()  # graph -> names of tensors of distinct ids a gather reads


def active() -> bool:
  """Whether the graph being built is a step async training traces with distinct-row gradients (`applying`)."""
  return not tf.executing_eagerly() and tf.compat.v1.get_default_graph() in _active


@contextlib.contextmanager
def applying(optimizer, bf16_rows: bool = False):
  """While a step's computation and updates are traced (in one graph): `lookup` marks the ids it gathers (and, with
  `bf16_rows`, sends the rows to the worker as bfloat16: `tfps.training.wire`), and `optimizer` (a tf-keras legacy
  optimizer) applies a sparse gradient whose ids are marked without summing them per row first. With `bf16_rows`
  every tf-keras `Embedding` layer looks up through `lookup` too (`_embedding_lookup`)."""
  graph = tf.compat.v1.get_default_graph()
  added = graph not in _active
  if added:
    _active[graph] = bf16_rows
  narrow = _tf_private.embedding_calls(_embedding_lookup) if bf16_rows else contextlib.nullcontext()
  try:
    with _tf_private.sparse_updates_unsummed(optimizer, is_distinct), narrow:
      yield
  finally:
    if added:
      del _active[graph]


def lookup(embeddings, ids: tf.Tensor, distinct: bool = True) -> tf.Tensor:
  """The rows of `ids` (1-D; each id once where `distinct`) in `embeddings` (a table variable, or its shards as
  ParameterServerStrategy partitioned it: whole rows, in order), gathered from each shard (with ids marked as distinct
  where `distinct`); as `tf.nn.embedding_lookup` gives them."""
  shards = strategy_lib.shards_of(embeddings)
  if len(shards) == 1:
    return gather(shards[0], ids, distinct)
  sizes = [int(shard.shape[0]) for shard in shards]
  ends = np.cumsum(sizes)
  shard_of = tf.searchsorted(tf.constant(ends, ids.dtype), ids, side="right", out_type=tf.int32)
  local = ids - tf.gather(tf.constant(ends - sizes, ids.dtype), shard_of)
  parts = tf.dynamic_partition(local, shard_of, len(shards))
  positions = tf.dynamic_partition(tf.range(tf.size(ids)), shard_of, len(shards))
  rows: List[tf.Tensor] = [gather(shard, part, distinct) for shard, part in zip(shards, parts)]
  return tf.dynamic_stitch(positions, rows)


def gather(shard, ids: tf.Tensor, distinct: bool = True, ids_on: Optional[str] = None) -> tf.Tensor:
  """The rows of `ids` in `shard` (a variable), gathered on its ps and returned by an op placed apart from it, as
  `tf.nn.embedding_lookup` does (its identity), so that ops on the rows' metadata (the gradient's `Shape`) run where
  the rows are used, not on the ps (a transfer per table and step); as bfloat16 on the way with `bf16_rows`.
  `ids_on`: the device where `ids` are (made on the shard's ps, they are marked there, not sent to the caller and
  back); None: the caller's."""
  with strategy_lib.on_device(ids_on):
    rows = tf.gather(shard, _marked(ids) if distinct else ids)
  if _active.get(tf.compat.v1.get_default_graph()):  # tracing a step with bf16_rows
    return wire.crossed(rows, destination=None, source=shard.device)
  return tf.identity(rows)


def _embedding_lookup(layer, ids, original_call):
  """A tf-keras `Embedding` layer's call while a step with `bf16_rows` is traced: its rows gathered through `lookup`
  (ids as they are), as the layer gives them; the layer's own call for sparse or ragged ids, sparse outputs and
  tables that are not float32."""
  if (not isinstance(ids, tf.Tensor) or layer.sparse or layer.embeddings.dtype != tf.float32
      or not (ids.dtype.is_integer or ids.dtype.is_floating)):
    return original_call(layer, ids)
  if ids.dtype not in (tf.int32, tf.int64):
    ids = tf.cast(ids, tf.int32)  # as the layer does
  rows = lookup(layer.embeddings, tf.reshape(ids, [-1]), distinct=False)
  rows = tf.reshape(rows, tf.concat([tf.shape(ids), [layer.output_dim]], 0))
  return rows if layer.compute_dtype == layer.variable_dtype else tf.cast(rows, layer.compute_dtype)


def is_distinct(ids: tf.Tensor) -> bool:
  """Whether `ids` (a sparse gradient's) are ids `lookup` marked, through ops that keep their elements."""
  tensor = ids
  for _ in range(_MOST_HOPS):
    if not hasattr(tensor, "op"):  # an eager tensor
      return False
    if tensor.name in _marks.get(tensor.graph, ()):
      return True
    if tensor.op.type not in _ELEMENTS_KEPT:
      return False
    tensor = tensor.op.inputs[0]
  return False


def _marked(ids: tf.Tensor) -> tf.Tensor:
  """`ids` (distinct), marked where `applying` is active, as the tensor a gather then reads."""
  if active():
    ids = tf.identity(ids, name="distinct_ids")
    _marks.setdefault(ids.graph, set()).add(ids.name)
  return ids
