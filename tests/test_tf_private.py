"""Pins every tf-keras / TensorFlow name and call pattern that `tfps/_tf_private.py` relies on, in one process without
a cluster: a TensorFlow or tf-keras upgrade that changes one fails here."""

import contextlib
import inspect
import threading
import types

import numpy as np
import pytest

import tfps  # sets TF_USE_LEGACY_KERAS before TensorFlow is imported
from tfps import _tf_private
import tensorflow as tf
import tf_keras

OPTIMIZERS = [lambda: tf_keras.optimizers.legacy.Adagrad(0.1), lambda: tf_keras.optimizers.Adagrad(0.1)]


def _model(optimizer=None):
  model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
  model.compile(optimizer or tf_keras.optimizers.legacy.SGD(0.1), "mse")
  return model


def _data():
  return np.ones((8, 2), np.float32), np.ones((8, 1), np.float32)


def _parameters(function):
  return list(inspect.signature(function).parameters)


def test_swapped_restores_an_own_attribute_and_removes_a_borrowed_one_even_on_error():
  optimizer = tf_keras.optimizers.legacy.SGD(0.1)
  own = optimizer.gradient_aggregator
  with pytest.raises(KeyError):
    with _tf_private.swapped(optimizer, "gradient_aggregator", "a"), \
        _tf_private.swapped(optimizer, "apply_gradients", "b"):
      assert (optimizer.gradient_aggregator, optimizer.apply_gradients) == ("a", "b")
      raise KeyError("inside")
  assert optimizer.gradient_aggregator is own
  assert "apply_gradients" not in vars(optimizer)


def test_steps_per_execution_is_set_on_a_compiled_model():
  assert _parameters(tf_keras.Model._configure_steps_per_execution) == ["self", "steps_per_execution"]
  model = _model()
  assert _tf_private.steps_per_execution(model) == 1
  _tf_private.set_steps_per_execution(model, 7)
  assert _tf_private.steps_per_execution(model) == 7


def test_a_train_step_updates_the_loss_metric_once_through_its_own_update_state_which_can_be_held_back():
  model = _model()
  metric = _tf_private.loss_metric(model)
  assert isinstance(metric, tf_keras.metrics.Mean) and "update_state" in vars(metric)
  assert _tf_private.loss_metric(tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])) is None

  @tf.function
  def step(x, y):
    updates = []
    with _tf_private.updates_held(metric, updates):
      logs = model.train_step((x, y))
    return len(updates), updates[0][1], logs["loss"]

  held, weight, loss = step(*_data())
  assert int(held) == 1 and int(weight) == 8  # one update per step, the step's loss weighted by its batch size
  assert float(metric.count) == 0.0 and float(loss) == 0.0  # held back: the metric never saw the step
  assert "update_state" in vars(metric) and metric.update_state is not None
  metric.update_state(2.0, sample_weight=8)
  assert float(metric.result()) == 2.0


def test_a_compile_that_names_metrics_has_them_unbuilt_until_its_first_step():
  named = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
  named.compile("sgd", "mse", weighted_metrics=["mae"])
  plain = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
  plain.compile("sgd", "mse")
  assert _tf_private.has_unbuilt_metrics(named) and not _tf_private.has_unbuilt_metrics(plain)
  named.train_on_batch(*_data())
  assert not _tf_private.has_unbuilt_metrics(named)
  assert not _tf_private.has_unbuilt_metrics(tf_keras.Sequential([tf_keras.layers.Dense(1)]))  # not compiled


def test_exact_evaluation_shards_are_set_and_drop_the_cached_test_function():
  model = _model()
  assert _tf_private.exact_evaluation_shards(model) == 0
  model.evaluate(*_data(), verbose=0)
  assert model.test_function is not None  # tf-keras caches it on the model
  _tf_private.set_exact_evaluation_shards(model, 4)
  assert _tf_private.exact_evaluation_shards(model) == 4 and model.test_function is None


