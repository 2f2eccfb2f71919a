"""A pytest process that imported TensorFlow ends without Python's teardown (tests/conftest.py), keeping its exit
status, its output and its exit handlers; one that did not ends the usual way."""

import pathlib
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent

# Stands in for TensorFlow (the conftest looks for the module's name only) so that the child costs no TensorFlow start;
# an object torn down with the module says so, as does an exit handler.
_CHILD = """
import atexit, os, sys, types
if os.environ.get("FAKE_TENSORFLOW"):
  sys.modules.setdefault("tensorflow", types.ModuleType("tensorflow"))
atexit.register(os.write, 1, b"exit handlers ran\\n")

class Teardown:
  def __init__(self):
    self.write = os.write
  def __del__(self):
    self.write(1, b"module teardown ran\\n")

TORN_DOWN_WITH_THE_MODULE = Teardown()

def test_passes(tmp_path):
  assert tmp_path.is_dir()

def test_fails():
  assert 1 == 2
"""


def _run(tmp_path, *args, fake_tensorflow):
  env = {"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin", **({"FAKE_TENSORFLOW": "1"} if fake_tensorflow else {})}
  command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
             f"--basetemp={tmp_path / 'base'}", *args, str(tmp_path / "test_child.py")]
  return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_process_with_tensorflow_skips_the_teardown_and_keeps_its_status_output_and_exit_handlers(tmp_path):
  (tmp_path / "test_child.py").write_text(_CHILD)
  failed = _run(tmp_path, fake_tensorflow=True)
  assert failed.returncode == 1, failed.stdout + failed.stderr
  assert "1 failed, 1 passed" in failed.stdout and "exit handlers ran" in failed.stdout
  assert "module teardown ran" not in failed.stdout
  passed = _run(tmp_path, "-k", "passes", fake_tensorflow=True)
  assert passed.returncode == 0 and "1 passed" in passed.stdout, passed.stdout + passed.stderr
  assert "module teardown ran" not in passed.stdout
  usual = _run(tmp_path, fake_tensorflow=False)  # without TensorFlow: the usual teardown
  assert usual.returncode == 1 and "module teardown ran" in usual.stdout, usual.stdout + usual.stderr
