"""Each ps applies a step's updates once, however many times its scheduled function runs: rules 1 to 3 of
`tfps.training.exactly_once` (the rules this module's docstrings number).

`PsRecords` keeps, beside the variables on every ps, the steps that ps has applied (absolute marks, as in
`exactly_once.StepProgress`'s progress vector). While a step's updates are traced, `applying_once_per_ps` makes each
ps start them only once all the step's gradients for that ps are there (rule 1, `updates_after_every_gradient`) and
skip them where it applied the step already (rule 3, `OncePerPs`). Rule 2, a scheduled function's record once its
steps ran on every ps, is `tfps.training.asynchronous.AsyncRunner`'s.
"""

import contextlib
import uuid
from typing import Dict, Iterable, List, Optional

import tensorflow as tf

from tfps import _tf_private
from tfps.training import exactly_once
from tfps.training import packing
from tfps.training import step_order
from tfps.training import strategy as strategy_lib
from tfps.training import touched_rows
from tfps.training import wire


# The names of each ps's decision on a step's updates and of its record of them (`OncePerPs`), as found in a
# partitioned graph (`bench/transfers.py`).
DECISION, RECORD = "tfps_decision", "tfps_record"


def counted_after_updates(step, once: "OncePerPs" = None) -> List[tf.Operation]:
  """Inside `applying_once_per_ps`, after a step's updates: the step's count where `step` (a
  `tfps.training.steps.Step`) does not count itself (a list, empty where it does). With `once` (the `OncePerPs` the
  context yields) the count waits for the updates it made on the counter's ps, and for an op per variable there only
  where no update went through it.

  Counted on the counter's ps after the step's updates there (their conditional branches, whether these applied the
  updates or skipped them), directly, not through the strategy's update, as a tf-keras legacy optimizer's
  `iterations` is: a step run again is counted again, and the counter is settled from the records (rule 4). It
  waits for no other ps (each would send it a control signal in every step): the function's record waits for them all
  (rule 2). Made on the counter's ps from nothing of the worker's: a count built on the worker would wait there for
  the updates and go back to the ps, a round trip in every step."""
  if step.counts_itself:
    return []
  device = step.counter.device
  local = [part for variable in step.variables() for part in strategy_lib.shards_of(variable) if part.device == device]
  after = step_order.after_updates(local) if once is None else once.after_updates_on(device, local)
  with tf.device(device), tf.control_dependencies(after):
    return [step.count(1)]


def _on_their_ps(grads_and_vars, bf16_rows: bool = False):
  """In a tf.function: `(grads_and_vars, gates)`, each gradient moved to its variable's ps (a copy there, which the
  update then reads: the update's ops all run on the ps), and `{device: op}`, one op per ps that runs once every
  gradient for a variable on that ps is there. The dense gradients of one ps (the small dense layers) travel packed
  in one tensor: one transfer per ps and step instead of one per variable; with `bf16_rows` the rows of a sparse
  gradient (float32) travel as bfloat16 (`tfps.training.wire`)."""
  moved = list(grads_and_vars)
  by_device, dense = {}, {}
  for position, (gradient, variable) in enumerate(moved):
    if gradient is None:
      continue
    if isinstance(gradient, tf.IndexedSlices):
      values = wire.crossed(gradient.values, variable.device) if bf16_rows else gradient.values
      with tf.device(variable.device):
        gradient = tf.IndexedSlices(tf.identity(values, name="tfps_gradient_in"),
                                    tf.identity(gradient.indices, name="tfps_gradient_in"), gradient.dense_shape)
      by_device.setdefault(variable.device, []).extend([gradient.values, gradient.indices])
      moved[position] = (gradient, variable)
    elif gradient.shape.is_fully_defined():
      dense.setdefault((variable.device, gradient.dtype), []).append(position)
    else:
      with tf.device(variable.device):
        moved[position] = (tf.identity(gradient, name="tfps_gradient_in"), variable)
      by_device.setdefault(variable.device, []).append(moved[position][0])
  for (device, _), positions in sorted(dense.items(), key=lambda item: (item[0][0], item[0][1].name)):
    packed, parts = packing.transferred([moved[position][0] for position in positions], destination=device)
    for position, part in zip(positions, parts):
      moved[position] = (part, moved[position][1])
    by_device.setdefault(device, []).append(packed)
  return moved, dict(zip(sorted(by_device), step_order.grouped(by_device)))