def test_the_exact_shard_function_comes_from_the_instance_and_the_containers_hold_what_it_copies():
  """What `use_exact_shard_function` relies on: tf-keras's evaluate takes the exact shard function from the instance's
  `_make_test_function_exact` where `_pss_evaluation_shards` is set under ParameterServerStrategy, and built compile
  containers hold per-output lists of metrics, a total loss `Mean` and per-output loss metrics, with names the clones
  keep."""
  source = inspect.getsource(tf_keras.Model._get_test_function_runner)  # pylint: disable=protected-access
  assert "self._pss_evaluation_shards" in source and "self._make_test_function_exact()" in source
  inputs = tf_keras.Input((2,))
  model = tf_keras.Model(inputs, {name: tf_keras.layers.Dense(1, name=name)(inputs) for name in ("a", "b")})
  model.compile("sgd", {"a": "mse", "b": "mse"}, metrics={"a": ["mae"]}, weighted_metrics={"b": ["mse"]})
  model.evaluate(np.ones((4, 2)), {"a": np.ones((4, 1)), "b": np.ones((4, 1))}, verbose=0)
  metrics, loss = model.compiled_metrics, model.compiled_loss
  names = lambda lists: [[m and m.name for m in per_output] for per_output in lists]  # None: an output without any
  assert names(metrics._metrics) == [["a_mae"], [None]]  # pylint: disable=protected-access
  assert names(metrics._weighted_metrics) == [[None], ["b_mse"]]  # pylint: disable=protected-access
  metrics._create_ordered_metrics()  # pylint: disable=protected-access
  assert [m.name for m in metrics.metrics] == ["a_mae", "b_mse"]
  assert loss._total_loss_mean.name == "loss"  # pylint: disable=protected-access
  assert [m.name for m in loss._per_output_metrics] == ["a_loss", "b_loss"]  # pylint: disable=protected-access
  assert [m.name for m in loss.metrics] == ["loss", "a_loss", "b_loss"]
  from tf_keras.src.metrics import base_metric  # pylint: disable=g-import-not-at-top
  from tf_keras.src.utils import tf_utils  # pylint: disable=g-import-not-at-top
  from tensorflow.python.distribute import input_ops  # pylint: disable=g-import-not-at-top
  with tf_utils.with_metric_local_vars_scope():
    assert base_metric.clone_metric(metrics.metrics[0]).name == "a_mae"
  assert callable(input_ops.auto_shard_dataset) and hasattr(model, "_test_counter")


def test_a_distributed_lookup_tables_handle_is_a_property_captured_at_call_time_in_the_graph_it_is_read_in():
  """What `lookup_tables_captured_outermost` relies on: the handle is a property of the class, which captures a
  call-time value in the default graph; a function graph names the graph it was traced in (`outer_graph`)."""
  from tensorflow.python.distribute import ps_values  # pylint: disable=g-import-not-at-top
  handle = ps_values.DistributedTable.resource_handle
  assert isinstance(handle, property) and "capture_call_time_value" in inspect.getsource(handle.fget)
  with _tf_private.lookup_tables_captured_outermost():
    assert ps_values.DistributedTable.resource_handle is not handle
  assert ps_values.DistributedTable.resource_handle is handle
  outer = []
  tf.function(lambda: tf.cond(tf.constant(True), lambda: outer.append(tf.compat.v1.get_default_graph().outer_graph)
                              or tf.constant(1), lambda: tf.constant(2))).get_concrete_function()
  assert outer and isinstance(outer[0], tf.__internal__.FuncGraph)


def test_resources_made_in_a_block_are_collected_and_the_saver_takes_a_trace_made_as_it_traces(tmp_path):
  made, traces = [], []

  def lookup(word):
    traces.append(1)
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(["a"], [1]), -1)
    return table.lookup(word)

  module = tf.Module()
  module.lookup = tf.function(lookup, input_signature=[tf.TensorSpec([None], tf.string)])
  with _tf_private.resources_made(made):
    concrete = _tf_private.traced_as_saved(module.lookup)
  assert [type(resource).__name__ for resource in made] == ["StaticHashTable"] and traces == [1]
  module.tables = made
  tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": concrete})
  assert traces == [1]  # the saver took that trace
  loaded = tf.saved_model.load(str(tmp_path))
  assert loaded.lookup(tf.constant(["a", "b"])).numpy().tolist() == [1, -1]


