"""Dispatches a process to its role: ps and worker serve, the chief trains, the evaluator evaluates.

`run_task` is the one way a script serves every role; `run_main` runs a script's `main` so that a tfps error (a bad
argument, a bad cluster, an unreachable task) ends it with one line on stderr instead of a traceback. Neither reads
flags: a script builds the cluster with `tfps.config_from_flags()` and passes it on.
"""

import os
import sys
from typing import Callable, Optional, Sequence, TypeVar

from absl import app

from tfps import checks
from tfps.cluster import config as cluster_lib
from tfps.cluster import console
from tfps.cluster import failures
from tfps.errors import ClusterConfigError
from tfps.errors import EXIT_LOST_TASK
from tfps.errors import exit_now
from tfps.errors import EXIT_REFUSED
from tfps.errors import TfpsError
from tfps.errors import refuse
from tfps.errors import UnreachableTaskError

T = TypeVar("T")


def resolve_cluster(cluster: Optional[cluster_lib.ClusterConfig] = None) -> cluster_lib.ClusterConfig:
  """`cluster` if given, else the cluster of the TF_CONFIG an orchestrator (or tfps-launch) set.

  Raises:
    ClusterConfigError: no cluster is described, or the description breaks a rule.
  """
  if cluster is not None:
    if not isinstance(cluster, cluster_lib.ClusterConfig):
      raise TypeError(f"`cluster` must be a tfps ClusterConfig (e.g. tfps.testing.local_cluster()), got "
                      f"{type(cluster).__name__}")
    return cluster
  config = cluster_lib.from_environ(os.environ)
  if config is None:
    raise ClusterConfigError("no cluster given: pass cluster= (tfps.config_from_flags() in a script with "
                             "--ps_hosts, --worker_hosts and --job_name, or tfps.testing.local_cluster()), set "
                             "TF_CONFIG, or run under tfps-launch")
  return config


def _check_settings(model_dir: Optional[str], lost_chief_timeout_secs: float) -> None:
  checks.non_negative_number("lost_chief_timeout_secs", lost_chief_timeout_secs, "number of seconds")
  if model_dir is not None:  # every task reads it (ps and workers: the FINAL marker)
    checks.directory("model_dir", model_dir)


def run_task(chief_fn: Optional[Callable[[cluster_lib.ClusterConfig], T]] = None,
             evaluator_fn: Optional[Callable[[Optional[cluster_lib.ClusterConfig]], T]] = None,
             cluster: Optional[cluster_lib.ClusterConfig] = None,
             thread_spinning: bool = cluster_lib.DEFAULT_THREAD_SPINNING, model_dir: Optional[str] = None,
             lost_chief_timeout_secs: float = cluster_lib.DEFAULT_LOST_CHIEF_TIMEOUT_SECS,
             connect_timeout_secs: float = cluster_lib.DEFAULT_CONNECT_TIMEOUT_SECS) -> Optional[T]:
  """Runs this process's role; one call serves every role of a user's script.

  ps and worker tasks serve and never return: given the run's `model_dir` they exit with status 0 once training has
  ended (the chief's FINAL marker, the chief gone) and with status 3 when the chief has not answered for
  `lost_chief_timeout_secs` before that (`tfps.cluster.job_end`); without it they serve until stopped. The chief
  returns `chief_fn(cluster)`; the evaluator returns `evaluator_fn(cluster)`. A script that only evaluates (no
  `chief_fn`) and is given no cluster anywhere runs `evaluator_fn(None)`: a standalone sidecar needs no cluster.

  Args:
    chief_fn: trains (e.g. calls `tfps.fit(..., cluster=cluster)`); called on the chief.
    evaluator_fn: evaluates (e.g. `tfps.run_sidecar_evaluator`); called on the evaluator task.
    cluster: the cluster (e.g. `tfps.config_from_flags()`); default: TF_CONFIG.
    thread_spinning: whether idle ps and worker threads spin (TensorFlow's default) or sleep; `--thread_spinning`.
    model_dir: the run's model_dir (on storage every host sees), for ps and workers to see training end.
    lost_chief_timeout_secs: how long a ps or worker waits for a silent chief before it fails (status 3).
    connect_timeout_secs: how long a ps or worker waits for the host name of its own address to resolve before it
      refuses to serve (one line naming it); `--connect_timeout_secs`: `tfps.server_options_from_flags()`.
  """
  if chief_fn is None and evaluator_fn is None:
    raise TypeError("run_task needs `chief_fn`, `evaluator_fn` or both")
  if cluster is None and chief_fn is None and cluster_lib.from_environ(os.environ) is None:
    return evaluator_fn(None)
  config = resolve_cluster(cluster)
  _check_settings(model_dir, lost_chief_timeout_secs)
  console.drop_executor_teardown_errors()
  if config.task_type in ("ps", "worker"):
    from tfps.cluster import server  # pylint: disable=g-import-not-at-top
    server.run_server(config, thread_spinning, model_dir, lost_chief_timeout_secs,
                      resolve_timeout_secs=connect_timeout_secs)
  if config.task_type == "evaluator":
    if evaluator_fn is None:
      raise ClusterConfigError("this task is an evaluator but the script gives no evaluation to run; pass "
                               "evaluator_fn= to tfps.run_task")
    return evaluator_fn(config)
  if chief_fn is None:
    raise ClusterConfigError("this task is the chief but the script gives no training to run; pass chief_fn= to "
                             "tfps.run_task")
  try:
    return chief_fn(config)
  except Exception as e:  # pylint: disable=broad-except
    message = failures.describe_lost_task(e, config)
    if message is None:
      raise
    raise UnreachableTaskError(message) from None


def run_main(main: Callable[[Sequence[str]], Optional[int]], argv: Optional[Sequence[str]] = None,
             flags_parser: Optional[Callable[[Sequence[str]], list]] = None) -> None:
  """`absl.app.run(main)` for tfps scripts: a tfps error ends the process with one line on stderr instead of a
  traceback, and exit status `EXIT_LOST_TASK` (3) for an unreachable or lost task (start it again once the task is
  back), `EXIT_REFUSED` (2) for the rest (bad argument, bad cluster, a checkpoint that does not fit). `flags_parser`:
  absl's `app.run` argument (`tfps.run_main` passes `tfps.flags.command_line_parser`, which refuses a bad flag alike)."""
  program = os.path.basename(sys.argv[0])
  def guarded(args):
    try:
      return main(args)
    except UnreachableTaskError as e:
      exit_now(EXIT_LOST_TASK, f"{program}: {e}")
    except TfpsError as e:
      refuse(program, str(e))
  app.run(guarded, argv=argv, **({"flags_parser": flags_parser} if flags_parser else {}))
