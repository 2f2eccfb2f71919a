"""The launcher's console: TensorFlow's noise stays in the task logs unless --verbose or TF_CPP_MIN_LOG_LEVEL is
given; the end-of-run summary names the restarts and their causes."""

import gc
import json
import os
import pathlib
import subprocess
import sys

import pytest

from marked_processes import MARK, kill_marked
from tfps.cluster import console

REPO = pathlib.Path(__file__).resolve().parents[1]
NOISY_TASK = REPO / "tests" / "fixtures" / "noisy_task.py"
FAKE_TASK = REPO / "tests" / "fixtures" / "fake_task.py"

# Lines as a chief printed them on this machine (TF 2.21, no GPU).
NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795442766.519647    6115 port.cc:153] oneDNN custom operations are on. You may see slightly",
    "I0000 00:00:1795442766.520317    6115 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
    "not be used.",
    "E0000 00:00:1795442775.906318    6115 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed "
    "call to cuInit: UNKNOWN ERROR (303)",
    "I1123 14:06:36.239156 140630091651968 functional_saver.py:440] Sharding callback duration: 104 microseconds",
    "WARNING:tensorflow:5 out of the last 5 calls to <function MultiDeviceSaver.save.<locals>.tf_function_save at "
    "0x7f4a36e00a40> triggered tf.function retracing. Tracing is expensive",
    "/x/dataset_ops.py:463: UserWarning: To make it possible to preserve tf.data options across serialization "
    "boundaries, their implementation has moved",
    '  warnings.warn("To make it possible to preserve tf.data options across "',
]
SESSION_DUMP = ["I1123 14:06:16.018245 140630091651968 remote.py:225] default session config: device_count {",
                '  key: "GPU"', "  value: 0", "}", "allow_soft_placement: true", "", ]
KEPT = [
    "I1123 14:06:16.252583 140630091651968 strategy.py:106] Connected to chief:0 of 1 chief, 2 worker, 1 ps",
    "I1123 14:06:35.854554 140630091651968 callbacks.py:63] epoch 1/2 done | loss 0.5804 | auc 0.5599",
    "W1123 14:06:35.854554 140630091651968 fitting.py:63] a real warning of tfps",
    "WARNING:tensorflow:5 out of the last 5 calls to <function train_step at 0x7f4a36e00a40> triggered tf.function "
    "retracing.",  # the user's function: a real warning
    "E1123 14:06:35.854554 140630091651968 cluster.cc:63] a real C++ error",
    "Traceback (most recent call last):",
]


def kept(lines, quiet=True):
  line_filter = console.ConsoleFilter(quiet=quiet)
  return [line for line in lines if line_filter.keep(line.encode() + b"\n")]


def test_filter_drops_tensorflow_noise_and_keeps_tfps_lines_and_real_warnings():
  assert kept(NOISE) == []
  assert kept(SESSION_DUMP + KEPT) == KEPT  # the dump ends at its empty line
  assert kept(NOISE + SESSION_DUMP + KEPT, quiet=False) == NOISE + SESSION_DUMP + KEPT


def launch(tmp_path, *args, script, script_args=(), env):
  command = [sys.executable, "-m", "tfps.cluster.launch", f"--log_dir={tmp_path / 'logs'}", "--num_workers=1", *args,
             str(script), "--", *script_args]
  return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture
def quiet_env(tmp_path):
  """Our environment without a TF_CPP_MIN_LOG_LEVEL of the user's; leftover tasks are killed at the end."""
  env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
  env[MARK] = str(tmp_path)
  yield env
  kill_marked(tmp_path)


def noise_of(text):
  return [line for line in text.splitlines() if not console.ConsoleFilter().keep(line.encode() + b"\n")]


@pytest.mark.slow
def test_console_is_quiet_by_default_and_verbose_or_a_user_log_level_shows_all(tmp_path, quiet_env):
  quiet = launch(tmp_path, script=NOISY_TASK, env=quiet_env)
  assert quiet.returncode == 0, quiet.stderr
  log = (tmp_path / "logs" / "chief-0.log").read_text()
  assert "chief: tensorflow imported" in quiet.stdout
  assert noise_of(log), log  # TensorFlow's start-up lines are in the task's log ...
  assert noise_of(quiet.stdout) == [] and "InitializeLog" not in quiet.stdout  # ... not on the console

  verbose = launch(tmp_path, "--verbose", script=NOISY_TASK, env=quiet_env)
  assert verbose.returncode == 0, verbose.stderr
  assert noise_of(verbose.stdout) and "chief: TF_CPP_MIN_LOG_LEVEL=0" in verbose.stdout

  user = launch(tmp_path, script=NOISY_TASK, env=dict(quiet_env, TF_CPP_MIN_LOG_LEVEL="0"))
  assert user.returncode == 0, user.stderr
  assert noise_of(user.stdout) and "chief: TF_CPP_MIN_LOG_LEVEL=0" in user.stdout


