"""Online training on the Estimator path: a model_fn trained without end on a stream (`tfps.training.online`)."""

from typing import Callable, Optional

from absl import logging
import tensorflow as tf

from tfps import checks
from tfps.estimator import stream_evaluation
from tfps.training import dataset_fns
from tfps.training import loop
from tfps.training import online
from tfps.training import tables
from tfps.training import window_evaluation


def train_on_stream(estimator, make_batches: Callable, *, max_steps: Optional[int] = None,
                    checkpoint_every_secs: Optional[float] = None, stop=None,
                    after_checkpoint: Optional[Callable[[int], None]] = None,
                    evaluate_every_steps: Optional[int] = None, evaluate_every_secs: Optional[float] = None,
                    eval_batch_size: int = 1024) -> int:
  """Trains `estimator` (a `tfps.Estimator`, on the cluster) on a stream until SIGTERM (or `stop`, a
  `threading.Event`, is set; or the global step reaches `max_steps`), async (not pipelined), sync or geo; returns the
  final step.

  Every message is applied exactly once, across lost workers, ps and chief restarts: each checkpoint holds the
  stream position after its last example; a restarted chief reads on from the newest checkpoint's.

  Args:
    estimator: the `tfps.Estimator`; its `RunConfig` gives `save_checkpoints_steps`, `log_step_count_steps`,
      `steps_per_execution`, the training mode (async without pipelined updates, sync or geo), `delta_export_secs` (deltas name their examples' positions).
    make_batches: `fn(positions) -> tfps.data.stream.batches.StreamBatches`, the stream's batches starting at
      `positions` (the newest checkpoint's, or None: the stream's own start).
    max_steps: stop when the global step reaches it (None: never).
    checkpoint_every_secs: a checkpoint at least this often while steps are trained (None: by steps alone).
    stop, after_checkpoint: an event that ends training (None: SIGTERM does); `fn(step)` called after checkpoints.
    evaluate_every_steps, evaluate_every_secs, eval_batch_size: evaluate the newest checkpoint on the newest held-out
      window (`StreamBatches(held_out=...)`) this often, in batches of `eval_batch_size` (`stream_evaluation`).
  """
  checks.positive_int("max_steps", max_steps, allow_none=True)
  config = estimator.config
  online.check_mode(config.mode)
  batches = online.open_batches(make_batches, estimator.model_dir)
  after_checkpoint, evaluation_due = window_evaluation.with_window_evaluation(
      batches, after_checkpoint, estimator.model_dir,
      stream_evaluation.window_evaluation_of(estimator, batches.window_input_fn(eval_batch_size)),
      evaluate_every_steps, evaluate_every_secs)

  def placeholder_input_fn():  # a batch of zeros on each worker, only to trace the step that creates the variables
    return tf.data.Dataset.from_tensors(tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype),
                                                              batches.element_spec)).repeat()

  model = estimator.distributed_model()
  (manager := model.prepare(placeholder_input_fn)).begin()
  logging.info("Training on %s from step %d (%s)", batches.source.name, int(model.global_step.numpy()),
               config.mode.describe(model.cluster.num_workers, dataset_fns.static_batch_size(batches.element_spec)))
  stream_loop = online.StreamLoop(
      batches=batches, checkpoint_every_secs=checkpoint_every_secs, evaluation_due=evaluation_due,
      runner=model.runner, checkpoint_manager=manager,
      config=loop.LoopConfig(log_every_steps=config.log_step_count_steps,
                             checkpoint_every_steps=config.save_checkpoints_steps),
      model_dir=estimator.model_dir, metrics=lambda: tables.table_metrics(model.model.variables.tables),
      deltas=model.deltas)
  return online.run_until_stopped(stream_loop, max_steps, after_checkpoint, stop)
