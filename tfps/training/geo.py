"""Geo training (PaddleRec's geo-SGD): each worker trains `geo_steps` steps on a local copy of the parameters, then
adds its parameter difference to the ps.

One scheduled function is one round on one worker:

1. Pull: a local copy (a variable in the worker's own memory) of every dense trainable variable is loaded from the
   ps. The optimizer's state of those variables (Adagrad's accumulators, ...) stays on the worker between rounds,
   loaded from the ps by the worker's first round only: each worker keeps its own, as geo-SGD's local optimizer does.
2. Discover: the round's batches run forward once with every tf-keras `Embedding` answering zeros, which yields the
   ids each table is looked up with; the rows of those ids (and of the optimizer's slots of the table) are gathered
   from the ps into a local cache of the touched rows only, never a table-sized buffer. A table layer with its id map
   on the ps (`tfps.layers.DynamicEmbedding`) finds its ids' rows there in this pass (admitting and evicting, once
   per batch and shard), and its rows are cached alike; the map itself is never copied.
3. Train: `geo_steps` steps of the user's own step (Keras `train_step`, or the model_fn's loss and optimizer) run
   with every variable, slot and table redirected to its local copy; lookups go to the cached rows.
4. Push: the difference between each local copy and what was pulled is added to the ps (dense variables whole,
   tables and their slots row by row), and the step counter grows by the steps run.

Step 2 traces the forward pass once per batch (of which each batch runs only what finds its ids); step 3 writes a
round's steps out one after another up to `2 * UNROLLED_STEPS - 1` steps, and trains a longer round in a loop over
its batches (held in TensorArrays), `UNROLLED_STEPS` steps traced per iteration, so its trace stops growing there. The
steps touch no ps: the learning rate is read once per round, and the step's metrics (tf-keras's) are local copies
too, pushed as their differences (their updates add up).

What crosses the network per round is one pull and one push of the dense parameters and of the distinct touched
rows with their slot rows, against the dense parameters and the batch's rows read and their gradients written at
every step in async training. A table's slot rows are pushed additively, which is exact for Adagrad's accumulators
and an approximation for momentum-like slots. The ps keeps the dense variables' optimizer state of the time training
started (checkpoints hold it as such): each worker's is its own. A round that a worker failure cut short is run
again from its pull; a round whose push was recorded (`tfps.training.exactly_once`) is not run again, and each ps
takes a round's push whole and once (`ps_records.OncePerPs.run_all`): a round cut short in the middle of its push,
run again, pushes only to the ps that did not take it.
"""

import contextlib
from typing import Callable, Dict, List

import tensorflow as tf

from tfps import _tf_private
from tfps.errors import UsageError
from tfps.training import exactly_once
from tfps.training import geo_copies
from tfps.training import ps_records
from tfps.training import steps as steps_lib
from tfps.training import strategy as strategy_lib
from tfps.training import tables as tables_lib

LARGE_DENSE_ELEMENTS = 1 << 20  # a variable this large and not an Embedding table is not copied to every worker
MARK_STRIDE = 1 << 20  # table layers' bookkeeping mark of a round's batch: `seq * MARK_STRIDE + batch + 1`
# A round of at least twice this many steps trains in a loop of this many steps per iteration (then the steps left);
# a shorter round's steps are written out one after another. Each step written out costs about half a CPU-second to
# trace (bench/geo_start.py), and a round in a loop about 5% of its examples/s with rounds of 10 steps, whatever the
# steps per iteration (2 of 5 or 10 of 1; bench/results/geo_loop/NOTES.md).
UNROLLED_STEPS = 20


@contextlib.contextmanager
def _recording(record: Callable, rows_of: Callable = lambda layer, ids: ids):
  """While tracing: every tf-keras Embedding layer calls `record(layer, ids)` and answers zeros, reading no table;
  every table layer with an id map on the ps (`tfps.training.tables.answering`) calls `record(layer, rows_of(layer,
  ids))` (the rows of its ids on the ps, for the round's own trace) and answers zeros."""
  def zeros(ids, width, dtype):
    return _each_id(lambda ids: tf.zeros(tf.concat([tf.shape(ids), [width]], 0), dtype), ids)

  def answer(layer, ids, original):
    del original
    record(layer, ids)
    return zeros(ids, layer.output_dim, layer.compute_dtype)

  def table_answer(layer, ids):
    record(layer, rows_of(layer, ids))
    return zeros(ids, layer.dim, layer.compute_dtype)

  with _tf_private.embedding_calls(answer), tables_lib.answering(table_answer):
    yield


