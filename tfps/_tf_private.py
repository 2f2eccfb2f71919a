"""SHIM: the only place tfps touches private TensorFlow / tf-keras internals, or patches tf-keras objects at run time.

Each function names why no public way exists. `tests/test_tf_private.py` pins every name and call pattern relied on
here, so a TensorFlow / tf-keras upgrade that changes one fails there, in one place.

Every run-time patch goes through `swapped` (one helper), on the instance concerned and only while a step is traced.
The exceptions say why: `embedding_calls` and `lookup_tables_captured_outermost` patch a class while a step is
traced; `replace_train_function` and `use_exact_shard_function` set a model instance's tf-keras function for good.
"""

import contextlib
import copy
import functools
from typing import Callable

import tensorflow as tf
import tf_keras


@contextlib.contextmanager
def swapped(owner, name: str, value):
  """`owner.<name>` is `value` inside the block, and what it was again after (an attribute `owner` did not hold itself,
  e.g. a method of its class, is removed again, so the class's is seen)."""
  original, own = getattr(owner, name), name in vars(owner)
  setattr(owner, name, value)
  try:
    yield
  finally:
    if own:
      setattr(owner, name, original)
    else:
      delattr(owner, name)


def set_steps_per_execution(model, steps: int) -> None:
  """Sets the steps packed into one scheduled function of an already compiled tf-keras model.

  tf-keras takes `steps_per_execution` only in `compile()`, and the user's `build_model` compiles; recompiling would
  lose the user's compile arguments. It makes a new variable where it is called (outside a strategy's scope: in the
  calling process).
  """
  model._configure_steps_per_execution(steps)  # pylint: disable=protected-access


def steps_per_execution(model) -> int:
  """The compiled model's steps per execution (1 where the user did not choose)."""
  variable = getattr(model, "_steps_per_execution", None)
  return 1 if variable is None else int(tf.keras.backend.get_value(variable))


def is_sharded_variable(value) -> bool:
  """Whether `value` is a `ShardedVariable` (a variable ParameterServerStrategy's partitioner split): TensorFlow
  exports the class only as `tf.__internal__.distribute.ShardedVariable`."""
  return isinstance(value, tf.__internal__.distribute.ShardedVariable)


def initial_accumulator_value(optimizer, default: float = 0.0) -> float:
  """A legacy Adagrad's initial accumulator value (the value its `accumulator` slots start at); `default` for an
  optimizer without one. tf-keras keeps it in the private `_initial_accumulator_value` only."""
  return getattr(optimizer, "_initial_accumulator_value", default)


def is_compiled(model) -> bool:
  """Whether `model.compile` ran: a model compiled without a loss has no `compiled_loss`, and tf-keras then notes the
  compile in `_is_compiled` only."""
  return bool(model.compiled_loss) or bool(getattr(model, "_is_compiled", False))


def loss_metric(model):
  """The `Mean` tf-keras's compiled loss updates in every step and `fit` logs as "loss" (`compiled_loss`'s private
  `_total_loss_mean`), or None where the model has none."""
  return getattr(model.compiled_loss, "_total_loss_mean", None) if model.compiled_loss else None


def has_unbuilt_metrics(model) -> bool:
  """Whether `model` was compiled with metrics that are not built yet. tf-keras builds them in the first step's trace;
  which metrics a compile named is only in its `MetricsContainer`'s private `_user_metrics` and
  `_user_weighted_metrics` (an unbuilt container lists none)."""
  container = model.compiled_metrics
  if container is None or container.built:
    return False
  named = tf.nest.flatten([getattr(container, "_user_metrics", None),
                           getattr(container, "_user_weighted_metrics", None)])
  return any(metric is not None for metric in named)


def updates_held(metric, updates: list):
  """While a step is traced: each `metric.update_state(value, sample_weight=...)` appends `(value, sample_weight)` to
  `updates` instead of updating the metric (its `update_state` is the instance's own attribute: tf-keras wraps it per
  instance). Nothing changes where `metric` is None."""
  if metric is None:
    return contextlib.nullcontext()

  def held(values, sample_weight=None):
    updates.append((values, sample_weight))
    return tf.no_op()

  return swapped(metric, "update_state", held)


def set_exact_evaluation_shards(model, shards: int) -> None:
  """Turns on tf-keras's exactly-once evaluation under ParameterServerStrategy (`pss_evaluation_shards` in compile).

  Like `steps_per_execution`, tf-keras reads it only from `compile()`. 0 turns it off. A test function cached for the
  other setting is dropped (tf-keras builds it once per model and reads the setting when it builds it).
  """
  if exact_evaluation_shards(model) != shards:
    model.test_function = None
  model._pss_evaluation_shards = shards  # pylint: disable=protected-access
  if shards:
    use_exact_shard_function(model)


