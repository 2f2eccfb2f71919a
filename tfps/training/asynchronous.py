"""Async training (ParameterServerStrategy's own): every worker step applies its gradients at once, each step applied
and counted once even when a worker dies (`tfps.training.exactly_once`, all four rules; table layers' bookkeeping
once per step and shard: `tfps.training.tables.StepMarks`). The dense gradients of each ps are sent in one transfer
per ps and step, and by default (`packed_reads`) its small dense variables are read in one (`tfps.training.packing`); a
legacy Adagrad updates a batch's table rows all at once, under a lock of each table shard (without it with
`lockfree_row_updates`), and a stacked table's gradient, summed per row on the worker, is not summed again on the ps
(`tfps.training.distinct_rows`); a legacy optimizer's learning rate is read on each ps from a copy there, set once per
scheduled function (`tfps.training.rate_copies`); a scheduled function's loop runs `unrolled_steps` steps per
iteration (by default 1; "auto": 4 with batches of a static size up to 1024, else 1); with `pipelined_updates` a
step's updates are applied while the next step computes (`tfps.training.modes`); with `bf16_rows` table rows and
their gradients cross the network as bfloat16 (`tfps.training.wire`); with `records_lock=False` no ps holds a lock
from its decision on a step to its record (`tfps.training.ps_records.PsRecords`)."""

import contextlib

import tensorflow as tf

from tfps import _tf_private
from tfps.errors import UsageError
from tfps.training import dataset_fns
from tfps.training import distinct_rows
from tfps.training import exactly_once
from tfps.training import packing
from tfps.training import ps_records
from tfps.training import rate_copies
from tfps.training import step_order
from tfps.training import steps as steps_lib
from tfps.training import strategy as strategy_lib
from tfps.training import tables


