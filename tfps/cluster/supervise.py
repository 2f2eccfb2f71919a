"""Watching a local cluster's tasks and restarting them after failures (no TensorFlow import).

What survives what:
- a worker that dies is restarted alone, on its port; the coordinator retries its work elsewhere meanwhile and uses
  it again when it is back;
- a ps or chief that dies (or a chief that fails) restarts the training cluster: every ps, worker and the chief start
  again on their ports, and the chief resumes from its newest checkpoint (the Keras path's of the last epoch, the
  Estimator path's of its global step), losing at most one checkpoint interval;
- an evaluator that dies is restarted alone;
- after `max_restarts` restarts in all, the next failure stops everything;
- a task that refused its input (exit status 2: its flags, cluster or checkpoint) is not restarted: it would refuse
  again; a training task's refusal stops everything, an evaluator's fails the launch but not training.
"""

import sys
import time
from typing import List

from absl import logging

from tfps.cluster import tasks as tasks_lib
from tfps.errors import EXIT_REFUSED

POLL_SECS = 0.2
TRAINING_JOBS = ("ps", "worker", "chief")


def _say(message: str) -> None:
  print(f"tfps-launch: {message}", file=sys.stderr, flush=True)


class Supervisor:
  """Runs the monitor loop over a `TaskGroup`; `run()` returns the launcher's exit status."""

  def __init__(self, group: tasks_lib.TaskGroup, max_restarts: int = 0, evaluator_timeout_secs: float = 300.0):
    self.group = group
    self.max_restarts = max_restarts
    self.evaluator_timeout_secs = evaluator_timeout_secs
    self.restarts = 0
    self.restart_log: List[dict] = []  # one record per restart: time, restart, task, cause, restarted
    self.evaluator_failed = False

  def run(self) -> int:
    """Watches the tasks until the chief succeeds or a failure cannot be restarted."""
    while True:
      for task in list(self.group.tasks):
        code = task.poll()
        if code is None or task.reported:
          continue
        task.reported = True
        status = self._on_exit(task, code)
        if status is not None:
          return status
        if task not in self.group.tasks:
          break  # restarted: the list of tasks changed
      time.sleep(POLL_SECS)

  def _on_exit(self, task: tasks_lib.Task, code: int):
    """Handles one task's exit; returns the exit status when the run is over, else None."""
    job = task.name[0]
    if job == "chief" and code == 0:
      return self._wait_for_evaluator() or (1 if self.evaluator_failed else 0)
    if job in ("evaluator", "ps", "worker") and code == 0:  # a server ends by itself once training has ended
      logging.info("%s finished", task.label)
      return None
    refused = code == EXIT_REFUSED  # its flags, cluster or checkpoint: started again, it would refuse them again
    if refused:  # its one line, once: on the console already if streamed, else quoted from its log
      lines = [] if task.stream else [line.strip() for line in task.tail(quiet=True) if line.strip()][-1:]
      why = f": {lines[0]}" if lines else "; its last line above says why"
      then = "training goes on without it; the launch will exit 1" if job == "evaluator" else "stopping every task"
      _say(f"{task.label} refused its input (exit status {EXIT_REFUSED}{why}); not restarting it: {then}")
    else:
      _say(self.group.describe_exit(task))
      if self.restarts >= self.max_restarts and self.max_restarts:
        then = "training goes on without the evaluator" if job == "evaluator" else "stopping every task"
        _say(f"no restarts left (--max_restarts={self.max_restarts}); {then}")
    if refused or self.restarts >= self.max_restarts:
      if job == "evaluator":
        self.evaluator_failed = True
        return None
      return tasks_lib.exit_status(code) if job == "chief" or refused else 1
    self.restarts += 1
    progress = f"restart {self.restarts}/{self.max_restarts}"
    alone = job in ("worker", "evaluator")
    self.restart_log.append({"time": time.time(), "restart": self.restarts, "task": task.label,
                             "cause": f"{task.label} {tasks_lib.describe_returncode(code)}",
                             "restarted": task.label if alone else "ps, workers, chief"})
    if alone:
      _say(f"{progress}: restarting {task.label} alone, at {task.config.address or 'its place'}")
      self.group.restart([task], self.restarts)
    else:
      _say(f"{progress}: {task.label} failed; restarting the training cluster (ps, workers, chief) on the same "
           "ports; the chief resumes from its newest checkpoint")
      self.group.restart([t for t in self.group.tasks if t.name[0] in TRAINING_JOBS], self.restarts)
    return None

  def _wait_for_evaluator(self) -> int:
    """After the chief succeeded: gives a running evaluator time to finish; returns 1 if it failed."""
    evaluator = self.group.find(("evaluator", 0))
    if evaluator is None or evaluator.reported:
      return 0
    if evaluator.poll() is None:
      logging.info("chief finished; waiting up to %gs for the evaluator", self.evaluator_timeout_secs)
    code = evaluator.wait(self.evaluator_timeout_secs)
    evaluator.reported = True
    if code is None:
      _say(f"evaluator:0 did not finish within {self.evaluator_timeout_secs:g}s after the chief; stopping it")
      return 1
    if code != 0:
      _say(self.group.describe_exit(evaluator))
      return 1
    return 0
