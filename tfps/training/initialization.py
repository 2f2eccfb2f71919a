"""Large variables initialized in place on their ps, so that a ps holds one copy of its share of a table.

A `tf.Variable` created remotely keeps its initial value and the initializer's intermediate results alive next to it
until it is built: a 400 MB table raised its ps's peak RSS by 1.24 GB (3.1x), and the peak of a ps holding a table and
its Adagrad accumulator was 1.57x their size. Variables of at least `MIN_BYTES` are instead created without a value
and filled by one function run on their own ps, in which the initializer's results are used up in place: the same
table raises the peak by 0.42 GB, and the table with its accumulator by 1.05x their size (tests/ps_peak_rss.py).
The values are the initializer's, as before. A value restored on creation, or given as a tensor, takes TensorFlow's
own path.
"""

import contextlib
import inspect

import tensorflow as tf

from tfps import _tf_private

MIN_BYTES = 8 << 20


def _in_place(next_creator, **kwargs):
  initial_value = kwargs.get("initial_value")
  # tf-keras optimizers give a slot's shape and dtype only to its initializer: `partial(initializer, shape=, dtype=)`
  bound = getattr(initial_value, "keywords", None) or {}
  shape, dtype = kwargs.get("shape") or bound.get("shape"), kwargs.get("dtype") or bound.get("dtype")
  if (kwargs.get("distribute_strategy") is None  # not below the strategy's creator: not placed (or sharded) yet
      or not callable(initial_value) or shape is None or dtype is None or _restores(initial_value)):
    return next_creator(**kwargs)
  shape, dtype = tf.TensorShape(shape), tf.as_dtype(dtype)
  if not shape.is_fully_defined() or shape.num_elements() * dtype.size < MIN_BYTES:
    return next_creator(**kwargs)
  colocated = kwargs.get("colocate_with")  # an optimizer slot: ParameterServerStrategy colocates it with its variable
  with tf.init_scope(), (tf.device(colocated.device) if colocated is not None else contextlib.nullcontext()):
    # (init_scope as in `tf.Variable`: created and filled once, even while a function is traced)
    variable = _tf_private.uninitialized_variable(
        shape=shape, dtype=dtype, name=kwargs.get("name"), trainable=kwargs.get("trainable"),
        constraint=kwargs.get("constraint"), synchronization=kwargs.get("synchronization"),
        aggregation=kwargs.get("aggregation"), distribute_strategy=kwargs.get("distribute_strategy"))
    made = []

    def fill_with(value_fn, *args):
      def fill(*inputs):
        with tf.device(variable.device):  # the initializer's ops too, not only the assignment
          made.append(value_fn(*inputs))
          with tf.control_dependencies([variable.assign(made[-1], read_value=False)]):
            return tf.constant(True)
      return tf.function(fill, autograph=False).get_concrete_function(*args)  # traced (the initializer called)

    computed = fill_with(initial_value)
    # Restored on creation, behind the strategy's per-shard lambda (`_restores` cannot see it): TensorFlow's path.
    restored = hasattr(made[0], "checkpoint_position")
    if not restored:
      repeated = _repeated_value(made[0])
      if repeated is None:
        with _no_constant_folding():
          computed().numpy()  # built and run before the option is restored
      else:  # the value as an argument: no constant the size of the variable can be folded from it
        value = tf.constant(repeated, dtype)
        fill_with(lambda scalar: tf.fill(shape, scalar), value)(value).numpy()
  return next_creator(**kwargs) if restored else variable


def _restores(initial_value) -> bool:
  """Whether `initial_value` restores a checkpointed value (it takes the shard to restore); seen before tracing it."""
  try:
    return "shard_info" in inspect.signature(initial_value).parameters
  except (TypeError, ValueError):  # no signature to read
    return False


def _repeated_value(value):
  """The one value `value` (traced) repeats, if it is a graph constant of one repeated value (a constant
  initializer's, such as Adagrad's accumulator's), else None.

  A constant op keeps its whole value for as long as its function lives, so the variable could not take over its
  memory (measured: twice the variable on the ps); a `tf.fill` of the value, given as an argument so that nothing
  folds it back into a constant, makes a result it can take over.
  """
  if not isinstance(value, tf.Tensor) or value.op.type != "Const":
    return None
  proto = value.op.get_attr("value")
  if proto.tensor_content:  # every element stored: not one repeated value
    return None
  scalar = tf.make_tensor_proto(0, dtype=value.dtype)  # the stored value without the shape: the scalar it repeats
  scalar.CopyFrom(proto)
  scalar.tensor_shape.Clear()
  return tf.make_ndarray(scalar)


@contextlib.contextmanager
def _no_constant_folding():
  """Grappler folds an initializer with constant seeds (tf-keras's) into a constant as big as the table, which the
  function then keeps on the ps: twice the table (measured). Off while such a filling function is built and run."""
  previous = tf.config.optimizer.get_experimental_options()
  tf.config.optimizer.set_experimental_options({"constant_folding": False})
  try:
    yield
  finally:
    tf.config.optimizer.set_experimental_options({"constant_folding": previous.get("constant_folding", True)})


@contextlib.contextmanager
def around(scope):
  """`scope` (a strategy's scope) inside a creator scope of `_in_place`: entered outside the strategy's own creator,
  `_in_place` is reached with each shard the strategy asks for, already placed on its ps."""
  with tf.variable_creator_scope(_in_place), scope:
    yield
