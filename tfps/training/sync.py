"""Synchronous parameter-server training: one update per global step from the averaged gradients of several worker
batches, all computed on the same parameter version (what TF1's SyncReplicasOptimizer did, which
ParameterServerStrategy does not offer).

A step runs in two phases, each a set of scheduled functions the coordinator waits for:

1. Gradients. Each worker computes the gradients of one batch of its own dataset and writes them into its slot of a
   gradient buffer kept beside each variable on its ps (slot = the worker's index; a dense gradient in a `[workers,
   ...]` buffer, an embedding's sparse gradient as its rows and their indices, never a table-sized buffer). The slot
   is then marked with the step. A worker whose slot is already marked does nothing, so a function re-run after a
   worker failure never counts twice. When a slot stays empty for `steal_after_secs` (its worker died and is being
   restarted), another worker fills it with a batch of its own, and the step goes on.
2. Update. One function averages the first `replicas` marked slots and applies them with the model's optimizer,
   once per ps: as in async (`tfps.training.ps_records`), a ps starts the step's updates only once all its
   gradients are there, records the step after them, and skips them when the function runs again after a failure.
   A worker that dies during the update can leave it applied on one ps and not another; the re-run applies it where
   it is missing and nowhere else. The step counter is then settled from the records (a count that reached its ps
   without that ps's record is not counted twice).

On a stream (`schedule_batches`) the chief gives each step its `replicas` batches, batch k trained in slot k by
whichever worker gets there first: a function run again, or two workers filling one slot, write the same gradients.

The user's step (a `tfps.training.steps.Step`) runs unchanged: its `optimizer.apply_gradients` call is redirected into
the buffer while the gradient function is traced.
"""

import time
from typing import List, Tuple

from absl import logging
import tensorflow as tf

from tfps import _tf_private
from tfps.errors import TfpsError, UsageError
from tfps.training import exactly_once
from tfps.training import ps_records
from tfps.training import steps as steps_lib
from tfps.training import tables

STEAL_AFTER_SECS = 2.0


class SyncStepTimeout(TfpsError):
  """A sync step did not gather its gradients in time."""


class GradientBuffers:
  """Per-variable gradient slots (one per worker) on the variable's ps, created when the gradients are first seen.

  A dense gradient goes into a `[slots, ...]` variable. A sparse one (an embedding's `IndexedSlices`) goes into one
  hash table per slot, id -> summed row: it holds the rows of one batch, whatever their number (TensorFlow 2.21 cannot
  read back a variable of undefined shape on a ps, and a table-sized buffer is what sync must avoid).
  """

  def __init__(self, strategy, num_slots: int):
    self._strategy = strategy
    self.num_slots = num_slots
    self.entries: List[Tuple[tf.Variable, object]] = []  # (variable, dense buffer or one table per slot)

  def _create(self, variable, gradient):
    if isinstance(gradient, tf.IndexedSlices):
      with tf.init_scope(), tf.device(variable.device):
        buffer = [tf.lookup.experimental.MutableHashTable(tf.int64, gradient.values.dtype,
                                                          default_value=tf.zeros(gradient.values.shape[1:],
                                                                                 gradient.values.dtype))
                  for _ in range(self.num_slots)]
    else:
      replica_context = tf.distribute.get_replica_context()
      if replica_context is not None:  # traced inside strategy.run: variables are made in cross-replica context
        return replica_context.merge_call(lambda _: self._create(variable, gradient))
      with tf.init_scope(), self._strategy.extended.colocate_vars_with(variable):
        name = variable.name.split(":")[0].replace("/", "_")
        buffer = tf.Variable(tf.zeros([self.num_slots] + variable.shape, gradient.dtype), trainable=False,
                             name=f"sync_grad_{name}")
    self.entries.append((variable, buffer))
    return buffer

  def _buffer_of(self, variable, gradient):
    for known, buffer in self.entries:
      if known is variable:
        return buffer
    return self._create(variable, gradient)

  def write(self, slot: tf.Tensor, grads_and_vars) -> List:
    """Ops writing the gradients into `slot` (traced inside the gradient function)."""
    writes = []
    for gradient, variable in grads_and_vars:
      if gradient is None:
        continue
      buffer = self._buffer_of(variable, gradient)
      if isinstance(gradient, tf.IndexedSlices):
        ids, positions = tf.unique(tf.cast(gradient.indices, tf.int64))
        rows = tf.math.unsorted_segment_sum(gradient.values, positions, tf.size(ids))

        def writer(table, ids=ids, rows=rows):
          def write():
            with tf.control_dependencies([table.remove(table.export()[0])]):
              return table.insert(ids, rows)
          return write
        writes.append(tf.switch_case(tf.cast(slot, tf.int32), [writer(table) for table in buffer]))
      else:
        writes.append(buffer.scatter_update(tf.IndexedSlices(gradient[None], tf.reshape(slot, [1]))))
    return writes

  def average(self, chosen: tf.Tensor, replicas: int):
    """The `(gradient, variable)` pairs averaged over the `chosen` slots (`[slots]` bool, `replicas` of them)."""
    pairs = []
    for variable, buffer in self.entries:
      if isinstance(buffer, list):
        ids, rows = [], []
        none = (tf.zeros([0], tf.int64), tf.zeros([0] + variable.shape[1:], buffer[0].value_dtype))
        for slot, table in enumerate(buffer):
          slot_ids, slot_rows = tf.cond(chosen[slot], table.export, lambda: none)
          ids.append(slot_ids)
          rows.append(slot_rows)
        pairs.append((tf.IndexedSlices(tf.concat(rows, 0) / replicas, tf.concat(ids, 0),
                                       dense_shape=tf.shape(variable, out_type=tf.int64)), variable))
      else:
        weights = tf.reshape(tf.cast(chosen, buffer.dtype), [-1] + [1] * variable.shape.rank)
        pairs.append((tf.reduce_sum(buffer * weights, 0) / replicas, variable))
    return pairs