def use_exact_shard_function(model) -> None:
  """Makes this model's exactly-once evaluation under ParameterServerStrategy (`pss_evaluation_shards`) evaluate each
  shard as `Model.test_step` evaluates a batch.

  tf-keras's own shard function (`Model._make_test_function_exact`, no public hook) updates every compiled metric with
  the whole `(y, y_pred)` structure and its sample weights unmatched to the outputs (a model with several outputs, or
  weighted metrics, fails in it), rebuilds the loss without its loss weights, output names and regularization losses
  (another "loss" than the other evaluations report), and calls the model inside a `tf.cond` in its loop (a lookup
  table's per-worker resource, a `StringLookup`'s, is then never fed there). This one keeps function-local copies of
  the compiled loss and metrics containers, updates them as `test_step` does, and runs the model in a `tf.while_loop`
  over the shard's optional next batch. Each copy keeps its original's name, which tf-keras's aggregation matches.
  """
  from tensorflow.python.distribute import input_ops  # pylint: disable=g-import-not-at-top
  own_test_step = type(model).test_step is not tf_keras.Model.test_step

  def shard_function(dataset, total_shards, shard_index):
    metrics, loss = _local_compile_containers(model)
    iterator = iter(input_ops.auto_shard_dataset(dataset, total_shards, shard_index))

    def step(batch):
      if own_test_step:
        _shard_test_step(model, batch, metrics, loss)
        return
      x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(batch)
      y_pred = model(x, training=False)
      loss(y, y_pred, sample_weight, regularization_losses=model.losses)
      metrics.update_state(y, y_pred, sample_weight)

    def body(optional):
      model.distribute_strategy.run(step, args=(optional.get_value(),))
      return (iterator.get_next_as_optional(),)

    tf.while_loop(lambda optional: optional.has_value(), body, (iterator.get_next_as_optional(),))
    outputs = {metric.name: metric.weights for metric in loss.metrics + metrics.metrics}
    with tf.control_dependencies(tf.nest.flatten(outputs)):
      model._test_counter.assign_add(1)  # pylint: disable=protected-access
    return outputs

  function = tf.function(shard_function, reduce_retracing=True)
  scheduled = lambda *args: model._cluster_coordinator.schedule(function, args=args)  # pylint: disable=protected-access
  model._make_test_function_exact = lambda: scheduled  # pylint: disable=protected-access


class _CallsNoted:
  """A compiled loss container that notes whether it was called."""

  def __init__(self, container):
    self.container, self.called = container, False

  def __call__(self, *args, **kwargs):
    self.called = True
    return self.container(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self.container, name)


def _shard_test_step(model, batch, metrics, loss) -> None:
  """A `test_step` of the model's own on a shard's batch, the shard's containers (`metrics`, `loss`) its compiled
  ones while it is traced. A "loss" it returns without calling the compiled loss (TensorFlow Recommenders' models
  compute it in `compute_loss`) goes to the shard's loss mean, weighted by the batch's examples as tf-keras weights
  it."""
  noted = _CallsNoted(loss)
  with swapped(model, "compiled_loss", noted), swapped(model, "compiled_metrics", metrics):
    logs = model.test_step(batch)
  if not noted.called and isinstance(logs, dict) and "loss" in logs:
    examples = tf.shape(tf.nest.flatten(batch)[0])[0]
    loss._total_loss_mean.update_state(tf.reduce_mean(logs["loss"]), sample_weight=examples)  # pylint: disable=protected-access


def _local_compile_containers(model) -> tuple:
  """`(metrics, loss)`: copies of the model's built compiled metrics and loss containers whose metrics are clones with
  function-local variables (made in the function being traced, as tf-keras's exact evaluation makes its clones)."""
  from tf_keras.src.metrics import base_metric  # pylint: disable=g-import-not-at-top
  from tf_keras.src.utils import tf_utils  # pylint: disable=g-import-not-at-top
  # pylint: disable=protected-access
  with tf_utils.with_metric_local_vars_scope():
    metrics, loss = copy.copy(model.compiled_metrics), copy.copy(model.compiled_loss)
    clone = lambda metric: None if metric is None else base_metric.clone_metric(metric)
    metrics._metrics = [[clone(m) for m in per_output] for per_output in metrics._metrics]
    metrics._weighted_metrics = [[clone(m) for m in per_output] for per_output in metrics._weighted_metrics]
    metrics._create_ordered_metrics()
    loss._total_loss_mean = clone(loss._total_loss_mean)
    loss._per_output_metrics = [clone(m) for m in loss._per_output_metrics]
  # pylint: enable=protected-access
  return metrics, loss