def test_summary_names_restarts_and_their_causes(tmp_path, quiet_env):
  result = launch(tmp_path, script=FAKE_TASK, env=quiet_env,
                  script_args=["--fail_task=worker:0", f"--fail_once_file={tmp_path / 'failed'}", "--chief_secs=3"])
  assert result.returncode == 0, result.stderr
  summary = result.stdout[result.stdout.index("tfps-launch: run summary"):]
  assert "no run summary" in summary  # the stand-in trained nothing
  assert "restarts: 1\n    1. worker:0 exited with code 3; restarted worker:0\n" in summary


def test_restarts_go_into_the_run_records_of_the_chiefs_model_dir(tmp_path, quiet_env):
  model_dir = tmp_path / "run"
  result = launch(tmp_path, script=FAKE_TASK, env=quiet_env,
                  script_args=["--fail_task=ps:0", f"--fail_once_file={tmp_path / 'failed'}", "--chief_secs=3",
                               f"--model_dir={model_dir}"])
  assert result.returncode == 0, result.stderr
  restarts = [json.loads(line) for line in (model_dir / "run" / "restarts.jsonl").read_text().splitlines()]
  assert [(r["restart"], r["cause"], r["restarted"]) for r in restarts] == [
      (1, "ps:0 exited with code 3", "ps, workers, chief")]
  assert "  steps 10 in " in result.stdout, result.stdout
  assert "final training metrics: loss 0.4000" in result.stdout
  assert not (tmp_path / "logs" / "model_dir.json").exists()  # the chief's pointer is cleaned up


def test_a_task_started_on_its_own_gets_the_quiet_console(quiet_env):
  """The many-hosts way and every Kubernetes pod: no launcher; the task's own stderr goes through the filter."""
  tf_config = {"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "chief": ["127.0.0.1:3"]},
               "task": {"type": "chief", "index": 0}}
  result = subprocess.run([sys.executable, str(NOISY_TASK)], cwd=REPO, env=dict(quiet_env, TF_CONFIG=json.dumps(
      tf_config)), capture_output=True, text=True, timeout=180)
  assert result.returncode == 0, result.stderr
  assert "chief: tensorflow imported" in result.stdout
  assert noise_of(result.stderr) == [] and "InitializeLog" not in result.stderr, result.stderr


def test_the_filter_child_passes_all_but_the_noise():
  lines = NOISE + SESSION_DUMP + KEPT
  result = subprocess.run([sys.executable, "-I", console.__file__], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 0 and result.stdout.splitlines() == KEPT


@pytest.mark.parametrize("environ, argv, level, lone", [
    ({"TF_CONFIG": "{...}"}, ["train.py"], None, True),
    ({"TFPS_TASK_TYPE": "worker"}, ["train.py"], None, True),  # a pod that derives its cluster
    ({}, ["train.py", "--job_name=worker", "--task_index=1"], None, True),  # the many-hosts way
    ({}, ["train.py", "--job_name", "ps"], None, True),
    ({}, ["train.py", "--epochs=2"], None, False),  # no role: a notebook, a test, a one-process script
    ({"TF_CONFIG": "{...}", "TFPS_LAUNCH_LOG_DIR": "/tmp/logs"}, ["train.py"], None, False),  # tfps-launch filters
    ({"TF_CONFIG": "{...}", "TFPS_QUIET_CONSOLE": "1"}, ["train.py"], None, False),  # filtered already
    ({"TF_CONFIG": "{...}"}, ["train.py"], "0", False),  # the user's own TF_CPP_MIN_LOG_LEVEL: everything
])
def test_which_processes_get_the_quiet_console(environ, argv, level, lone):
  assert console.is_lone_task(environ, argv, level) is lone


def test_executor_teardown_errors_are_dropped_and_other_unraisable_errors_kept(monkeypatch, capsys):
  """What TensorFlow's `Executor.__del__` raises after a lost peer would print in pieces around the chief's one line;
  an unraisable error of anything else still reaches the hook installed before."""
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  console.drop_executor_teardown_errors()

  class Executor:  # pylint: disable=too-few-public-methods
    def __del__(self):
      raise RuntimeError("CANCELLED: RemoteExecuteNode::RunAsync")

  class Other:  # pylint: disable=too-few-public-methods
    def __del__(self):
      raise RuntimeError("a real error")

  Executor.__del__.__qualname__, Executor.__del__.__module__ = "Executor.__del__", "tensorflow.python.eager.executor"
  executor, other = Executor(), Other()
  del executor, other
  gc.collect()
  assert [str(u.exc_value) for u in seen] == ["a real error"]
  assert "Exception ignored" not in capsys.readouterr().err
