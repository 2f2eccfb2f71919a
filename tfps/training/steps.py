"""What a training step is (`Step`) and what drives steps in one training mode (`Runner`), for both training paths.

Each path builds its `Step` once: `tfps.keras.steps.keras_step` from a compiled tf-keras model, `ModelFnModel.step`
(tfps.estimator) from a model_fn. `tfps.training.runners.build_runner` picks the runner of the training mode; the
Keras path calls it from tf-keras `Model.fit`, the Estimator path from `tfps.training.loop.TrainLoop`. See
docs/training_modes_layer.md.
"""

import dataclasses
from typing import Any, Callable, List, Optional

import tensorflow as tf

from tfps import _tf_private


@dataclasses.dataclass(frozen=True)
class Step:
  """One training step of a model, as every runner drives it.

  Attributes:
    run: `fn(batch) -> (loss, num_examples)`, in replica context: the user's step, applying its gradients with one
      `optimizer().apply_gradients` call (runners intercept that call, and the updates it makes).
    forward: `fn(batch)`, in replica context: the model's output alone (geo traces it to find the embedding ids).
    optimizer: `fn() -> optimizer` (a tf-keras optimizer; it must exist when a runner's function is first traced).
    variables: `fn() -> [tf.Variable]`, every variable of the model (a step is recorded after their updates).
    trainable_variables: `fn() -> [tf.Variable]`, the ones gradients are taken against.
    counter: the int64 step counter, on a ps.
    counts_itself: whether `run` increments `counter` (tf-keras optimizers count in `iterations`); else the runner adds
      the steps it ran.
    outputs: `fn(loss_sum, examples) -> structure`, what one scheduled function returns, given the loss summed over its
      steps and their examples (tf-keras: the model's metric results, which `fit` takes as its logs).
    loss_is_a_sum: `fn() -> bool`, known once `run` is traced: whether `run`'s loss is its batch's loss summed over its
      examples (tf-keras's held-back loss metric update), so that the losses of a step's batches add up; else each is
      its batch's mean, and a step's loss is the mean over its batches.
    tables: `fn() -> list`, the model's layers (or their states) that keep tables of their own on the ps
      (`tfps.training.tables`), known once the model is built.
    metric_variables: `fn() -> [tf.Variable]`, the variables of the metrics `run` updates or reads (tf-keras: the
      model's compiled metrics).
  """

  run: Callable
  forward: Callable
  optimizer: Callable
  variables: Callable[[], List[tf.Variable]]
  trainable_variables: Callable[[], List[tf.Variable]]
  counter: tf.Variable
  counts_itself: bool
  outputs: Callable[[tf.Tensor, tf.Tensor], Any] = lambda loss_sum, examples: (loss_sum, examples)
  tables: Callable[[], list] = lambda: []
  metric_variables: Callable[[], List[tf.Variable]] = lambda: []
  loss_is_a_sum: Callable[[], bool] = lambda: False

  def count(self, steps) -> Optional[tf.Operation]:
    """Adds `steps` to the counter unless `run` counts itself (then None)."""
    return None if self.counts_itself else self.counter.assign_add(tf.cast(steps, tf.int64))


class Runner:
  """Drives steps in one training mode; one subclass (one file) per mode, registered in `tfps.training.runners`.

  The caller (tf-keras `fit`, or the coordinator loop) calls `begin()` where no function is pending, then `schedule`
  any number of times, joins the coordinator, and calls `settle()`.

  A subclass implements:
    schedule(iterator, num_steps): runs `num_steps` (at most `steps_per_execution`) steps from the per-worker
      `iterator`; returns what `Step.outputs` gives for them (a RemoteValue, or a value with `fetch()`).
  and may override `begin` and `settle` (the step counter is exact at `settle`), and `check_settings`. A runner that
  trains on batches the chief gives (a stream: async and sync) implements `schedule_batches(stacked, num_steps)`,
  each step on `batches_per_step` of the stacked batches.

  Attributes:
    steps_per_execution: the most steps one `schedule` call runs.
  """

  def __init__(self, step: Step, *, mode, strategy, coordinator, num_workers: int, steps_per_execution: int):
    self.step = step
    self.mode = mode
    self.strategy = strategy
    self.coordinator = coordinator
    self.num_workers = num_workers
    self.steps_per_execution = self.execution_steps(mode, steps_per_execution)

  @classmethod
  def check_settings(cls, mode, steps_per_execution: Optional[int]) -> None:
    """Raises `UsageError` on a user's `steps_per_execution` that this mode cannot take (None: not given)."""
    del mode, steps_per_execution

  @classmethod
  def execution_steps(cls, mode, steps_per_execution: int) -> int:
    """The steps per execution the mode runs, given the caller's choice."""
    del mode
    return steps_per_execution

  @property
  def batches_per_step(self) -> int:
    """The batches one step trains on where the chief gives them (`schedule_batches`, a stream): 1 (sync: one per
    worker batch it averages)."""
    return 1

  def schedule(self, iterator, num_steps: int):
    raise NotImplementedError(f"{type(self).__name__} must implement `schedule(iterator, num_steps)`")

  def begin(self) -> None:
    """Called where no scheduled function is pending, before the functions `settle` will account for."""

  def settle(self) -> int:
    """Called after the coordinator's join; makes the step counter exact and returns it."""
    return int(self.step.counter.numpy())


class GivenBatches:
  """Batches handed to a scheduled function as its arguments (a stream read on the chief), in place of a per-worker
  iterator: step `index` of the function takes batch `index`, also when the function runs again after a worker
  failure from a step past its first (`next_batch`).

  Args:
    stacked: a batch structure whose tensors hold the function's batches stacked along a first dimension.
  """

  def __init__(self, stacked):
    self.stacked = stacked

  def batch_at(self, index):
    """Batch `index` (a scalar tensor) of the stack."""
    return tf.nest.map_structure(lambda tensor: tf.gather(tensor, index), self.stacked)


def repeated(step: Callable, times: int) -> Callable:
  """A loop body running `step(*state) -> state` `times` times, traced one after another."""
  def steps(*state):
    for _ in range(times):
      state = step(*state)
    return state
  return steps


def next_batch(iterator, index):
  """Step `index`'s batch: batch `index` of `GivenBatches`, else `next(iterator)` (a per-worker iterator)."""
  return iterator.batch_at(index) if isinstance(iterator, GivenBatches) else next(iterator)


def redirected_apply_gradients(optimizer, sink: Callable):
  """While a step is traced: its `optimizer.apply_gradients(grads_and_vars, *args, **kwargs)` call applies nothing
  and returns `sink(list(grads_and_vars), *args, **kwargs)` instead (sync writes the gradients into its buffers,
  pipelined async holds them for the next iteration)."""
  return _tf_private.intercepting_apply_gradients(
      optimizer, lambda apply_gradients, grads_and_vars, *args, **kwargs: sink(grads_and_vars, *args, **kwargs))