def _each_id(fn: Callable, ids):
  """`fn(ids)`, or for ragged ids (a tf-keras Embedding takes them) `fn` of their values, in the same rows."""
  return tf.ragged.map_flat_values(fn, ids) if isinstance(ids, tf.RaggedTensor) else fn(ids)


def _key(table) -> tuple:
  return tuple(strategy_lib.variable_id(shard) for shard in strategy_lib.shards_of(table))


class GeoRunner(steps_lib.Runner):
  """Runs geo rounds (see the module docstring): `schedule(iterator, num_steps)` schedules one round of `num_steps`
  steps, `mode.geo_steps` at most, on one worker. Needs a tf-keras legacy optimizer (its slots are created now).

  Attributes:
    progress: the rounds' `exactly_once.StepProgress` (one record per round).
  """

  def __init__(self, step: steps_lib.Step, **kwargs):
    super().__init__(step, **kwargs)
    if self.mode.geo_steps >= MARK_STRIDE:
      raise UsageError(f"`geo_steps` ({self.mode.geo_steps}) must be below {MARK_STRIDE}")
    optimizer = step.optimizer()
    if not hasattr(optimizer, "get_slot_names"):
      raise UsageError(f"sync_mode=geo needs a tf_keras.optimizers.legacy optimizer, got {type(optimizer).__name__}")
    with self.strategy.scope():
      _tf_private.create_optimizer_slots(optimizer, step.trainable_variables())
      self.progress = exactly_once.StepProgress(1, step.counter)
    self.progress.ps_records = ps_records.PsRecords()  # each ps takes a round's push once
    # Made now where the variables exist (those of variables made by the first trace are made then, and a tf.function
    # whose first trace makes variables is traced twice).
    self.progress.ps_records.make_for([*step.variables(), step.counter])
    # table layers' bookkeeping, once per batch and shard
    self.table_marks = tables_lib.StepMarks(self.strategy, step.tables())
    self._names = geo_copies.LocalNames()
    self._functions: Dict[object, Callable] = {}

  @classmethod
  def check_settings(cls, mode, steps_per_execution) -> None:
    if steps_per_execution is not None:
      raise UsageError(f"`steps_per_execution` ({steps_per_execution}) applies to sync_mode=async only: geo runs "
                       "`geo_steps` steps per function")

  @classmethod
  def execution_steps(cls, mode, steps_per_execution: int) -> int:
    return mode.geo_steps

  def schedule(self, iterator, num_steps: int):
    if num_steps not in self._functions:  # one function per round length (its batches are read before its loops)
      def round_of(iterator, seq):
        return self.round_function(iterator, num_steps, seq)
      self._functions[num_steps] = tf.function(round_of, autograph=False)
    return self.coordinator.schedule(self._functions[num_steps], args=(iterator, self.progress.next_sequence()))

  def schedule_batches(self, stacked, num_steps: int):
    """`schedule` for batches given by the chief (a stream): one round on the first `num_steps` batches of `stacked`
    (a batch structure, batches stacked along a first dimension); a round run again trains the same batches, and a
    round pushed is not run again."""
    if ("given", num_steps) not in self._functions:
      def round_of(stacked, seq):
        return self.round_function(steps_lib.GivenBatches(stacked), num_steps, seq)
      self._functions[("given", num_steps)] = tf.function(round_of, autograph=False)
    return self.coordinator.schedule(self._functions[("given", num_steps)],
                                     args=(stacked, self.progress.next_sequence()))

  def _slots(self, variable) -> List[tf.Variable]:
    optimizer = self.step.optimizer()
    return [optimizer.get_slot(variable, name) for name in optimizer.get_slot_names()]

  def round_function(self, iterator, num_steps: int, seq):
    """A scheduled round of `num_steps` (a Python int) steps; returns `Step.outputs` of its summed loss and examples.

    `seq` is `progress.next_sequence()`: a round run again after its push was recorded does nothing.
    """
    slot, first = self.progress.begin(seq, 1)

    def run():
      return self._round(iterator, num_steps, slot, seq)

    def skip():
      return tf.constant(0.0), tf.constant(0, tf.int64), self.step.counter.read_value()

    with _tf_private.lookup_tables_captured_outermost():  # the model's lookup tables, called inside the cond
      loss, examples, counter = tf.cond(first > 0, skip, run)
    recorded = self.progress.record(slot, seq * self.progress.stride + 1, [counter])
    with tf.control_dependencies([recorded]):
      return self.step.outputs(tf.identity(loss), tf.identity(examples))

  def _tables_of(self, batch) -> Dict[tuple, object]:
    """The tables the step looks up (by tracing the forward pass in a scratch graph, which never runs)."""
    found = {}

    def forward(batch):
      with _recording(lambda layer, ids: found.setdefault(_key(layer.embeddings), layer.embeddings)):
        self.step.forward(batch)

    def replicated(batch):
      self.strategy.run(forward, args=(batch,))

    tf.function(replicated).get_concrete_function(tf.nest.map_structure(tf.type_spec_from_value, batch))
    return found

  def _dense_copies(self, optimizer, tables: Dict[tuple, object]) -> List[geo_copies.DenseCopy]:
    """Local copies (pulled) of every variable of the model, the optimizer and the step's metrics but the tables and
    their slots. A metric's copy is pushed as its difference, as the model's are: its updates (sums, counts) add up."""
    table_parts = set()
    for table in tables.values():
      for shard in strategy_lib.shards_of(table):
        table_parts.update([strategy_lib.variable_id(shard)] +
                           [strategy_lib.variable_id(slot) for slot in self._slots(shard)])
    dense = []
    optimizers = {strategy_lib.variable_id(part)
                  for variable in optimizer.variables() for part in strategy_lib.shards_of(variable)}
    for variable in [*self.step.trainable_variables(), *optimizer.variables(), *self.step.metric_variables()]:
      for part in strategy_lib.shards_of(variable):
        key = strategy_lib.variable_id(part)
        if key in table_parts:
          continue
        if (part.shape.num_elements() or 0) > LARGE_DENSE_ELEMENTS:
          raise UsageError(f"sync_mode=geo copies every variable but embedding tables to each worker; {part.name} "
                           f"{part.shape} is large and not the table of a tf_keras Embedding layer")
        table_parts.add(key)  # once, though listed by both the model and the optimizer
        resident = key in optimizers and key != strategy_lib.variable_id(optimizer.iterations)
        dense.append(geo_copies.DenseCopy(part, self._names, resident=resident))
    return dense

  def _round(self, iterator, num_steps: int, slot, seq):
    optimizer = self.step.optimizer()
    stack = _Stack(iterator, num_steps)
    batches = [stack.batch_at(index) for index in range(num_steps)]
    table_variables = self._tables_of(batches[0])
    dense = self._dense_copies(optimizer, table_variables)  # 1. Pull.
    with contextlib.ExitStack() as swaps:
      for copy in dense:
        swaps.enter_context(_tf_private.swapped_handle(copy.variable, copy.handle))
      # 2. Discover the ids of every table (on the local dense copies); cache their rows. A table layer with an id
      # map on the ps finds (admits, evicts) the rows of its ids there, once per batch and shard (`table_marks`).
      with tf.control_dependencies([copy.pull for copy in dense]):
        tables, found_rows = self._discover(batches, table_variables, slot, seq)
      fills = [copy.pull for copy in dense] + [cache[4] for table in tables.values() for cache in table.caches]
      for table in tables.values():
        for variable, handle, *_ in table.caches:
          swaps.enter_context(_tf_private.swapped_handle(variable, handle))

      # 3. Train on the local copies.
      loss, examples = self._train_locally(optimizer, stack, tables, found_rows, fills)
    # 4. Push the differences (the variables answer from the ps again), once per ps: each ps adds them once all of its
    # differences are there, and a round run again after its worker died in the middle of its push skips the ps that
    # took it (the round's mark is `seq + 1`).
    once = self.progress.ps_records.once_per_ps(slot, seq + 1)
    with tf.control_dependencies([loss]):
      updates = [update for part in list(dense) + list(tables.values()) for update in part.updates()]
      pushes = [copy.pull for copy in dense if copy.resident] + once.run_all(updates)
    if not self.step.counts_itself:  # where the optimizer does not count (its `iterations` is pushed)
      with tf.control_dependencies(pushes):
        pushes.append(once.run(self.step.counter, lambda: self.step.count(num_steps)))
    with tf.control_dependencies(pushes + once.records()):
      return loss, examples, self.step.counter.read_value()

  def _discovery_pass(self, batch, mark, slot, owners: Dict[tuple, Callable]):
    """The forward pass of one batch on the local dense copies, recording each table's calls; returns `(ids, rows)`:
    per table key, the ids (flat, int64) of each call, and for a table layer the rows each call found on the ps
    (int64, shaped as its ids; -1: none). Sets `owners[key]` for a table layer (its `row_owners`)."""
    ids_of: Dict[tuple, list] = {}
    rows_found: Dict[tuple, list] = {}

    def record(layer, ids):
      ids_of.setdefault(_key(layer.embeddings), []).append(
          tf.cast(tf.reshape(ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids, [-1]), tf.int64))

    def rows_of(layer, ids):
      rows = tf.cast(layer.rows_of(ids, training=True), tf.int64)
      owners[_key(layer.embeddings)] = layer.row_owners
      rows_found.setdefault(_key(layer.embeddings), []).append(rows)
      flat = tf.reshape(rows, [-1])
      return tf.boolean_mask(flat, flat >= 0)

    def forward(batch, mark):  # the contexts entered in the replica's thread, where the layers read them
      with _recording(record, rows_of), self.table_marks.marking(slot, mark):
        self.step.forward(batch)

    self.strategy.run(forward, args=(batch, mark))
    return ids_of, rows_found

  def _discover(self, batches, table_variables: Dict[tuple, object], slot, seq):
    """Step 2 of a round: each batch's `_discovery_pass`, one after another (as Python code: in a loop, TensorFlow ran
    the whole forward pass of each batch, 10% more CPU per example with rounds of 10 steps, where here it prunes all
    but what finds the ids). Returns `(tables, found_rows)`: a `geo_copies.TouchedRows` per table, and
    `found_rows(index)(key, call)`: the rows call `call` of table layer `key` found for batch `index` (a scalar tensor).
    """
    owners: Dict[tuple, Callable] = {}
    ids: Dict[tuple, list] = {}
    rows: Dict[tuple, list] = {}  # (key, call) -> the call's rows, batch after batch
    for index, batch in enumerate(batches):
      ids_of, rows_found = self._discovery_pass(batch, seq * MARK_STRIDE + index + 1, slot, owners)
      for key, made in ids_of.items():
        ids.setdefault(key, []).extend(made)
      for key, made in rows_found.items():
        for call, found in enumerate(made):
          rows.setdefault((key, call), []).append(found)
    tables = {key: geo_copies.TouchedRows(table_variables[key], tf.concat(ids[key], 0), self._slots, self._names,
                                          owners.get(key))
              for key in ids}
    arrays = {key_call: _tensor_array(found) for key_call, found in rows.items()}
    return tables, lambda index: lambda key, call: arrays[key, call].read(index)

  def _train_locally(self, optimizer, stack: "_Stack", tables, found_rows, fills):
    """Step 3 of a round: trains on every batch against the local copies, `UNROLLED_STEPS` per iteration of a loop;
    returns the summed loss and examples. `found_rows` is `_discover`'s."""
    def lookup(layer, ids, original):
      return original(layer, _each_id(tables[_key(layer.embeddings)].virtual_ids, ids))

    def train(batch, rows_of_call):
      made: Dict[tuple, int] = {}

      def lookup_rows(layer, ids):  # the rows its call of the same batch found in step 2
        key = _key(layer.embeddings)
        made[key] = made.get(key, -1) + 1
        rows = tf.reshape(rows_of_call(key, made[key]), [-1])
        local = tf.where(rows >= 0, tables[key].virtual_ids(tf.maximum(rows, 0)), -1)
        return tf.reshape(layer.lookup_rows(local), tf.concat([tf.shape(ids), [layer.dim]], 0))

      with tables_lib.answering(lookup_rows):
        return self.step.run(batch)

    def body(index, loss_sum, examples):
      with tf.control_dependencies([loss_sum]):  # each step after the one before
        loss, count = self.strategy.run(train, args=(stack.batch_at(index), found_rows(index)))
      return index + 1, loss_sum + tf.cast(loss, tf.float32), examples + tf.cast(count, tf.int64)

    rate = _tf_private.learning_rate_variable(optimizer)  # read once per round, not at each step from its ps
    rate = None if rate is None else tf.convert_to_tensor(rate)
    with _tf_private.embedding_calls(lookup), _tf_private.identity_gradient_aggregation(optimizer), \
        _tf_private.learning_rate_read(optimizer, lambda device: rate):
      with tf.control_dependencies(fills):
        state = (0, tf.constant(0.0), tf.constant(0, tf.int64))  # a step's index: an int where written out
      looped = stack.size // UNROLLED_STEPS * UNROLLED_STEPS if stack.size >= 2 * UNROLLED_STEPS else 0
      if looped:
        state = tf.while_loop(lambda index, *_: index < looped, steps_lib.repeated(body, UNROLLED_STEPS), state,
                              parallel_iterations=1)
      _, loss_sum, examples = steps_lib.repeated(body, stack.size - looped)(*state)
    return loss_sum, examples