@contextlib.contextmanager
def updates_after_every_gradient(optimizer, once: "OncePerPs", bf16_rows: bool = False):
  """While a train step is traced: the optimizer's updates on each ps start only once all the step's gradients for
  that ps have reached it (`once` decides there after them), so a worker that dies before sending them all leaves
  each ps with all of its updates of that step applied or none; a run again applies that step on the ps that have
  not (rule 3). No ps waits for another's gradients (that costs two control transfers per pair of ps and step)
  unless the optimizer writes a variable neither through the strategy's update nor after it (a current tf-keras
  optimizer: `_tf_private.writes_through_the_strategy`).
  Each gradient is sent once, to its ps, and updated from there: the update, and the skip of `OncePerPs`, then run
  on the ps without a further round trip to the worker. Not for an optimizer that clips or scales the gradients
  itself: it would send them twice, and the ones it applies would still arrive one by one. With `bf16_rows` the rows
  of sparse gradients travel as bfloat16 (`tfps.training.wire`)."""
  if optimizer is None or not _tf_private.applies_gradients_as_given(optimizer):
    yield
    return

  def gated(apply_gradients, grads_and_vars, *args, **kwargs):
    moved, gates = _on_their_ps(grads_and_vars, bf16_rows)
    once.decide_after(gates)
    updated = [variable for gradient, variable in moved if gradient is not None]
    once.expect(updated)
    # An optimizer that also writes a variable directly and without waiting for its updates (a current tf-keras
    # optimizer's `iterations`), not through the strategy's update that `once` makes conditional, would write it before
    # the gradients arrive: every op of such an optimizer waits for every ps's gradients instead.
    everywhere = [] if _tf_private.writes_through_the_strategy(optimizer) else list(gates.values())
    # A current tf-keras optimizer's learning rate and step count reach each ps before it decides, as a legacy one's
    # coefficients do (read outside the gate above: they wait for no gradient). Under ParameterServerStrategy a worker
    # is one replica: aggregating its gradients is the identity, and an aggregation op left to the worker's default
    # device would send each gradient back there.
    with _tf_private.step_values_on_each_ps(optimizer, updated, once.decide_after), \
        tf.control_dependencies(everywhere), _tf_private.identity_gradient_aggregation(optimizer), \
        _tf_private.prepared_coefficients(optimizer, once.decide_after_coefficients):
      return apply_gradients(moved, *args, **kwargs)

  with _tf_private.intercepting_apply_gradients(optimizer, gated):
    yield


@contextlib.contextmanager
def applying_once_per_ps(optimizer, records: "PsRecords", strategy, slot, mark, after=None, bf16_rows=False):
  """While a step's updates are traced: rules 1 and 3, each ps starts them once all its gradients are there (and
  the op of `after`, `{device: op}`, on it), and skips them where it applied step `mark` already. Yields the
  `OncePerPs` (`records()`, each ps's record).
  With `bf16_rows` the rows of sparse gradients travel to the ps as bfloat16.

  A tf-keras legacy optimizer's step count (`iterations`) follows its own ps's updates only, not every ps's
  (`OncePerPs.skipping_applied`)."""
  once = records.once_per_ps(slot, mark, after)
  counter = getattr(optimizer, "iterations", None) if _tf_private.writes_through_the_strategy(optimizer) else None
  with updates_after_every_gradient(optimizer, once, bf16_rows), once.skipping_applied(strategy, counter):
    yield once