class AsyncRunner(steps_lib.Runner):
  """Packs up to `steps_per_execution` steps into one scheduled function `function(iterator, num_steps, seq)`.

  Attributes:
    function: the traced function it schedules (`seq` is `progress.next_sequence()`).
    progress: its `exactly_once.StepProgress`; `progress.ps_records` are the per-ps step records.
  """

  def __init__(self, step: steps_lib.Step, **kwargs):
    super().__init__(step, **kwargs)
    with self.strategy.scope():
      self.progress = exactly_once.StepProgress(self.steps_per_execution, step.counter)
    self.progress.ps_records = ps_records.PsRecords(lock=self.mode.records_lock)
    self.progress.ps_records.make_for(step.variables())  # those of variables made by the first trace: made then
    # table layers' bookkeeping, once per step and shard
    self.table_marks = tables.StepMarks(self.strategy, step.tables())
    # opt-in: the small dense variables of a ps read in one transfer per step
    self.packed_reads = packing.PackedReads() if self.mode.packed_reads else None
    # a legacy optimizer's learning rate read on each ps from a copy there, set once per function
    self.rate_copies = rate_copies.RateCopies(strategy_lib.cluster_of(self.strategy).num_ps)
    self._tables = None  # the variables a step gathers rows from, found at the first trace (`_gathered`)
    steps = self._pipelined_steps if self.mode.pipelined_updates else self._steps
    self.function = tf.function(steps, autograph=False)  # a step's errors surface unwrapped
    self._given = None  # `function` for batches given as arguments (`schedule_batches`), made at its first use
    self._start = (0, 0)

  def _steps(self, iterator, num_steps, seq):
    """Each step computes its gradients and applies them before the next step reads what they update.

    The loop runs `unrolled_steps` steps per iteration (by default chosen here from the batches' static size:
    `TrainingMode.steps_per_iteration`), traced one after another, then the steps left one per iteration. An
    iteration ends only when every op of its steps has run, and each one costs its own transfers of the loop's
    condition and control signals between every ps and the worker; within an iteration a step waits only for what it
    reads (tf.function orders the ops on each variable in program order: a step reads a variable after the previous
    step's update of it, and each ps decides on a step's updates after its record of the previous step)."""
    progress = self.progress
    num_steps = tf.cast(num_steps, tf.int64)
    slot, first = progress.begin(seq, num_steps)
    self.rate_copies.set(self.step.optimizer())
    unrolled = self.mode.steps_per_iteration(self.steps_per_execution, _batch_size(iterator))

    def step(index, loss_sum, examples):
      mark, batch = self._mark(seq, index), steps_lib.next_batch(iterator, index)
      slots = ps_records.SlotOfMark(mark, progress.stride)
      with self._applying(slots, mark) as once, self._reading(batch):
        loss, count = self._run(self.step.run, batch, slots, mark)
        ps_records.counted_after_updates(self.step, once)
      once.records()
      return index + 1, loss_sum + tf.cast(loss, tf.float32), examples + tf.cast(count, tf.int64)

    state = (first, tf.constant(0.0, tf.float32), tf.constant(0, tf.int64))
    if unrolled > 1:
      state = tf.while_loop(lambda index, *_: index + unrolled <= num_steps, steps_lib.repeated(step, unrolled), state,
                            parallel_iterations=1)
    _, loss_sum, examples = tf.while_loop(lambda index, *_: index < num_steps, step, state, parallel_iterations=1)
    self._record(slot, seq, num_steps, [loss_sum, examples])
    return self.step.outputs(loss_sum, examples)

  def _pipelined_steps(self, iterator, num_steps, seq):
    """Step i's gradients are applied while step i + 1 computes its own, from parameters without step i's updates:
    each ps applies one step's updates while the worker computes the next step (one step of delay, as a second
    worker would add). The first step computed only computes; the last applies after the loop. The loop runs
    `unrolled_steps` such steps per iteration, then the steps left one per iteration, as `_steps` does.

    A function run again that finds all its steps applied computes its last step again, for nothing: each ps skips
    that step's updates (recorded there), and its loss and examples are not counted."""
    progress = self.progress
    num_steps = tf.cast(num_steps, tf.int64)
    slot, first = progress.begin(seq, num_steps)
    self.rate_copies.set(self.step.optimizer())
    start = tf.minimum(first, num_steps - 1)
    ran = first < num_steps  # else every step was applied already, and the last one is computed for nothing

    loss, count, held = self._computed(iterator, self._mark(seq, start))
    if self.step.tables():  # known once a step is traced (model_fns build their layers then)
      raise UsageError("`pipelined_updates` (True) cannot train table layers (" + ", ".join(
          sorted(getattr(table, "name", type(table).__name__) for table in self.step.tables())) + "): a row given to "
          "a new id could take the delayed update of the id it held; train them with pipelined_updates=False")
    pending, invariants = _flat_gradients(held[0])

    def body(index, loss_sum, examples, *pending):
      loss, count, computed = self._computed(iterator, self._mark(seq, index))
      # After the computation in program order: each ps reads this step's parameters before it applies the last one's,
      # and decides on its updates of the last step once all those reads are done (`ps_records.OncePerPs`).
      reads = step_order.after_reads(self.step.variables())
      self._apply(held, pending, self._mark(seq, index - 1), reads)
      flat, _ = _flat_gradients(computed[0])
      return (index + 1, loss_sum + tf.cast(loss, tf.float32), examples + tf.cast(count, tf.int64), *flat)

    unrolled = self.mode.steps_per_iteration(self.steps_per_execution, _batch_size(iterator))
    loop = (start + 1, tf.where(ran, tf.cast(loss, tf.float32), 0.0),
            tf.where(ran, tf.cast(count, tf.int64), tf.constant(0, tf.int64)), *pending)
    shapes = (tf.TensorShape([]),) * 3 + tuple(invariants)
    if unrolled > 1:
      loop = tf.while_loop(lambda index, *_: index + unrolled <= num_steps, steps_lib.repeated(body, unrolled), loop,
                           shape_invariants=shapes, parallel_iterations=1)
    _, loss_sum, examples, *pending = tf.while_loop(lambda index, *_: index < num_steps, body, loop,
                                                    shape_invariants=shapes, parallel_iterations=1)
    last = self._apply(held, pending, self._mark(seq, num_steps - 1))
    self._record(slot, seq, num_steps, last + [loss_sum, examples])
    return self.step.outputs(loss_sum, examples)

  def _mark(self, seq, index):
    """Step `index` of function `seq` in the records (`exactly_once`)."""
    return seq * self.progress.stride + index + 1

  def _run(self, fn, batch, slots, mark):
    """`fn(batch)` in replica context, table layers marked with the step (`slots`: its `SlotOfMark`)."""
    slot = slots.on(self.progress.variable.device)
    return self.strategy.run(self.table_marks.marked(fn, slot, mark), args=(batch,))

  @contextlib.contextmanager
  def _applying(self, slots, mark, after=None):
    """While a step's updates are traced: every update waits for all its gradients (and the op of `after` on its
    ps) and is skipped where its ps applied step `mark` already (yields the `ps_records.OncePerPs`; `slots` the
    mark's `SlotOfMark`); gradients of ids a table looked up as distinct are not summed per row again."""
    optimizer = self.step.optimizer()
    rows = _tf_private.adagrad_rows_at_once(optimizer, locked=not self.mode.lockfree_row_updates)
    bf16_rows = self.mode.bf16_rows
    once = ps_records.applying_once_per_ps(optimizer, self.progress.ps_records, self.strategy, slots, mark, after,
                                             bf16_rows)
    with rows, distinct_rows.applying(optimizer, bf16_rows), self.rate_copies.reading(optimizer), once as applying:
      yield applying

  def _reading(self, batch):
    """While a step on `batch` reads its parameters: with `packed_reads`, those of each ps in one transfer, but its
    tables (the variables it gathers rows from)."""
    if self.packed_reads is None:
      return contextlib.nullcontext()
    if self._tables is None:
      self._tables = self._gathered(batch)
    return self.packed_reads.reading(self.step.trainable_variables(), self._tables)

  def _gathered(self, batch) -> list:
    """The variables (or shards) the step gathers rows from, wherever the model looks them up: found by tracing the
    step on `batch`'s spec in a scratch graph (never run), its updates held back."""
    found = []

    def step(batch):
      optimizer = self.step.optimizer()
      with (contextlib.nullcontext() if optimizer is None else
            steps_lib.redirected_apply_gradients(optimizer, lambda *args, **kwargs: tf.no_op())):
        self.strategy.run(self.step.run, args=(batch,))
      found.extend(packing.gathered(tf.compat.v1.get_default_graph(), self.step.trainable_variables()))

    tf.function(step, autograph=False).get_concrete_function(tf.nest.map_structure(tf.type_spec_from_value, batch))
    return found

  def _record(self, slot, seq, num_steps, after):
    """Records all `num_steps` steps of function `seq` (its `slot`, as `progress.begin` gave it) applied, after `after`
    (the loop's outputs: a loop ends once every op of its last iteration has run, on every ps). Rule 2 once per
    function, not per step: each step's record waited for every ps's, a control signal from each ps to the one holding
    the progress in every step. A function run again after a worker died mid-way starts at its first step, and each
    ps skips the steps it applied (rule 3): those steps are computed again, not applied again."""
    return self.progress.record(slot, seq * self.progress.stride + tf.cast(num_steps, tf.int64), after)

  def _computed(self, iterator, mark):
    """A step's computation alone: `(loss, count, held)`, `held` its `apply_gradients` call held back, as
    `(grads_and_vars, args, kwargs)`."""
    held = []

    def hold(grads_and_vars, *args, **kwargs):
      held.append((grads_and_vars, args, kwargs))
      return tf.no_op()

    batch = next(iterator)
    with steps_lib.redirected_apply_gradients(self.step.optimizer(), hold), self._reading(batch):
      loss, count = self._run(self.step.run, batch, ps_records.SlotOfMark(mark, self.progress.stride), mark)
    if len(held) != 1:
      raise UsageError(f"`pipelined_updates` (True) needs a step that applies its gradients with one "
                       f"`optimizer.apply_gradients` call; this one made {len(held)}")
    return loss, count, held[0]

  def _apply(self, held, gradients, mark, after=None):
    """The updates of step `mark`: the `apply_gradients` call `held` (`_computed`) made with `gradients` (flat, as
    `_flat_gradients` gives them), each ps's after its op in `after`, then each ps's record of it (returned)."""
    (grads_and_vars, args, kwargs), optimizer = held, self.step.optimizer()
    pairs = _packed_gradients(grads_and_vars, gradients)
    slots = ps_records.SlotOfMark(mark, self.progress.stride)
    with self._applying(slots, mark, after) as once:
      self.strategy.run(lambda: optimizer.apply_gradients(pairs, *args, **kwargs))
      ps_records.counted_after_updates(self.step, once)
    return once.records()

  def schedule(self, iterator, num_steps: int):
    return self.coordinator.schedule(self.function, args=(iterator, tf.constant(num_steps, tf.int64),
                                                          self.progress.next_sequence()))

  def schedule_batches(self, stacked, num_steps: int):
    """`schedule` for batches given as arguments: `num_steps` steps on the first batches of `stacked` (a batch
    structure, `steps_per_execution` batches stacked; `steps_lib.GivenBatches`); a function run again after a worker
    failure goes on with the batch of its first step not applied. Not with `pipelined_updates`."""
    if self.mode.pipelined_updates:
      raise UsageError("`pipelined_updates` (True) cannot train on batches given by the chief (a stream); train on "
                       "a stream with pipelined_updates=False")
    if self._given is None:
      self._given = tf.function(lambda stacked, num_steps, seq: self._steps(steps_lib.GivenBatches(stacked),
                                                                            num_steps, seq), autograph=False,
                                reduce_retracing=True)  # a stream's partial batches: one more trace, any size
    return self.coordinator.schedule(self._given, args=(stacked, tf.constant(num_steps, tf.int64),
                                                        self.progress.next_sequence()))

  def begin(self) -> None:
    self._start = (int(self.step.counter.numpy()), self.progress.position)

  def settle(self) -> int:
    return self.progress.settle(self.step.counter, *self._start)


