"""Which rows of each table changed since the last delta export, recorded on the ps where the rows live.

A `TouchedRows` keeps, beside every variable shard that takes sparse updates (an embedding table's shard), a bool
vector with one entry per row: the step's update of the shard sets the entries of the rows it changes, in the same
conditional branch on the ps (`exactly_once.OncePerPs.run`, the one place async and sync training apply a variable's
update and geo training pushes a round's rows), so a step skipped there marks nothing. The delta exporter reads, per shard, the ids marked and their rows
(gathered on the ps: only those rows cross the network), and clears the marks it shipped once the delta is written.

A variable updated densely gets no record: it is shipped whole in every delta.
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
    record = self._record_beside(shard)
    rows = tf.reshape(tf.cast(rows, tf.int64), [-1])
    with tf.device(record.device):
      return record.scatter_update(tf.IndexedSlices(tf.ones_like(rows, tf.bool), rows)).op

  def _record_beside(self, shard) -> tf.Variable:
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


def mark_updated(variable, gradient) -> list:
  """In a traced update of `variable` by `gradient`, under the strategy in scope: the ops marking its rows where
  touched rows are tracked and the gradient is sparse (else none)."""
  if not isinstance(gradient, tf.IndexedSlices) or not tf.distribute.has_strategy():
    return []
  records = _active.get(tf.distribute.get_strategy().extended)
  if records is None or not records.watches(variable):
    return []
  return [records.mark(variable, gradient.indices)]