def test_fit_runs_the_replaced_train_function_of_this_model_only_and_logs_what_it_returns():
  assert _parameters(tf_keras.Model.make_train_function) == ["self", "force"]
  model, other = _model(), _model()
  calls = []

  def run(iterator):
    calls.append(iterator)
    return {"loss": tf.constant(0.25)}

  _tf_private.replace_train_function(model, run)
  history = model.fit(*_data(), batch_size=4, epochs=2, verbose=0)
  assert len(calls) == 4  # 2 epochs x 2 steps, one execution each
  assert history.history["loss"] == [0.25, 0.25]
  assert "make_train_function" not in vars(other)
  assert other.fit(*_data(), batch_size=4, epochs=1, verbose=0).history["loss"][0] != 0.25


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS, ids=["legacy", "current"])
def test_train_step_applies_gradients_through_the_instance_method_and_the_strategy_update(make_optimizer):
  """`intercepting_apply_gradients` and `intercepting_updates` see every gradient tf-keras's train_step applies."""
  assert _parameters(tf.distribute.StrategyExtended.update) == ["self", "var", "fn", "args", "kwargs", "group"]
  assert _parameters(make_optimizer().apply_gradients)[0] == "grads_and_vars"
  model = _model(make_optimizer())
  model.train_on_batch(*_data())  # creates the optimizer's variables outside the interception
  applied, updated = [], []

  def apply(apply_gradients, grads_and_vars, *args, **kwargs):
    applied.extend(variable.name for _, variable in grads_and_vars)
    return apply_gradients(grads_and_vars, *args, **kwargs)

  def update(original, var, fn, args, kwargs, group):
    updated.append(var.name)
    return original(var, fn, args=args, kwargs=kwargs, group=group)

  before = [variable.numpy() for variable in model.trainable_variables]
  model.train_function = None  # traced again, inside the interception
  with _tf_private.intercepting_apply_gradients(model.optimizer, apply), \
      _tf_private.intercepting_updates(tf.distribute.get_strategy(), update):
    model.train_on_batch(*_data())
  names = sorted(variable.name for variable in model.trainable_variables)
  assert sorted(applied) == names and sorted(set(updated)) == names
  assert all((variable.numpy() != value).any() for variable, value in zip(model.trainable_variables, before))
  assert "apply_gradients" not in vars(model.optimizer)
  assert "update" not in vars(tf.distribute.get_strategy().extended)


def test_a_legacy_optimizer_aggregates_gradients_with_its_gradient_aggregator_and_makes_slots_on_demand():
  optimizer = tf_keras.optimizers.legacy.Adagrad(0.1)
  variable = tf.Variable([1.0, 2.0])
  _tf_private.create_optimizer_slots(optimizer, [variable])
  assert optimizer.get_slot_names() == ["accumulator"]
  assert optimizer.get_slot(variable, "accumulator").shape == variable.shape
  seen = []
  own = optimizer.gradient_aggregator
  with _tf_private.swapped(optimizer, "gradient_aggregator", lambda pairs: seen.append(pairs) or own(pairs)):
    optimizer.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
  assert len(seen) == 1
  with _tf_private.identity_gradient_aggregation(optimizer):
    optimizer.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
  assert optimizer.gradient_aggregator is own


def test_every_embedding_layer_answers_through_the_class_call_while_patched():
  assert _parameters(tf_keras.layers.Embedding.call) == ["self", "inputs"]
  layer = tf_keras.layers.Embedding(10, 3)
  ids = tf.constant([[1, 2]])
  plain = layer(ids).numpy()
  with _tf_private.embedding_calls(lambda layer_, ids_, original: original(layer_, ids_) + 1.0):
    assert np.allclose(layer(ids).numpy(), plain + 1.0)
  assert np.allclose(layer(ids).numpy(), plain)
  assert "call" in vars(tf_keras.layers.Embedding)


