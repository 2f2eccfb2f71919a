"""Which rows of each table changed since the last delta export, recorded on the ps where the rows live.

A `TouchedRows` keeps, beside every variable shard that takes sparse updates (an embedding table's shard), a bool
vector with one entry per row: the step's update of the shard sets the entries of the rows it changes, in the same
conditional branch on the ps (`ps_records.OncePerPs.run`, the one place async and sync training apply a variable's
update and geo training pushes a round's rows), so a step skipped there marks nothing. The delta exporter reads, per shard, the ids marked and their rows
(gathered on the ps: only those rows cross the network), and clears the marks it shipped once the delta is written.

A variable updated densely gets no record: it is shipped whole in every delta.

A dynamic table's row shard (`tfps.models.dynamic_rows.RowShard`) whose deltas are written also gets a set of the
raw ids it evicted (`mark_evicted`, in its eviction on its ps); its admissions mark the rows they give out
(`mark_rows`). A delta ships the evicted ids as deletions and clears those it shipped.
"""

import threading
import weakref
from typing import Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

_active = weakref.WeakKeyDictionary()  # strategy.extended -> TouchedRows
_lock = threading.Lock()


class TouchedRows:
  """The touched-row records of one strategy's table shards, made as a step's update is first traced."""

  def __init__(self, strategy):
    self._strategy = strategy
    self._records: Dict[int, Tuple[tf.Variable, tf.Variable]] = {}  # id(shard) -> (shard, record)
    self._watched: Dict[int, object] = {}  # id(shard) -> shard: those `mark_updated` marks
    self._evicted: Dict[int, Tuple[object, tf.lookup.experimental.MutableHashTable]] = {}  # id(row shard) -> set

  def watch(self, shards) -> None:
    """`mark_updated` marks the rows of `shards` (a model's variables; not, say, the optimizer's slots)."""
    self._watched.update({id(shard): shard for shard in shards})

  def watches(self, shard) -> bool:
    return id(shard) in self._watched

  def record_of(self, shard) -> Optional[tf.Variable]:
    """The record beside `shard`, or None where no sparse update of it was traced."""
    found = self._records.get(id(shard))
    return None if found is None else found[1]

  def mark(self, shard, rows: tf.Tensor) -> tf.Operation:
    """In a tf.function, on `shard`'s ps after its update: rows `rows` (of the shard) changed."""
    record = self.record_beside(shard)
    rows = tf.reshape(tf.cast(rows, tf.int64), [-1])
    with tf.device(record.device):
      return record.scatter_update(tf.IndexedSlices(tf.ones_like(rows, tf.bool), rows)).op

  def record_beside(self, shard) -> tf.Variable:
    """The record beside `shard`, made now if there is none (outside a replica's trace: before training)."""
    with _lock:
      if id(shard) not in self._records:
        with tf.init_scope(), self._strategy.scope(), self._strategy.extended.colocate_vars_with(shard):
          record = tf.Variable(tf.zeros([shard.shape[0]], tf.bool), trainable=False, name="tfps_touched_rows",
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self._records[id(shard)] = (shard, record)
      return self._records[id(shard)][1]

  def changed(self, shard) -> Tuple[np.ndarray, np.ndarray]:
    """`(rows, values)`: the rows of `shard` marked since the last `clear` and their values, found and gathered on
    its ps. A shard with no record yet changed nowhere by a sparse update: `(None, None)`."""
    record = self.record_of(shard)
    if record is None:
      return None, None
    rows, values = _gathered(shard, record)
    return rows.numpy(), values.numpy()

  def clear(self, shard, rows: np.ndarray) -> None:
    """Clears the marks of `rows` of `shard` (those a written delta holds)."""
    record = self.record_of(shard)
    if record is not None and len(rows):
      record.scatter_update(tf.IndexedSlices(tf.zeros([len(rows)], tf.bool), tf.constant(rows, tf.int64)))

  def evicted_set(self, row_shard, key_dtype=None):
    """The set (a `MutableHashTable` of id -> 1) of ids `row_shard` evicted since the last `clear_evicted`, on its
    ps; made with `key_dtype` when first asked for (None: not made, None returned)."""
    with _lock:
      if id(row_shard) not in self._evicted and key_dtype is not None:
        with tf.init_scope(), tf.device(row_shard.device or None):
          self._evicted[id(row_shard)] = (row_shard, tf.lookup.experimental.MutableHashTable(
              key_dtype, tf.int64, default_value=0, name="tfps_evicted_ids"))
      found = self._evicted.get(id(row_shard))
      return None if found is None else found[1]

  def evicted(self, row_shard) -> Optional[np.ndarray]:
    """The ids `row_shard` evicted since the last `clear_evicted` (None where it never evicted under tracking)."""
    found = self.evicted_set(row_shard)
    return None if found is None else found.export()[0].numpy()

  def clear_evicted(self, row_shard, ids: np.ndarray) -> None:
    """Forgets the evicted `ids` of `row_shard` (those a written delta holds)."""
    found = self.evicted_set(row_shard)
    if found is not None and len(ids):
      found.remove(tf.constant(ids, found.key_dtype))


@tf.function(autograph=False)
def _gathered(shard, record):
  with tf.device(record.device):
    rows = tf.reshape(tf.where(record.read_value()), [-1])
    return tf.identity(rows), tf.gather(shard, rows)


def track(strategy) -> TouchedRows:
  """Starts recording touched rows for the steps traced from now on under `strategy`; returns the records."""
  with _lock:
    if strategy.extended not in _active:
      _active[strategy.extended] = TouchedRows(strategy)
    return _active[strategy.extended]


def _records() -> Optional[TouchedRows]:
  """The records of the strategy in scope, where it tracks touched rows."""
  return _active.get(tf.distribute.get_strategy().extended) if tf.distribute.has_strategy() else None


def mark_updated(variable, gradient) -> list:
  """In a traced update of `variable` by `gradient`, under the strategy in scope: the ops marking its rows where
  touched rows are tracked and the gradient is sparse (else none)."""
  return mark_rows(variable, gradient.indices) if isinstance(gradient, tf.IndexedSlices) else []


def mark_rows(variable, rows) -> list:
  """In a traced write of rows `rows` of `variable` (on its ps), under the strategy in scope: the ops marking them
  where touched rows are tracked and `variable` is watched (else none)."""
  records = _records()
  if records is None or not records.watches(variable):
    return []
  return [records.mark(variable, rows)]


def mark_evicted(row_shard, ids) -> list:
  """In a dynamic table's traced eviction of `ids` (on `row_shard`'s ps), under the strategy in scope: the ops
  adding them to the shard's evicted ids where touched rows are tracked (else none)."""
  records = _records()
  if records is None:
    return []
  evicted = records.evicted_set(row_shard, ids.dtype)
  return [evicted.insert(ids, tf.ones(tf.shape(ids), tf.int64))]
