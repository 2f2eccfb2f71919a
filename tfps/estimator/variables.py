"""The variables of a `model_fn`: created on its first call, handed back on every later call.

An Estimator `model_fn` builds its model on every call: per mode and, in TF2, per trace. Its variables come from
`tf.compat.v1.get_variable`, `tf.compat.v1.layers` or tf-keras layers built inside the function. `ModelFnVariables`
runs each call under `tf.compat.v1.keras.utils.track_tf1_style_variables` (which makes `get_variable` and
`compat.v1.layers` work in TF2) inside a variable-creator scope that gives the call the variables of the first call,
in creation order. The shim alone is not enough: it reuses `get_variable` variables by name but gives tf-keras layers
built inside the call new variables on every call (their names are uniquified per call), so reuse here is by order,
checked by shape and dtype. Only the first call creates variables; a later call that creates one the first call did
not is an error. Table layers (`tfps.layers.DynamicEmbedding`: rows plus id maps on the ps) are kept the same way, whole:
a later call's layer gets the table (`tfps.training.tables.build_state`) the first call's layer in that position built.

Metric state (tf-keras `Metric` variables: non-trainable, ON_READ, SUM) is not model state and is never checkpointed:
inside `metric_scope` it is made of function-local variables of the traced function (fresh on every run, so a retried
evaluation closure starts from zero); elsewhere (a metric updated in TRAIN mode) of ordinary variables, reused by
order like the model's and otherwise ignored.
"""

import contextlib
import functools
import re
from typing import Callable, List, Optional

from absl import logging
import tensorflow as tf

from tfps.training import strategy as strategy_lib
from tfps.training import tables
from tfps.estimator.spec import ModelFnError


class _Tf1StyleScope(tf.Module):
  """A throwaway module: `track_tf1_style_variables` needs a module, and a fresh one never reuses by name itself."""

  def __init__(self):
    super().__init__(name="model_fn")

  @tf.compat.v1.keras.utils.track_tf1_style_variables
  def run(self, fn: Callable):
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), custom_getter=_without_partitioner):
      return fn()


def _without_partitioner(getter, *args, **kwargs):
  """Drops a TF1 `partitioner` (TF2 refuses it): ParameterServerStrategy's partitioner shards large variables."""
  if kwargs.pop("partitioner", None) is not None:
    logging.log_first_n(logging.INFO, "Ignoring the TF1 partitioner of %s; large variables are sharded over the ps "
                        "by the strategy", 1, kwargs.get("name") or args[0])
  return getter(*args, **kwargs)


def _is_metric_state(kwargs: dict) -> bool:
  return (kwargs.get("trainable") is False
          and kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ
          and kwargs.get("aggregation") == tf.VariableAggregation.SUM)


def _requested_shape(kwargs: dict) -> Optional[tf.TensorShape]:
  if kwargs.get("shape") is not None:
    return tf.TensorShape(kwargs["shape"])
  initial = kwargs.get("initial_value")
  if isinstance(initial, functools.partial) and initial.args:  # initializer(shape, ...) from get_variable or Keras
    try:
      return tf.TensorShape(initial.args[0])
    except (TypeError, ValueError):
      return None
  shape = getattr(initial, "shape", None)
  return None if shape is None else tf.TensorShape(shape)


def _base_name(name: Optional[str]) -> Optional[str]:
  """`kernel` of `while/model/dense_3/kernel:0`: the part a layer's uniquified name and scopes do not change."""
  return None if not name else re.sub(r"/part_\d+$", "", name.split(":")[0]).rsplit("/", 1)[-1]


def _name_of(variable) -> str:
  """A variable's name; a sharded variable's is that of its first shard."""
  return variable.name if isinstance(variable, tf.Variable) else variable.variables[0].name


def _initial_value_out_of_the_trace(kwargs: dict) -> dict:
  """`kwargs` of a new variable, its initial value usable where the variable is made. A constant tensor of the traced
  model_fn (`get_variable(initializer=tf.constant(...))`, as TF1 model_fns write) is replaced by its value:
  `get_variable` makes variables out of the trace (under `tf.init_scope`), where the trace's tensors do not exist.
  Another tensor of the trace is left to TensorFlow (lifted out of the function, as `tf.Variable(tf.random.normal(...))`
  is).

  Raises:
    ModelFnError: the variable is made out of the trace from a tensor the model_fn computes.
  """
  initial = kwargs.get("initial_value")
  if not tf.is_symbolic_tensor(initial):
    return kwargs
  value = tf.get_static_value(initial)
  if value is not None:
    return dict(kwargs, initial_value=value)
  if tf.executing_eagerly():  # out of the trace: its tensors cannot be used here
    raise ModelFnError(
        f"model_fn variable {kwargs.get('name')!r} starts from {initial.name!r}, a tensor model_fn computes, but "
        "get_variable makes its variables outside the traced model_fn: give the initial value as an initializer "
        "(tf.compat.v1.constant_initializer, ...) or a constant")
  return kwargs


def made_eagerly(next_creator, **kwargs):
  """A variable creator that makes each variable eagerly (under `tf.init_scope`) while a function is traced, unknown to
  that function: a `tf.function` whose first trace made variables is traced again, so the trace that makes a model_fn's
  variables runs under this. Left to the trace: a variable its maker keeps in the function
  (`experimental_enable_variable_lifting=False`), and one whose initial value is a tensor of the trace."""
  initial_value = kwargs.get("initial_value")
  if kwargs.get("experimental_enable_variable_lifting") is False or tf.is_symbolic_tensor(initial_value):
    return next_creator(**kwargs)
  with tf.init_scope():
    return next_creator(**dict(kwargs, experimental_enable_variable_lifting=False))