class SyncRunner(steps_lib.Runner):
  """Runs sync steps on the ClusterCoordinator: `schedule(iterator, num_steps)` runs `num_steps` of them, each a
  gradient round and an update, and returns the last update function's result (`Step.outputs` of the loss summed
  over the steps, each step's the sum or the mean of its batches' as `Step.loss_is_a_sum` says, and the examples of
  every batch used).

  `mode.replicas_to_aggregate` worker batches (default: one per worker) make one step: `gather(iterator, step)`
  schedules `gradient_function` until enough slots hold gradients of `step`, then `update_function(step, loss_sum,
  examples)` applies them, and `settle_step(step)` checks the step counter after it.
  """

  def __init__(self, step: steps_lib.Step, timeout_secs: float = 600.0, **kwargs):
    super().__init__(step, **kwargs)
    self._replicas = self.mode.replicas(self.num_workers)
    self._timeout_secs = timeout_secs
    self.buffers = GradientBuffers(self.strategy, self.num_workers)
    with self.strategy.scope(), self.strategy.extended.colocate_vars_with(step.counter):
      self.marks = tf.Variable(tf.fill([self.num_workers], tf.constant(-1, tf.int64)), trainable=False,
                               name="sync_slot_steps")
    # Table layers' bookkeeping (sightings, admissions) once per step and worker slot: a re-run gradient function whose
    # first run got to a table shard only looks up there.
    self.table_marks = tables.StepMarks(self.strategy, step.tables())
    self.ps_records = ps_records.PsRecords()  # the steps each ps has applied (slot: step % SLOTS, mark: step + 1)
    self.gradient_function = tf.function(self._gradients)
    self.update_function = tf.function(self._update)
    self._given = None  # `gradient_function` for batches given as arguments (`schedule_batches`), made at first use

  @classmethod
  def check_settings(cls, mode, steps_per_execution) -> None:
    if steps_per_execution is not None:
      raise UsageError(f"`steps_per_execution` ({steps_per_execution}) applies to sync_mode=async only: a sync step "
                       "is its own scheduled round")

  def _gradients(self, iterator, step, may_steal):
    worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64)
    free = tf.not_equal(self.marks.read_value(), step)
    if isinstance(iterator, steps_lib.GivenBatches):  # batch k in slot k: any worker may fill any free slot at once
      free = tf.logical_and(free, tf.range(self.num_workers) < self._replicas)
      may_steal = tf.constant(True)
    first_free = tf.argmax(tf.cast(free, tf.int32), output_type=tf.int64)
    slot = tf.where(free[worker], worker,
                    tf.where(tf.logical_and(may_steal, tf.reduce_any(free)), first_free, tf.constant(-1, tf.int64)))

    def compute():
      writes = []
      with steps_lib.redirected_apply_gradients(
          self.step.optimizer(), lambda pairs, *_, **__: writes.extend(self.buffers.write(slot, pairs)) or tf.no_op()):
        loss, count = self.strategy.run(self.table_marks.marked(self.step.run, slot, step + 1),
                                        args=(steps_lib.next_batch(iterator, slot),))
      with tf.control_dependencies(writes):
        marked = self.marks.scatter_update(tf.IndexedSlices(tf.reshape(step, [1]), tf.reshape(slot, [1])))
      with tf.control_dependencies([marked]):
        return tf.constant(1, tf.int64), tf.cast(loss, tf.float32), tf.cast(count, tf.int64)

    def skip():
      return tf.constant(0, tf.int64), tf.constant(0.0), tf.constant(0, tf.int64)

    with _tf_private.lookup_tables_captured_outermost():  # the model's lookup tables, called inside the cond
      return tf.cond(slot >= 0, compute, skip)

  def _update(self, step, loss_sum, examples):
    marked = tf.equal(self.marks.read_value(), step)
    chosen = tf.logical_and(marked, tf.cumsum(tf.cast(marked, tf.int32)) <= self._replicas)
    ready = tf.equal(tf.reduce_sum(tf.cast(chosen, tf.int32)), self._replicas)
    slot, mark = _record_of(step)

    def apply():
      def replica_apply():
        optimizer = self.step.optimizer()
        with ps_records.applying_once_per_ps(optimizer, self.ps_records, self.strategy, slot, mark) as once:
          optimizer.apply_gradients(self.buffers.average(chosen, self._replicas))
          counted = ps_records.counted_after_updates(self.step, once)
        with tf.control_dependencies(once.records() + counted):
          return tf.constant(True)
      return self.strategy.run(replica_apply)

    applied = tf.cond(ready, apply, lambda: tf.constant(False))
    with tf.control_dependencies([applied]):
      return self.step.outputs(tf.identity(loss_sum), tf.identity(examples))

  def settle_step(self, step: int) -> None:
    """After step `step`'s update function ended: the counter reads `step + 1` where every ps recorded the step (a
    count whose record was lost with its worker counted it twice), or the step was not applied."""
    counter = int(self.step.counter.numpy())
    if counter == step + 1:
      return
    slot, mark = _record_of(step)
    if not self.ps_records.vectors or any(int(vector.sparse_read(slot)[0].numpy()) < mark
                                          for vector in self.ps_records.vectors.values()):
      raise RuntimeError(f"sync step {step} was not applied (the step counter is {counter})")
    exactly_once.settle_counter(self.step.counter, step + 1)

  @property
  def batches_per_step(self) -> int:
    return self._replicas

  def schedule(self, iterator, num_steps: int):
    return self._schedule_steps(num_steps, lambda index: (iterator, self.gradient_function))

  def schedule_batches(self, stacked, num_steps: int):
    """`schedule` for batches given by the chief (a stream): `stacked` (a batch structure, batches stacked along a
    first dimension) holds step `i`'s `batches_per_step` batches at `i * batches_per_step` on. A step trains its batch
    `k` in gradient slot `k`, whichever worker fills it: a gradient function run again, or two filling one slot at
    once, train the same batch on the same parameters, and the update averages each batch once."""
    if self._given is None:
      self._given = tf.function(lambda stacked, step, may_steal: self._gradients(
          steps_lib.GivenBatches(stacked), step, may_steal), autograph=False)
    size = self._replicas
    return self._schedule_steps(num_steps, lambda index: (
        tf.nest.map_structure(lambda tensor: tensor[index * size:(index + 1) * size], stacked), self._given))

  def _schedule_steps(self, num_steps: int, inputs):
    """Runs `num_steps` steps, step `index`'s gradients from `inputs(index)`: `(iterator or stacked batches, the
    gradient function taking them)`."""
    loss_sum, examples, result = 0.0, 0, None
    for index in range(num_steps):
      step = int(self.step.counter.numpy())
      gradients = self.gather(*inputs(index), step=step)
      counted = [value for value in (g.fetch() for g in gradients) if value[0]]
      losses = [float(loss) for _, loss, _ in counted]
      loss_sum += sum(losses) if self.step.loss_is_a_sum() else sum(losses) / max(len(losses), 1)
      examples += sum(int(count) for _, _, count in counted)
      # The sums go to the last update only (the earlier ones take zeros): `Step.outputs` may update a metric with
      # them (tf-keras's loss metric), which must take each step once.
      last = index == num_steps - 1
      result = self.coordinator.schedule(self.update_function, args=(
          tf.constant(step, tf.int64), tf.constant(loss_sum if last else 0.0, tf.float32),
          tf.constant(examples if last else 0, tf.int64)))
      self.coordinator.join()
      self.settle_step(step)
    return result

  def gather(self, iterator, function=None, *, step: int) -> list:
    """Schedules gradient functions (`function`, default `gradient_function`, on `iterator`) until `replicas` slots
    hold gradients of `step`."""
    function = function or self.gradient_function
    started = time.monotonic()
    results, needed, rounds = [], self._replicas, 0
    while needed > 0:
      may_steal = tf.constant(time.monotonic() - started > STEAL_AFTER_SECS)
      results += [self.coordinator.schedule(function, args=(iterator, tf.constant(step, tf.int64), may_steal))
                  for _ in range(needed)]
      self.coordinator.join()
      needed = self._replicas - int(tf.reduce_sum(tf.cast(tf.equal(self.marks, step), tf.int32)).numpy())
      rounds += 1
      if needed > 0:
        waited = time.monotonic() - started
        if waited > self._timeout_secs:
          raise SyncStepTimeout(f"sync step {step}: only {self._replicas - needed} of {self._replicas} worker "
                                f"batches after {waited:.0f}s; are the workers up?")
        if rounds == 2:
          logging.info("sync step %d is waiting for %d more worker batch(es)", step, needed)
        time.sleep(0.05)
    return results


def _record_of(step):
  """`(slot, mark)`: where each ps records in its `ps_records.PsRecords` vector that it applied step `step`."""
  return tf.reshape(step % exactly_once.SLOTS, [1]), step + 1