def test_a_swapped_handle_redirects_reads_and_updates_to_another_variable():
  variable, other = tf.Variable(1.0), tf.Variable(5.0)
  assert _tf_private.unwrapped(variable) is variable
  with _tf_private.swapped_handle(variable, other.handle):
    assert float(variable.read_value()) == 5.0
    variable.assign_add(1.0)
  assert (float(variable.numpy()), float(other.numpy())) == (1.0, 6.0)


def test_a_variable_read_through_another_read_is_converted_to_it_and_its_own_read_keeps_its_gradient():
  layer = tf_keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
  layer.build((None, 2))
  inputs = tf.ones((1, 2))
  with _tf_private.reading_through(layer.kernel, lambda: tf.fill([2, 1], 3.0)):
    assert float(layer(inputs)[0, 0]) == 6.0  # the layer's own conversion of its kernel
    with tf.GradientTape() as tape:
      read = _tf_private.own_value(layer.kernel) * 2.0
    assert tape.gradient(read, layer.kernel).numpy().tolist() == [[2.0], [2.0]]
  assert float(layer(inputs)[0, 0]) == 2.0


def test_reads_made_unrecorded_reach_a_variable_only_through_the_values_recorded_as_its_reads():
  dense, table = tf.Variable([[1.0], [2.0]]), tf.Variable([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])

  @tf.function
  def gradients():
    with tf.GradientTape() as tape:
      with _tf_private.reads_unrecorded():  # both read and concatenated, as a packed read does
        packed = tf.concat([tf.reshape(_tf_private.own_value(v), [-1]) for v in (dense, table)], 0)
      kernel = tf.reshape(packed[:2], [2, 1])
      _tf_private.record_read(dense, kernel)  # only the dense part is used whole
      loss = tf.reduce_sum(tf.matmul(tf.gather(table, [2, 2]), kernel))
    return tape.gradient(loss, [dense, table])

  dense_gradient, table_gradient = gradients()
  assert dense_gradient.numpy().tolist() == [[6.0], [6.0]]  # through the recorded read
  assert isinstance(table_gradient, tf.IndexedSlices)  # through its gather alone: still sparse
  assert table_gradient.indices.numpy().tolist() == [2, 2]
  assert table_gradient.values.numpy().tolist() == [[1.0, 2.0], [1.0, 2.0]]


def test_an_uninitialized_variable_takes_its_value_from_an_assignment():
  variable = _tf_private.uninitialized_variable(shape=[2], dtype=tf.float32, name="later")
  variable.assign([3.0, 4.0])
  assert variable.numpy().tolist() == [3.0, 4.0]


@pytest.mark.parametrize("optimizer, as_given", [
    (tf_keras.optimizers.legacy.SGD(0.1), True), (tf_keras.optimizers.SGD(0.1), True),
    (tf_keras.optimizers.SGD(0.1, global_clipnorm=1.0), False),
    (tf_keras.optimizers.legacy.SGD(0.1, clipvalue=1.0), False),
    (tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.SGD(0.1)), False),
])
def test_which_optimizers_apply_the_gradients_they_are_given(optimizer, as_given):
  assert _tf_private.applies_gradients_as_given(optimizer) == as_given


def test_tf_keras_refuses_batch_callbacks_under_pss_unless_they_accept_remote_logs():
  # The method, not the class: a class's source is found by parsing its whole module with `ast`, which Python 3.11.7
  # can fail with "SystemError: AST constructor recursion depth mismatch" in a process with other threads (CPython
  # gh-106905); it did 3 times in 3 here after tests/test_fit.py in the same process. A function's source needs no parse.
  source = inspect.getsource(tf_keras.callbacks.CallbackList._disallow_batch_hooks_in_ps_strategy)  # pylint: disable=protected-access
  assert _tf_private.BATCH_CALLBACKS_REFUSED in source and "_supports_tf_logs" in source
  callback = tf_keras.callbacks.Callback()
  assert not callback._supports_tf_logs  # pylint: disable=protected-access
  _tf_private.accept_remote_logs(callback)
  assert callback._supports_tf_logs  # pylint: disable=protected-access


