"""One row shard's id-to-row bookkeeping of a `DynamicEmbedding` (`tfps.models.dynamic_embedding`), on its ps.

A `RowShard` keeps, next to its rows: a `MutableHashTable` from id to row, the sightings of ids not admitted yet, the
id and last-seen step of every row, a stack of free rows, and its counters (admitted, evicted, fallbacks). Its
`lookup_or_admit` admits ids seen `min_count` times, frees rows of ids not seen for `steps_to_live` calls, and runs
once per step and shard under a runner (`tfps.training.tables.StepMarks`), inside a `tf.CriticalSection` of its own,
so concurrent steps of several workers never hand one row to two ids.
"""

import contextlib
import uuid
import weakref
from typing import Callable, Optional

import tensorflow as tf

from tfps.training import tables
from tfps.training import touched_rows

EVICTION_SCANS_PER_LIFETIME = 10  # an id is freed between `steps_to_live` and 1.1x that many calls after last seen
_LAST_HELD = weakref.WeakKeyDictionary()  # graph -> the output of the last shard lock taken in it


def _hold_in_turn(lock, inputs, body):
  """`lock.execute(body)` once `inputs` are there and every shard lock taken before in this graph was let go.

  A function holds at most one shard lock at a time, so the locks of two functions cannot wait on each other. Without
  it a lock is taken as soon as its inputs are there, and a geo round (one lock per batch and shard) could take a
  later batch's lock on one shard before an earlier batch's on the other; two workers' rounds doing this in opposite
  orders waited on each other (seen: a geo run on the Estimator path held for 140 s, until gRPC dropped a connection).
  """
  graph = tf.compat.v1.get_default_graph()
  before = _LAST_HELD.get(graph)
  with tf.control_dependencies(inputs + ([before] if before is not None else [])):
    held = lock.execute(body)
  _LAST_HELD[graph] = held
  return held


def build_lock(index: int) -> tf.CriticalSection:
  """A shard's critical section, on the current device, with a shared name of its own: by default every table's
  shard `index` would share one mutex (named `lock_{index}/`) on a ps, and two tables of one model hang a step on it."""
  return tf.CriticalSection(name=f"lock_{index}", shared_name=f"tfps_table_lock_{uuid.uuid4().hex}")


def shaped_lookup(table, keys):
  """`table.lookup(keys)` with the shape of `keys` (a hash table's lookup loses it while traced)."""
  return tf.reshape(table.lookup(keys), tf.shape(keys))


