"""The sidecar evaluator's loop, one for both training paths, and the evaluation records it writes.

`follow_checkpoints` watches `model_dir/checkpoints` (a plain process: no cluster), evaluates each new checkpoint
(every one in order, or only the newest) with the path's own `evaluate(path) -> metrics`, and appends one record per
evaluation to `model_dir/<eval_dir_name>/metrics.jsonl`:

  {"checkpoint": path, "checkpoint_number": N, "step": optimizer steps, "metrics": {...}, "time": unix seconds}

A sidecar started again (its process restarted, or run again on a finished run) evaluates only checkpoints that
`metrics.jsonl` holds no record of (by name and step): a checkpoint is evaluated once, and its record written once.

It returns after the checkpoint the chief's FINAL marker names (`tfps.training.checkpoints`); when no new checkpoint
appears for `idle_timeout_secs` (default one hour; None waits forever) it raises `TimeoutError`: the one timeout
convention of both paths.
"""

import json
import os
import time
from typing import Callable, Dict, List, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from tfps import checks
from tfps.errors import IdleTimeoutError
from tfps.training import checkpoints as checkpoints_lib

METRICS_FILE = "metrics.jsonl"
DEFAULT_IDLE_TIMEOUT_SECS = 3600.0


def write_evaluation(eval_dir: str, checkpoint: Optional[str], step: int, metrics: Dict) -> dict:
  """Appends the record of one evaluation to `eval_dir/metrics.jsonl` and writes its scalar metrics to TensorBoard
  there (at `step`); returns the record."""
  tf.io.gfile.makedirs(eval_dir)
  entry = {"checkpoint": checkpoint,
           "checkpoint_number": checkpoints_lib.checkpoint_number(checkpoint) if checkpoint else None,
           "step": int(step), "metrics": metrics, "time": time.time()}
  with tf.io.gfile.GFile(os.path.join(eval_dir, METRICS_FILE), "a") as f:
    f.write(json.dumps(entry) + "\n")
  writer = tf.summary.create_file_writer(eval_dir)
  with writer.as_default(step=int(step)):
    for name, value in metrics.items():
      if np.ndim(value) == 0:
        tf.summary.scalar(name, float(value))
  writer.flush()
  return entry


def read_evaluations(model_dir: str, eval_dir_name: str = "eval") -> List[dict]:
  """The evaluation records written so far under `model_dir`, oldest first."""
  path = os.path.join(model_dir, eval_dir_name, METRICS_FILE)
  if not tf.io.gfile.exists(path):
    return []
  with tf.io.gfile.GFile(path) as records:
    return [json.loads(line) for line in records if line.strip()]


def _recorded(model_dir: str, eval_dir_name: str) -> set:
  """`(name, step)` of the checkpoints an earlier sidecar of this run evaluated, told in a log line (with the step:
  a run resumed with other epochs may write a checkpoint of another step under a name used before)."""
  names = {(os.path.basename(record["checkpoint"]), record.get("step"))
           for record in read_evaluations(model_dir, eval_dir_name) if record.get("checkpoint")}
  if names:
    logging.info("%s holds the evaluations of %d checkpoint(s) (of an earlier sidecar): not evaluated again (move "
                 "the file away to evaluate them again)", os.path.join(model_dir, eval_dir_name, METRICS_FILE),
                 len(names))
  return names


def _step_or_none(path: str) -> Optional[int]:
  try:
    return checkpoints_lib.checkpoint_step(path)
  except (tf.errors.OpError, ValueError):  # deleted meanwhile: `_evaluated` tells
    return None


def _gone(path: str) -> bool:
  return not tf.io.gfile.exists(path + ".index")


