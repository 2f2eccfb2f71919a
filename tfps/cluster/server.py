"""Runs the server of a ps or worker task until the process is stopped, or until training ends (`job_end`)."""

import os
import signal
import sys
import time
from typing import NoReturn, Optional

from absl import logging
import tensorflow as tf

from tfps.cluster import config as cluster_lib
from tfps.cluster import isolation
from tfps.cluster import job_end
from tfps.cluster import ports
from tfps.errors import AddressInUseError

SERVER_JOBS = ("ps", "worker")
# TensorFlow's CPU allocator with oneDNN (on by default on x86) serves every tensor of 4 KiB or more from a BFC pool
# that never gives memory back to the system: a ps whose table was replaced (a restore assigns every shard a new
# tensor) kept the old one's memory for good, 2.1x its share of table and slots where 1.0x was live (measured,
# bench/results/scale/restore_same_ps/NOTES.md). TensorFlow reads this once, at its first large tensor.
SYSTEM_ALLOCATOR_ENV = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"
_SIGNAL_POLL_SECONDS = 0.5


def server_config(thread_spinning: bool = cluster_lib.DEFAULT_THREAD_SPINNING) -> tf.compat.v1.ConfigProto:
  """The session config of a ps or worker server: idle threads spin (TensorFlow's default) or sleep (tfps's)."""
  config = tf.compat.v1.ConfigProto()
  config.experimental.disable_thread_spinning = not thread_spinning
  return config


def build_server(config: cluster_lib.ClusterConfig,
                 thread_spinning: bool = cluster_lib.DEFAULT_THREAD_SPINNING,
                 resolve_timeout_secs: float = cluster_lib.DEFAULT_CONNECT_TIMEOUT_SECS) -> tf.distribute.Server:
  """Starts the `tf.distribute.Server` of the ps or worker task `config` describes, with `server_config`, once its
  own host name resolves (`ports.check_resolves`, waiting up to `resolve_timeout_secs`); a ps takes its tensors from
  the system allocator unless its environment says otherwise (`SYSTEM_ALLOCATOR_ENV`)."""
  if config.task_type not in SERVER_JOBS:
    raise ValueError(f"only ps and worker tasks run a server, not {config.task_type}:{config.task_index}")
  os.environ["GRPC_FAIL_FAST"] = "use_caller"  # else a dead worker is never reported to the coordinator
  if config.task_type == "ps":  # freed tables go back to the system (unless the user chose otherwise)
    os.environ.setdefault(SYSTEM_ALLOCATOR_ENV, "1")
  ports.check_can_listen(config)
  ports.check_resolves(config, resolve_timeout_secs)
  try:
    return tf.distribute.Server(tf.train.ClusterSpec(config.training_cluster()), job_name=config.task_type,
                                task_index=config.task_index, protocol="grpc", start=True,
                                config=server_config(thread_spinning))
  except tf.errors.UnknownError as e:  # "Could not start gRPC server": the port was taken after the check
    raise AddressInUseError(f"{ports.address_in_use_message(config)} ({e.message})") from None


def _exit_on_signal(signum, frame):
  del frame
  logging.info("Received signal %d; stopping the server", signum)
  logging.flush()
  os._exit(0)  # a server cannot be stopped cleanly


def run_server(config: cluster_lib.ClusterConfig,
               thread_spinning: bool = cluster_lib.DEFAULT_THREAD_SPINNING, model_dir: Optional[str] = None,
               lost_chief_timeout_secs: float = job_end.DEFAULT_LOST_CHIEF_TIMEOUT_SECS,
               resolve_timeout_secs: float = cluster_lib.DEFAULT_CONNECT_TIMEOUT_SECS) -> NoReturn:
  """Serves as the ps or worker task of `config` until SIGTERM or SIGINT (then exits with status 0) or, given the
  run's `model_dir`, until training ends (status 0) or the chief is gone for good (status 3): `job_end`. A task
  whose own host name does not resolve within `resolve_timeout_secs` refuses in one line (status 2)."""
  server = build_server(config, thread_spinning, resolve_timeout_secs)
  signal.signal(signal.SIGTERM, _exit_on_signal)
  signal.signal(signal.SIGINT, _exit_on_signal)
  if model_dir:  # before the line below: a FINAL marker written after it is one this task saw appear
    job_end.watch_job_end(config, model_dir, lost_chief_timeout_secs)
  logging.info("Serving %s at %s (idle threads %s)", config.describe(), config.address,
               "spin" if thread_spinning else "sleep")
  warning = isolation.exposure_warning(f"{config.task_type}:{config.task_index}", config.address)
  if warning:  # not inside tfps-launch's private namespace: other hosts may reach this port
    logging.warning(warning)
  sys.stdout.flush()
  # Not `server.join()`: it blocks inside TensorFlow, where Python never runs a signal handler, so SIGTERM waited for
  # the launcher's SIGKILL. Not `signal.pause()` either: the kernel may deliver the signal to one of TensorFlow's
  # threads, and then pause() never returns. The handler runs in this thread at the latest when a short sleep ends.
  while server:  # holds the server: dropping it would ask TensorFlow to stop it
    time.sleep(_SIGNAL_POLL_SECONDS)
  raise RuntimeError("the server was dropped")
