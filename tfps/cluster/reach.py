"""The chief reaches its cluster: it checks it can listen on its port, waits until every ps and worker answers, and
once connected watches the ps (`watchdog`) and warns where its port is exposed. No TensorFlow: the strategy itself is
built in `tfps.training.strategy`."""

import socket
import time
from typing import Sequence

from absl import logging

from tfps.cluster import config as cluster_lib
from tfps.cluster import isolation
from tfps.cluster import ports
from tfps.cluster import watchdog
from tfps.errors import UnreachableTaskError


def wait_for_tasks(config: cluster_lib.ClusterConfig, timeout_secs: float = cluster_lib.DEFAULT_CONNECT_TIMEOUT_SECS,
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


def before_connecting(config: cluster_lib.ClusterConfig, connect_timeout_secs: float) -> None:
  """The chief's port is free to listen on and every ps and worker answers (else one line naming the task)."""
  ports.check_can_listen(config)
  wait_for_tasks(config, connect_timeout_secs)


def after_connecting(config: cluster_lib.ClusterConfig, lost_task_timeout_secs: float) -> None:
  """A chief of its own process (not an in-process test cluster) is ended by a silent ps; its exposed port is
  warned about (connecting made it listen, like every server)."""
  if config.chief_hosts:
    watchdog.start_watchdog(config, timeout_secs=lost_task_timeout_secs)
  warning = config.address and isolation.exposure_warning(f"chief:{config.task_index}", config.address)
  if warning:
    logging.warning(warning)
