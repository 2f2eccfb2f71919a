"""Shared fixtures: one in-process cluster per test process (its servers cannot be stopped)."""

import os
import pathlib

import pytest

import tfps  # sets TF_USE_LEGACY_KERAS before any test imports TensorFlow

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
NUM_WORKERS = 2
NUM_PS = 2


@pytest.fixture(scope="session")
def cluster():
  """The in-process cluster (2 workers, 2 ps) every in-process test shares."""
  return tfps.testing.local_cluster(num_workers=NUM_WORKERS, num_ps=NUM_PS)


@pytest.fixture
def shared_data():
  """`../shared/data`, or a skip where the checkout has no shared data beside it."""
  if not SHARED_DATA.is_dir():
    pytest.skip(f"no shared data at {SHARED_DATA}")
  return SHARED_DATA


def _subprocess_environ() -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  return env


@pytest.fixture
def subprocess_env():
  """Environment for tfps subprocesses started by tests."""
  return _subprocess_environ()


@pytest.fixture(scope="module")
def module_subprocess_env():
  """`subprocess_env` for a module-scoped fixture (a run several tests of a file share)."""
  return _subprocess_environ()


@pytest.fixture
def processes_naming():
  """`text -> [psutil.Process]`: live processes whose command line contains `text` (leftovers of a test's run)."""
  import psutil  # pylint: disable=g-import-not-at-top

  def find(text):
    found = []
    for process in psutil.process_iter(["cmdline"]):
      try:
        if any(text in part for part in process.info["cmdline"] or ()):
          found.append(process)
      except psutil.Error:
        continue
    return found

  return find

