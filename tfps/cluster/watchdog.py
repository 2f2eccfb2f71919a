"""The chief's watch over its parameter servers: a ps that stops answering ends the chief within a bounded time.

TensorFlow's RPCs notice a ps whose host went silent (a cut link drops packets and nothing resets the connection) only
through gRPC keepalive (`tfps._env`) and only while a call to it is in flight, so a thread also probes each ps with a
fresh connection (`ports.probe`) every few seconds. When
one has not answered for `timeout_secs`, the chief prints one line naming it and its address and exits with status 3
(`EXIT_LOST_TASK`): an outside supervisor (Kubernetes' restart policy, tfps-launch) starts it again and it resumes
from its checkpoint.
"""

import os
import sys
import threading
import time
from typing import Callable, Optional, Sequence

from tfps.cluster import config as cluster_lib
from tfps.cluster import ports
from tfps.errors import EXIT_LOST_TASK
from tfps.errors import exit_now

DEFAULT_TIMEOUT_SECS = 30.0
_WATCHED = set()  # address tuples already watched by this process


def lost_task_message(job: str, index: int, address: str, silent_secs: float, error: OSError) -> str:
  host, port = address.rsplit(":", 1)
  return (f"task {job}:{index} at {address} has not answered for {silent_secs:.0f}s: "
          f"{ports.explain_connect_error(error, host, port)}; start this task again once it is back: it resumes "
          "from the last checkpoint")


def _exit_with(message: str) -> None:
  # the main thread is blocked inside TensorFlow on the silent task, and exiting would wait on it
  exit_now(EXIT_LOST_TASK, f"{os.path.basename(sys.argv[0])}: {message}")


def start_watchdog(config: cluster_lib.ClusterConfig, jobs: Sequence[str] = ("ps",),
                   timeout_secs: float = DEFAULT_TIMEOUT_SECS, interval_secs: float = 2.0,
                   on_lost: Optional[Callable[[str], None]] = None) -> Optional[threading.Thread]:
  """Starts a daemon thread probing every task of `jobs`; calls `on_lost(message)` (default: print it, exit 3) when
  one has not answered for `timeout_secs`. Returns None if this process already watches the same tasks."""
  tasks = [(job, index, address) for job in jobs for index, address in enumerate(config.hosts(job))]
  key = tuple(address for _, _, address in tasks)
  if key in _WATCHED:
    return None
  _WATCHED.add(key)
  on_lost = on_lost or _exit_with

  def watch():
    answered = {address: time.monotonic() for _, _, address in tasks}
    while True:
      for job, index, address in tasks:
        try:
          ports.probe(address, interval_secs * 2)
          answered[address] = time.monotonic()
        except OSError as e:
          silent_secs = time.monotonic() - answered[address]
          if silent_secs >= timeout_secs:
            on_lost(lost_task_message(job, index, address, silent_secs, e))
            return
      time.sleep(interval_secs)

  thread = threading.Thread(target=watch, name="tfps-ps-watchdog", daemon=True)
  thread.start()
  return thread
