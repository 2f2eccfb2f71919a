"""Deltas of dynamic tables (`tfps.layers.DynamicEmbedding`): beside the rows that changed, each row shard's id map.

A delta (`tfps.training.deltas`) holds a dynamic table's rows changed since the last export like any table's (the
rows its steps updated and the rows its admissions gave out, marked on the ps: `tfps.training.touched_rows`), and for
each row shard, in `tensors.npz` under `table<t>/<shard>/`:
- `rows`, `keys`, `live`: the shard's changed rows (local to the shard), the raw id each was last given, and whether
  that id still maps to it (read on the shard's ps when the delta is written);
- `deleted`: the raw ids the shard evicted since the last export (recorded in its eviction, on its ps).
String ids are stored as their bytes and lengths (`<name>/bytes`, `<name>/lengths`): an archive read without pickle.

Applied to a served copy: the deleted ids leave its map, then each live id maps to its row, so an evicted id reads
the default (zeros), as an id never seen does, and a row given to another id answers for that one. The map's keys of
each row (`row_keys`) follow the changed rows. What only training reads (each row's last-seen clock, the stack of
free rows) is not shipped: a served copy answers as the full export does, it is not a checkpoint to train on from.

The tables are layers (`tfps.fit`) or the states a model_fn's layers share (the Estimator path, whose base export
copies each map from the ps: `copy_maps`); both give `name`, `key_dtype`, `embeddings` and `delta_shards()`.
"""

import os
from typing import Callable, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfps.errors import UsageError
from tfps.training import delta_files


class TableDeltas:
  """The dynamic tables of a model in its deltas: `layers` (each with `delta_shards()`), their rows and evictions
  recorded in `touched` (records made here, before training is traced)."""

  def __init__(self, layers, touched):
    self.touched = touched
    self.tables = []  # (name, key dtype, the rows' variable, [(row shard, offset)])
    self._owned = set()
    for layer in layers:
      shards = layer.delta_shards()
      for row_shard, rows_variable, _ in shards:
        touched.record_beside(rows_variable)
        touched.evicted_set(row_shard, layer.key_dtype)
        self._owned.update(id(variable) for variable in row_shard.variables)
      self.tables.append((layer.name, layer.key_dtype, layer.embeddings,
                          [(row_shard, offset) for row_shard, _, offset in shards]))

  def owns(self, weight) -> bool:
    """Whether `weight` is a table's bookkeeping (a row shard's map keys, clocks, free rows, counters): not among the
    variables a delta ships (a served copy loaded back has none of them but the map and its keys, shipped here)."""
    return id(weight) in self._owned

  def describe(self) -> List[dict]:
    return [{"name": name, "key_dtype": key_dtype.name, "shards": len(shards)}
            for name, key_dtype, _, shards in self.tables]

  def add(self, tensors: dict, weights) -> List[Tuple[object, np.ndarray]]:
    """Adds each table's map changes to `tensors` (where the rows' changed ids are, under `<index>/ids`, `index` the
    rows' variable's in `weights`); returns `(row shard, evicted ids)` to clear once the delta is written."""
    position = {id(weight): index for index, weight in enumerate(weights)}
    evicted = []
    for number, (_, key_dtype, embeddings, shards) in enumerate(self.tables):
      changed = tensors[f"{position[id(embeddings)]}/ids"]
      for shard_number, (row_shard, offset) in enumerate(shards):
        prefix = f"table{number}/{shard_number}"
        local = changed[(changed >= offset) & (changed < offset + row_shard.rows)] - offset
        keys, live = _owners(row_shard, local)
        gone = self.touched.evicted(row_shard)
        gone = np.zeros([0], key_dtype.as_numpy_dtype) if gone is None else gone
        tensors[f"{prefix}/rows"], tensors[f"{prefix}/live"] = local, live
        _put_keys(tensors, f"{prefix}/keys", keys, key_dtype)
        _put_keys(tensors, f"{prefix}/deleted", gone, key_dtype)
        evicted.append((row_shard, gone))
    return evicted

  def clear(self, evicted=None) -> None:
    """Forgets the evicted ids `evicted` (from `add`) once written; None: all recorded so far (a base written)."""
    for row_shard, ids in evicted if evicted is not None else self._recorded():
      self.touched.clear_evicted(row_shard, ids)

  def _recorded(self):
    for _, _, _, shards in self.tables:
      for row_shard, _ in shards:
        ids = self.touched.evicted(row_shard)
        if ids is not None:
          yield row_shard, ids


