"""Process environment tfps needs before TensorFlow is first imported."""

import os
import sys

from tfps.errors import KerasVersionError

_TRUE = ("1", "true", "True")
LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
USER_LOG_LEVEL = os.environ.get(LOG_LEVEL)  # as the user set it, before `prepare` sets tfps's default


def prepare() -> None:
  """Selects tf-keras (Keras 2) and gRPC fail-fast; refuses a TensorFlow already running Keras 3."""
  os.environ["GRPC_FAIL_FAST"] = "use_caller"  # else a dead worker is never reported to the coordinator
  os.environ.setdefault(LOG_LEVEL, "1")  # TensorFlow's C++ INFO lines drown the training log
  if os.environ.get("TF_USE_LEGACY_KERAS") in _TRUE:
    return
  os.environ["TF_USE_LEGACY_KERAS"] = "1"
  if "tensorflow" in sys.modules:
    keras_module = sys.modules["tensorflow"].keras.__name__
    if not keras_module.startswith("tf_keras"):
      raise KerasVersionError(
          f"TensorFlow was imported with Keras 3 ({keras_module}) active before tfps; Keras 3 has no ParameterServerStrategy "
          "support. Import tfps before tensorflow, or set TF_USE_LEGACY_KERAS=1 before starting Python")