class _Stack:
  """A round's batches: `batch_at(index)` reads batch `index` (an int, or a scalar tensor in a loop). From a per-worker
  iterator, a round trained in a loop reads them in a loop too (one `get_next` in the function, which TensorFlow
  refuses to trace more than 32 times) into TensorArrays, one per component tensor of the batch structure (a sparse or
  ragged tensor has several), read back as the iterator's element type; a shorter round reads them one by one. Given
  batches (`steps_lib.GivenBatches`) are read where they are."""

  def __init__(self, iterator, size: int):
    self.size = size
    self._given = iterator if isinstance(iterator, steps_lib.GivenBatches) else None
    self._batches = None
    if self._given is not None:
      return
    if size < 2 * UNROLLED_STEPS:  # the round's steps are written out, each reading its own batch
      self._batches = [next(iterator) for _ in range(size)]
      return
    self._spec = iterator.element_spec
    components = tf.nest.flatten(self._spec, expand_composites=True)
    columns = [tf.TensorArray(spec.dtype, size=size, element_shape=spec.shape, infer_shape=False)
               for spec in components]

    def read(index, *columns):
      batch = tf.nest.flatten(next(iterator), expand_composites=True)
      return (index + 1, *[column.write(index, tensor) for column, tensor in zip(columns, batch)])

    _, *self._columns = tf.while_loop(lambda index, *_: index < size, read, (tf.constant(0), *columns),
                                      parallel_iterations=1)

  def batch_at(self, index):
    if self._given is not None:
      return self._given.batch_at(index)
    if self._batches is not None:
      return self._batches[index]
    return tf.nest.pack_sequence_as(self._spec, [column.read(index) for column in self._columns],
                                    expand_composites=True)


def _tensor_array(tensors: List[tf.Tensor]) -> tf.TensorArray:
  """The tensors in a TensorArray whose reads have the static shape they share."""
  shape = tensors[0].shape
  for tensor in tensors[1:]:
    shape = shape.most_specific_compatible_shape(tensor.shape)
  array = tf.TensorArray(tensors[0].dtype, size=len(tensors), element_shape=shape, infer_shape=False)
  for index, tensor in enumerate(tensors):
    array = array.write(index, tensor)
  return array
