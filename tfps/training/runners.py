"""The one place where the training mode is dispatched: each mode's runner, and `build_runner`.

A new mode is one file with a `tfps.training.steps.Runner` subclass, and one line in `RUNNERS` (its settings go in
`tfps.training.modes.TrainingMode`).
"""

from typing import Dict, Optional, Type

from tfps.training import modes
from tfps.training import steps as steps_lib
from tfps.training.asynchronous import AsyncRunner
from tfps.training.geo import GeoRunner
from tfps.training.sync import SyncRunner

RUNNERS: Dict[str, Type[steps_lib.Runner]] = {"async": AsyncRunner, "sync": SyncRunner, "geo": GeoRunner}


def runner_class(mode: modes.TrainingMode) -> Type[steps_lib.Runner]:
  """The Runner subclass of `mode`."""
  return RUNNERS[mode.sync_mode]


def check_settings(mode: modes.TrainingMode, steps_per_execution: Optional[int]) -> None:
  """Raises `UsageError` where `mode` cannot take a user's `steps_per_execution` (None: not given)."""
  runner_class(mode).check_settings(mode, steps_per_execution)


def build_runner(mode: modes.TrainingMode, step: steps_lib.Step, *, strategy, coordinator, num_workers: int,
                 steps_per_execution: int) -> steps_lib.Runner:
  """The runner driving `step` in `mode` on the cluster of `strategy` and `coordinator`.

  Args:
    mode: the training mode.
    step: what a step is (`tfps.keras.steps.keras_step`, or a model_fn model's `step`).
    strategy, coordinator: the cluster's.
    num_workers: the cluster's workers.
    steps_per_execution: the steps one scheduled function runs (async), or one `schedule` call runs (sync); geo runs
      `mode.geo_steps`. The runner's `steps_per_execution` says what it runs.
  """
  return runner_class(mode)(step, mode=mode, strategy=strategy, coordinator=coordinator, num_workers=num_workers,
                            steps_per_execution=steps_per_execution)