def _batch_size(iterator):
  """The static size of the batches the steps take from `iterator` (`steps_lib.next_batch`), or None."""
  if isinstance(iterator, steps_lib.GivenBatches):  # stacked: the batch is the second dimension
    shape = tf.nest.flatten(iterator.stacked)[0].shape
    return shape[1] if shape.rank and shape.rank > 1 else None
  spec = getattr(iterator, "element_spec", None)
  return None if spec is None else dataset_fns.static_batch_size(spec)


def _flat_gradients(grads_and_vars):
  """The gradients' tensors as loop variables, and their shape invariants (a sparse gradient's rows vary)."""
  flat, invariants = [], []
  for gradient, _ in grads_and_vars:
    if isinstance(gradient, tf.IndexedSlices):
      parts = [gradient.values, gradient.indices] + ([] if gradient.dense_shape is None else [gradient.dense_shape])
      flat.extend(parts)
      invariants.extend([tf.TensorShape([None]).concatenate(gradient.values.shape[1:]), tf.TensorShape([None])]
                        + ([] if gradient.dense_shape is None else [gradient.dense_shape.shape]))
    elif gradient is not None:
      flat.append(gradient)
      invariants.append(gradient.shape)
  return flat, invariants


def _packed_gradients(grads_and_vars, flat):
  """`grads_and_vars` with the gradients rebuilt from `flat` (`_flat_gradients` of a step of the same structure)."""
  flat, packed = list(flat), []
  for gradient, variable in grads_and_vars:
    if isinstance(gradient, tf.IndexedSlices):
      values, indices = flat.pop(0), flat.pop(0)
      dense_shape = None if gradient.dense_shape is None else flat.pop(0)
      packed.append((tf.IndexedSlices(values, indices, dense_shape), variable))
    elif gradient is not None:
      packed.append((flat.pop(0), variable))
  return packed