class RowShard(tf.Module):
  """The id-to-row bookkeeping of one row shard, on that shard's ps."""

  def __init__(self, rows: int, base: int, key_dtype, device: str, strategy, colocate_with, index: int,
               lock: Optional[tf.CriticalSection] = None):
    """`lock`: the critical section of a shard that shares its rows' variable with other shards (a table the
    partitioner kept whole, with `num_shards` maps over it); by default one of its own."""
    super().__init__(name=f"shard_{index}")
    self.rows = rows
    self.base = base  # where the shard's rows start in the variable holding them
    self.device = device
    empty_key = "" if key_dtype == tf.string else 0
    with tf.init_scope(), self.placed():  # resources, not function-local, when a model_fn builds the layer in a trace
      self.map = tf.lookup.experimental.MutableHashTable(key_dtype, tf.int64, default_value=-1, name=f"map_{index}")
      self.counts = tf.lookup.experimental.MutableHashTable(key_dtype, tf.int64, default_value=0,
                                                            name=f"counts_{index}")
      # Concurrent steps of several workers take turns; a copy outside a strategy (serving) runs one at a time, and a
      # mutex, not being trackable, could not be saved in its SavedModel.
      self.lock = lock or (build_lock(index) if strategy else None)
    scope = strategy.extended.colocate_vars_with(colocate_with) if strategy else contextlib.nullcontext()
    with scope:
      def variable(name, make, dtype=tf.int64):  # `make()` inside the initializer: a model_fn may build in a trace
        return tf.Variable(lambda: tf.cast(make(), dtype), dtype=dtype, trainable=False, name=name)
      self.row_keys = variable("row_keys", lambda: tf.fill([rows], tf.constant(empty_key, key_dtype)), key_dtype)
      self.last_seen = variable("last_seen", lambda: tf.fill([rows], tf.constant(-1, tf.int64)))
      self.free = variable("free", lambda: tf.range(rows - 1, -1, -1, dtype=tf.int64))
      self.num_free = variable("num_free", lambda: rows)
      self.clock = variable("clock", lambda: 0)
      self.admitted = variable("admitted", lambda: 0)
      self.evicted = variable("evicted", lambda: 0)
      self.fallbacks = variable("fallbacks", lambda: 0)

  def placed(self):
    """On the shard's ps; unplaced outside a strategy (a serving copy must not name the devices it was saved on)."""
    return tf.device(self.device) if self.device else contextlib.nullcontext()

  def lookup(self, keys):
    with self.placed():
      return shaped_lookup(self.map, keys)

  def lookup_or_admit(self, keys, rows_variable, initializer, slots, min_count: int, steps_to_live: Optional[int]):
    """Rows of `keys` (distinct), admitting ids seen `min_count` times and evicting stale ones; -1: the default.

    Inside a runner's step (`tables.current_step()`), the bookkeeping runs once per step on this shard: a step run
    again after a worker failure, whose first run got here, only looks up (it neither counts, admits, evicts nor
    ticks the clock), as its updates are skipped on a ps that applied them."""
    def bookkeeping(last=lambda: []):
      return self._bookkeeping(keys, rows_variable, initializer, slots, min_count, steps_to_live, last)

    step = tables.current_step()
    with self.placed():
      # Everything the bookkeeping reads is on this ps before the lock is taken, so nothing inside waits for the
      # worker. A worker's tensor read inside would come through a `tf.cond` switch placed on the worker: a worker
      # dying after the clock's tick and before that tensor came left the tick without the step's mark (seen in geo
      # under kills: a shard's clock one ahead).
      inputs = [tf.identity(keys)]
      if step is not None:
        record = step.marks.vector_beside(rows_variable)
        inputs += [tf.identity(step.mark), tf.identity(step.slot)]
      keys = inputs[0]

      def body():
        if step is None:
          return bookkeeping()
        mark, slot = inputs[1:]

        def marked():
          return bookkeeping(last=lambda: [record.scatter_max(tf.IndexedSlices(tf.reshape(mark, [1]), slot))])
        return tf.cond(record.sparse_read(slot)[0] >= mark, lambda: shaped_lookup(self.map, keys), marked)

      if self.lock is None:
        return body()
      return _hold_in_turn(self.lock, inputs, body)

  def _bookkeeping(self, keys, rows_variable, initializer, slots, min_count: int, steps_to_live: Optional[int],
                   last: Callable[[], list] = lambda: []):
    """`lookup_or_admit` on this shard, under its lock: evicts stale rows (every `steps_to_live // 10` calls), admits
    the ids seen `min_count` times, and returns the rows of `keys`; `last()`: the step's mark, written last."""
    # The writes a step run again must not repeat (the clock's tick, the sightings, the fallbacks counted, and
    # `last()`: the step's mark) come last and together, each waiting only for the rest: a step cancelled in the
    # middle of its bookkeeping (its worker died) leaves them all undone, and what ran before them (admission,
    # eviction, `last_seen`) comes out the same when the step runs again.
    clock = self.clock.read_value() + 1
    evicted = tf.no_op()
    if steps_to_live is not None:  # a scan of the shard's rows every `steps_to_live // 10` calls, not every call
      every = max(1, steps_to_live // EVICTION_SCANS_PER_LIFETIME)
      evicted = tf.cond(tf.equal(clock % every, 0), lambda: self._evict(clock - steps_to_live),
                        lambda: tf.constant(0, tf.int64))
    with tf.control_dependencies([evicted]):
      rows = shaped_lookup(self.map, keys)
    missing = tf.boolean_mask(keys, rows < 0)
    ready, sightings = missing, None
    if min_count > 1:
      seen = shaped_lookup(self.counts, missing) + 1
      ready = tf.boolean_mask(missing, seen >= min_count)
      sightings = (tf.boolean_mask(missing, seen < min_count), tf.boolean_mask(seen, seen < min_count))
    admitted, fallbacks = self._admit(ready, rows_variable, initializer, slots, remove_counts=min_count > 1)
    with tf.control_dependencies([admitted]):
      rows = shaped_lookup(self.map, keys)
    live = tf.boolean_mask(rows, rows >= 0)
    seen_now = self.last_seen.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(live), clock), live))
    with tf.control_dependencies([seen_now, rows]):
      final = ([self.clock.assign_add(1), self.fallbacks.assign_add(fallbacks)] +
               ([self.counts.insert(*sightings)] if sightings else []) + last())
    with tf.control_dependencies(final):
      return tf.identity(rows)

  def _admit(self, ready, rows_variable, initializer, slots, remove_counts: bool):
    """Gives free rows to `ready` ids: fresh row values, optimizer slot rows back to their initial values.

    Returns the op and how many ids found no free row: counted in `fallbacks` with the step's last writes, not here,
    as the same ids find none again when the step runs again."""
    wanted = tf.size(ready, out_type=tf.int64)
    num_free = self.num_free.read_value()
    take = tf.minimum(wanted, num_free)
    keys = ready[:take]
    new_rows = self.free.read_value()[num_free - take:num_free]
    in_variable = new_rows + self.base
    with tf.control_dependencies([new_rows]):
      updates = [
          self.num_free.assign_sub(take), self.admitted.assign_add(take), self.map.insert(keys, new_rows),
          self.row_keys.scatter_update(tf.IndexedSlices(keys, new_rows)),
          rows_variable.scatter_update(tf.IndexedSlices(
              initializer([tf.cast(take, tf.int32), rows_variable.shape[1]], rows_variable.dtype), in_variable)),
      ]
      updates += touched_rows.mark_rows(rows_variable, in_variable)  # for delta exports, where they are written
      updates += [slot.scatter_update(tf.IndexedSlices(
          tf.fill([take, rows_variable.shape[1]], tf.constant(initial, slot.dtype)), in_variable))
                  for slot, initial in slots]
      if remove_counts:
        updates.append(self.counts.remove(keys))
    return tf.group(updates), wanted - take

  def _evict(self, stale_before):
    """Frees the rows of ids last seen before clock `stale_before`; returns how many."""
    last_seen = self.last_seen.read_value()
    stale = tf.reshape(tf.where((last_seen >= 0) & (last_seen < stale_before)), [-1])
    count = tf.size(stale, out_type=tf.int64)
    num_free = self.num_free.read_value()
    stale_keys = tf.gather(self.row_keys.read_value(), stale)
    with tf.control_dependencies([stale_keys, num_free]):
      done = tf.group([
          self.map.remove(stale_keys),
          self.last_seen.scatter_update(
              tf.IndexedSlices(tf.fill(tf.shape(stale), tf.constant(-1, tf.int64)), stale)),
          self.free.scatter_update(tf.IndexedSlices(stale, num_free + tf.range(count))),
          self.num_free.assign_add(count), self.evicted.assign_add(count)] +
          touched_rows.mark_evicted(self, stale_keys))  # for delta exports, where they are written
    with tf.control_dependencies([done]):
      return tf.identity(count)  # the rows freed