def test_a_legacy_adagrad_applies_unique_rows_through_its_sparse_apply_method():
  """`adagrad_rows_at_once` replaces `_resource_apply_sparse(grad, var, indices, apply_state=None)`, which the legacy
  optimizer calls with the ids made unique, reading `_fallback_apply_state` and the "accumulator" slot."""
  optimizer, variable = tf_keras.optimizers.legacy.Adagrad(0.1), tf.Variable(tf.zeros([5, 2]))
  assert _parameters(type(optimizer)._resource_apply_sparse) == ["self", "grad", "var", "indices", "apply_state"]
  seen = []
  with _tf_private.swapped(optimizer, "_resource_apply_sparse",
                           lambda grad, var, indices, apply_state=None: seen.append(indices.numpy().tolist())):
    optimizer.apply_gradients([(tf.IndexedSlices(tf.ones([3, 2]), tf.constant([4, 1, 4])), variable)])
  assert [sorted(ids) for ids in seen] == [[1, 4]]
  coefficients = optimizer._fallback_apply_state(variable.device, variable.dtype.base_dtype)  # pylint: disable=protected-access
  assert {"lr_t", "epsilon"} <= set(coefficients) and optimizer.get_slot(variable, "accumulator").shape == (5, 2)


def test_a_legacy_optimizer_sums_a_sparse_gradient_per_row_in_one_method_before_its_sparse_apply():
  """`sparse_updates_unsummed` replaces `_resource_apply_sparse_duplicate_indices(grad, handle, indices, **kwargs)`,
  through which a legacy optimizer applies every sparse gradient, and calls `_resource_apply_sparse` itself."""
  for optimizer_class in (tf_keras.optimizers.legacy.Adagrad, tf_keras.optimizers.legacy.Adam):
    optimizer, variable = optimizer_class(0.1), tf.Variable(tf.zeros([5, 2]))
    assert _parameters(type(optimizer)._resource_apply_sparse_duplicate_indices) == [  # pylint: disable=protected-access
        "self", "grad", "handle", "indices", "kwargs"]
    seen = []
    with _tf_private.swapped(optimizer, "_resource_apply_sparse_duplicate_indices",
                             lambda grad, handle, indices, **kwargs: seen.append(indices.numpy().tolist())):
      optimizer.apply_gradients([(tf.IndexedSlices(tf.ones([3, 2]), tf.constant([4, 1, 4])), variable)])
    assert seen == [[4, 1, 4]]


def test_sharded_variables_compiled_models_and_adagrads_initial_accumulator_are_recognised():
  """`tf.__internal__.distribute.ShardedVariable`, tf-keras's `_is_compiled` and `_initial_accumulator_value`."""
  sharded = tf.__internal__.distribute.ShardedVariable([tf.Variable([1.0]), tf.Variable([2.0])])
  assert _tf_private.is_sharded_variable(sharded) and not _tf_private.is_sharded_variable(tf.Variable([1.0]))
  model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
  assert not _tf_private.is_compiled(model)
  model.compile(tf_keras.optimizers.legacy.SGD(0.1))  # no loss
  assert model._is_compiled and _tf_private.is_compiled(model)  # pylint: disable=protected-access
  assert _tf_private.initial_accumulator_value(tf_keras.optimizers.legacy.Adagrad(0.1, 0.25)) == 0.25
  assert _tf_private.initial_accumulator_value(tf_keras.optimizers.legacy.SGD(0.1)) == 0.0


def test_a_coordinator_tells_through_its_cluster_s_failure_handler_whether_it_awaits_a_lost_worker():
  coordinator_class = tf.distribute.experimental.coordinator.ClusterCoordinator
  module = inspect.getmodule(coordinator_class)
  assert "self._cluster.stop()" in inspect.getsource(coordinator_class.__del__)  # why a collected one may hang
  assert "self.failure_handler = " in inspect.getsource(module.Cluster.__init__)
  handler = module.WorkerPreemptionHandler  # the one a cluster without the coordination service uses (tfps's)
  assert "self._cluster_due_for_update_or_finish.set()" in inspect.getsource(handler.wait_on_failure)
  assert "with self._cluster_update_lock:" in inspect.getsource(handler.stop)
  due = threading.Event()
  coordinator = types.SimpleNamespace(_cluster=types.SimpleNamespace(
      failure_handler=types.SimpleNamespace(_cluster_due_for_update_or_finish=due)))
  assert not _tf_private.worker_recovery_pending(coordinator)
  due.set()
  assert _tf_private.worker_recovery_pending(coordinator)


