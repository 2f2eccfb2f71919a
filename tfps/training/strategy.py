"""Builds the ParameterServerStrategy and its ClusterCoordinator for a `ClusterConfig`; nothing else."""

import contextlib
import logging as py_logging
import socket
import time
import weakref
from typing import List, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tfps import checks
from tfps.cluster import config as cluster_lib
from tfps.cluster import isolation
from tfps.cluster import ports
from tfps.cluster import watchdog
from tfps.training import initialization
from tfps.errors import UnreachableTaskError

DEFAULT_MIN_SHARD_BYTES = 256 << 10
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
  (`tfps.training.initialization`): each ps then holds one copy of its share of a table, not three while it is created."""

  def scope(self):
    return initialization.around(super().scope())


def build_cluster_resolver(config: cluster_lib.ClusterConfig) -> tf.distribute.cluster_resolver.ClusterResolver:
  """A resolver for the training cluster of `config`, seen from the chief (never including the evaluator)."""
  spec = tf.train.ClusterSpec(config.training_cluster())
  if not config.chief_hosts:  # an unlisted coordinator: the strategy gives it an address of its own
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
  return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="chief", task_id=0, rpc_layer="grpc")


def wait_for_tasks(config: cluster_lib.ClusterConfig, timeout_secs: float = 60.0,
                   jobs: Sequence[str] = ("ps", "worker")) -> None:
  """Waits until every task of `jobs` answers as a TensorFlow (gRPC) server, or raises naming the first one that did
  not. Another program on a task's port would otherwise make the chief hang inside TensorFlow.

  A name that does not resolve yet is retried too (in Kubernetes a pod's name appears once the pod runs).

  Raises:
    UnreachableTaskError: a task did not answer within `timeout_secs`; the message says why and what to check.
  """
  deadline = time.monotonic() + timeout_secs
  for job in jobs:
    for index, address in enumerate(config.hosts(job)):
      host, port = address.rsplit(":", 1)
      while True:
        try:
          attempt_secs = min(1.0, max(deadline - time.monotonic(), 0.05))
          with socket.create_connection((host.strip("[]"), int(port)), timeout=attempt_secs) as connection:
            ports.check_speaks_grpc(connection, attempt_secs)
          break
        except OSError as e:
          if time.monotonic() >= deadline:
            raise UnreachableTaskError(f"task {job}:{index} at {address} did not answer within {timeout_secs:g}s: "
                                       f"{ports.explain_connect_error(e, host, port)}") from None
          time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))


def build_strategy(config: cluster_lib.ClusterConfig, num_shards: Optional[int] = None,
                   min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES,
                   connect_timeout_secs: float = cluster_lib.DEFAULT_CONNECT_TIMEOUT_SECS,
                   lost_task_timeout_secs: float = watchdog.DEFAULT_TIMEOUT_SECS
                   ) -> Tuple[tf.distribute.experimental.ParameterServerStrategy,
                              tf.distribute.experimental.coordinator.ClusterCoordinator]:
  """Connects to the cluster and returns `(strategy, coordinator)`.

  Args:
    config: the cluster; its task must be the chief.
    num_shards: shards of each large variable; defaults to the number of ps.
    min_shard_bytes: variables smaller than this are not sharded (see `ShardLargeVariables`).
    connect_timeout_secs: how long to wait for every ps and worker to answer before raising.
    lost_task_timeout_secs: a ps silent this long mid-run ends the chief (one line, exit status 3; see
      `tfps.cluster.watchdog`).
  """
  if config.task_type != "chief":
    raise ValueError(f"the strategy is built on the chief, not on task {config.task_type}:{config.task_index}")
  num_shards = config.num_ps if num_shards is None else num_shards
  if tf.get_logger().level == py_logging.NOTSET:  # TensorFlow's per-closure INFO lines drown tfps's progress
    tf.get_logger().setLevel(py_logging.WARNING)
  ports.check_can_listen(config)
  wait_for_tasks(config, connect_timeout_secs)
  strategy = ParameterServerStrategy(
      build_cluster_resolver(config), variable_partitioner=ShardLargeVariables(num_shards, min_shard_bytes))
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  _CLUSTERS[strategy] = config
  if config.chief_hosts:  # a chief of its own process (not an in-process test cluster): a silent ps must end it
    watchdog.start_watchdog(config, timeout_secs=lost_task_timeout_secs)
  logging.info("Connected to %s; large variables sharded %d-way", config.describe(), num_shards)
  warning = config.address and isolation.exposure_warning(f"chief:{config.task_index}", config.address)
  if warning:  # connecting made the chief listen on its port too, like every server
    logging.warning(warning)
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
  if isinstance(variable, tf.__internal__.distribute.ShardedVariable):
    return list(variable.variables)
  return [variable]
