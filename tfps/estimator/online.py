"""Online training on the Estimator path: a model_fn trained without end on a stream (`tfps.training.online`)."""

from typing import Callable, Optional

from absl import logging
import tensorflow as tf

from tfps import checks
from tfps.training import loop
from tfps.training import online
from tfps.training import stream_positions
from tfps.training import tables


def train_on_stream(estimator, make_batches: Callable, *, max_steps: Optional[int] = None,
                    checkpoint_every_secs: Optional[float] = None, stop=None,
                    after_checkpoint: Optional[Callable[[int], None]] = None) -> int:
  """Trains `estimator` (a `tfps.Estimator`, on the cluster) on a stream until SIGTERM (or `stop`, a
  `threading.Event`, is set; or the global step reaches `max_steps`), async (not pipelined), sync or geo; returns the
  final step.

  Every message is applied exactly once, across lost workers, ps and chief restarts: each checkpoint holds the
  stream position after the last example it holds, and a restarted chief reads on from the newest checkpoint's.

  Args:
    estimator: the `tfps.Estimator`; its `RunConfig` gives `save_checkpoints_steps`, `log_step_count_steps`,
      `steps_per_execution` and the training mode (async without pipelined updates, sync or geo).
    make_batches: `fn(positions) -> tfps.data.stream.batches.StreamBatches`, the stream's batches starting at
      `positions` (the newest checkpoint's, or None: the stream's own start).
    max_steps: stop when the global step reaches it (None: never).
    checkpoint_every_secs: a checkpoint at least this often while steps are trained (None: by steps alone).
    stop: an event that ends training (None: SIGTERM does).
    after_checkpoint: `fn(step)`, called after each checkpoint (e.g. an evaluation on the newest window).
  """
  checks.positive_int("max_steps", max_steps, allow_none=True)
  config = estimator.config
  online.check_mode(config.mode)
  batches = make_batches(stream_positions.newest_positions(estimator.model_dir))
  spec = batches.element_spec

  def placeholder_input_fn():  # a batch of zeros on each worker, only to trace the step that creates the variables
    return tf.data.Dataset.from_tensors(tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), spec)).repeat()

  model = estimator.distributed_model()
  manager = model.prepare(placeholder_input_fn)
  manager.begin()
  logging.info("Training on %s from step %d (%s)", batches.source.name, int(model.global_step.numpy()),
               config.mode.describe(model.cluster.num_workers))
  stream_loop = online.StreamLoop(
      batches=batches, checkpoint_every_secs=checkpoint_every_secs, runner=model.runner, checkpoint_manager=manager,
      config=loop.LoopConfig(log_every_steps=config.log_step_count_steps,
                             checkpoint_every_steps=config.save_checkpoints_steps),
      model_dir=estimator.model_dir, metrics=lambda: tables.table_metrics(model.model.variables.tables))
  step = online.run_until_stopped(stream_loop, max_steps, after_checkpoint, stop)
  if max_steps is not None and step >= max_steps:
    manager.finish()
  return step
