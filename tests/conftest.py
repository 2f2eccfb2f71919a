"""Shared fixtures: one in-process cluster per test process (its servers cannot be stopped)."""

import os
import pathlib

import pytest

import needs
import tfps  # sets TF_USE_LEGACY_KERAS before any test imports TensorFlow

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
NUM_WORKERS = 2
NUM_PS = 2


@pytest.fixture(scope="session")
def cluster():
  """The in-process cluster (2 workers, 2 ps) every in-process test shares."""
  return tfps.testing.local_cluster(num_workers=NUM_WORKERS, num_ps=NUM_PS)


@pytest.fixture(scope="session")
def kafka_broker():
  """The address of a one-broker mock Kafka cluster (librdkafka's, served on loopback by this process)."""
  import online_stream  # pylint: disable=g-import-not-at-top  (confluent-kafka, only where a test needs it)
  holder, bootstrap = online_stream.mock_cluster()
  yield bootstrap
  del holder


@pytest.fixture
def shared_data():
  """`../shared/data` (MovieLens 100K, the Criteo sample); a skip where the checkout has none beside it, a failure
  under CI=true (`needs.require`)."""
  needs.require((SHARED_DATA / "criteo" / "criteo_sample.csv").is_file(),
                f"the shared data at {SHARED_DATA} (criteo/criteo_sample.csv, ml-100k/)")
  return SHARED_DATA


@pytest.fixture
def subprocess_env():
  """Environment for tfps subprocesses started by tests."""
  env = dict(os.environ)
  env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  return env


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