@pytest.mark.parametrize("own_release", [True, False])
def test_a_release_is_ordered_after_the_ops_on_its_own_mutex_only(own_release):
  """tf.function runs the stateful ops that take no resource (a plain `ConsumeMutexLock`) in program order, whatever
  their device, and not before a later lock of the same mutex; `released` is ordered by its lock's mutex: after that
  mutex's earlier lock, before its next one, and after nothing else."""
  release = _tf_private.released if own_release else (lambda lock: tf.raw_ops.ConsumeMutexLock(mutex_lock=lock))
  mutexes = [tf.raw_ops.MutexV2(shared_name=f"tfps_test_release_{own_release}_{index}") for index in range(2)]

  @tf.function
  def locked_in_turn():
    for mutex in mutexes + mutexes[:1]:
      release(tf.raw_ops.MutexLock(mutex=mutex))
    return tf.constant(0)

  graph = locked_in_turn.get_concrete_function().graph
  takes = [op for op in graph.get_operations() if op.type == "MutexLock"]
  releases = [op for op in graph.get_operations() if op.type == "ConsumeMutexLock"]
  assert (releases[0] in releases[1].control_inputs) is not own_release
  assert (releases[0] in takes[2].control_inputs) is own_release  # the same mutex: taken again once let go
  assert int(locked_in_turn()) == 0


@pytest.mark.parametrize("legacy", [True, False])
def test_a_legacy_optimizer_hands_its_coefficients_over_before_its_updates(legacy):
  """`prepared_coefficients`: a legacy optimizer's `_prepare` runs in `apply_gradients` before any update, and gives
  its learning rate per (device, dtype); another optimizer is left as it is."""
  optimizer = tf_keras.optimizers.legacy.Adagrad(0.1) if legacy else tf_keras.optimizers.Adagrad(0.1)
  variable, seen = tf.Variable([1.0, 2.0]), []
  with _tf_private.prepared_coefficients(optimizer, seen.append):
    optimizer.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
  assert "_prepare" not in vars(optimizer)
  if not legacy:
    assert not seen
    return
  [coefficients] = seen
  [(device, dtype)] = coefficients
  assert (device, dtype) == (variable.device, tf.float32)
  assert abs(float(coefficients[(device, dtype)]["lr_t"]) - 0.1) < 1e-7


def test_a_legacy_optimizers_coefficients_take_the_learning_rate_given_for_their_device():
  """`learning_rate_variable` and `learning_rate_read`: a legacy optimizer's rate is a variable in `_hyper` once made;
  while reading, its coefficients (`_prepare_local`, made per device) take the rate given for that device, and its
  own rate where none is given; after, its own again. None for a schedule or a current optimizer."""
  optimizer, variable = tf_keras.optimizers.legacy.SGD(0.5), tf.Variable([1.0, 2.0])
  assert _tf_private.learning_rate_variable(optimizer) is None  # not made yet
  optimizer.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
  rate = _tf_private.learning_rate_variable(optimizer)
  assert isinstance(rate, tf.Variable) and float(rate.numpy()) == 0.5
  given = {variable.device: tf.constant(0.25)}
  with _tf_private.learning_rate_read(optimizer, given.get):
    optimizer.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
  np.testing.assert_allclose(variable.numpy(), [0.25, 1.25])
  with _tf_private.learning_rate_read(optimizer, lambda device: None):
    optimizer.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
  np.testing.assert_allclose(variable.numpy(), [-0.25, 0.75])
  assert "_prepare_local" not in vars(optimizer)
  assert optimizer._hyper["learning_rate"] is rate  # pylint: disable=protected-access
  schedule = tf_keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
  assert _tf_private.learning_rate_variable(tf_keras.optimizers.legacy.SGD(schedule)) is None
  assert _tf_private.learning_rate_variable(tf_keras.optimizers.SGD(0.5)) is None