def exact_evaluation_shards(model) -> int:
  """The model's `pss_evaluation_shards` (0: exact evaluation off)."""
  return getattr(model, "_pss_evaluation_shards", 0) or 0


def replace_train_function(model, run: Callable[[object], object]) -> None:
  """`model.fit` calls `run(iterator)` for each execution (of the model's steps per execution) and takes what it returns
  (a RemoteValue of the metric results, under ParameterServerStrategy) as the logs.

  tf-keras has no public way to give `fit` another train function: it calls `model.make_train_function()` and caches
  the result in `model.train_function`. Both are set on this model instance only.
  """
  def make_train_function(force=False):
    if model.train_function is None or force:
      model.train_function = run
    return model.train_function

  model.make_train_function = make_train_function
  model.train_function = None


BATCH_CALLBACKS_REFUSED = "Batch-level `Callback`s are not supported"  # the start of tf-keras's error under PSS
# The start of the warning tf-keras logs (to the "tensorflow" logger) where a training input ends within an epoch.
INPUT_RAN_OUT = "Your input ran out of data"


def accept_remote_logs(callback) -> None:
  """Lets `callback` use batch-level hooks under ParameterServerStrategy, where the logs it gets are RemoteValues.

  tf-keras refuses batch-level callbacks under ParameterServerStrategy (`BATCH_CALLBACKS_REFUSED`) unless the callback
  sets `_supports_tf_logs`; there is no public switch.
  """
  callback._supports_tf_logs = True  # pylint: disable=protected-access


def applies_gradients_as_given(optimizer) -> bool:
  """Whether `optimizer.apply_gradients` updates with the gradients it is given, not ones it derives after being called
  (clipping by `clipnorm`/`clipvalue`/`global_clipnorm`, or a LossScaleOptimizer's `inner_optimizer`)."""
  return (all(getattr(optimizer, name, None) is None for name in ("clipnorm", "clipvalue", "global_clipnorm"))
          and not hasattr(optimizer, "inner_optimizer"))


def writes_through_the_strategy(optimizer) -> bool:
  """Whether every variable `optimizer.apply_gradients` writes is written through `strategy.extended.update` or
  only once every update made there has run (so it waits for whatever those updates wait for).

  A tf-keras legacy optimizer updates each variable through it, and then increments its `iterations` directly (an
  `AssignAddVariableOp` outside the updates: with one replica per worker ParameterServerStrategy does not wrap its
  `ONLY_FIRST_REPLICA` variables in an `AggregatingVariable`, whose assignment would be an update), under a control
  dependency on every update `extended.update` returned. A current tf-keras optimizer increments its `iterations`
  directly with no dependency on its updates: that may run before any gradient of the step has arrived.
  """
  return isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer)


def intercepting_apply_gradients(optimizer, wrapper: Callable):
  """While a step is traced: `optimizer.apply_gradients(grads_and_vars, ...)` calls
  `wrapper(apply_gradients, list(grads_and_vars), *args, **kwargs)`, `apply_gradients` being the optimizer's own.

  A tf-keras `train_step` applies its gradients inside `optimizer.minimize`; there is no hook between computing the
  gradients and applying them but the optimizer's own method, replaced on this optimizer instance.
  """
  apply_gradients = optimizer.apply_gradients
  return swapped(optimizer, "apply_gradients", lambda grads_and_vars, *args, **kwargs: wrapper(
      apply_gradients, list(grads_and_vars), *args, **kwargs))


def intercepting_updates(strategy, wrapper: Callable):
  """While a step is traced: each `strategy.extended.update(var, fn, args, kwargs, group)` calls
  `wrapper(update, var, fn, args, kwargs, group)`, `update` being the strategy's own.

  tf-keras optimizers (legacy and current) apply each variable's gradient through `distribution.extended.update`, and
  so do assignments to an aggregating variable (a global step) in cross-replica context: it is the one place where
  every update of one variable can be made conditional. Replaced on this strategy's `extended` instance.
  """
  extended = strategy.extended
  update = extended.update
  return swapped(extended, "update", lambda var, fn, args=(), kwargs=None, group=True: wrapper(
      update, var, fn, args, kwargs, group))


