"""`DynamicEmbedding`: an embedding table keyed by raw ids (int64 or string), without hashing collisions.

The rows are one `[capacity, dim]` variable, sharded over the ps by the strategy's partitioner like any large table.
Each row shard has an id-to-row map next to it, on the same ps (`tfps.models.dynamic_rows.RowShard`): a
`MutableHashTable` from id to row, the sightings of ids not admitted yet, the id and last-seen step of every row, and
a stack of free rows. A worker routes each distinct id of a batch to shard `hash(id) % num_shards`; that shard's
bookkeeping runs on its ps inside a `tf.CriticalSection`, so concurrent steps of several workers never hand one row
to two ids. Gradients and optimizer slots follow the rows,
because rows are rows of an ordinary sharded variable.

Admission: an id gets a row once it has been seen `min_count` times (counted per training call). Until then, and
when its shard has no free row (counted in `fallbacks`), it reads the default: a zero vector, which gets no gradient.
Eviction: with `steps_to_live`, a row whose id was not seen in the last `steps_to_live` training calls of its shard is
freed (the rows are scanned every `steps_to_live // 10` calls, so an id goes between `steps_to_live` and 1.1x that
many calls after it was last seen); the next id given the row starts from a fresh value and fresh optimizer slots.
Inference (`training=False`) only looks up. Geo training (`tables.answering`) asks for the rows of a round's ids
(`rows_of`) and reads its local copies of them (`lookup_rows`); the map is never copied. Under a runner (async, sync,
geo) a step's bookkeeping runs once per shard even when a worker failure makes ParameterServerStrategy run the step
again (`tfps.training.tables.StepMarks`). A model_fn (Estimator path) builds the layer on every call; its calls share
one `_Table` (`tfps.training.tables.build_state`).
"""

from typing import Dict, Optional

import tensorflow as tf
import tf_keras

from tfps import _tf_private
from tfps.models import dynamic_rows
from tfps.models.dynamic_rows import RowShard
from tfps.training import distinct_rows
from tfps.training import tables

_KEY_DTYPES = {tf.int64: tf.int64, tf.int32: tf.int64, tf.string: tf.string}


def _check_positive(name, value, allow_none=False):
  if allow_none and value is None:
    return
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"`{name}` ({value!r}) must be a positive integer{' or None' if allow_none else ''}")


