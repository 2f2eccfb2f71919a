"""An in-process cluster for tests and notebooks.

In-process `tf.distribute.Server`s cannot be stopped, so a process holds at most one such cluster: asking again with
the same sizes returns it, asking for other sizes is an error.
"""

import os
from typing import List, Optional

import portpicker
import tensorflow as tf

from tfps import checks
from tfps.cluster import config as cluster_lib

IN_PROCESS_THREADS_PER_TASK = 4
_CLUSTER: Optional[cluster_lib.ClusterConfig] = None
_SERVERS: List[tf.distribute.Server] = []  # kept alive for the life of the process


def local_cluster(num_workers: int = 2, num_ps: int = 1) -> cluster_lib.ClusterConfig:
  """Starts `num_ps` ps and `num_workers` worker servers in this process on free loopback ports.

  Returns the `ClusterConfig` of the chief (this process), usable wherever tfps takes `cluster=`.
  """
  global _CLUSTER
  checks.positive_int("num_workers", num_workers)
  checks.positive_int("num_ps", num_ps)
  if _CLUSTER is not None:
    if (_CLUSTER.num_workers, _CLUSTER.num_ps) != (num_workers, num_ps):
      raise RuntimeError(f"this process already runs an in-process cluster with {_CLUSTER.num_workers} worker(s) "
                         f"and {_CLUSTER.num_ps} ps, and in-process servers cannot be stopped; asked for "
                         f"{num_workers} worker(s) and {num_ps} ps")
    return _CLUSTER
  os.environ["GRPC_FAIL_FAST"] = "use_caller"
  config = cluster_lib.from_hosts(
      ps_hosts=[f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(num_ps)],
      worker_hosts=[f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(num_workers)])
  spec = tf.train.ClusterSpec(config.training_cluster())
  # In one process every server shares the inter-op thread pool, sized by the cores; with fewer threads than
  # workers + 1, Model.fit deadlocks (seen on 2 cores), as TensorFlow's own in-process cluster recipe notes. Every
  # strategy a test process builds on the cluster adds closures that hold threads, so give it room to spare.
  threads = max(os.cpu_count() or 1, IN_PROCESS_THREADS_PER_TASK * (num_workers + 1))
  worker_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads)
  for job in ("worker", "ps"):
    for index in range(len(config.hosts(job))):
      _SERVERS.append(tf.distribute.Server(spec, job_name=job, task_index=index, protocol="grpc",
                                           config=worker_config if job == "worker" else None, start=True))
  _CLUSTER = config
  return config
