"""Process environment tfps needs before TensorFlow is first imported."""

import os
import sys

from tfps.errors import KerasVersionError

_TRUE = ("1", "true", "True")
LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
_TFPS_LOG_LEVEL = "TFPS_DEFAULT_LOG_LEVEL"  # set beside tfps's default, so that child processes tell it from the user's
# TF_CPP_MIN_LOG_LEVEL as the user set it (None: unset, or tfps's default inherited from a parent tfps process)
USER_LOG_LEVEL = (None if os.environ.get(LOG_LEVEL) == os.environ.get(_TFPS_LOG_LEVEL) else os.environ.get(LOG_LEVEL))


def prepare() -> None:
  """Selects tf-keras (Keras 2) and gRPC fail-fast; refuses a TensorFlow already running Keras 3."""
  os.environ["GRPC_FAIL_FAST"] = "use_caller"  # else a dead worker is never reported to the coordinator
  if LOG_LEVEL not in os.environ:  # TensorFlow's C++ INFO lines drown the training log
    os.environ[LOG_LEVEL] = os.environ[_TFPS_LOG_LEVEL] = "1"
  if os.environ.get("TF_USE_LEGACY_KERAS") in _TRUE:
    return
  os.environ["TF_USE_LEGACY_KERAS"] = "1"
  if "tensorflow" in sys.modules:
    keras_module = sys.modules["tensorflow"].keras.__name__
    if not keras_module.startswith("tf_keras"):
      raise KerasVersionError(
          f"TensorFlow was imported with Keras 3 ({keras_module}) active before tfps; Keras 3 has no ParameterServerStrategy "
          "support. Import tfps before tensorflow, or set TF_USE_LEGACY_KERAS=1 before starting Python")


def command_line_parsed() -> bool:
  """Whether absl parsed a command line in this process (a script under `absl.app`, not a notebook).

  Only whether, never a flag's value: library code takes its settings as arguments (`tfps.flags` reads flags).
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  return flags.FLAGS.is_parsed()