def _owners(row_shard, local: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """The ids rows `local` of `row_shard` were last given, and whether each still maps to its row; read on its ps."""
  rows = tf.constant(local, tf.int64)
  with row_shard.placed():
    keys = tf.gather(row_shard.row_keys, rows)
    live = tf.equal(tf.reshape(row_shard.map.lookup(keys), [-1]), rows)
  return keys.numpy(), live.numpy()


def _put_keys(tensors: dict, name: str, keys: np.ndarray, key_dtype) -> None:
  if key_dtype == tf.string:
    tensors[f"{name}/lengths"] = np.array([len(key) for key in keys], np.int64)
    tensors[f"{name}/bytes"] = np.frombuffer(b"".join(keys), np.uint8)
  else:
    tensors[name] = np.asarray(keys, np.int64)


def _keys(tensors, name: str, key_dtype) -> tf.Tensor:
  if key_dtype != tf.string:
    return tf.constant(tensors[name], tf.int64)
  data, ends = tensors[f"{name}/bytes"].tobytes(), np.cumsum(tensors[f"{name}/lengths"])
  return tf.constant([data[end - length:end] for end, length in zip(ends, tensors[f"{name}/lengths"])], tf.string)


def copy_maps(source, target) -> None:
  """Puts into `target` (a dynamic table's state built outside the strategy: a serving copy, its maps empty) the map
  and row keys of each row shard of `source` (the same table on the ps): what serving reads besides the rows."""
  if len(source.shards) != len(target.shards):
    raise UsageError(f"{source.name}: the serving copy has {len(target.shards)} row shard(s), training "
                     f"{len(source.shards)}; give the layer `num_shards={len(source.shards)}` so a copy built "
                     "outside the strategy has as many")
  for trained, served in zip(source.shards, target.shards):
    with trained.placed():
      keys, rows = trained.map.export()
    served.map.insert(keys, rows)
    served.row_keys.assign(trained.row_keys.read_value())


def apply_delta(shards_of: Callable[[int, str], Sequence], path: str) -> None:
  """Applies the map changes of the delta at `path` to the dynamic tables of a served copy (its rows applied by
  `tfps.training.deltas.apply_delta`); `shards_of(number, name)` gives the row shards of its table `number` (in the
  deltas' order) named `name`."""
  tables = delta_files.read_manifest(path).get("tables", [])
  if not tables:
    return
  with np.load(os.path.join(path, delta_files.TENSORS)) as tensors:
    for number, table in enumerate(tables):
      key_dtype = tf.as_dtype(table["key_dtype"])
      for shard_number, row_shard in enumerate(shards_of(number, table["name"])):
        prefix = f"table{number}/{shard_number}"
        rows, live = tensors[f"{prefix}/rows"], tensors[f"{prefix}/live"]
        keys = _keys(tensors, f"{prefix}/keys", key_dtype)
        handle = row_shard.map.resource_handle
        tf.raw_ops.LookupTableRemoveV2(table_handle=handle, keys=_keys(tensors, f"{prefix}/deleted", key_dtype))
        tf.raw_ops.LookupTableInsertV2(table_handle=handle, keys=tf.boolean_mask(keys, live),
                                       values=tf.constant(rows[live], tf.int64))
        row_shard.row_keys.scatter_update(tf.IndexedSlices(keys, tf.constant(rows, tf.int64)))
