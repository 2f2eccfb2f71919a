"""Bench scripts imported by tests for their functions (`bench_module("throughput")`).

Several bench scripts define a flag of the same name (`--out`), and a test process collects every test file, so two
of them may be imported into one process: a flag an earlier one defined is removed before the next is imported (the
tests call functions only, never read these flags).
"""

import importlib
import pathlib
import sys
import types

from absl import flags

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_NAMES = ("out",)


def bench_module(name: str) -> types.ModuleType:
  """`bench/<name>.py`, imported once per process."""
  if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
  qualified = f"bench.{name}"
  if qualified not in sys.modules:
    for flag in SHARED_NAMES:
      if flag in flags.FLAGS:
        delattr(flags.FLAGS, flag)
  return importlib.import_module(qualified)
