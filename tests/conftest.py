"""Shared fixtures: one in-process cluster per test process (its servers cannot be stopped)."""

import atexit
import os
import pathlib
import sys

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
def info_log(caplog):
  """`caplog` holding tfps's INFO lines (absl's logger), whatever level an earlier test of the process left absl's
  logger at (absl sets it to WARNING when a parsed command line is unparsed)."""
  caplog.set_level("INFO")
  caplog.set_level("INFO", logger="absl")
  return caplog


@pytest.fixture
def shared_data():
  """`../shared/data` (MovieLens 100K, the Criteo sample); a skip where the checkout has none beside it, a failure
  under CI=true (`needs.require`)."""
  needs.require((SHARED_DATA / "criteo" / "criteo_sample.csv").is_file(),
                f"the shared data at {SHARED_DATA} (criteo/criteo_sample.csv, ml-100k/)")
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


_SESSION = []  # the session, once started: its exit status decides how the process ends


def pytest_sessionstart(session):
  """Keeps the session for `pytest_unconfigure`."""
  _SESSION.append(session)


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
  """Ends a process that imported TensorFlow once its tests are reported, without Python's teardown.

  Tearing such a process down collects TensorFlow's objects (coordinators, their cancelled functions, in-process
  servers that cannot be stopped) and joins TensorFlow's hundreds of threads: 1.5-2 CPU-s, but 18-50 s of wall at
  a load of 28-31 after tests/test_fit.py, 32 s after tests/test_models.py (1.8 s now); every pytest-xdist worker
  paid it once (xdist waits up to 10 s for a worker to end, then kills it). Output captured outside
  the tests is still written and the exit handlers (pytest's temporary-directory locks, logging) still run; what is
  skipped is Python's module teardown and pytest's last garbage collection, which only turns exceptions ignored in
  TensorFlow's `__del__` methods into warnings. An interrupted or failed session ends the usual way.
  """
  session = _SESSION[0] if _SESSION else None
  if "tensorflow" not in sys.modules or session is None or session.exitstatus not in (
      pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
    return
  capture = config.pluginmanager.getplugin("capturemanager")
  if capture is not None:
    capture.stop_global_capturing()
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(int(session.exitstatus))  # pylint: disable=protected-access


# The longest test files, longest first. Each was run alone (`/usr/bin/time pytest tests/<file> --durations=0`) on
# 2026-11-27, on 2 cores shared at a load average of 16-24: CPU seconds of pytest and its children, then wall seconds
# (2-7 times the CPU under that load). `scripts/test.sh` runs three files at a time in this order (pytest-xdist --dist
# loadfile --no-loadscope-reorder); xdist's own order (most tests first) started these last, and a long file started
# last keeps one process busy while the other has nothing left to run. The other files follow as collected.
LONGEST_FIRST = (
    "test_chaos.py",  # 307 s CPU, 474 s wall: seven tfps-launch runs with kills
    "test_online_processes.py",  # five tfps-launch runs on streams, three with kills
    "test_throughput_bench.py",  # 68, 464 (at load 30): one run of the bench, six variants
    "test_dynamic_embedding_chaos.py",  # 179, 409
    "test_many_hosts.py",  # 89, 335 (with the Keras run's worker cut at 30 s): network cuts of 15-20 s
    "test_transfers_bench.py",  # 35, 432 (at load 30)
    "test_dynamic_embedding_modes.py",  # 74, 444
    "test_dynamic_embedding_models.py",  # 63, 233
    "test_models.py",  # 63, 308
    "test_dynamic_embedding_retrieval.py",  # 49, 267
    "test_estimator_processes.py",  # 61, 159
    "test_isolation.py",  # 32, 224
    "test_quality_bench.py",  # 38, 97
)


def pytest_collection_modifyitems(items):
  """Orders the test files of LONGEST_FIRST first, in its order; a file's tests keep their order."""
  rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))
