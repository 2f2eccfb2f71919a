"""Layers that keep tables of their own on the ps (e.g. `tfps.layers.DynamicEmbedding`) meet the training paths here.

Such a layer has two methods, so the paths never need to know its class:
- `bind_optimizer(optimizer)`: called under the strategy scope once the model is built and compiled, before a step
  is traced (the layer resets the optimizer's slot rows of rows it gives out);
- `table_metrics()`: its statistics as `{name: number}`, read from the ps (logged as `<layer>/<name>`).

And it reads three contexts the paths open while they trace:
- `current_step()`: the step being traced, as `StepMarks` give it (a runner's record of the steps each table shard
  did its bookkeeping for), so a step run again after a worker failure does not count or admit twice; per thread, so
  a runner hands `strategy.run` the step function wrapped by `StepMarks.marked`;
- `build_state(make)`: the table's state (rows and maps), made by `make()` unless a `keeping_state` keeper (the
  Estimator path, whose model_fn builds its layers again on every call) hands back the state of an earlier call;
- `current_answer()`: geo training's stand-in for the layer's training call (`answering`).
"""

import contextlib
import threading
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional

import tensorflow as tf
import tf_keras

from tfps.training import exactly_once

_context = threading.local()


def is_table(value) -> bool:
  """Whether `value` is a layer that keeps tables of its own."""
  return callable(getattr(value, "bind_optimizer", None)) and callable(getattr(value, "table_metrics", None))


def tables_of(model: tf_keras.Model) -> List[tf_keras.layers.Layer]:
  """The model's layers that keep tables of their own (each once: not also the table state a layer holds, which
  `submodules` lists beside it)."""
  return [layer for layer in model.submodules if isinstance(layer, tf_keras.layers.Layer) and is_table(layer)]


def bind_optimizers(model: tf_keras.Model) -> None:
  for layer in tables_of(model):
    layer.bind_optimizer(model.optimizer)


def table_metrics(tables: Iterable) -> Dict[str, float]:
  """Each table's statistics as `<name>/<statistic>`: table layers (`tables_of`), or the states a model_fn's layers
  share (named as their layer)."""
  return {f"{table.name}/{name}": value for table in tables for name, value in table.table_metrics().items()}


class StepMark(NamedTuple):
  """The step being traced: `marks.vector_beside(variable)[slot] >= mark` where a shard did its bookkeeping."""
  marks: "StepMarks"
  slot: tf.Tensor  # shape [1]
  mark: tf.Tensor  # int64 scalar, grows with every step sharing the slot


class StepMarks:
  """One runner's record, on the ps of each table shard, of the steps whose bookkeeping that shard did: per slot, the
  largest mark. A runner's marks start at zero (fresh vectors): marks of another runner (an earlier `fit`, a chief
  before its restart) never make a step skip its bookkeeping."""

  def __init__(self, strategy, tables: Iterable = ()):
    """The records beside the row variables of `tables` (layers or table states with `delta_shards()`, built) are made
    now, the others when first asked for: a tf.function whose first trace creates a variable is traced twice."""
    self._strategy = strategy
    self._vectors: Dict[int, tf.Variable] = {}
    for table in tables:
      for _, rows_variable, _ in getattr(table, "delta_shards", lambda: [])():
        self.vector_beside(rows_variable)

  def vector_beside(self, variable) -> tf.Variable:
    """The record beside `variable` (a table shard's variable, on its ps), made when first asked for."""
    if id(variable) not in self._vectors and tf.distribute.in_cross_replica_context() is False \
        and tf.distribute.has_strategy():  # in a replica's thread: made by the strategy's thread, as variables are
      tf.distribute.get_replica_context().merge_call(lambda _: self.vector_beside(variable))
    if id(variable) not in self._vectors:
      with tf.init_scope(), self._strategy.scope(), self._strategy.extended.colocate_vars_with(variable):
        self._vectors[id(variable)] = tf.Variable(tf.zeros([exactly_once.SLOTS], tf.int64), trainable=False,
                                                  name="tfps_table_steps",
                                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    return self._vectors[id(variable)]

  def marking(self, slot, mark):
    """While a step is traced in this thread: table layers do their bookkeeping for `(slot, mark)` once per shard."""
    return _setting("step", StepMark(self, tf.reshape(tf.cast(slot, tf.int64), [1]), tf.cast(mark, tf.int64)))

  def marked(self, fn: Callable, slot, mark) -> Callable:
    """`fn` run inside `marking(slot, mark)`: what a runner gives `strategy.run`, which traces `fn` in a replica thread
    of its own (`mirrored_run`), where a `marking` opened around `strategy.run` is not seen."""
    def run(*args, **kwargs):
      with self.marking(slot, mark):
        return fn(*args, **kwargs)
    return run


def current_step() -> Optional[StepMark]:
  """The step being traced (None: bookkeeping on every call, as outside a runner)."""
  return getattr(_context, "step", None)


def keeping_state(keeper: Callable[[Callable], object]):
  """Table layers built inside get their state from `keeper(make)` instead of `make()`."""
  return _setting("keeper", keeper)


def build_state(make: Callable[[], object]):
  """`make()`, or what the open `keeping_state` keeper gives for it."""
  keeper = getattr(_context, "keeper", None)
  return make() if keeper is None else keeper(make)


def answering(answer: Callable):
  """While tracing: a table layer's training call returns `answer(layer, ids)` instead of reading its rows itself.

  Geo training (`tfps.training.geo`) finds the rows a round's ids have on the ps this way, then trains on local
  copies of those rows. Such a layer has, besides the two methods above:
  - `rows_of(ids, training=True)`: the global rows of `ids` (-1: the default), its bookkeeping done on the ps;
  - `lookup_rows(rows)`: the vectors of global `rows` of its `embeddings` (zeros for -1);
  - `row_owners(index, rows)`: the ids that rows `rows` of row shard `index` belong to now, read from the ps.
  """
  return _setting("answer", answer)


def current_answer() -> Optional[Callable]:
  """The open `answering` stand-in (None: the layer reads its rows itself)."""
  return getattr(_context, "answer", None)


@contextlib.contextmanager
def _setting(name: str, value):
  """`_context.<name>` is `value` inside (in this thread: a context read in a replica's function is entered there)."""
  previous = getattr(_context, name, None)
  setattr(_context, name, value)
  try:
    yield
  finally:
    setattr(_context, name, previous)
