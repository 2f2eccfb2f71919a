"""Process environment tfps needs before TensorFlow is first imported."""

import os
import sys

from tfps.errors import KerasVersionError

_TRUE = ("1", "true", "True")
LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
_TFPS_LOG_LEVEL = "TFPS_DEFAULT_LOG_LEVEL"  # set beside tfps's default, so that child processes tell it from the user's
# TF_CPP_MIN_LOG_LEVEL as the user set it (None: unset, or tfps's default inherited from a parent tfps process)
USER_LOG_LEVEL = (None if os.environ.get(LOG_LEVEL) == os.environ.get(_TFPS_LOG_LEVEL) else os.environ.get(LOG_LEVEL))


GRPC_OPTIONS = "TF_GRPC_DEFAULT_OPTIONS"  # gRPC channel arguments TensorFlow reads once, at its first channel
# gRPC keepalive on every channel TensorFlow opens: an RPC in flight to a task whose host went silent (a cut link drops
# packets, nothing resets the connection) fails with UnavailableError after about time + timeout, instead of waiting
# forever; the coordinator then gives a worker's function to the other workers and waits for that worker to come back.
# `grpc.http2.max_pings_without_data` stays at gRPC's default (2): TensorFlow's servers take no channel arguments and
# answer a client that keeps pinging while they send nothing with GOAWAY "too_many_pings" (seen: a 10 s function with
# unlimited pings every 1 s failed; with the default a 27 s function ran clean).
# gRPC's minimum connect timeout (20 s by default) bounds how long after a silent host is back it is reached again:
# a connection attempt started while it was silent waits that long for an answer that never comes.
# gRPC's reconnect backoff grows 1.6x per failed attempt up to 120 s by default, so a worker back after a 30 s cut could
# wait ~15 s, after minutes up to 2 min, before the coordinator's channel tries it again; capped at 5 s (one connect
# attempt to a silent host every 5 s costs nothing).
GRPC_KEEPALIVE = (("grpc.keepalive_time_ms", 5000), ("grpc.keepalive_timeout_ms", 5000),
                  ("grpc.min_reconnect_backoff_ms", 2000), ("grpc.max_reconnect_backoff_ms", 5000))


def grpc_options(given: str) -> str:
  """`given` (TF_GRPC_DEFAULT_OPTIONS as set, `name=value,...`) plus tfps's settings for the names it leaves out."""
  names = {option.split("=", 1)[0].strip() for option in given.split(",") if option.strip()}
  ours = [f"{name}={value}" for name, value in GRPC_KEEPALIVE if name not in names]
  return ",".join([option for option in [given.strip(",")] if option] + ours)


def prepare() -> None:
  """Selects tf-keras (Keras 2), gRPC fail-fast and keepalive; refuses a TensorFlow already running Keras 3."""
  os.environ["GRPC_FAIL_FAST"] = "use_caller"  # else a dead worker is never reported to the coordinator
  os.environ[GRPC_OPTIONS] = grpc_options(os.environ.get(GRPC_OPTIONS, ""))
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

  Only whether, never a flag's value: library code takes its settings as arguments (`tfps.cli` reads flags).
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  return flags.FLAGS.is_parsed()
