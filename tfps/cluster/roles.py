"""Dispatches a process to its role: ps and worker serve, the chief trains, the evaluator evaluates."""

import os
import sys
from typing import Callable, Optional, Sequence, TypeVar

from absl import app
from absl import flags
from absl import logging

from tfps.cluster import config as cluster_lib
from tfps.cluster import failures
from tfps import flags as flags_lib
from tfps.errors import ClusterConfigError
from tfps.errors import TfpsError
from tfps.errors import UnreachableTaskError

T = TypeVar("T")


def resolve_cluster(cluster: Optional[cluster_lib.ClusterConfig] = None,
                    flag_values: flags.FlagValues = flags.FLAGS) -> cluster_lib.ClusterConfig:
  """`cluster` if given, else the cluster from tfps flags and/or TF_CONFIG.

  Raises:
    ClusterConfigError: no cluster is described anywhere, or the description breaks a rule.
  """
  if cluster is not None:
    if not isinstance(cluster, cluster_lib.ClusterConfig):
      raise TypeError(f"`cluster` must be a tfps ClusterConfig (e.g. tfps.testing.local_cluster()), got "
                      f"{type(cluster).__name__}")
    return cluster
  if flag_values.is_parsed():
    config = flags_lib.config_from_flags(flag_values)
  else:
    config = cluster_lib.from_environ(os.environ)
  if config is None:
    raise ClusterConfigError("no cluster given: pass cluster= (e.g. tfps.testing.local_cluster()), set TF_CONFIG, "
                             "or run under tfps-launch / with --ps_hosts, --worker_hosts and --job_name")
  return config


def run_task(chief_fn: Callable[[cluster_lib.ClusterConfig], T],
             evaluator_fn: Optional[Callable[[cluster_lib.ClusterConfig], T]] = None,
             cluster: Optional[cluster_lib.ClusterConfig] = None,
             flag_values: flags.FlagValues = flags.FLAGS) -> Optional[T]:
  """Runs this process's role; one call serves every role of a user's script.

  ps and worker tasks serve until stopped and never return; the chief returns `chief_fn(cluster)`; the evaluator
  returns `evaluator_fn(cluster)`.
  """
  config = resolve_cluster(cluster, flag_values)
  if config.task_type in ("ps", "worker"):
    from tfps.cluster import server  # pylint: disable=g-import-not-at-top
    server.run_server(config)
  if config.task_type == "evaluator":
    if evaluator_fn is None:
      raise ClusterConfigError("this task is an evaluator but the script gives no evaluation to run")
    return evaluator_fn(config)
  try:
    return chief_fn(config)
  except Exception as e:  # pylint: disable=broad-except
    message = failures.describe_lost_task(e, config)
    if message is None:
      raise
    raise UnreachableTaskError(message) from None


def run_main(main: Callable[[Sequence[str]], Optional[int]], argv: Optional[Sequence[str]] = None) -> None:
  """`absl.app.run(main)` for tfps scripts: a tfps error (bad cluster, unreachable task) ends the process with one
  line on stderr and exit status 2 instead of a traceback."""
  def guarded(args):
    try:
      return main(args)
    except TfpsError as e:
      print(f"{os.path.basename(sys.argv[0])}: {e}", file=sys.stderr, flush=True)
      if isinstance(e, UnreachableTaskError):  # TensorFlow's exit would wait on the lost task forever
        logging.flush()
        sys.stdout.flush()
        os._exit(2)
      sys.exit(2)
  app.run(guarded, argv=argv)
