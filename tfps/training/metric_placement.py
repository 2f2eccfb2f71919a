"""Each tf-keras metric's variables on one ps.

A metric makes its variables one after another (`Metric.add_weight`, synchronization `ON_READ`), and
ParameterServerStrategy places each variable on the next ps in turn: the loss metric's `total` on one ps and its
`count` on the next. Its `update_state` then sends the step's values to both ps each step, and `Mean` orders the two
increments, a control edge from one ps to the other. Placed together, a metric costs one ps the step's values and no
ps another's. Variables made one after another with synchronization `ON_READ` (a metric's; also a batch
normalization's moving mean and variance) are placed with the first of them; any other variable ends the run. Where
the strategy's partitioner shards a run's first variable (small as it is), the run is left to the strategy.
"""

import contextlib

import tensorflow as tf

from tfps import _tf_private


@contextlib.contextmanager
def together(scope):
  """`scope` (a ParameterServerStrategy's scope), inside which each run of `ON_READ` variables is placed with its first
  variable (see the module docstring). Inside the strategy's own creator: the strategy places what this asks."""
  first = []

  def creator(next_creator, **kwargs):
    if kwargs.get("synchronization") != tf.VariableSynchronization.ON_READ or "colocate_with" in kwargs:
      first.clear()
      return next_creator(**kwargs)
    if first:
      return next_creator(**_tf_private.colocated_with(kwargs, first[0]))
    made = next_creator(**kwargs)
    if not _tf_private.is_sharded_variable(made):  # a sharded first (a partitioner that splits even these) leads none
      first.append(made)
    return made

  with scope, tf.variable_creator_scope(creator):
    yield
