"""A test's missing need (tool, data, root, package) skips it with its reason outside CI and fails it under CI=true."""

import pathlib
import subprocess
import sys

import pytest

import needs

TESTS = pathlib.Path(__file__).resolve().parent


def test_a_missing_need_skips_outside_ci_and_fails_under_ci(monkeypatch):
  monkeypatch.delenv("CI", raising=False)
  needs.require(True, "nothing")  # met: no effect
  with pytest.raises(pytest.skip.Exception, match=r"^needs the moon \(ask NASA\)$"):
    needs.require(False, "the moon (ask NASA)")
  with pytest.raises(pytest.skip.Exception, match=r"^needs no_such_tool_x on PATH \(apt-get install x\)$"):
    needs.require_tools("sh", "no_such_tool_x", install="apt-get install x")
  monkeypatch.setenv("CI", "true")
  needs.require(True, "nothing")
  with pytest.raises(pytest.fail.Exception, match=r"^CI=true and this test needs the moon \(ask NASA\)$"):
    needs.require(False, "the moon (ask NASA)")
  with pytest.raises(pytest.fail.Exception, match=r"needs the Python package no_such_module_x \(pip install x\)$"):
    needs.require_module("no_such_module_x", "pip install x")
  assert needs.require_module("json", "-").dumps([]) == "[]"


def test_the_summary_names_a_skip_and_ci_fails_naming_what_is_missing(tmp_path):
  (tmp_path / "test_one.py").write_text(
      "import needs\n"
      "def test_it():\n  needs.require_module('no_such_module_x', 'pip install x')\n")
  (tmp_path / "test_two.py").write_text(
      "import needs\n"
      "def test_it():\n  needs.require(False, 'the moon')\n")
  command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)]

  def run(ci):
    env = {"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin", **({"CI": ci} if ci else {})}
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

  outside = run(None)
  assert outside.returncode == 0, outside.stdout
  assert "SKIPPED [1] test_one.py:3: needs the Python package no_such_module_x (pip install x)" in outside.stdout
  assert "SKIPPED [1] test_two.py:3: needs the moon" in outside.stdout
  under_ci = run("true")
  assert under_ci.returncode != 0
  assert "CI=true and this test needs the Python package no_such_module_x (pip install x)" in under_ci.stdout
  assert "CI=true and this test needs the moon" in under_ci.stdout and "skipped" not in under_ci.stdout