def test_the_learning_rate_given_is_read_without_making_a_legacy_optimizers_variables():
  legacy = tf_keras.optimizers.legacy.Adagrad(0.25)
  assert _tf_private.learning_rate_given(legacy) == 0.25 and _tf_private.learning_rate_variable(legacy) is None
  schedule = tf_keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
  assert _tf_private.learning_rate_given(tf_keras.optimizers.legacy.SGD(schedule)) is schedule
  assert _tf_private.learning_rate_given(tf.compat.v1.train.AdagradOptimizer(0.5)) == 0.5
  assert float(_tf_private.learning_rate_given(tf_keras.optimizers.SGD(0.5))) == 0.5


def test_a_current_optimizer_updates_from_the_step_values_copied_before_them_and_changes_no_value():
  """`step_values_on_each_ps`: a current optimizer's updates read the learning rate and `iterations` copied on each
  variable's device when the block opened (a learning rate assigned later is not read), and apply the values its
  own updates apply: Adam with a schedule and weight decay, a dense and a sparse gradient with a row twice. Its
  methods and attributes are its own again after; a legacy optimizer is left as it is. `identity_gradient_aggregation`
  replaces a current optimizer's `aggregate_gradients` while it is open."""
  for method, parameters in (("update_step", 2), ("_apply_weight_decay", 1), ("_deduplicate_sparse_grad", 1)):
    assert len(_parameters(getattr(tf_keras.optimizers.Adam, method))) == 1 + parameters, method
  assert {"_learning_rate", "_iterations"} <= set(vars(tf_keras.optimizers.Adam(0.1)))
  schedule = lambda: tf_keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
  gradients = [tf.constant([[1.0, -2.0], [0.5, 0.25]]),
               tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, 4.0]]), tf.constant([1, 1]), tf.constant([3, 2]))]
  results = []
  for copied in (False, True):
    optimizer = tf_keras.optimizers.Adam(schedule(), weight_decay=0.01)
    variables = [tf.Variable(tf.ones([2, 2])), tf.Variable(tf.ones([3, 2]))]
    seen = []
    for _ in range(2):
      with (_tf_private.step_values_on_each_ps(optimizer, variables, seen.append) if copied
            else contextlib.nullcontext()):
        optimizer.apply_gradients(zip(gradients, variables))
    results.append([variable.numpy() for variable in variables])
  assert all(np.array_equal(plain, copied) for plain, copied in zip(*results)), results
  assert [sorted(devices) for devices in seen] == [[variables[0].device]] * 2
  for name in ("update_step", "_apply_weight_decay", "_deduplicate_sparse_grad"):
    assert name not in vars(optimizer), name
  assert isinstance(optimizer._learning_rate, tf_keras.optimizers.schedules.LearningRateSchedule)
  assert optimizer._iterations is optimizer.iterations and int(optimizer.iterations) == 2

  sgd, variable = tf_keras.optimizers.SGD(0.1), tf.Variable([1.0])
  with _tf_private.step_values_on_each_ps(sgd, [variable], lambda ops: None):
    sgd.learning_rate.assign(5.0)
    sgd.apply_gradients([(tf.constant([1.0]), variable)])
  assert abs(float(variable[0]) - 0.9) < 1e-7 and sgd._learning_rate is sgd.learning_rate
  assert _parameters(sgd.aggregate_gradients) == ["grads_and_vars"]
  with _tf_private.identity_gradient_aggregation(sgd):
    assert sgd.aggregate_gradients([1]) == [1]  # its own would all-reduce each pair
  assert "aggregate_gradients" not in vars(sgd)
  legacy, seen = tf_keras.optimizers.legacy.Adagrad(0.1), []
  with _tf_private.step_values_on_each_ps(legacy, [variable], seen.append):
    assert "update_step" not in vars(legacy) and "_resource_apply_dense" not in vars(legacy)
  assert not seen
