"""The chief's side of a training run, one for both paths (`tfps.fit` and the Estimator path).

`connect` builds the strategy for the cluster and the mode; the returned `Chief` creates every variable and optimizer
slot and binds the table layers to the optimizer (`create_variables`), resumes a run in `model_dir` (`resume`: from its
newest checkpoint, on any number of ps and shards; `finished_run`: a run that already ended) and builds the mode's
runner (`build_runner`). What a step is, and how the variables are first made, stays with each path.
"""

import dataclasses
import os
from typing import Callable, Iterable, Optional, Tuple

import tensorflow as tf

from tfps.cluster import config as cluster_lib
from tfps.cluster import options as options_lib
from tfps.errors import UsageError
from tfps.training import checkpoints
from tfps.training import modes
from tfps.training import resharding
from tfps.training import runners
from tfps.training import steps as steps_lib
from tfps.training import strategy as strategy_lib

@dataclasses.dataclass(frozen=True)
class Chief:
  """The strategy and coordinator of a cluster, seen from its chief, and the training mode; see `connect`."""

  cluster: cluster_lib.ClusterConfig
  mode: modes.TrainingMode
  strategy: tf.distribute.experimental.ParameterServerStrategy
  coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator

  @property
  def num_workers(self) -> int:
    return self.cluster.num_workers

  def create_variables(self, create: Callable[[], Tuple[object, Iterable]]) -> None:
    """Runs `create()`, which makes every variable (the model's and its optimizer's, sharded over the ps) and returns
    `(optimizer, table layers)`; binds each table layer to the optimizer (admissions reset the slot rows of the rows
    they give out)."""
    optimizer, tables = create()
    with self.strategy.scope():
      for table in tables:
        table.bind_optimizer(optimizer)

  def restore(self, path: str, root) -> None:
    """Restores checkpoint `path` into `root`, checked against it first; any number of ps and shards either side.
    A checkpoint whose files are missing or damaged raises `UsageError` (one line: a restart would fail alike)."""
    with self.strategy.scope():
      try:
        resharding.restore(path, root)
      except (tf.errors.NotFoundError, tf.errors.DataLossError, tf.errors.OutOfRangeError) as e:
        reason = e.message.splitlines()[0][:160]
        state = os.path.join(os.path.dirname(path), "checkpoint")
        raise UsageError(f"checkpoint {path} cannot be read ({reason}): its files are missing or damaged; to go on "
                         f"from the one before, delete its all_model_checkpoint_paths line in {state} and point "
                         "model_checkpoint_path there at the one before") from None

  def resume(self, model_dir: Optional[str], root) -> Optional[str]:
    """Where a run in `model_dir` goes on from: returns the checkpoint restored into `root` (the newest: a chief
    started again, a finished run given more steps, a run moved to another cluster), or None. A checkpoint that does
    not fit raises `CheckpointMismatchError` before any step.
    """
    if not model_dir:
      return None
    saved = checkpoints.list_checkpoints(model_dir)
    if not saved:
      return None
    self.restore(saved[-1], root)
    return saved[-1]

  def build_runner(self, step: steps_lib.Step, steps_per_execution: int) -> steps_lib.Runner:
    """The mode's runner (`runners.build_runner`) of `step`, built under the strategy's scope."""
    with self.strategy.scope():
      return runners.build_runner(self.mode, step, strategy=self.strategy, coordinator=self.coordinator,
                                  num_workers=self.num_workers, steps_per_execution=steps_per_execution)


def connect(cluster: cluster_lib.ClusterConfig, mode: modes.TrainingMode,
            options: options_lib.StrategyOptions) -> Chief:
  """Builds the strategy of `cluster` (its task is the chief) with `options`, for training in `mode`."""
  mode.replicas(cluster.num_workers)  # fails early on more replicas than workers
  strategy, coordinator = strategy_lib.build_strategy(cluster, options)
  return Chief(cluster, mode, strategy, coordinator)


def finished_run(model_dir: Optional[str], total_steps: int) -> Optional[dict]:
  """The FINAL marker of a run in `model_dir` that already trained `total_steps` steps (None: train).

  This is what a chief restarted after training ended (its ps died while it was exiting) finds: training is not
  repeated, as an Estimator does not train past `max_steps` again.
  """
  if not model_dir:
    return None
  marker = checkpoints.read_final_marker(model_dir)
  if marker is None or marker.get("step", -1) < total_steps or not marker.get("last_checkpoint"):
    return None
  return marker