def identity_gradient_aggregation(optimizer):
  """While tracing: a tf-keras optimizer's aggregation of gradients across replicas is the identity.

  A legacy optimizer's `apply_gradients` calls `self.gradient_aggregator(grads_and_vars)` (a constructor argument,
  kept on the instance), a current one's `self.aggregate_gradients(grads_and_vars)` (a method meant to be
  overridden); under ParameterServerStrategy a worker is one replica, so it is the identity anyway, but the legacy one
  asks each variable for its device, which a worker-local copy (geo) leaves to the worker that runs the function, and
  the current one returns each gradient from an op on the worker: a gradient already on its ps went back to the
  worker and, after the ps's decision on the step, to the ps again (`bench/transfers.py`).
  """
  name = "gradient_aggregator" if hasattr(optimizer, "gradient_aggregator") else "aggregate_gradients"
  if not callable(getattr(optimizer, name, None)):
    return contextlib.nullcontext()
  return swapped(optimizer, name, lambda grads_and_vars: grads_and_vars)


def prepared_coefficients(optimizer, seen: Callable[[dict], None]):
  """While tracing: each time a tf-keras legacy optimizer prepares the coefficients of its updates (`_prepare`, in
  `apply_gradients`, before any update), `seen` gets them, `{(device, dtype): {name: value}}`, made on each variable
  device (the learning rate there: a read of its variable, which may live on another ps). Nothing is changed on
  another optimizer. No public hook reaches these tensors before the updates that read them."""
  prepare = getattr(optimizer, "_prepare", None)
  if not isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer) or prepare is None:
    return contextlib.nullcontext()

  def prepared(var_list):
    coefficients = prepare(var_list)
    seen(coefficients)
    return coefficients

  return swapped(optimizer, "_prepare", prepared)


def learning_rate_variable(optimizer):
  """A tf-keras legacy optimizer's `learning_rate` variable, once made (its first `apply_gradients`, or
  `create_optimizer_slots`); None for another optimizer, or a rate that is a schedule or a callable. Its hyperparameter
  variables are kept in `_hyper`, made by `_create_hypers`; `optimizer.learning_rate` makes them if they are not."""
  if not isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
    return None
  rate = optimizer._hyper.get("learning_rate")  # pylint: disable=protected-access
  return rate if isinstance(rate, tf.Variable) else None


def learning_rate_given(optimizer):
  """The learning rate `optimizer` was made with, read without making its hyperparameter variables (reading a legacy
  tf-keras optimizer's `learning_rate` makes them): a legacy one keeps it in `_hyper`, a current one and a TF1 one
  (`tf.compat.v1.train.*`) in `_learning_rate`; None where there is none."""
  if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
    return optimizer._hyper.get("learning_rate")  # pylint: disable=protected-access
  return getattr(optimizer, "_learning_rate", None)


def learning_rate_read(optimizer, read: Callable[[str], object]):
  """While tracing: a tf-keras legacy optimizer's coefficients on a variable's device (`_prepare_local`, under that
  device, which reads the learning rate from `_hyper`) take the rate `read(device)` gives, where it gives one (a
  tensor), else its variable's value as before. No public hook reaches that read: `_hyper["learning_rate"]` is replaced
  while each device's coefficients are made."""
  prepare_local = getattr(optimizer, "_prepare_local", None)
  if learning_rate_variable(optimizer) is None or prepare_local is None:
    return contextlib.nullcontext()

  def local(var_device, var_dtype, apply_state):
    value = read(var_device)
    if value is None:
      return prepare_local(var_device, var_dtype, apply_state)
    hyper = optimizer._hyper  # pylint: disable=protected-access
    rate, hyper["learning_rate"] = hyper["learning_rate"], value
    try:
      return prepare_local(var_device, var_dtype, apply_state)
    finally:
      hyper["learning_rate"] = rate

  return swapped(optimizer, "_prepare_local", local)


