"""When a ps or worker task ends by itself: training has ended, or its chief is gone for good.

A server has no way of its own to learn that training is over: TensorFlow's ps and workers serve until they are
killed, so on many hosts (one command per host) and under Kubernetes a finished job never completes. Given the run's
`model_dir` (on storage every host sees, as the chief's checkpoints already require), a thread of the server watches
two things every `PROBE_INTERVAL_SECS`:

  - the chief's FINAL marker (`model_dir/checkpoints/FINAL`, `tfps.training.checkpoints`), written when training ends;
  - the chief's own server (the chief listens at its address once it has connected to the cluster), probed with a
    fresh connection as the chief's watchdog probes the ps (`ports.probe`).

Training has ended when a marker is there that this task saw appear (absent at a look, or changed since its start),
or that was there all along while a chief came and went (a chief started on a finished run restores it and exits
without training again). The task then exits with status 0 once the chief has not answered for `END_GRACE_SECS`
(the chief may still read variables after FINAL: a final evaluation, an export), at the latest
`lost_chief_timeout_secs` after it found the marker. A marker that was there when the task started and no chief seen
since is a previous run's: the chief of a new run removes it when it starts.

A chief that has not answered for `lost_chief_timeout_secs` while training has not ended is gone for good: the task
prints one line naming it and exits with status 3 (`EXIT_LOST_TASK`), a failure, so that a restart policy starts it
again (with the chief, under a JobSet's failure policy) and a job whose chief never comes back fails instead of
holding its nodes. A chief restarted within that time finds its ps and workers still there.

A worker also follows its ps: where a ps's process ends while training has not ended (`process_watch`: noticed at
once, however soon the ps is started again), the worker prints one line naming it and exits with status 3, so that
its restart policy starts it again beside the restarted ps and chief. A worker that served a ps's previous process
can stall the restarted chief: in a TFJob run (ps and chief started again, workers left running) the chief's first
steps waited 126 to 206 s, again after each restart, until gRPC ended the stuck calls ("Too many pings"); with the
workers started again beside them, no run stalled. Where a supervisor already starts every task again when a ps fails
(tfps-launch, a JobSet's failure policy), it sets `TFPS_PS_FAILURE_RESTARTS_ALL` and workers do not end themselves.

Where the chief is not listed in the cluster (a notebook's coordinator), nothing can be probed: the task exits with 0
`UNLISTED_CHIEF_GRACE_SECS` after a marker appeared, and never for a lost chief.
"""

import os
import sys
import threading
import time
from typing import Callable, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from tfps.cluster import config as cluster_lib
from tfps.cluster import ports
from tfps.cluster import process_watch
from tfps.errors import EXIT_LOST_TASK
from tfps.errors import exit_now

CHECKPOINT_SUBDIR = "checkpoints"
FINAL_MARKER = "FINAL"
DEFAULT_LOST_CHIEF_TIMEOUT_SECS = cluster_lib.DEFAULT_LOST_CHIEF_TIMEOUT_SECS
END_GRACE_SECS = 5.0
UNLISTED_CHIEF_GRACE_SECS = 30.0
PROBE_INTERVAL_SECS = 2.0

Outcome = Tuple[int, str]  # exit status, the line that says why


def final_marker_path(model_dir: str) -> str:
  """`model_dir/checkpoints/FINAL`: the chief's marker that training ended (`tfps.training.checkpoints`)."""
  return os.path.join(model_dir, CHECKPOINT_SUBDIR, FINAL_MARKER)


def read_marker_text(model_dir: str) -> Optional[str]:
  """The FINAL marker's text, or None where there is none."""
  path = final_marker_path(model_dir)
  try:
    with tf.io.gfile.GFile(path) as f:
      return f.read()
  except tf.errors.NotFoundError:
    return None


