"""The worker-local copies a geo round trains on (`tfps.training.geo`): their names on the worker (`LocalNames`), a
dense variable's whole copy (`DenseCopy`), and the touched rows of a table and of its optimizer slots (`TouchedRows`).
Each gives the round's pull (its fill ops) and push (`updates()`, for `ps_records.OncePerPs.run_all`)."""

import itertools
import os
import uuid
from typing import Callable, Dict, List, Optional

import tensorflow as tf

from tfps.training import strategy as strategy_lib


class LocalNames:
  """Names of worker-local variables: stable across traces of one GeoRunner, distinct between GeoRunners, and between
  chiefs. A worker outlives its chief, and keeps the local variables of the chief's rounds: a chief restarted (from a
  checkpoint, on another number of ps) that reused their names would take over a stale optimizer state, or variables
  of other shapes (seen: "var and accum do not have the same shape")."""

  _instances = itertools.count()
  _chief = ("", -1)  # (this process's id, its pid): drawn anew in a process forked from one that imported this module

  def __init__(self):
    self._prefix = f"tfps_geo_{self._chief_id()}_{next(self._instances)}"
    self._names: Dict[tuple, str] = {}

  @classmethod
  def _chief_id(cls) -> str:
    """This process's id: a task forked from tfps-launch's fork server (which imports this module) gets its own."""
    if cls._chief[1] != os.getpid():
      cls._chief = (uuid.uuid4().hex[:12], os.getpid())
    return cls._chief[0]

  def handle(self, variable, kind: str, shape, dtype) -> tf.Tensor:
    """A variable in the memory of the worker running the function (each worker has its own)."""
    key = (strategy_lib.variable_id(variable), kind)
    name = self._names.setdefault(key, f"{self._prefix}/{len(self._names)}")
    return tf.raw_ops.VarHandleOp(dtype=dtype, shape=shape, shared_name=name, container="")


class DenseCopy:
  """A whole local copy of one variable: pulled and pushed every round, or `resident` (the optimizer's state of a
  dense variable): pulled by a worker's first round only, then kept and updated on the worker, never pushed."""

  def __init__(self, variable, names: LocalNames, resident: bool = False):
    self.variable = variable
    self.resident = resident
    self.handle = names.handle(variable, "copy", variable.shape, variable.dtype)
    if resident:
      self.pull = tf.cond(tf.raw_ops.VarIsInitializedOp(resource=self.handle), tf.no_op,
                          lambda: tf.raw_ops.AssignVariableOp(resource=self.handle, value=variable.read_value()))
    else:
      self.pulled = variable.read_value()
      self.pull = tf.raw_ops.AssignVariableOp(resource=self.handle, value=self.pulled)

  def updates(self) -> List[tuple]:
    """The push: `(variable, [difference], add)` for `OncePerPs.run_all` (none for a resident copy)."""
    if self.resident:
      return []
    with tf.control_dependencies([self.pull]):
      local = tf.raw_ops.ReadVariableOp(resource=self.handle, dtype=self.variable.dtype)
    return [(self.variable, [local - self.pulled], self.variable.assign_add)]


class TouchedRows:
  """The touched rows of one embedding table (sharded or not) and of its optimizer slots, cached locally.

  `owners(k, rows)`, for a table layer keeping an id map on the ps: the ids rows `rows` of shard k belong to now. A
  row whose id changed between the pull and the push (evicted and given to another id meanwhile) is not pushed: the
  difference trained for the old id would land in the new id's fresh row.
  """

  def __init__(self, table, ids: tf.Tensor, slots: Callable, names: LocalNames, owners: Optional[Callable] = None):
    self.shards = strategy_lib.shards_of(table)
    rows = [shard.shape[0] for shard in self.shards]
    self.offsets = [sum(rows[:k]) for k in range(len(rows) + 1)]
    self.ids, _ = tf.unique(tf.reshape(tf.cast(ids, tf.int64), [-1]))
    self.ids = tf.sort(self.ids)
    # Where each shard's ids start in the sorted ids.
    self.starts = tf.searchsorted(self.ids, tf.constant(self.offsets, tf.int64), out_type=tf.int64)
    self.caches = []  # (variable, handle, local ids, filled value, fill op, shard index)
    self.owners = owners
    self.owned = []  # per shard: the ids its cached rows belonged to at the pull (with `owners`)
    for k, shard in enumerate(self.shards):
      local_ids = self.ids[self.starts[k]:self.starts[k + 1]] - self.offsets[k]
      self.owned.append(owners(k, local_ids) if owners else None)
      for variable in [shard] + slots(shard):
        handle = names.handle(variable, "rows", tf.TensorShape([None]).concatenate(variable.shape[1:]),
                              variable.dtype)
        filled = tf.gather(variable, local_ids)
        fill = tf.raw_ops.AssignVariableOp(resource=handle, value=filled)
        self.caches.append((variable, handle, local_ids, filled, fill, k))

  def virtual_ids(self, ids: tf.Tensor) -> tf.Tensor:
    """Ids under which the cached rows answer `ids`: shard k's row p of the cache is id `offsets[k] + p` (the rows
    of a sharded table are split in order, as `tf.nn.embedding_lookup` reads them)."""
    flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
    shard = (tf.searchsorted(tf.constant(self.offsets[1:-1], tf.int64), flat, side="right", out_type=tf.int64)
             if len(self.shards) > 1 else tf.zeros_like(flat))
    position = tf.searchsorted(self.ids, flat, out_type=tf.int64) - tf.gather(self.starts, shard)
    return tf.reshape(tf.gather(tf.constant(self.offsets[:-1], tf.int64), shard) + position, tf.shape(ids))

  def updates(self) -> List[tuple]:
    """The push: `(variable, [difference, rows], add, True)` per cached variable, for `OncePerPs.run_all`."""
    pushes = []
    locals_ = []
    for variable, handle, local_ids, filled, fill, k in self.caches:
      with tf.control_dependencies([fill]):
        locals_.append(tf.raw_ops.ReadVariableOp(resource=handle, dtype=variable.dtype))
    kept = {}
    with tf.control_dependencies(locals_):  # the owners are read once the round's training is done
      for k, owned in enumerate(self.owned):
        if owned is not None:
          local_ids = self.ids[self.starts[k]:self.starts[k + 1]] - self.offsets[k]
          kept[k] = tf.equal(self.owners(k, local_ids), owned)
    for (variable, handle, local_ids, filled, fill, k), local in zip(self.caches, locals_):
      delta = local - filled
      if k in kept:
        delta, local_ids = tf.boolean_mask(delta, kept[k]), tf.boolean_mask(local_ids, kept[k])
      pushes.append((variable, [delta, local_ids],
                     lambda delta, rows, variable=variable: variable.scatter_add(tf.IndexedSlices(delta, rows)), True))
    return pushes