@contextlib.contextmanager
def step_values_on_each_ps(optimizer, variables, seen: Callable[[dict], None]):
  """While tracing: a current (not legacy) tf-keras optimizer's updates of `variables` read its learning rate and step
  count from copies made now on each variable's device, and sum a sparse gradient's duplicate rows there; `seen` gets
  `{device: op}`, one op per device that runs once its copies are there. Nothing changes for another optimizer (a
  legacy one prepares its coefficients before its updates: `prepared_coefficients`).

  A current optimizer reads `self.learning_rate` (a variable on one ps; with a `LearningRateSchedule`, the value
  `apply_gradients` assigns from `self.iterations` first) in each variable's `update_step` and `_apply_weight_decay`,
  and Adam and others `self.iterations` in `update_step`, and `_deduplicate_sparse_grad` runs on the worker: each
  tensor a ps then received inside an update it runs conditionally (`tfps.training.ps_records.OncePerPs`), after its
  decision. The copies hold the values it reads there: `iterations` before `apply_gradients` increments it (the
  increment follows this read of the variable, as it followed the reads inside the updates), the schedule's value of
  it. No public hook reaches these reads: `_learning_rate` and `_iterations` are swapped on the instance while each
  variable's update is traced (`update_step`, `_apply_weight_decay` called for one variable at a time), and
  `_deduplicate_sparse_grad` runs under each gradient's device.
  """
  if not isinstance(optimizer, tf_keras.optimizers.Optimizer):
    yield
    return
  copies = _step_value_copies(optimizer, sorted({variable.device for variable in variables}))
  seen({device: tf.group(*values) for device, values in copies.items()})

  def reading_copies(variable):
    if variable.device not in copies:
      return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(swapped(optimizer, "_learning_rate", copies[variable.device][0]))
    stack.enter_context(swapped(optimizer, "_iterations", copies[variable.device][1]))
    return stack

  update_step, weight_decay = optimizer.update_step, optimizer._apply_weight_decay  # pylint: disable=protected-access

  def update_reading_copies(gradient, variable):
    with reading_copies(variable):
      return update_step(gradient, variable)

  def weight_decay_reading_copies(decayed):
    for variable in decayed:
      with reading_copies(variable):
        weight_decay([variable])

  with swapped(optimizer, "update_step", update_reading_copies), \
      swapped(optimizer, "_apply_weight_decay", weight_decay_reading_copies), \
      swapped(optimizer, "_deduplicate_sparse_grad", _each_on_its_ps(
          optimizer._deduplicate_sparse_grad)):  # pylint: disable=protected-access
    yield


def _each_on_its_ps(deduplicate: Callable) -> Callable:
  """`deduplicate` (a current tf-keras optimizer's `_deduplicate_sparse_grad`, gradients -> gradients) for one gradient
  at a time, under the device of a sparse gradient's values (its ps)."""
  def deduplicated(gradients):
    summed = []
    for gradient in gradients:
      with tf.device(gradient.values.device if isinstance(gradient, tf.IndexedSlices) else ""):
        summed += deduplicate([gradient])
    return summed

  return deduplicated


def _step_value_copies(optimizer, devices) -> dict:
  """`{device: (learning rate, iterations)}`: a current tf-keras optimizer's learning rate and step count as its
  updates would read them now, a copy on each of `devices`."""
  with tf.device(optimizer.iterations.device):
    step = tf.convert_to_tensor(optimizer.iterations)
    rate = optimizer._learning_rate  # pylint: disable=protected-access
    rate = tf.convert_to_tensor(rate(step) if isinstance(rate, tf_keras.optimizers.schedules.LearningRateSchedule)
                                else rate)
  copies = {}
  for device in devices:
    with tf.device(device):
      copies[device] = (tf.identity(rate, name="tfps_learning_rate"), tf.identity(step, name="tfps_iterations"))
  return copies


def lookup_tables_captured_outermost():
  """While tracing: a ParameterServerStrategy lookup table's resource handle (`DistributedTable`: a `StringLookup`'s,
  an `IntegerLookup`'s, any `StaticHashTable` made under the strategy's scope) is captured by the outermost function
  being traced, and reaches a `tf.cond` branch inside it as an ordinary captured tensor.

  TensorFlow captures the handle where it is used, as a value given when the function is called
  (`FuncGraph.capture_call_time_value`: each worker's own copy of the table); such a capture made in a `tf.cond`
  branch is never given ("You must feed a value for placeholder tensor ... with dtype resource" on the worker). The
  sync and geo runners call the model inside a `tf.cond`. No public hook reaches the capture: the class's property is
  patched, only while those runners' functions are traced (like `embedding_calls`, on the class: the tables are made
  inside the model's layers, and a model_fn makes its layers inside that very trace).
  """
  from tensorflow.python.distribute import ps_values  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import func_graph  # pylint: disable=g-import-not-at-top
  original = ps_values.DistributedTable.resource_handle

  def resource_handle(table):
    graph = outermost = tf.compat.v1.get_default_graph()
    while isinstance(getattr(outermost, "outer_graph", None), func_graph.FuncGraph):
      outermost = outermost.outer_graph
    if outermost is graph:
      return original.fget(table)
    with outermost.as_default():
      return original.fget(table)

  return swapped(ps_values.DistributedTable, "resource_handle", property(resource_handle))


