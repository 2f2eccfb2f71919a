"""tfps.run_task: the one role dispatch of scripts; it reads no flags (the cluster is an argument, else TF_CONFIG)."""

import json
import subprocess
import sys

import pytest

from tfps import ClusterConfig
from tfps.cluster import roles
from tfps.errors import ClusterConfigError

CLUSTER = ClusterConfig(ps_hosts=("127.0.0.1:1",), worker_hosts=("127.0.0.1:2",), evaluator_hosts=("127.0.0.1:3",))


def test_the_chief_and_the_evaluator_get_their_function(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  assert roles.run_task(lambda c: ("chief", c), lambda c: ("eval", c), cluster=CLUSTER) == ("chief", CLUSTER)
  evaluator = CLUSTER.for_task("evaluator")
  assert roles.run_task(lambda c: "chief", lambda c: ("eval", c), cluster=evaluator) == ("eval", evaluator)


def test_the_cluster_defaults_to_tf_config_never_to_flags(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                                              "task": {"type": "evaluator", "index": 0}}))
  assert roles.run_task(lambda c: "chief", lambda c: c.task_type) == "evaluator"
  monkeypatch.delenv("TF_CONFIG")
  with pytest.raises(ClusterConfigError, match="no cluster given: pass cluster="):
    roles.run_task(lambda c: "chief")


def test_an_evaluation_only_script_runs_without_a_cluster(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  assert roles.run_task(evaluator_fn=lambda c: ("standalone", c)) == ("standalone", None)


@pytest.mark.parametrize("task,kwargs,message", [
    ("evaluator", {"chief_fn": lambda c: 0}, "this task is an evaluator but the script gives no evaluation to run"),
    ("chief", {"evaluator_fn": lambda c: 0}, "this task is the chief but the script gives no training to run"),
])
def test_a_missing_role_function_is_named(task, kwargs, message):
  with pytest.raises(ClusterConfigError, match=message):
    roles.run_task(cluster=CLUSTER.for_task(task), **kwargs)


@pytest.mark.parametrize("kwargs,expected", [
    ({}, (False, None, 600.0, 60.0)),
    ({"thread_spinning": True, "model_dir": "/shared/run", "lost_chief_timeout_secs": 20, "connect_timeout_secs": 5},
     (True, "/shared/run", 20, 5))])
def test_a_server_task_gets_the_thread_spinning_setting_and_what_ends_it(monkeypatch, kwargs, expected):
  from tfps.cluster import server  # pylint: disable=g-import-not-at-top
  served = []
  monkeypatch.setattr(server, "run_server", lambda config, *args, resolve_timeout_secs: served.append(
      (config, *args, resolve_timeout_secs)))
  ps = CLUSTER.for_task("ps")
  roles.run_task(lambda c: "chief", cluster=ps, **kwargs)  # the stand-in returns; a real server never does
  assert served[0] == (ps, *expected)  # the last: how long it waits for its own name to resolve
  spinning = expected[0]
  assert server.server_config(spinning).experimental.disable_thread_spinning is not spinning


def test_a_negative_lost_chief_timeout_is_refused():
  with pytest.raises(ValueError, match=r"`lost_chief_timeout_secs` \(-1\) must be a non-negative number of seconds"):
    roles.run_task(lambda c: "chief", cluster=CLUSTER.for_task("ps"), lost_chief_timeout_secs=-1)


_LAST_LINE = """
import os, sys
from tfps.errors import last_line_on_stderr
print("an earlier line", file=sys.stderr, flush=True)
os.write(2, b"an unfinished line")
last_line_on_stderr("train.py: the line that says why")
os.write(2, b"a TensorFlow thread's later line\\n")
print("a later Python line", file=sys.stderr, flush=True)
os._exit(3)
"""


def test_the_line_a_task_exits_with_stays_the_last_on_stderr(subprocess_env):
  """A lost task ends the chief with one line naming it (`errors.exit_now`); TensorFlow's threads go on writing gRPC
  errors to stderr until the process is gone: one once came after that line in a test's log, and another thread's
  unfinished line once began it. The line is on a line of its own, and nothing written to stderr after it shows."""
  result = subprocess.run([sys.executable, "-c", _LAST_LINE], env=subprocess_env, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 3, result.stderr[-2000:]
  lines = [line for line in result.stderr.splitlines() if line]
  assert lines == ["an earlier line", "an unfinished line", "train.py: the line that says why"], result.stderr
