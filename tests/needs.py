"""What a test needs from the machine (a tool, data, root, a package), checked in one place.

Outside CI a missing need skips the test with its reason (`pytest -rs` lists them); with `CI=true` it fails the test,
naming what is missing: CI must provide everything the suite needs (`.ci/run`).
"""

import importlib
import os
import shutil

import pytest


def in_ci() -> bool:
  """Whether the suite runs under CI (`CI=true`, as CI services set it)."""
  return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require(condition: bool, what: str) -> None:
  """Skips the calling test unless `condition`, saying it needs `what`; under `CI=true` fails it instead."""
  __tracebackhide__ = True  # pylint: disable=unused-variable  (the report names the test's line, not this one)
  if condition:
    return
  if in_ci():
    pytest.fail(f"CI=true and this test needs {what}", pytrace=False)
  pytest.skip(f"needs {what}")


def require_root() -> None:
  """Root: test hosts are network namespaces with their own links and firewalls."""
  __tracebackhide__ = True  # pylint: disable=unused-variable
  require(os.geteuid() == 0, "root (test hosts are network namespaces)")


def require_tools(*names: str, install: str) -> None:
  """Programs on PATH; `install` says how to get them."""
  __tracebackhide__ = True  # pylint: disable=unused-variable
  missing = [name for name in names if shutil.which(name) is None]
  require(not missing, f"{', '.join(missing)} on PATH ({install})")


def require_module(name: str, install: str):
  """The module `name`, imported; `install` says how to get it."""
  __tracebackhide__ = True  # pylint: disable=unused-variable
  try:
    return importlib.import_module(name)
  except ImportError:
    return require(False, f"the Python package {name} ({install})")
