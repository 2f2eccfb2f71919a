"""Test helpers for users' and tfps's own tests.

`tfps.testing.local_cluster` (an in-process cluster, `in_process`) imports TensorFlow on first use; `hosts` (test
hosts as network namespaces) does not. `applied_steps` counts on every ps the training steps applied there.
"""

import importlib

_LAZY = {"local_cluster": "tfps.testing.in_process", "IN_PROCESS_THREADS_PER_TASK": "tfps.testing.in_process"}


def __getattr__(name):
  if name not in _LAZY:
    raise AttributeError(f"module 'tfps.testing' has no attribute {name!r}")
  return getattr(importlib.import_module(_LAZY[name]), name)
