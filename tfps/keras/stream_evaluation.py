"""Evaluation of a Keras stream run on its held-out windows, inline on the chief and by the sidecar: the Keras path's
evaluation (`window_evaluation`) for `tfps.training.window_evaluation`, which picks the checkpoints and windows and
writes the records, as on the Estimator path.

Each checkpoint is read into an unsharded copy of the model (`build_model()` without a strategy, as the Keras
sidecar of file runs reads it: `tfps.keras.evaluation.run_sidecar_evaluator`) and evaluated on the window with the
model's `evaluate`. On the chief, whose training runs under the strategy's scope, the copy is made and evaluated
outside it (`tfps.keras.export.outside_strategies`): its variables stay in the chief's process, off the ps.
"""

from typing import Callable, Dict, List, Optional

import tensorflow as tf
import tf_keras

from tfps.keras import evaluation
from tfps.keras import export
from tfps.training import sidecar
from tfps.training import window_evaluation


def window_evaluation_of(build_model: Callable[[], tf_keras.Model],
                         window_input_fn: Callable[[str], Callable]) -> window_evaluation.MakeEvaluate:
  """The Keras path's `MakeEvaluate`: `build_model()`'s copy, each checkpoint read into it and evaluated on the
  window (`loss` and the compiled metrics, and `examples`: the window's examples, counted as they are read);
  `window_input_fn` is `fn(path) -> dataset_fn` of a window file (`StreamBatches.window_input_fn`)."""

  def make(path: str):
    dataset = window_input_fn(path)(tf.distribute.InputContext())
    model = export.outside_strategies(build_model)
    export.outside_strategies(lambda: evaluation.ensure_built(model, dataset))
    checkpoint = tf.train.Checkpoint(model=model)

    def evaluate(checkpoint_path: str) -> Dict[str, float]:
      checkpoint.read(checkpoint_path).expect_partial()
      logs = export.outside_strategies(lambda: model.evaluate(dataset, return_dict=True, verbose=0))
      examples = dataset.reduce(tf.constant(0, tf.int64), lambda n, batch: n + tf.shape(batch[1], tf.int64)[0])
      return {**evaluation.to_floats(logs), "examples": int(examples)}

    return evaluate

  return make


def run_window_evaluator(build_model: Callable[[], tf_keras.Model], window_input_fn: Callable[[str], Callable],
                         model_dir: str, *, poll_secs: float = 2.0,
                         idle_timeout_secs: Optional[float] = sidecar.DEFAULT_IDLE_TIMEOUT_SECS) -> List[dict]:
  """The sidecar evaluator of a Keras stream run in `model_dir` (`window_evaluation.run_window_evaluator`): every
  checkpoint in turn on the held-out window current at it, until the final one. Returns the records."""
  return window_evaluation.run_window_evaluator(model_dir, window_evaluation_of(build_model, window_input_fn),
                                                poll_secs=poll_secs, idle_timeout_secs=idle_timeout_secs)