class MetricState:
  """Metric variables, created on first need and handed out in creation order on every later call.

  With a `graph`, they are function-local variables of that graph: fresh on every run of the function (so a retried
  evaluation closure starts from zero). Without one, they are ordinary variables, kept (and ignored) from call to
  call: the state of metrics a model_fn updates outside an evaluation, e.g. in TRAIN mode.
  """

  def __init__(self, graph=None):
    self.graph = graph
    self.created: List[tf.Variable] = []
    self._index = 0

  def restart(self) -> None:
    """Starts a new call: the next request gets the first variable again."""
    self._index = 0

  def get(self, next_creator, kwargs: dict) -> tf.Variable:
    """The variable of this request (`kwargs` as a variable creator gets them), created on first need."""
    index, self._index = self._index, self._index + 1
    if index < len(self.created):
      return self.created[index]
    if self.graph is None:
      variable = next_creator(**kwargs)
    else:
      with self.graph.as_default():  # in the function's own graph, not a loop body's: state outlives an iteration
        initial = kwargs.get("initial_value")
        initial = initial if callable(initial) else (lambda value=initial: value)
        # tf.Variable, not the creator chain: a tf1.Variable (tf-keras metrics make those) would drop the no-lifting
        # flag, and a lifted variable would keep its state from one run of the function to the next.
        variable = tf.Variable(initial, trainable=False, name=kwargs.get("name"), dtype=kwargs.get("dtype"),
                               synchronization=kwargs.get("synchronization"),
                               aggregation=kwargs.get("aggregation"), experimental_enable_variable_lifting=False)
    self.created.append(variable)
    return variable


class ModelFnVariables(tf.Module):
  """The model variables of one `model_fn`, in creation order (checkpointed in that order)."""

  def __init__(self):
    super().__init__(name="model_fn_variables")
    self.created = []
    self.tables = []  # table layers' states, in creation order (checkpointed with their id maps)
    self._calls = 0
    self._index = 0
    self._table_index = 0
    self._mode = None
    self._metric_scope: Optional[MetricState] = None  # open during an evaluation trace
    self._other_metrics = MetricState()
    self._bypass = False

  def trainable_variables_flat(self) -> List[tf.Variable]:
    """The trainable variables, each sharded variable given as its shards (what gradients are taken against)."""
    flat = []
    for variable in self.created + [table.embeddings for table in self.tables]:
      if not getattr(variable, "trainable", True):
        continue
      flat.extend(strategy_lib.shards_of(variable))
    return flat

  def model_variables(self) -> List[tf.Variable]:
    """Every model variable: those created through the model_fn's calls, and the tables' rows."""
    return list(self.created) + [table.embeddings for table in self.tables]

  @contextlib.contextmanager
  def metric_scope(self):
    """Metric variables created by calls inside this scope are local to the function being traced."""
    previous = self._metric_scope
    self._metric_scope = MetricState(tf.compat.v1.get_default_graph())
    try:
      yield self._metric_scope
    finally:
      self._metric_scope = previous

  def call(self, fn: Callable, mode: str):
    """Runs `fn()` (a model_fn call) with this object's variables."""
    self._index, self._table_index, self._mode = 0, 0, mode
    metrics = self._metric_scope or self._other_metrics
    metrics.restart()
    try:
      with tf.variable_creator_scope(self._creator), tables.keeping_state(self._table):
        return _Tf1StyleScope().run(fn)
    finally:
      self._calls += 1

  def _table(self, make: Callable):
    """The table of the table layer built now: the first call's in this position, else `make()` (its variables
    bypass the reuse by order: they belong to the table)."""
    index, self._table_index = self._table_index, self._table_index + 1
    if index < len(self.tables):
      return self.tables[index]
    if self._calls:
      raise ModelFnError(f"model_fn built a new table layer in mode {self._mode!r} on a later call; its first call "
                         f"built {len(self.tables)}. A model_fn must build the same table layers on every call")
    self._bypass = True
    try:
      table = make()
    finally:
      self._bypass = False
    self.tables.append(table)
    return table

  def _creator(self, next_creator, **kwargs):
    if self._bypass:
      return next_creator(**kwargs)
    if _is_metric_state(kwargs):
      self._bypass = True
      try:
        return (self._metric_scope or self._other_metrics).get(next_creator, kwargs)
      finally:
        self._bypass = False
    index, self._index = self._index, self._index + 1
    if index < len(self.created):
      return self._check_same(self.created[index], index, kwargs)
    if self._calls:
      raise ModelFnError(
          f"model_fn created a new variable {kwargs.get('name')!r} (shape {_requested_shape(kwargs)}) in mode "
          f"{self._mode!r} on a later call; its first call created {len(self.created)} variables. A model_fn must "
          "create the same variables, in the same order, on every call and in every mode (metrics excepted)")
    variable = next_creator(**_initial_value_out_of_the_trace(kwargs))
    self.created.append(variable)
    return variable

  def _check_same(self, variable, index: int, kwargs: dict):
    shape = _requested_shape(kwargs)
    dtype = kwargs.get("dtype")
    name = _base_name(kwargs.get("name"))
    same = ((shape is None or not shape.is_fully_defined() or shape == variable.shape)
            and (dtype is None or tf.as_dtype(dtype).base_dtype == variable.dtype.base_dtype)
            and (name is None or name == _base_name(_name_of(variable))))
    if not same:
      raise ModelFnError(
          f"model_fn variable #{index} is {kwargs.get('name')!r} {shape} in mode {self._mode!r}, but the first call "
          f"created {_name_of(variable)!r} {variable.shape} there. A model_fn must create its variables in the same "
          "order on every call and in every mode")
    return variable
