"""Builds the ParameterServerStrategy and its ClusterCoordinator for a `ClusterConfig`; nothing else."""

import contextlib
import logging as py_logging
import weakref
from typing import List, Optional, Tuple

from absl import logging
import tensorflow as tf

from tfps import _tf_private
from tfps import checks
from tfps.cluster import config as cluster_lib
from tfps.cluster import options as options_lib
from tfps.cluster import reach
from tfps.cluster.reach import wait_for_tasks  # pylint: disable=unused-import  (its home before tfps.cluster.reach)
from tfps.training import initialization
from tfps.training import metric_placement

DEFAULT_MIN_SHARD_BYTES = options_lib.DEFAULT_MIN_SHARD_BYTES
_CLUSTERS = weakref.WeakKeyDictionary()  # strategy -> the ClusterConfig it was built for


class ShardLargeVariables(tf.distribute.experimental.partitioners.Partitioner):
  """`FixedShardsPartitioner` for variables of at least `min_shard_bytes`; smaller ones stay whole.

  Sharding a small dense kernel buys nothing and costs one RPC per shard per step, so only tables big enough to matter
  (embeddings) are split into `num_shards` shards along their first axis; whole variables are placed on the ps
  round-robin. `min_shard_bytes=0` is `FixedShardsPartitioner(num_shards)`.
  """

  def __init__(self, num_shards: int, min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES):
    self.num_shards = checks.positive_int("num_shards", num_shards)
    self.min_shard_bytes = checks.non_negative_int("min_shard_bytes", min_shard_bytes)

  def __call__(self, shape, dtype, axis=0):
    shape = tf.TensorShape(shape)
    partitions = [1] * shape.rank
    if shape.rank and shape[axis] is not None and shape[axis] >= 2:
      nbytes = shape.num_elements() * tf.as_dtype(dtype).size
      if nbytes >= self.min_shard_bytes:
        partitions[axis] = min(self.num_shards, shape[axis])
    return partitions


class ParameterServerStrategy(tf.distribute.experimental.ParameterServerStrategy):
  """TensorFlow's strategy, whose scope also creates large variables in place on their ps
  (`tfps.training.initialization`): each ps then holds one copy of its share of a table, not three while it is created;
  and places each metric's variables on one ps (`tfps.training.metric_placement`)."""

  def scope(self):
    return metric_placement.together(initialization.around(super().scope()))


def build_cluster_resolver(config: cluster_lib.ClusterConfig) -> tf.distribute.cluster_resolver.ClusterResolver:
  """A resolver for the training cluster of `config`, seen from the chief (never including the evaluator)."""
  spec = tf.train.ClusterSpec(config.training_cluster())
  if not config.chief_hosts:  # an unlisted coordinator: the strategy gives it an address of its own
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
  return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="chief", task_id=0, rpc_layer="grpc")


def build_strategy(config: cluster_lib.ClusterConfig, options: Optional[options_lib.StrategyOptions] = None,
                   **settings) -> Tuple[tf.distribute.experimental.ParameterServerStrategy,
                                        tf.distribute.experimental.coordinator.ClusterCoordinator]:
  """Connects to the cluster and returns `(strategy, coordinator)`.

  Args:
    config: the cluster; its task must be the chief.
    options: a `tfps.StrategyOptions` (or a dict of its fields): `num_shards` (default: the number of ps),
      `min_shard_bytes` (see `ShardLargeVariables`), `connect_timeout_secs` (how long to wait for every ps and worker
      to answer), `lost_task_timeout_secs` (a ps silent this long mid-run ends the chief: `tfps.cluster.watchdog`).
    **settings: those fields one by one (`build_strategy(config, num_shards=2)`).
  """
  options = options_lib.as_strategy_options(options, **settings)
  if config.task_type != "chief":
    raise ValueError(f"the strategy is built on the chief, not on task {config.task_type}:{config.task_index}")
  num_shards = config.num_ps if options.num_shards is None else options.num_shards
  if tf.get_logger().level == py_logging.NOTSET:  # TensorFlow's per-closure INFO lines drown tfps's progress
    tf.get_logger().setLevel(py_logging.WARNING)
  reach.before_connecting(config, options.connect_timeout_secs)
  strategy = ParameterServerStrategy(
      build_cluster_resolver(config), variable_partitioner=ShardLargeVariables(num_shards, options.min_shard_bytes))
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  _CLUSTERS[strategy] = config
  logging.info("Connected to %s; large variables sharded %d-way", config.describe(), num_shards)
  reach.after_connecting(config, options.lost_task_timeout_secs)
  return strategy, coordinator


def cluster_of(strategy: tf.distribute.Strategy) -> cluster_lib.ClusterConfig:
  """The cluster `build_strategy` built `strategy` for."""
  if strategy not in _CLUSTERS:
    raise ValueError("this model was not built under a strategy from tfps.build_strategy (tfps.fit builds one)")
  return _CLUSTERS[strategy]


def on_device(device: Optional[str]):
  """`tf.device(device)`, or no device scope at all where `device` is None (ops then run where the caller's do)."""
  return contextlib.nullcontext() if device is None else tf.device(device)


def shards_of(variable) -> List[tf.Variable]:
  """The variables holding `variable`: its shards if ParameterServerStrategy partitioned it, else itself."""
  if _tf_private.is_sharded_variable(variable):
    return list(variable.variables)
  return [variable]


def variable_id(variable) -> int:
  """One identity per variable, whether handed out wrapped by the strategy or not."""
  return id(_tf_private.unwrapped(variable))
