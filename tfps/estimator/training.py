"""`train_and_evaluate` for the chief, and the sidecar evaluator that follows a training run's checkpoints."""

import time
from typing import Dict, List, Optional

from absl import logging

from tfps import run_records
from tfps.errors import ArgumentTypeError
from tfps.training import sidecar
from tfps.estimator import evaluation
from tfps.estimator.estimator import Estimator
from tfps.estimator.spec import EvalSpec, TrainSpec


def _check_args(estimator, train_spec, eval_spec) -> None:
  for name, value, kind in (("estimator", estimator, Estimator), ("train_spec", train_spec, TrainSpec),
                            ("eval_spec", eval_spec, EvalSpec)):
    if not isinstance(value, kind):
      raise ArgumentTypeError(f"`{name}` must be a tfps.{kind.__name__}, got {type(value).__name__}")


def train_and_evaluate(estimator: Estimator, train_spec: TrainSpec, eval_spec: EvalSpec) -> Optional[dict]:
  """Trains `estimator` on the cluster and evaluates it, as `tf.estimator.train_and_evaluate` did.

  Run on the chief. With inline evaluation (`eval_spec.inline`, default: unless the cluster lists an evaluator), the
  chief evaluates on the workers after a checkpoint when `throttle_secs` have passed since the last evaluation, and
  once more at the end; results go to `model_dir/eval/metrics.jsonl`. Otherwise a sidecar evaluator
  (`run_evaluator`) evaluates the checkpoints.

  Returns:
    The last inline evaluation's metrics, or None without inline evaluation.
  """
  _check_args(estimator, train_spec, eval_spec)
  model = estimator.distributed_model()
  inline = eval_spec.inline
  if inline is None:
    inline = not model.cluster.evaluator_hosts
  if not inline:
    model.train(train_spec.input_fn, max_steps=train_spec.max_steps)
    return None
  state = {"last_time": None, "last_step": None, "results": None}

  def evaluate(step: int) -> None:
    now = time.monotonic()
    if state["last_time"] is not None and now - state["last_time"] < eval_spec.throttle_secs:
      return
    state["results"] = _evaluate_inline(estimator, model, eval_spec)
    state["last_time"], state["last_step"] = time.monotonic(), step

  model.train(train_spec.input_fn, max_steps=train_spec.max_steps, after_checkpoint=evaluate)
  if state["last_step"] != int(model.global_step.numpy()):
    state["results"] = _evaluate_inline(estimator, model, eval_spec)
  return state["results"]


def _evaluate_inline(estimator: Estimator, model, eval_spec: EvalSpec) -> dict:
  results = model.evaluate(eval_spec.input_fn, eval_spec.steps)
  checkpoint = estimator.latest_checkpoint()
  evaluation.write_results(estimator.model_dir, eval_spec.eval_dir_name, results, results["global_step"], checkpoint)
  logging.info("Evaluation at step %d: %s", results["global_step"], _format(results))
  metrics = {name: value for name, value in results.items() if name != "global_step"}
  run_records.record_validation(estimator.model_dir, results["global_step"], metrics)
  run_records.update_summary(estimator.model_dir, {run_records.VALIDATION_PREFIX + k: v for k, v in metrics.items()})
  return results


def _format(results: dict) -> str:
  return ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(results.items()))


def run_evaluator(estimator: Estimator, eval_spec: EvalSpec, poll_secs: float = 2.0,
                  timeout_secs: Optional[float] = sidecar.DEFAULT_IDLE_TIMEOUT_SECS) -> List[Dict[str, object]]:
  """Evaluates the newest checkpoint in `model_dir` as they appear, until the final one (a plain process; no cluster).

  Each checkpoint is restored into unsharded variables and evaluated with the model_fn in EVAL mode, every batch
  exactly once. The loop and the records (`model_dir/eval[_<name>]/metrics.jsonl`: checkpoint, checkpoint_number,
  step, metrics, time; and TensorBoard) are `tfps.training.sidecar`'s, shared with the Keras path. Returns the records
  after evaluating the checkpoint the chief's final marker names; raises `TimeoutError` when no new checkpoint came
  for `timeout_secs` (None: waits forever).
  """
  if not isinstance(eval_spec, EvalSpec):
    raise ArgumentTypeError(f"`eval_spec` must be a tfps.EvalSpec, got {type(eval_spec).__name__}")
  time.sleep(eval_spec.start_delay_secs)
  model = estimator.local_model()
  runs = []

  def evaluate(path: str) -> dict:
    if not runs:
      runs.append(model.evaluation(eval_spec.input_fn, eval_spec.steps))
    model.restore(path)
    return runs[0].run_locally()

  return sidecar.follow_checkpoints(estimator.model_dir, evaluate, eval_dir_name=eval_spec.eval_dir_name,
                                    poll_secs=poll_secs, idle_timeout_secs=timeout_secs)