def follow_checkpoints(model_dir: str, evaluate: Callable[[str], Dict], *, eval_dir_name: str = "eval",
                       evaluate_every_checkpoint: bool = False, poll_secs: float = 1.0,
                       idle_timeout_secs: Optional[float] = DEFAULT_IDLE_TIMEOUT_SECS,
                       after_record: Optional[Callable[[dict], None]] = None) -> List[dict]:
  """Evaluates the checkpoints of `model_dir` as they appear until the final one; returns the records written.

  Args:
    model_dir: the training run's model_dir.
    evaluate: `evaluate(checkpoint_path) -> {metric: value}`; restores the checkpoint and evaluates it.
    eval_dir_name: the folder under `model_dir` that receives `metrics.jsonl` and the TensorBoard scalars.
    evaluate_every_checkpoint: evaluate every checkpoint in order, not only the newest.
    poll_secs: seconds between looks at `model_dir`.
    idle_timeout_secs: raise `IdleTimeoutError` (a `TimeoutError`) when no new checkpoint appears for this long
      (None: wait forever).
    after_record: called with each record (e.g. to keep the best checkpoint).

  A checkpoint deleted before it was read (the chief keeps only its newest few) is skipped with a warning; one that
  `metrics.jsonl` already has a record of (an earlier sidecar's) is not evaluated again.
  """
  checks.non_negative_number("poll_secs", poll_secs, "number of seconds")
  if idle_timeout_secs is not None:
    checks.non_negative_number("idle_timeout_secs", idle_timeout_secs, "number of seconds")
  eval_dir = os.path.join(model_dir, eval_dir_name)
  seen, records, last_new = set(), [], time.monotonic()
  before = _recorded(model_dir, eval_dir_name)
  if not checkpoints_lib.list_checkpoints(model_dir):
    logging.info("Waiting for a checkpoint in %s (up to %s)", checkpoints_lib.checkpoint_dir(model_dir),
                 "no end" if idle_timeout_secs is None else f"{idle_timeout_secs:g} s")
  while True:
    final = checkpoints_lib.read_final_marker(model_dir)  # read first: a checkpoint listed later is not missed
    pending = [path for path in checkpoints_lib.list_checkpoints(model_dir) if path not in seen]
    if pending:
      last_new = time.monotonic()
      seen.update(pending)
      pending = [path for path in pending if (os.path.basename(path), _step_or_none(path)) not in before]
      for path in pending if evaluate_every_checkpoint else pending[-1:]:
        record = _evaluated(path, evaluate, eval_dir)
        if record is not None:
          if after_record is not None:
            after_record(record)
          records.append(record)
    if _finished(final, seen):
      logging.info("Training finished; the sidecar evaluator evaluated %d checkpoint(s)", len(records))
      return records
    if idle_timeout_secs is not None and time.monotonic() - last_new > idle_timeout_secs:
      raise IdleTimeoutError(f"no new checkpoint in {model_dir} for {idle_timeout_secs:g}s; is training running?")
    time.sleep(poll_secs)


def _evaluated(path: str, evaluate: Callable[[str], Dict], eval_dir: str) -> Optional[dict]:
  """The record of checkpoint `path` evaluated (written to `eval_dir`), or None where it was deleted first."""
  try:
    step = checkpoints_lib.checkpoint_step(path)
    metrics = evaluate(path)
  except (tf.errors.OpError, ValueError) as e:
    if not _gone(path):
      raise
    logging.warning("Skipping checkpoint %s (deleted before it was read): %s", path, str(e).splitlines()[0])
    return None
  record = write_evaluation(eval_dir, path, step, metrics)
  logging.info("Evaluated %s (step %d): %s", path, step, _format(metrics))
  return record


def _finished(final: Optional[dict], seen) -> bool:
  """Whether the FINAL marker `final` names a checkpoint in `seen` (or none): by name, as the chief may spell
  model_dir otherwise (a relative path, another mount of the same storage)."""
  if final is None:
    return False
  last = final.get("last_checkpoint")
  return last is None or os.path.basename(last) in {os.path.basename(path) for path in seen}


def _format(metrics: Dict) -> str:
  return " | ".join(f"{name} {value:.4f}" if isinstance(value, float) else f"{name} {value}"
                    for name, value in sorted(metrics.items()))