@contextlib.contextmanager
def resources_made(made: list):
  """Appends to `made` every resource object (a lookup table, ...) created in the block, once it ends.

  A SavedModel saves the resources its functions use only where an object it tracks holds them. A model_fn makes its
  layers, and their lookup tables (a `StringLookup`'s), inside the serving function's trace: nothing tracks them
  unless the exporter keeps them. TensorFlow collects resources this way for its own savers
  (`resource_tracker_scope`); no public way exists.
  """
  from tensorflow.python.trackable import resource  # pylint: disable=g-import-not-at-top
  tracker = resource.ResourceTracker()
  with resource.resource_tracker_scope(tracker):
    yield
  made.extend(tracker.resources)


def traced_as_saved(function):
  """`function.get_concrete_function()` (a `tf.function` with an input signature), traced as `tf.saved_model.save`
  with its default options traces it, so that the saver takes this trace instead of tracing again.

  A trace keys on whether it is made for saving (the save options' variable policy); the saver's own trace of a
  model_fn would make new lookup tables there, which no saved object holds ("captures tensor ... which is unsupported
  or not reachable from root"). No public way to trace as the saver does.
  """
  from tensorflow.python.saved_model import save_context  # pylint: disable=g-import-not-at-top
  with save_context.save_context(tf.saved_model.SaveOptions()):
    return function.get_concrete_function()


def embedding_calls(answer: Callable):
  """While tracing: every tf-keras `Embedding` layer's call is `answer(layer, ids, original_call)`.

  The one patch made on a class: on the Estimator path the layers are created inside the model_fn, during the very
  trace that must see them answer (no instance exists before it to patch), and a Keras model may hold its Embedding
  layers in nested layers or lists. The patch lasts only while geo traces a round on the chief, or while async
  training with `bf16_rows` traces a step (`tfps.training.distinct_rows`).
  """
  original = tf_keras.layers.Embedding.call
  return swapped(tf_keras.layers.Embedding, "call", lambda layer, ids: answer(layer, ids, original))


def adagrad_rows_at_once(optimizer, locked: bool = True):
  """While tracing: a tf-keras legacy `Adagrad` applies a gradient of table rows by gathering the rows and their
  accumulators, updating them all at once and scattering them back, instead of TensorFlow's sparse Adagrad kernel.

  The kernel evaluates one Eigen expression per row (two: accumulator, then weights); for a batch's ~6,000 rows that was
  29% of a ps's CPU (bench/results/row_updates/NOTES.md). The arithmetic is the kernel's, in its order, so the results
  are equal bit for bit; the ids are unique there (the optimizer sums duplicates before `_resource_apply_sparse`, where
  the kernel is called), so no row is gathered twice. `locked` (the default) holds a lock of the variable's own (a
  `MutexV2` shared by name on its ps) from the gathers to the scatters, as the kernel holds the variable's: two workers
  updating the same rows take turns, and no update is lost. Without it the rows are read and written as TF1's optimizers
  did by default (`tfps.TrainingMode.lockfree_row_updates`). The kernel is called from that method, replaced on this
  optimizer instance; an optimizer of another class keeps its own.
  """
  if type(optimizer) is not tf_keras.optimizers.legacy.Adagrad:  # pylint: disable=unidiomatic-typecheck
    return contextlib.nullcontext()

  def apply_rows(grad, var, indices, apply_state=None):
    device, dtype = var.device, var.dtype.base_dtype
    coefficients = ((apply_state or {}).get((device, dtype))
                    or optimizer._fallback_apply_state(device, dtype))  # pylint: disable=protected-access
    accumulator = optimizer.get_slot(var, "accumulator")

    def update():
      accumulated = tf.raw_ops.ResourceGather(resource=accumulator.handle, indices=indices, dtype=dtype) + grad * grad
      rows = tf.raw_ops.ResourceGather(resource=var.handle, indices=indices, dtype=dtype) - (
          coefficients["lr_t"] * grad / (tf.sqrt(accumulated) + coefficients["epsilon"]))
      return tf.group(tf.raw_ops.ResourceScatterUpdate(resource=accumulator.handle, indices=indices,
                                                       updates=accumulated),
                      tf.raw_ops.ResourceScatterUpdate(resource=var.handle, indices=indices, updates=rows))

    if not locked:
      return update()
    with tf.device(device):
      # One lock per variable (shard) on its ps, found by name in the ps's resource manager by every step of every
      # worker; it is released when the lock tensor is consumed, or dropped with a cancelled step.
      lock = tf.raw_ops.MutexLock(mutex=tf.raw_ops.MutexV2(shared_name=f"tfps_rows_lock/{var.name}"))
      with tf.control_dependencies([lock]):
        updated = update()
      with tf.control_dependencies([updated]):
        return tf.raw_ops.ConsumeMutexLock(mutex_lock=lock)

  return swapped(optimizer, "_resource_apply_sparse", apply_rows)


