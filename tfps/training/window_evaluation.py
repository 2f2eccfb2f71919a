"""Evaluation on a stream's held-out window, one for both training paths: inline on the chief every N steps or T
seconds, and by the sidecar.

A stream trained with a held-out share (`tfps.data.stream.holdout`) has, beside each checkpoint N, the window of
held-out messages current at it (`checkpoints/window-N.csv`, and what it is in `stream-N.json`;
`tfps.training.stream_positions`). Both evaluations read checkpoint N into unsharded variables in their own process
and evaluate it on window N, every message once, with the path's own evaluation (`make_evaluate`: the Estimator
path's model_fn in EVAL mode, `tfps.estimator.stream_evaluation`; the Keras model's `evaluate`,
`tfps.keras.stream_evaluation`): the inline one on the chief after the checkpoints where one is due (the workers go
on after it), the sidecar on every checkpoint in turn.

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
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import sidecar
from tfps.training import stream_positions

INLINE_DIR = "eval_window"  # inline evaluations' metrics.jsonl and TensorBoard scalars

# `fn(window_path) -> fn(checkpoint) -> metrics`: a path's evaluation of checkpoints on the window file at
# `window_path` (made once, at the first evaluation, when the file is there); the metrics hold `loss`, the model's
# own and `examples`, the messages evaluated
MakeEvaluate = Callable[[str], Callable[[str], Dict[str, float]]]


class WindowEvaluator:
  """Evaluates checkpoints of the stream run in `model_dir` on the held-out window beside each, in this process.

  Args:
    model_dir: the stream run's folder.
    make_evaluate: the path's evaluation (`MakeEvaluate`).
    work_dir: where the window being evaluated is copied (default: `model_dir/eval_window`; one path, so one
      trace serves every window).
  """

  def __init__(self, model_dir: str, make_evaluate: MakeEvaluate, *, work_dir: Optional[str] = None):
    self.model_dir = model_dir
    self._copy = os.path.join(work_dir or os.path.join(model_dir, INLINE_DIR), "window.csv")
    self._make_evaluate, self._evaluate = make_evaluate, None

  def window_of(self, checkpoint: str) -> dict:
    """What the window of `checkpoint` is: its messages, the newest and its time, and the checkpoint's position."""
    record = stream_positions.read_record(self.model_dir, checkpoints_lib.checkpoint_number(checkpoint))
    if record is None or "window" not in record:
      raise UsageError(f"checkpoint {checkpoint} has no held-out window beside it: train on the stream with a "
                       "held-out share (--stream_holdout_every)")
    return {**record["window"], "positions": record["positions"]}

  def evaluate(self, checkpoint: str) -> Dict[str, float]:
    """The metrics of `checkpoint` on its window (`loss`, the model's metrics, `examples`); `{"examples": 0}` where
    the window is still empty."""
    if not self.window_of(checkpoint)["messages"]:
      return {"examples": 0}
    tf.io.gfile.makedirs(os.path.dirname(self._copy))
    tf.io.gfile.copy(stream_positions.window_path(self.model_dir, checkpoints_lib.checkpoint_number(checkpoint)),
                     self._copy, overwrite=True)
    if self._evaluate is None:
      self._evaluate = self._make_evaluate(self._copy)  # the copy exists now
    return self._evaluate(checkpoint)


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
    sidecar.write_evaluation(os.path.join(model_dir, INLINE_DIR), checkpoint, step, metrics)
    run_records.record_window(model_dir, step, metrics, window)
    logging.info("Step %d: on the held-out window (%d messages, newest %s): %s", step, window["messages"],
                 window["newest"], " | ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items())
                                              if isinstance(v, float)))


def with_window_evaluation(batches, after_checkpoint: Optional[Callable[[int], None]], model_dir: str,
                           make_evaluate: MakeEvaluate, every_steps: Optional[int], every_secs: Optional[float]):
  """`(after_checkpoint, evaluation_due)` for the stream loop: `after_checkpoint` then the inline evaluation
  (`make_evaluate`'s) on the newest held-out window where one is asked for (`evaluation_due`: None where none is).
  Refused in one line (and `batches`' source closed) where `batches` holds nothing out."""
  if every_steps is None and every_secs is None:
    return after_checkpoint, None
  if batches.held_out is None:
    batches.source.close()
    raise UsageError("evaluating on the newest held-out window needs a held-out share of the stream "
                     "(--stream_holdout_every, or StreamBatches(held_out=HeldOut(...)))")
  inline = InlineWindowEvaluation(WindowEvaluator(model_dir, make_evaluate), every_steps=every_steps,
                                  every_secs=every_secs)

  def after(step: int) -> None:
    if after_checkpoint is not None:
      after_checkpoint(step)
    inline(step)

  return after, inline.due


def run_window_evaluator(model_dir: str, make_evaluate: MakeEvaluate, *, poll_secs: float = 2.0,
                         idle_timeout_secs: Optional[float] = sidecar.DEFAULT_IDLE_TIMEOUT_SECS) -> List[dict]:
  """The sidecar evaluator of a stream run: evaluates every checkpoint of `model_dir`, in order, on the held-out
  window current at it, until the final one (a plain process; no cluster); records in `model_dir/eval/metrics.jsonl`
  (`tfps.training.sidecar`). Returns the records."""
  evaluator = WindowEvaluator(model_dir, make_evaluate, work_dir=os.path.join(model_dir, "eval"))
  return sidecar.follow_checkpoints(model_dir, evaluator.evaluate, evaluate_every_checkpoint=True,
                                    poll_secs=poll_secs, idle_timeout_secs=idle_timeout_secs)
