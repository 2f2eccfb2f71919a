"""tfps: recommender training on TensorFlow's ParameterServerStrategy.

Importing tfps selects tf-keras (`TF_USE_LEGACY_KERAS=1`) before TensorFlow is first imported. TensorFlow itself is
imported only when a name that needs it is first used, so the launcher and `tfps-config` start fast.
"""

import importlib

from tfps import _aliases
from tfps import _env

_env.prepare()
_aliases.install()  # moved modules' old paths (tfps.flags, tfps.cluster.launch, ...) for one release

from tfps.cluster import console as _console  # pylint: disable=g-import-not-at-top,wrong-import-position
_console.quiet_task_console(_env.USER_LOG_LEVEL)  # a task started on its own: the console tfps-launch gives its tasks

from tfps.cluster.config import ClusterConfig  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.errors import (ArgumentTypeError, CheckpointMismatchError, ClusterConfigError, KerasVersionError, TfpsError,  # pylint: disable=g-import-not-at-top,wrong-import-position
                         UnreachableTaskError, UsageError)
from tfps.cli.flags import (config_from_flags, define_flags, define_mode_flags, mode_from_flags,  # pylint: disable=g-import-not-at-top,wrong-import-position
                        server_options_from_flags, strategy_options_from_flags)
from tfps.training.modes import TrainingMode  # pylint: disable=g-import-not-at-top,wrong-import-position

__version__ = "0.1.0"

# name -> module that defines it; imported (with TensorFlow) on first use.
_LAZY = {
    "build_strategy": "tfps.training.strategy",
    "StrategyOptions": "tfps.cluster.options",
    "run_task": "tfps.cluster.roles",
    "run_main": "tfps.cli.flags",
    "resolve_cluster": "tfps.cluster.roles",
    "fit": "tfps.keras.fitting",
    "evaluate": "tfps.keras.fitting",
    "export_saved_model": "tfps.keras.export",
    "run_sidecar_evaluator": "tfps.keras.evaluation",
    "testing": None,
    "delta": None,
    "layers": None,
    "estimator": None,
    "Estimator": "tfps.estimator",
    "EstimatorSpec": "tfps.estimator",
    "EvalSpec": "tfps.estimator",
    "ModeKeys": "tfps.estimator",
    "RunConfig": "tfps.estimator",
    "TrainSpec": "tfps.estimator",
    "train_and_evaluate": "tfps.estimator",
}


def __getattr__(name):
  if name not in _LAZY:
    raise AttributeError(f"module 'tfps' has no attribute {name!r}")
  module_name = _LAZY[name]
  if module_name is None:
    return importlib.import_module(f"tfps.{name}")
  return getattr(importlib.import_module(module_name), name)