def sparse_updates_unsummed(optimizer, distinct: Callable[[tf.Tensor], bool]):
  """While tracing: a tf-keras legacy optimizer applies a sparse gradient whose ids `distinct(ids)` says hold each row
  once without first summing it per row.

  A legacy optimizer sends every sparse gradient through `_resource_apply_sparse_duplicate_indices` (`Unique` and
  `UnsortedSegmentSum`, then `_resource_apply_sparse`, which expects distinct ids); for ids already distinct the sum
  gives back the same slices in the same order, so skipping it changes no value. Replaced on this optimizer instance;
  an optimizer without that method (a current tf-keras one) is left as it is.
  """
  summing = getattr(optimizer, "_resource_apply_sparse_duplicate_indices", None)
  if summing is None:
    return contextlib.nullcontext()

  def apply(grad, handle, indices, **kwargs):
    if distinct(indices):
      return optimizer._resource_apply_sparse(grad, handle, indices, **kwargs)  # pylint: disable=protected-access
    return summing(grad, handle, indices, **kwargs)

  return swapped(optimizer, "_resource_apply_sparse_duplicate_indices", apply)


def colocated_with(kwargs: dict, variable) -> dict:
  """A variable creator's `kwargs` asking ParameterServerStrategy to place the new variable with `variable` (what
  `strategy.extended.colocate_vars_with(variable)` sets: its creator scope cannot be entered from inside another
  creator, which is where tfps decides this)."""
  return dict(kwargs, colocate_with=variable, use_resource=True)


def swapped_handle(variable, handle):
  """While tracing: every op on `variable` (reads, the optimizer's updates) uses `handle` instead of its own.

  This is how geo training runs the user's step unchanged on worker-local copies: tf-keras layers and optimizers
  hold their variables, and a variable's ops take its `_handle`; TensorFlow has no public way to redirect them.
  """
  return swapped(unwrapped(variable), "_handle", handle)


def reading_through(variable, read: Callable[[], tf.Tensor]):
  """While tracing: every whole read of `variable` (`tf.convert_to_tensor`, `value()`: how tf-keras layers read their
  weights) returns `read()`; `own_value` still reads the variable itself.

  tfps reads the small dense variables of a ps in one transfer per step (`tfps.training.packing`); a layer holds its
  variables and converts them to tensors itself, and TensorFlow has no public hook on that conversion. Replaced on the
  variable instance (unwrapped, as `swapped_handle`).
  """
  return swapped(unwrapped(variable), "value", read)


def own_value(variable) -> tf.Tensor:
  """The variable's own read (its `ReadVariableOp`, recorded on any gradient tape that is open), whatever
  `reading_through` put in front of it."""
  variable = unwrapped(variable)
  return type(variable).value(variable)


_RELEASE = "tfps_release"  # the name of the mutex releases `released` makes


def released(lock: tf.Tensor) -> tf.Operation:
  """In a tf.function: the release of `lock` (a `MutexLock` op's output) once the ops it depends on have run, which
  tf.function orders after the earlier ops on the lock's mutex only.

  `ConsumeMutexLock` takes no resource, and tf.function's automatic control dependencies run the stateful ops that
  take none one after another in program order, whatever their device: the releases of one step's locks on two ps
  would cost a control transfer from one ps to the next in every step. TensorFlow has no public way to name the
  resource an op touches; a resource resolver of the automatic control dependencies gives it the lock's mutex (one
  registered for the process, on the first call)."""
  _register_release_resolver()
  return tf.raw_ops.ConsumeMutexLock(mutex_lock=lock, name=_RELEASE)


def _release_resolver(op, resource_reads, resource_writes) -> bool:
  """The mutex of a release `released` made, as a resource the release writes; True where it added it."""
  del resource_reads
  if op.type != "ConsumeMutexLock" or not op.name.rsplit("/", 1)[-1].startswith(_RELEASE):
    return False
  lock = op.inputs[0].op
  if lock.type != "MutexLock" or lock.inputs[0] in resource_writes:
    return False
  resource_writes.add(lock.inputs[0])
  return True