class SlotOfMark:
  """The slot of a scheduled function (`exactly_once.StepProgress.begin`) made from one of its steps' `mark` on each ps
  that reads it: a mark is `seq * stride + index + 1` with `index < stride`, so its slot is
  `seq % exactly_once.SLOTS`. Each ps receives the mark in every step anyway; the slot made once on the progress
  vector's ps is a loop variable there, which each step's loop plumbing signals, and every other ps receives it from
  there in every step.

  Args:
    mark: the step's mark (int64).
    stride: `exactly_once.StepProgress.stride`.
  """

  def __init__(self, mark, stride: int):
    self._mark, self._stride, self._slots = mark, stride, {}

  def on(self, device: str) -> tf.Tensor:
    """The slot (shape [1]), made on `device` at its first use there."""
    if device not in self._slots:
      with tf.device(device):
        self._slots[device] = tf.reshape((self._mark - 1) // self._stride % exactly_once.SLOTS, [1])
    return self._slots[device]


class PsRecords:
  """On every ps that holds variables, the steps of each scheduled function that this ps has applied (absolute marks, as
  in the progress vector). A step run again skips, on each ps, the updates that ps applied already: a dead worker's
  step can have reached one ps and not another, or all of them without its record.

  Args:
    lock: each ps decides, applies and records holding a lock of its own (`OncePerPs`); False: no lock
      (`tfps.TrainingMode.records_lock`).
  """

  def __init__(self, lock: bool = True):
    self.lock = lock
    self.vectors: Dict[str, tf.Variable] = {}
    # Each ps's lock (a mutex beside its vector), which a ps holds from its decision on a step's updates to its record
    # of them (`OncePerPs`). Named for these records alone: the functions of another run on the same ps (another
    # model, a test before) never wait for it.
    self.locks: Dict[str, tf.Tensor] = {}
    self._lock_name = f"tfps_records_lock_{uuid.uuid4().hex}"

  def vector_for(self, variable) -> tf.Variable:
    """The record of `variable`'s ps, made (beside it) the first time a step is traced: a model's variables may not all
    exist before its first step."""
    if variable.device not in self.vectors:
      strategy = tf.distribute.get_strategy()
      with tf.init_scope(), strategy.scope(), strategy.extended.colocate_vars_with(variable):
        self.vectors[variable.device] = tf.Variable(tf.zeros([exactly_once.SLOTS], tf.int64), trainable=False,
                                                    name="tfps_applied_steps",
                                                    aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      if self.lock:
        with tf.init_scope(), tf.device(variable.device):
          self.locks[variable.device] = tf.raw_ops.MutexV2(shared_name=self._lock_name)
    return self.vectors[variable.device]

  def make_for(self, variables: Iterable[tf.Variable]) -> None:
    """Makes the records of the ps holding `variables` now: a tf.function whose first trace creates a variable is
    traced twice."""
    for variable in variables:
      for part in strategy_lib.shards_of(variable):
        self.vector_for(part)

  def once_per_ps(self, slot, mark, after=None) -> "OncePerPs":
    """Updates (`OncePerPs.run`) that each ps applies once for `mark` (`seq * stride + step index + 1`), however many
    times the scheduled function runs; a ps decides after its op in `after` (`{device: op}`), if any. `slot`: the
    function's slot, or its `SlotOfMark`."""
    return OncePerPs(self, slot, mark, after)


class OncePerPs:
  """In a tf.function: updates that run on each ps only if that ps has not recorded `mark` in `slot` yet, and, after
  them, each ps's record of it (`records()`). A ps decides once per function (its first `run`), so the updates of
  one mark on one ps all run or are all skipped together.

  Every update of a ps takes that decision as an input, so none starts before it, and the decision waits for the
  ps's gradients and its op of `after` (rule 1): once a ps decided, its updates and its record need nothing more from
  another task, and a worker that dies then leaves the step applied and recorded there, not applied in part.

  Each ps decides, updates and records holding a lock of its own (`PsRecords.locks`): a step can run twice at once,
  its function run again while the first run's part on a ps still applies it (the worker died after sending that ps
  all it needed), and without the lock both runs read no record and both applied it
  (`tests/test_exactly_once.py::test_two_runs_of_one_step_at_once_apply_it_once_on_its_ps`). The steps of different
  workers take turns there from decision to record, so no row update is lost without a table's own lock either."""

  def __init__(self, records: PsRecords, slot, mark, after=None):
    self._records, self._slot, self._mark = records, slot, mark  # slot: a tensor or a `SlotOfMark`
    self._after: Dict[str, list] = {device: [op] for device, op in (after or {}).items()}
    self._already: Dict[str, tf.Tensor] = {}
    self._applied: Dict[str, list] = {}
    self._updated = set()  # the variables `run` updated (`strategy_lib.variable_id`)
    self._locks: Dict[str, tf.Tensor] = {}  # each ps's lock, held from its decision to its record
    self._expected: Dict[str, set] = {}  # each ps's variables whose next update `run` holds back (`expect`)
    self._held: Dict[str, list] = {}  # each ps's updates held back for its one conditional
    self._made: Optional[List[tf.Operation]] = None  # `records()`, made once

  def decide_after(self, ops: Dict[str, tf.Operation]) -> None:
    """Each ps decides only after its op in `ops` (`{device: op}`) too; call before its first `run`."""
    for device, op in ops.items():
      if device in self._already:
        raise RuntimeError(f"the ps {device} decided on its updates before the ops it must wait for were given")
      self._after.setdefault(device, []).append(op)

  def decide_after_coefficients(self, coefficients: dict) -> None:
    """Each ps decides only once the coefficients an optimizer prepared for its updates there are on it
    (`{(device, dtype): {name: value}}`, made on that device: `_tf_private.prepared_coefficients`). The learning
    rate comes from the ps that holds its variable, or a copy on this ps (`tfps.training.rate_copies`). Arriving after
    the decision, it can be lost with a dying worker's step once the ps ran the updates that do not read it (a legacy
    Adagrad's accumulator rows) and not those that do, nor the record: the step run again then applies that part
    twice (`bench/transfers.py` lists such updates)."""
    for (device, _), values in sorted(coefficients.items(), key=lambda item: (item[0][0], item[0][1].name)):
      with tf.device(device):
        self.decide_after({device: tf.group(*[value for value in values.values() if isinstance(value, tf.Tensor)])})

  @contextlib.contextmanager
  def skipping_applied(self, strategy, counter=None):
    """While a step is traced: each variable update through `strategy.extended.update` (how tf-keras optimizers apply a
    gradient) runs only if its ps has not applied the mark yet (`run`).

    With `counter` (a tf-keras legacy optimizer's `iterations`, which it increments once every update it returns has
    run): the updates on another ps return an op that waits for nothing in their place, so the increment follows its own
    ps's updates only. Waiting for the others cost three control transfers in every step (each ps to the worker, and
    back to the counter's ps); the counter is settled from the records anyway (rule 4), which wait for every ps."""

    def conditional(update, var, fn, args, kwargs, group):
      gradient = args[0] if args else None
      done = self.run(var, lambda: update(var, fn, args=args, kwargs=kwargs, group=group), gradient)
      if group:
        return done
      if counter is not None and var.device != counter.device:
        with tf.device(counter.device):
          done = tf.no_op()
      return (done,)  # as ParameterServerStrategy returns them

    with _tf_private.intercepting_updates(strategy, conditional):
      yield
      self._emit_held()

  def expect(self, variables: Iterable[tf.Variable]) -> None:
    """The next update (`run`) of each of `variables` is held back (`run` returns an op that waits for nothing) until
    each expected variable of its ps has its update; then all run in one conditional on the ps's decision, not one
    each (fewer ops on the ps in every step), whose output `run` returns for the last."""
    for variable in variables:
      self._expected.setdefault(variable.device, set()).add(strategy_lib.variable_id(variable))

  def run(self, variable, update, gradient=None) -> tf.Tensor:
    """`update()` (the ops updating `variable`, made on its ps) unless its ps applied the mark; True where it ran.
    Where the update applies a sparse `gradient`, its rows are marked touched with it (`touched_rows`). An update
    `expect`ed is held back (see there); any other runs in a conditional of its own, after those held before it."""
    device, vector = variable.device, self._records.vector_for(variable)
    self._updated.add(strategy_lib.variable_id(variable))

    def apply():
      result = [r for r in tf.nest.flatten(update()) if r is not None]
      with tf.control_dependencies(result):
        return result + touched_rows.mark_updated(variable, gradient)

    with tf.device(device):
      if device not in self._already:
        with tf.control_dependencies(self._after.get(device, [])):
          self._locks[device] = (tf.raw_ops.MutexLock(mutex=self._records.locks[device]) if self._records.lock
                                 else tf.no_op())  # without the lock: what the decision waits for
        with tf.control_dependencies([self._locks[device]]):
          self._already[device] = tf.greater_equal(vector.sparse_read(self._slot_on(device))[0], self._mark,
                                                   name=DECISION)
    expected = self._expected.get(device, set())
    if strategy_lib.variable_id(variable) in expected:
      expected.remove(strategy_lib.variable_id(variable))
      self._held.setdefault(device, []).append(apply)
      if expected:
        with tf.device(device):
          return tf.no_op()
      return self._conditional(device)
    before = [self._conditional(device)] if self._held.get(device) else []
    self._held[device] = [apply]
    with tf.control_dependencies(before):
      return self._conditional(device)

  def _conditional(self, device: str) -> tf.Tensor:
    """The updates held back on `device` (`run`), in one conditional on its decision: they run unless it applied the
    mark (True where they ran)."""
    held = self._held.pop(device)

    def apply():
      ran = [op for update in held for op in update()]
      with tf.control_dependencies(ran):
        return tf.constant(True)

    with tf.device(device):
      done = tf.cond(self._already[device], lambda: tf.constant(False), apply)
    self._applied.setdefault(device, []).append(done)
    return done

  def _emit_held(self) -> None:
    """The updates still held back (an expected update never came), each ps's in one conditional; none expected."""
    self._expected.clear()
    for device in sorted(self._held):
      self._conditional(device)

  def after_updates_on(self, device: str, parts: Iterable[tf.Variable]) -> list:
    """What runs after the updates so far of `parts` (shards on `device`): those `run` made on `device`, and
    `step_order.after_updates` of the parts it did not update."""
    self._emit_held()
    return self._applied.get(device, []) + self._after_other_updates(parts)

  def _after_other_updates(self, parts) -> List[tf.Operation]:
    return step_order.after_updates(part for part in parts if strategy_lib.variable_id(part) not in self._updated)

  def run_all(self, updates) -> List[tf.Tensor]:
    """`run` for each `(variable, inputs, update)` of `updates`: `update(*inputs)`, reading copies of `inputs` made on
    the variable's ps. A ps starts its updates once all of its inputs are there, so a worker that dies while sending
    them leaves none of that ps's updates applied (not some of them, which a run again would apply twice). An update
    given as `(variable, [values, rows], update, True)` changes rows `rows` only (marked as a sparse gradient's). All
    are `expect`ed: each ps's run in one conditional."""
    moved, arrived = [], {}
    for variable, inputs, update, *sparse in updates:
      with tf.device(variable.device):
        copies = [tf.identity(tensor) for tensor in inputs]
      arrived.setdefault(variable.device, []).extend(copies)
      moved.append((variable, copies, update, tf.IndexedSlices(*copies) if sparse and sparse[0] else None))
    done = []
    self.expect(variable for variable, *_ in moved)
    for variable, copies, update, rows in moved:
      with tf.control_dependencies(arrived[variable.device]):
        done.append(self.run(variable, lambda update=update, copies=copies: update(*copies), rows))
    return done

  def _slot_on(self, device: str):
    return self._slot.on(device) if isinstance(self._slot, SlotOfMark) else self._slot

  def records(self) -> List[tf.Operation]:
    """Each ps's record of the mark, made after that ps's updates, and the release of its lock after it."""
    if self._made is None:
      self._emit_held()
      self._made = []
      for device, done in sorted(self._applied.items()):
        with tf.device(device), tf.control_dependencies(done):
          record = self._records.vectors[device].scatter_max(
              tf.IndexedSlices(tf.reshape(self._mark, [1]), self._slot_on(device)), name=RECORD)
        with tf.device(device), tf.control_dependencies([record]):
          self._made += [record] + ([_tf_private.released(self._locks[device])] if self._records.lock else [])
    return self._made