def _split(rows: int, parts: int):
  """Rows per shard as ParameterServerStrategy splits a variable: the first `rows % parts` shards get one more."""
  return [rows // parts + (1 if index < rows % parts else 0) for index in range(parts)]


class _Table(tf.Module):
  """What a `DynamicEmbedding` keeps: the rows, each row shard's bookkeeping, and the optimizer whose slot rows it
  resets. A model_fn builds its layers on every call: its calls share one `_Table` (`tables.build_state`), which
  also meets the training paths itself (`bind_optimizer`, `table_metrics`: `tfps.training.tables`)."""

  def __init__(self, layer_name: str, key_dtype, embeddings, shards, row_shards, offsets):
    super().__init__(name=layer_name)
    self.layer_name = layer_name
    self.key_dtype = key_dtype
    self.embeddings = embeddings
    self.shards = shards
    self.row_shards = row_shards
    self.offsets = offsets
    self.__dict__["_optimizer"] = None  # not tracked: the model's checkpoint holds the optimizer

  def bind_optimizer(self, optimizer) -> None:
    """See `DynamicEmbedding.bind_optimizer`."""
    if not isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
      raise TypeError(f"{self.layer_name}: slot rows can be reset for tf-keras legacy optimizers only, not "
                      f"{type(optimizer).__name__}")
    _tf_private.create_optimizer_slots(optimizer, self.row_shards)
    self.__dict__["_optimizer"] = optimizer

  def delta_shards(self):
    """See `DynamicEmbedding.delta_shards` (the Estimator path's deltas ask the table, which its calls share)."""
    return list(zip(self.shards, self.row_shards, self.offsets))

  def slots(self, index):
    """`(slot variable, initial value)` of the bound optimizer's slots of row shard `index`."""
    optimizer = self.__dict__["_optimizer"]
    if optimizer is None:
      return []
    initial_accumulator = _tf_private.initial_accumulator_value(optimizer)
    return [(optimizer.get_slot(self.row_shards[index], name), initial_accumulator if name == "accumulator" else 0.)
            for name in optimizer.get_slot_names()]

  def table_metrics(self) -> Dict[str, int]:
    """See `DynamicEmbedding.table_metrics`."""
    return {
        "occupancy": int(sum(shard.rows - int(shard.num_free.numpy()) for shard in self.shards)),
        "admitted": int(sum(int(shard.admitted.numpy()) for shard in self.shards)),
        "evicted": int(sum(int(shard.evicted.numpy()) for shard in self.shards)),
        "fallbacks": int(sum(int(shard.fallbacks.numpy()) for shard in self.shards)),
    }


class DynamicEmbedding(tf_keras.layers.Layer):
  """An embedding of raw ids (int64 or string) into `capacity` rows of width `dim`; no two live ids share a row.

  Args:
    capacity: rows of the table (over all shards); ids beyond it read the default (counted in `fallbacks`).
    dim: width of a row.
    key_dtype: `tf.int64` (int32 ids are widened) or `tf.string`.
    min_count: training calls an id must be seen in before it gets a row; until then it reads zeros.
    steps_to_live: free the row of an id not seen in this many training calls of its shard (None: never).
    init_scale: rows start uniform in [-init_scale, init_scale], drawn again whenever a row is given to a new id.
    num_shards: the shards the strategy's partitioner makes of the table (checked when built under it); needed to
      rebuild the layer outside any strategy from a sharded checkpoint (`tfps.export_saved_model`). None: whatever
      the partitioner makes, and one shard outside a strategy.

  `call(ids, training)` returns `ids.shape + [dim]`. `table_metrics()` reads occupancy, admitted, evicted and
  fallbacks from the ps (summed over shards).
  """

  def __init__(self, capacity: int, dim: int, *, key_dtype=tf.int64, min_count: int = 1,
               steps_to_live: Optional[int] = None, init_scale: float = 0.05, num_shards: Optional[int] = None,
               **kwargs):
    super().__init__(**kwargs)
    _check_positive("capacity", capacity)
    _check_positive("dim", dim)
    _check_positive("min_count", min_count)
    _check_positive("steps_to_live", steps_to_live, allow_none=True)
    _check_positive("num_shards", num_shards, allow_none=True)
    self.num_shards = num_shards
    key_dtype = tf.as_dtype(key_dtype)
    if key_dtype not in (tf.int64, tf.string):
      raise TypeError(f"`key_dtype` ({key_dtype.name}) must be int64 or string")
    self.capacity, self.dim, self.key_dtype = capacity, dim, key_dtype
    self.min_count, self.steps_to_live = min_count, steps_to_live
    if isinstance(init_scale, bool) or not isinstance(init_scale, (int, float)) or init_scale < 0:
      raise ValueError(f"`init_scale` ({init_scale!r}) must be a non-negative number")
    self.init_scale = float(init_scale)

  def build(self, input_shape):
    table = tables.build_state(self._make_table)  # the Estimator path hands back the table of its first call
    self.__dict__["_table"] = table  # tracked below through its parts, as before there was a `_Table`
    self.embeddings = table.embeddings
    self.shards = table.shards
    super().build(input_shape)

  def _make_table(self) -> "_Table":
    embeddings = self.add_weight("embeddings", shape=[self.capacity, self.dim],
                                 initializer=tf_keras.initializers.RandomUniform(-self.init_scale, self.init_scale),
                                 trainable=True)
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    sharded = _tf_private.is_sharded_variable(embeddings)
    if sharded:
      variables = list(embeddings.variables)
      sizes = [variable.shape[0] for variable in variables]
    else:  # whole: `num_shards` maps over parts of it, laid out as a partitioner would (a serving copy)
      sizes = _split(self.capacity, self.num_shards or 1)
      variables = [embeddings] * len(sizes)
    if self.num_shards is not None and len(sizes) != self.num_shards:
      raise ValueError(f"{self.name}: `num_shards` ({self.num_shards}) differs from the {len(sizes)} shard(s) the "
                       f"strategy's partitioner made of the {self.capacity}-row table")
    offsets = [sum(sizes[:index]) for index in range(len(sizes))]
    # Maps over one whole variable (a table below the partitioner's threshold) write the same rows and slots: one
    # critical section for all (TensorFlow refuses two that touch one resource), on the variable's ps
    lock = None
    if strategy and not sharded and len(sizes) > 1:
      with tf.init_scope(), tf.device(embeddings.device):
        lock = dynamic_rows.build_lock(0)
    shards = [RowShard(size, 0 if sharded else offset, self.key_dtype, variable.device if strategy else "", strategy,
                       variable, index, lock)
              for index, (size, offset, variable) in enumerate(zip(sizes, offsets, variables))]
    return _Table(self.name, self.key_dtype, embeddings, shards, variables, offsets)

  def bind_optimizer(self, optimizer) -> None:
    """Resets `optimizer`'s slot rows of a row whenever it is given to a new id; creates the slots now.

    Call it under the strategy scope after the layer is built and before training is traced (`tfps.fit` does);
    `optimizer` must be a tf-keras legacy optimizer. An accumulator slot (Adagrad, Ftrl) is reset to the
    optimizer's initial accumulator value, every other slot to zero.
    """
    self.__dict__["_table"].bind_optimizer(optimizer)

  @property
  def _row_shards(self):
    return self.__dict__["_table"].row_shards

  @property
  def _offsets(self):
    return self.__dict__["_table"].offsets

  def _slots(self, index):
    return self.__dict__["_table"].slots(index)

  def _fresh_rows(self, shape, dtype):
    # A stateful draw: an unseeded Keras initializer would give every admission the same values.
    return tf.random.uniform(shape, -self.init_scale, self.init_scale, dtype=dtype)

  def _keys(self, ids):
    ids = tf.convert_to_tensor(ids)
    if ids.dtype not in _KEY_DTYPES or _KEY_DTYPES[ids.dtype] != self.key_dtype:
      raise TypeError(f"{self.name}: ids of type {ids.dtype.name} are not allowed; this table takes "
                      f"{'int32 or int64' if self.key_dtype == tf.int64 else 'string'} ids")
    return tf.cast(ids, tf.int64) if ids.dtype == tf.int32 else ids

  def _shard_of(self, keys):
    if len(self.shards) == 1:
      return tf.zeros_like(keys, dtype=tf.int32)
    text = keys if self.key_dtype == tf.string else tf.strings.as_string(keys)
    return tf.cast(tf.strings.to_hash_bucket_fast(text, len(self.shards)), tf.int32)

  def _by_shard(self, keys, training: bool, each):
    """`each(index, local rows)` of the keys (distinct, a vector) of every shard, stitched back in the keys' order:
    the shard's rows of its keys, -1 where a key reads the default; in training, admitting and evicting."""
    shard_of = self._shard_of(keys)
    indices, parts = [], []
    for index, shard in enumerate(self.shards):
      where = tf.reshape(tf.where(tf.equal(shard_of, index)), [-1])
      shard_keys = tf.gather(keys, where)
      if training:
        local = shard.lookup_or_admit(shard_keys, self._row_shards[index], self._fresh_rows, self._slots(index),
                                      self.min_count, self.steps_to_live)
      else:
        local = shard.lookup(shard_keys)
      indices.append(tf.cast(where, tf.int32))
      parts.append(each(index, local))
    return tf.dynamic_stitch(indices, parts)

  def rows_of(self, ids, training=False):
    """Global rows of `ids` (any shape), -1 where an id reads the default; in training, admits and evicts."""
    keys = self._keys(ids)
    unique, positions = tf.unique(tf.reshape(keys, [-1]), out_idx=tf.int64)
    unique_rows = self._by_shard(unique, training,
                                 lambda index, local: tf.where(local >= 0, local + self._offsets[index], local))
    return tf.reshape(tf.gather(unique_rows, positions), tf.shape(keys))

  def _shard_vectors(self, index, local):
    """Vectors of a shard's `local` rows, zeros where a row is -1: the rows found are picked and gathered on the
    shard's ps, right after its bookkeeping there, and only they cross to the caller (the ids gathered stay there)."""
    shard = self.shards[index]
    with shard.placed():
      found = tf.where(local >= 0)
      rows = tf.gather_nd(local, found) + shard.base
    vectors = distinct_rows.gather(self._row_shards[index], rows, ids_on=shard.device or None)
    return tf.scatter_nd(found, vectors, [tf.size(local, out_type=tf.int64), self.dim])

  def call(self, ids, training=None):
    answer = tables.current_answer() if training else None
    if answer is not None:  # geo training: it finds the rows and reads its local copies of them
      return answer(self, ids)
    keys = self._keys(ids)
    unique, positions = tf.unique(tf.reshape(keys, [-1]), out_idx=tf.int64)
    unique_vectors = self._by_shard(unique, bool(training), self._shard_vectors)
    shape = tf.concat([tf.shape(keys), [self.dim]], axis=0)
    return tf.reshape(tf.gather(unique_vectors, positions), shape)

  def lookup_rows(self, rows):
    """Vectors of global `rows` (a vector) of `embeddings`, zeros where a row is -1 (the default)."""
    found = tf.where(rows >= 0)
    vectors = tf.nn.embedding_lookup(self.embeddings, tf.gather_nd(rows, found))
    return tf.scatter_nd(found, vectors, [tf.size(rows, out_type=tf.int64), self.dim])

  def row_owners(self, index, rows):
    """The ids rows `rows` (local to row shard `index`) were last given to, read from the shard's ps now."""
    return tf.gather(self.shards[index].row_keys, rows)

  def delta_shards(self):
    """For delta exports (`tfps.training.table_deltas`): `(bookkeeping, rows variable, offset)` of each row shard:
    its `RowShard`, the variable holding its rows, and where its rows start in the whole table."""
    return self.__dict__["_table"].delta_shards()

  def table_metrics(self) -> Dict[str, int]:
    """`occupancy` (rows in use), `admitted`, `evicted` and `fallbacks` over all shards, read from the ps."""
    return self.__dict__["_table"].table_metrics()

  def get_config(self):
    config = super().get_config()
    config.update(capacity=self.capacity, dim=self.dim, key_dtype=self.key_dtype.name, min_count=self.min_count,
                  steps_to_live=self.steps_to_live,
                  init_scale=self.init_scale, num_shards=self.num_shards)
    return config
