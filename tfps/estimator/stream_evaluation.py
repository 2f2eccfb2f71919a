"""Evaluation of an Estimator-path stream run on its held-out windows, inline on the chief and by the sidecar: the
Estimator path's evaluation (`window_evaluation_of`) for `tfps.training.window_evaluation`, which picks the
checkpoints and windows and writes the records, as on the Keras path.

Each checkpoint is restored into unsharded variables in this process (`Estimator.local_model`, made at the first
evaluation: on a chief, after it connected to the cluster, so that its variables are on the chief's own device) and
evaluated on the window with the model_fn in EVAL mode, every message once.
"""

from typing import Callable, List, Optional

from tfps.training import sidecar
from tfps.training import window_evaluation


def window_evaluation_of(estimator, window_input_fn: Callable[[str], Callable]) -> window_evaluation.MakeEvaluate:
  """The Estimator path's `MakeEvaluate` for `estimator` (a `tfps.Estimator`): `window_input_fn` is
  `fn(path) -> input_fn` of a window file (`tfps.data.stream.holdout.window_input_fn`, or
  `StreamBatches.window_input_fn`)."""

  def make(path: str):
    model = estimator.local_model()
    evaluation = model.evaluation(window_input_fn(path), None)

    def evaluate(checkpoint: str):
      model.restore(checkpoint)
      return evaluation.run_locally()

    return evaluate

  return make


def run_window_evaluator(estimator, window_input_fn: Callable[[str], Callable], *, poll_secs: float = 2.0,
                         idle_timeout_secs: Optional[float] = sidecar.DEFAULT_IDLE_TIMEOUT_SECS) -> List[dict]:
  """The sidecar evaluator of a stream run on the Estimator path (`window_evaluation.run_window_evaluator`): every
  checkpoint of `estimator.model_dir` in turn on the held-out window current at it, until the final one. Returns the
  records."""
  return window_evaluation.run_window_evaluator(estimator.model_dir, window_evaluation_of(estimator, window_input_fn),
                                                poll_secs=poll_secs, idle_timeout_secs=idle_timeout_secs)