class EndWatch:
  """Decides, from what each look found, whether this task should end and how (no I/O: fed by `watch_job_end`).

  Args:
    task: this task, for messages (`ps:0`).
    chief: the chief's `host:port`, or None where it is not listed.
    marker_path: where the FINAL marker is, for messages.
    initial_marker: the marker's text when this task started (None: none).
    lost_chief_timeout_secs: how long a chief may stay silent while training has not ended.
    now: the time of the start (monotonic seconds).
    followed_ps: the addresses of the ps whose process ending ends this task (a worker's ps; else none).
  """

  def __init__(self, task: str, chief: Optional[str], marker_path: str, initial_marker: Optional[str],
               lost_chief_timeout_secs: float, now: float, followed_ps: Sequence[str] = ()):
    self.task, self.chief, self.marker_path = task, chief, marker_path
    self.followed_ps = list(followed_ps)
    self.initial_marker = initial_marker
    self.timeout_secs = lost_chief_timeout_secs
    self.marker_new = initial_marker is None
    self.chief_seen = False
    self.last_answer = now
    self.ended_at: Optional[float] = None

  def look(self, marker: Optional[str], chief_answered: bool, now: float,
           ended_ps: Sequence[str] = ()) -> Optional[Outcome]:
    """What one look found: the marker's text (None: none), whether the chief answered, and the followed ps whose
    process ended since the last look. Returns the outcome once the task should end, else None."""
    if marker is None or marker != self.initial_marker:
      self.marker_new = True
    if chief_answered:
      self.chief_seen, self.last_answer = True, now
    ended = marker is not None and (self.marker_new or self.chief_seen)
    if ended and self.ended_at is None:
      self.ended_at = now
    if not ended:
      self.ended_at = None
      return self._ps_ended(ended_ps) or self._lost(now)
    silent_secs = now - self.last_answer
    if self.chief is None:
      return self._end("the chief is not listed") if now - self.ended_at >= UNLISTED_CHIEF_GRACE_SECS else None
    if not chief_answered and silent_secs >= END_GRACE_SECS:
      return self._end(f"chief:0 at {self.chief} is gone")
    if now - self.ended_at >= self.timeout_secs:
      return self._end(f"chief:0 still answers {self.timeout_secs:g}s later")
    return None

  def _end(self, why: str) -> Outcome:
    return 0, f"training ended ({self.marker_path}) and {why}: {self.task} exits"

  def _ps_ended(self, ended_ps: Sequence[str]) -> Optional[Outcome]:
    followed = [address for address in ended_ps if address in self.followed_ps]
    if not followed:
      return None
    names = ", ".join(f"ps:{self.followed_ps.index(address)} at {address}" for address in followed)
    return EXIT_LOST_TASK, (
        f"{self.task}: the process of {names} ended and training has not ended; stopping with status "
        f"{EXIT_LOST_TASK} so that a restart policy starts this task again beside the restarted ps and chief (a "
        "worker that served a ps's previous process can stall the restarted chief)")

  def _lost(self, now: float) -> Optional[Outcome]:
    if self.chief is None or now - self.last_answer < self.timeout_secs:
      return None
    return EXIT_LOST_TASK, (
        f"{self.task}: chief:0 at {self.chief} has not answered for {now - self.last_answer:.0f}s and training has not "
        f"ended (no new {self.marker_path}); stopping with status {EXIT_LOST_TASK} so that a restart policy starts "
        "this task again with the chief (--lost_chief_timeout_secs)")


def _exit(outcome: Outcome) -> None:
  status, message = outcome
  if status == 0:
    logging.info("%s", message)
  exit_now(status, None if status == 0 else f"{os.path.basename(sys.argv[0])}: {message}")


def followed_ps_of(config: cluster_lib.ClusterConfig, environ) -> Sequence[str]:
  """The ps a task follows (module docstring): a worker's, unless `environ` says a ps failure restarts every task."""
  if config.task_type != "worker" or environ.get(cluster_lib.PS_FAILURE_RESTARTS_ALL_ENV):
    return []
  return list(config.ps_hosts)


def watch_job_end(config: cluster_lib.ClusterConfig, model_dir: str,
                  lost_chief_timeout_secs: float = DEFAULT_LOST_CHIEF_TIMEOUT_SECS,
                  interval_secs: float = PROBE_INTERVAL_SECS,
                  on_end: Callable[[Outcome], None] = _exit) -> threading.Thread:
  """Starts a daemon thread that ends this ps or worker task as the module docstring says (`on_end(outcome)`)."""
  chief = config.chief_hosts[0] if config.chief_hosts else None
  followed_ps = followed_ps_of(config, os.environ)
  watch = EndWatch(f"{config.task_type}:{config.task_index}", chief, final_marker_path(model_dir),
                   read_marker_text(model_dir), lost_chief_timeout_secs, time.monotonic(), followed_ps)
  processes = process_watch.ProcessWatch(followed_ps)

  def run():
    while True:
      answered = False
      if chief is not None:
        try:
          ports.probe(chief, interval_secs * 2)
          answered = True
        except OSError:
          pass
      ended_ps = processes.wait(interval_secs)  # returns at once when a followed ps's process ends
      outcome = watch.look(read_marker_text(model_dir), answered, time.monotonic(), ended_ps)
      if outcome is not None:
        processes.close()
        on_end(outcome)
        return

  thread = threading.Thread(target=run, name="tfps-job-end", daemon=True)
  thread.start()
  return thread