@functools.lru_cache(maxsize=None)
def _register_release_resolver() -> None:
  from tensorflow.python.framework import auto_control_deps  # pylint: disable=g-import-not-at-top
  auto_control_deps.register_acd_resource_resolver(_release_resolver)


def reads_unrecorded():
  """While open: reads and ops made are recorded on no gradient tape.

  A packed read (`tfps.training.packing`) reads every small dense variable of a ps in one transfer, and a step may use
  only some of them whole (a small table, say, only through gathers). Recorded, the concatenation and split would give
  each variable a dense gradient of zeros for the parts the step did not use, turning a table's sparse gradient dense.
  The parts a step uses are recorded one by one (`record_read`). TensorFlow has no public way to pause every tape.
  """
  from tensorflow.python.eager import record  # pylint: disable=g-import-not-at-top
  return record.stop_recording()


def record_read(variable, value: tf.Tensor) -> None:
  """Records `value` on every open gradient tape as a read of `variable`, as the variable's own `ReadVariableOp` is
  recorded (`resource_variable_ops.BaseResourceVariable._read_variable_op`): gradients reach `variable` through
  `value` alone. TensorFlow has no public way to record an op on the tapes."""
  from tensorflow.python.eager import record  # pylint: disable=g-import-not-at-top
  from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-import-not-at-top
  variable = unwrapped(variable)
  resource_variable_ops.variable_accessed(variable)
  record.record_operation("ReadVariableOp", [value], [variable.handle], backward_function=lambda x: [x],
                          forward_function=lambda x: [x])


def unwrapped(variable):
  """The variable itself: ParameterServerStrategy hands out its variables wrapped in a `CachingVariable`, which
  passes every op to the wrapped one (`_v`)."""
  return variable.__dict__.get("_v", variable)


def create_optimizer_slots(optimizer, variables) -> None:
  """Creates a tf-keras legacy optimizer's slots (and hyperparameters) for `variables` now, under the strategy scope.

  They are otherwise made by its first `apply_gradients`, which geo training runs on worker-local copies.
  """
  optimizer._create_all_weights(variables)  # pylint: disable=protected-access


def uninitialized_variable(**kwargs):
  """A resource variable with its handle but no value yet (`UninitializedVariable`, which TensorFlow itself uses when
  restoring a SavedModel); the caller assigns its value.

  `tf.Variable` assigns its initial value from a tensor the caller still holds, so the variable's memory is a copy
  of it, and on a remote ps the initializer's intermediate results stay alive too: creating a 400 MB variable raised a
  ps's peak RSS by 1.24 GB. TensorFlow has no public way to create a variable without that initial tensor.
  """
  from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-import-not-at-top
  return resource_variable_ops.UninitializedVariable(**kwargs)


@contextlib.contextmanager
def restored_elsewhere(variables):
  """Inside the block, a checkpoint's restore (`tf.train.Checkpoint.read`) leaves the sharded `variables` alone: each
  hands it no saveable, so their saved values stay unused (the caller restores them piece by piece itself).

  TensorFlow restores every value of a checkpoint at once, per ps, before it assigns any.
  """
  with contextlib.ExitStack() as stack:
    for variable in variables:
      stack.enter_context(swapped(variable, "_gather_saveables_for_checkpoint", dict))
    yield


def checkpoint_object_graph(path: str):
  """The object graph stored in checkpoint `path` (`TrackableObjectGraph`: each object's named children, its
  variables' checkpoint keys, its optimizer slots).

  A checkpoint names its values only by the path of the object that held them; telling which part of a model a
  saved value belongs to (to name what differs from the model before restoring) needs this graph, whose proto class
  TensorFlow does not export.
  """
  from tensorflow.core.protobuf import trackable_object_graph_pb2  # pylint: disable=g-import-not-at-top
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(tf.train.load_checkpoint(path).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
  return graph


def worker_recovery_pending(coordinator) -> bool:
  """Whether `coordinator` (a `ClusterCoordinator`) is waiting for a lost worker to come back and rejoin.

  ClusterCoordinator has no public way to ask. It matters at the end of training: a coordinator collected while its
  preemption thread waits (its `__del__` stops that thread under the lock the recovery holds) hangs the chief;
  seen on TensorFlow 2.21 with a chief stopped by SIGTERM 2 s after its SIGKILLed worker had been restarted.
  """
  handler = getattr(getattr(coordinator, "_cluster", None), "failure_handler", None)
  due = getattr(handler, "_cluster_due_for_update_or_finish", None)
  return bool(due is not None and due.is_set())
