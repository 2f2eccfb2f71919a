"""Evaluation on a stream's held-out window: inline on the chief every N steps or T seconds, and by the sidecar.

A stream trained with a held-out share (`tfps.data.stream.holdout`) has, beside each checkpoint N, the window of
held-out messages current at it (`checkpoints/window-N.csv`, and what it is in `stream-N.json`;
`tfps.training.stream_positions`). Both evaluations restore checkpoint N into unsharded variables in their own
process and evaluate it on window N with the model_fn in EVAL mode (every message once): the inline one on the
chief after the checkpoints where one is due (it does not hold the workers), the sidecar on every checkpoint in turn.

Records: inline, one `window` record per evaluation in `run/progress.jsonl` (metrics, step, time, and the window: its
messages, the newest one and when it was written, the checkpoint's stream position) and TensorBoard scalars with
`model_dir/eval_window/metrics.jsonl`; the sidecar, `model_dir/eval/metrics.jsonl` as for file runs.
"""

import os
import time
from typing import Callable, Dict, List, Optional

from absl import logging
import tensorflow as tf

from tfps import checks
from tfps import run_records
from tfps.errors import UsageError
from tfps.estimator import evaluation
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import sidecar
from tfps.training import stream_positions

INLINE_DIR = "eval_window"  # inline evaluations' metrics.jsonl and TensorBoard scalars


class WindowEvaluator:
  """Evaluates checkpoints of `estimator` (a `tfps.Estimator`) on the held-out window beside each, in this process.

  Args:
    estimator: the stream run's estimator (its model_fn and model_dir).
    window_input_fn: `fn(path) -> input_fn` of a window file (`tfps.data.stream.holdout.window_input_fn`, or
      `StreamBatches.window_input_fn`).
    work_dir: where the window being evaluated is copied (default: `model_dir/eval_window`; one path, so one
      trace serves every window).
  """

  def __init__(self, estimator, window_input_fn: Callable[[str], Callable], *, work_dir: Optional[str] = None):
    self.model_dir = estimator.model_dir
    self._estimator, self._model = estimator, None  # the model made at the first evaluation (on a chief: after it
    # connected to the cluster, so that its variables are on the chief's own device)
    self._copy = os.path.join(work_dir or os.path.join(self.model_dir, INLINE_DIR), "window.csv")
    self._window_input_fn = window_input_fn
    self._evaluation = None

  def window_of(self, checkpoint: str) -> dict:
    """What the window of `checkpoint` is: its messages, the newest and its time, and the checkpoint's position."""
    record = stream_positions.read_record(self.model_dir, checkpoints_lib.checkpoint_number(checkpoint))
    if record is None or "window" not in record:
      raise UsageError(f"checkpoint {checkpoint} has no held-out window beside it: train on the stream with a "
                       "held-out share (--stream_holdout_every)")
    return {**record["window"], "positions": record["positions"]}

  def evaluate(self, checkpoint: str) -> Dict[str, float]:
    """The metrics of `checkpoint` on its window (`loss`, the model_fn's metrics, `examples`); `{"examples": 0}` where
    the window is still empty."""
    if not self.window_of(checkpoint)["messages"]:
      return {"examples": 0}
    tf.io.gfile.makedirs(os.path.dirname(self._copy))
    tf.io.gfile.copy(stream_positions.window_path(self.model_dir, checkpoints_lib.checkpoint_number(checkpoint)),
                     self._copy, overwrite=True)
    if self._evaluation is None:
      self._model = self._estimator.local_model()
      self._evaluation = self._model.evaluation(self._window_input_fn(self._copy), None)  # the copy exists now
    self._model.restore(checkpoint)
    return self._evaluation.run_locally()


class InlineWindowEvaluation:
  """The chief's evaluations on the newest window, every `every_steps` steps or `every_secs` seconds (whichever
  comes first; None: not by that), each after the checkpoint it asks for (`due`, then the call)."""

  def __init__(self, evaluator: WindowEvaluator, *, every_steps: Optional[int] = None,
               every_secs: Optional[float] = None):
    checks.positive_int("every_steps", every_steps, allow_none=True)
    if every_secs is not None:
      checks.non_negative_number("every_secs", every_secs, "number of seconds")
    self._evaluator, self._every_steps, self._every_secs = evaluator, every_steps, every_secs
    self._last_step, self._last_time = None, time.monotonic()

  def due(self, step: int) -> bool:
    """Whether an evaluation is due at `step` (the loop saves a checkpoint for it)."""
    if self._last_step == step:
      return False
    by_steps = self._every_steps is not None and step - (self._last_step or 0) >= self._every_steps
    by_time = self._every_secs is not None and time.monotonic() - self._last_time >= self._every_secs
    return by_steps or by_time

  def __call__(self, step: int) -> None:
    """After the checkpoint of `step`: evaluates it on its window when due, and records the result."""
    if not self.due(step):
      return
    self._last_step, self._last_time = step, time.monotonic()
    model_dir = self._evaluator.model_dir
    checkpoint = os.path.join(checkpoints_lib.checkpoint_dir(model_dir), f"ckpt-{step}")
    window = self._evaluator.window_of(checkpoint)
    metrics = self._evaluator.evaluate(checkpoint)
    if not metrics["examples"]:
      logging.info("Step %d: the held-out window is still empty; no evaluation", step)
      return
    evaluation.write_results(model_dir, INLINE_DIR, metrics, step, checkpoint)
    run_records.record_window(model_dir, step, metrics, window)
    logging.info("Step %d: on the held-out window (%d messages, newest %s): %s", step, window["messages"],
                 window["newest"], " | ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())
                                              if isinstance(v, float)))


def run_window_evaluator(estimator, window_input_fn: Callable[[str], Callable], *, poll_secs: float = 2.0,
                         idle_timeout_secs: Optional[float] = sidecar.DEFAULT_IDLE_TIMEOUT_SECS) -> List[dict]:
  """The sidecar evaluator of a stream run: evaluates every checkpoint of `estimator.model_dir`, in order, on the
  held-out window current at it, until the final one (a plain process; no cluster); records in
  `model_dir/eval/metrics.jsonl` (`tfps.training.sidecar`); `window_input_fn` as `WindowEvaluator` takes it.
  Returns the records."""
  evaluator = WindowEvaluator(estimator, window_input_fn, work_dir=os.path.join(estimator.model_dir, "eval"))
  return sidecar.follow_checkpoints(estimator.model_dir, evaluator.evaluate, evaluate_every_checkpoint=True,
                                    poll_secs=poll_secs, idle_timeout_secs=idle_timeout_secs)
