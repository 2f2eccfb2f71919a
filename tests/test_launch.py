"""tfps-launch end to end with stand-in tasks (no TensorFlow): exit codes, a failing task's log tail, no orphans."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from marked_processes import MARK, kill_marked, marked as tasks_of
from tfps.cluster import tasks as tasks_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
FAKE_TASK = REPO / "tests" / "fixtures" / "fake_task.py"


def launch(tmp_path, *args, script=FAKE_TASK, script_args=(), env=None, **kwargs):
  command = [sys.executable, "-m", "tfps.cluster.launch", f"--log_dir={tmp_path / 'logs'}", *args, str(script), "--",
             *script_args]
  return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs)


@pytest.fixture
def marked_env(tmp_path):
  env = dict(os.environ, **{MARK: str(tmp_path)})
  yield env
  kill_marked(tmp_path)  # leave nothing behind even when a test fails


def test_chief_success_stops_all_tasks_and_exits_zero(tmp_path, marked_env):
  proc = launch(tmp_path, "--num_ps=2", "--num_workers=2", env=marked_env)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  assert "started chief:0" in out and "chief done" in out  # the chief's output is streamed
  logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
  assert logs == ["chief-0.log", "ps-0.log", "ps-1.log", "tasks.json", "worker-0.log", "worker-1.log"]
  assert "started worker:1" in (tmp_path / "logs" / "worker-1.log").read_text()
  assert tasks_of(tmp_path) == []


def test_exit_status_is_the_chiefs(tmp_path, marked_env):
  proc = launch(tmp_path, script_args=["--chief_exit=7"], env=marked_env)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 7
  assert "task chief:0 exited with code 7; last lines of" in err and "  | chief done" in err
  assert tasks_of(tmp_path) == []


def test_dead_worker_is_named_with_exit_code_and_log_tail(tmp_path, marked_env):
  proc = launch(tmp_path, "--max_restarts=0", script_args=["--fail_task=worker:1", "--chief_hang", "--noise"],
                env=marked_env)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 1
  assert "task worker:1 exited with code 3; last lines of" in err
  assert "  | started worker:1\n  | worker:1 failing on purpose" in err  # TensorFlow's start-up noise left out
  assert "cuInit" not in err and "oneDNN" not in err and "InitializeLog" not in err, err
  assert tasks_of(tmp_path) == []


def test_killed_ps_is_reported_by_signal(tmp_path, marked_env):
  proc = launch(tmp_path, "--max_restarts=0", script_args=["--chief_hang"], env=marked_env)
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline:
    ps = [p for p in [tasks_lib.find_task(tmp_path / "logs", "ps:0", tasks_of(tmp_path))] if p]
    if ps:
      break
    time.sleep(0.1)
  ps[0].kill()
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 1
  assert "task ps:0 was killed by SIGKILL" in err
  assert tasks_of(tmp_path) == []


def test_evaluator_runs_and_finishes_after_the_chief(tmp_path, marked_env):
  proc = launch(tmp_path, "--evaluator", env=marked_env)
  proc.communicate(timeout=60)
  assert proc.returncode == 0
  assert "evaluator done" in (tmp_path / "logs" / "evaluator-0.log").read_text()


@pytest.mark.parametrize("code, said", [
    (3, "task evaluator:0 exited with code 3"),
    (2, "evaluator:0 refused its input (exit status 2: fake_task.py: evaluator:0 refuses --fail_task=evaluator:0 on "
        "purpose); not restarting it: training goes on without it; the launch will exit 1"),
])
def test_failed_evaluator_fails_the_launch_but_not_training(tmp_path, marked_env, code, said):
  proc = launch(tmp_path, "--evaluator", "--max_restarts=0", script_args=["--fail_task=evaluator:0", "--fail_secs=0.1",
                                                     f"--fail_code={code}", "--chief_secs=2"], env=marked_env)
  out, err = proc.communicate(timeout=60)
  assert said in err and "stopping every task" not in err, err
  assert "chief done" in out
  assert proc.returncode == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_leaves_no_process_behind(tmp_path, marked_env, signum):
  proc = launch(tmp_path, "--num_workers=3", "--evaluator", script_args=["--chief_hang", "--chief_secs=100",
                                                                           "--spawn_child"], env=marked_env)
  expected = 3 + 1 + 6 + 6  # the launcher, its `unshare`, the launcher in the namespace and its fork server; 6 tasks;
  # their grandchildren
  deadline = time.monotonic() + 90  # 6 tasks and their children start in 10-40 s on 2 busy cores
  while len(tasks_of(tmp_path)) < expected and time.monotonic() < deadline:
    time.sleep(0.1)
  assert len(tasks_of(tmp_path)) == expected, tasks_of(tmp_path)
  proc.send_signal(signum)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 128 + signum
  assert f"received {signal.Signals(signum).name}; stopping every task" in err
  assert tasks_of(tmp_path) == []


def test_a_signal_to_the_launcher_stops_the_chief_while_the_other_tasks_still_run(tmp_path, marked_env):
  """An online chief on SIGTERM ends its steps in flight and writes a checkpoint: its ps and workers must still
  run then."""
  term_file = tmp_path / "who_runs.json"
  proc = launch(tmp_path, "--num_workers=2", script_args=["--chief_hang", f"--chief_term_file={term_file}"],
                env=marked_env)
  deadline = time.monotonic() + 90
  while len(tasks_lib.task_pids(tmp_path / "logs")) < 4 and time.monotonic() < deadline:
    time.sleep(0.1)
  time.sleep(1.0)  # the chief's handler is set once its main runs
  proc.send_signal(signal.SIGINT)
  proc.communicate(timeout=60)
  assert json.loads(term_file.read_text()) == {"ps:0": True, "worker:0": True, "worker:1": True, "chief:0": True}
  assert tasks_of(tmp_path) == []


@pytest.mark.parametrize("args,message", [
    ([], "tfps-launch: no script given"),
    (["missing.py"], "tfps-launch: script 'missing.py' is not a file"),
    (["--num_workers=0", "x.py"], "tfps-launch: flag --num_workers=0: 0 is not a positive integer"),
    (["--num_ps=two", "x.py"], "tfps-launch: flag --num_ps=two: invalid literal"),
    (["x.py", "--epochs=2"], "tfps-launch: Unknown command line flag 'epochs' (the script's own flags go after `--`"),
    (["README.md"], "tfps-launch: script 'README.md' does not compile as Python: unterminated string literal"),
    (["--stop_grace_secs=nan", "x.py"], "tfps-launch: --stop_grace_secs=nan: must be a finite number"),
    (["--log_dir=README.md", "tests/fixtures/fake_task.py"], "tfps-launch: --log_dir=README.md is a file, not a "
     "directory"),
    (["--log_dir=/proc/nope", "tests/fixtures/fake_task.py"], "tfps-launch: --log_dir=/proc/nope cannot be made a "
     "directory (No such file or directory)"),
    (["--host=::1", "tests/fixtures/fake_task.py"], "tfps-launch: --host=::1: an IPv6 address is not supported"),
    (["scripts/train.py", "--", "--sync_mode=geo", "--replicas_to_aggregate=2"],  # before any task starts
     "tfps-launch: train.py: `replicas_to_aggregate` (2) applies only to sync_mode=sync, not geo"),
])
def test_bad_launcher_arguments_are_one_line(args, message):
  result = subprocess.run([sys.executable, "-m", "tfps.cluster.launch", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
  assert result.returncode == 2
  assert result.stderr.strip().startswith(message), result.stderr
  assert len(result.stderr.strip().splitlines()) == 1


def test_dead_worker_is_restarted_alone_on_its_port(tmp_path, marked_env):
  proc = launch(tmp_path, script_args=["--fail_task=worker:1", f"--fail_once_file={tmp_path / 'failed'}",
                                       "--chief_secs=3"], env=marked_env)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  assert "restart 1/3: restarting worker:1 alone, at 127.0.0.1:" in err
  worker_log = (tmp_path / "logs" / "worker-1.log").read_text()
  assert worker_log.count("started worker:1") == 2
  assert "===== tfps-launch: restart 1 of this task =====" in worker_log
  assert (tmp_path / "logs" / "worker-0.log").read_text().count("started worker:0") == 1  # the others ran on
  assert (tmp_path / "logs" / "chief-0.log").read_text().count("started chief:0") == 1
  assert tasks_of(tmp_path) == []


@pytest.mark.parametrize("failing", ["ps:0", "chief:0"])
def test_dead_ps_or_chief_restarts_the_training_cluster(tmp_path, marked_env, failing):
  proc = launch(tmp_path, "--evaluator", script_args=[f"--fail_task={failing}", f"--fail_once_file={tmp_path / 'f'}",
                                                     "--fail_secs=0.3", "--chief_secs=2"], env=marked_env)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  assert f"restart 1/3: {failing} failed; restarting the training cluster" in err
  for name in ("ps-0", "worker-0", "worker-1", "chief-0"):
    assert (tmp_path / "logs" / f"{name}.log").read_text().count("started ") == 2, name
  assert (tmp_path / "logs" / "evaluator-0.log").read_text().count("started ") == 1  # not part of training
  assert tasks_of(tmp_path) == []


def test_dead_evaluator_is_restarted_alone(tmp_path, marked_env):
  proc = launch(tmp_path, "--evaluator", script_args=["--fail_task=evaluator:0", f"--fail_once_file={tmp_path / 'f'}",
                                                     "--fail_secs=0.1", "--chief_secs=3"], env=marked_env)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  assert "restart 1/3: restarting evaluator:0 alone" in err
  assert (tmp_path / "logs" / "chief-0.log").read_text().count("started ") == 1
  assert "evaluator done" in (tmp_path / "logs" / "evaluator-0.log").read_text()


@pytest.mark.parametrize("failing", ["chief:0", "worker:1"])
def test_a_task_that_refuses_its_input_is_not_restarted(tmp_path, marked_env, failing):
  args = ["--chief_exit=2", "--chief_secs=0.2"] if failing == "chief:0" else ["--fail_task=worker:1", "--fail_code=2",
                                                                                "--fail_secs=0.1", "--chief_hang"]
  proc = launch(tmp_path, "--max_restarts=3", script_args=[*args, "--noise"], env=marked_env)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 2, err
  if failing == "chief:0":  # its output is on the console
    assert "chief:0 refused its input (exit status 2; its last line above says why); not restarting it" in err
  else:  # its one line, quoted once, without TensorFlow's start-up noise
    refusal = "fake_task.py: worker:1 refuses --fail_task=worker:1 on purpose"
    assert f"worker:1 refused its input (exit status 2: {refusal}); not restarting it" in err
    assert err.count(refusal) == 1, err
  assert "last lines of" not in err and "cuInit" not in err and "oneDNN" not in err, err
  assert "restart 1/" not in err
  assert tasks_of(tmp_path) == []


def test_restarts_are_bounded(tmp_path, marked_env):
  proc = launch(tmp_path, "--max_restarts=2", script_args=["--fail_task=worker:0", "--fail_secs=0.1", "--chief_hang"],
                env=marked_env)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 1
  assert "restart 1/2" in err and "restart 2/2" in err and "restart 3/" not in err
  assert "no restarts left (--max_restarts=2); stopping every task" in err
  assert (tmp_path / "logs" / "worker-0.log").read_text().count("started worker:0") == 3
  assert tasks_of(tmp_path) == []


def test_a_flag_the_script_refuses_stops_the_launch_before_any_task_starts(tmp_path, marked_env):
  proc = launch(tmp_path, "--num_ps=2", "--num_workers=2", script_args=["--chief_exit=many"], env=marked_env)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 2
  assert err == "tfps-launch: fake_task.py: flag --chief_exit=many: invalid literal for int() with base 10: 'many'\n"
  assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").glob("*.log"))  # no task started
  assert "started" not in out and tasks_of(tmp_path) == []


CHECK = "import sys; from tfps import flags; flags.check_script_flags(sys.argv[1], sys.argv[2:])"


@pytest.mark.parametrize("source, args, status, line", [
    ("from absl import app, flags\nflags.DEFINE_integer('n', 1, 'n')\nif __name__ == '__main__':\n  app.run(print)\n",
     ["--n=x"], 2, "script.py: flag --n=x: invalid literal for int() with base 10: 'x'"),
    ("from absl import app, flags\nflags.DEFINE_integer('n', 1, 'n')\nif __name__ == '__main__':\n  app.run(print)\n",
     ["--n=2"], 0, ""),
    ("from absl import app, flags\nflags.DEFINE_float('rate', 0.1, 'r', lower_bound=0)\nif __name__ == '__main__':\n"
     "  app.run(print)\n", ["--rate=inf"], 2, "script.py: --rate=inf: must be a finite number"),
    ("from absl import app, flags\nflags.DEFINE_enum('sync_mode', 'async', ['async', 'geo'], 'its own')\n"
     "if __name__ == '__main__':\n  app.run(print)\n", ["--sync_mode=geo"], 0, ""),  # not tfps's mode flags
    ("import argparse\nimport sys\nif __name__ == '__main__':\n  print('main ran')\n", ["--anything"], 0, ""),
    ("import tensorflow\nraise SystemExit('unreachable')\n", ["--n=x"], 0, ""),  # needs TensorFlow: left to its tasks
    ("import tfps\nif __name__ == '__main__':\n  tfps.run_main(print, arguments=False)\n", ["stray"], 2,
     "script.py: unexpected argument 'stray': this program takes flags only (--name=value; a boolean flag is --name "
     "or --noname)"),
    ("import tfps\nif __name__ == '__main__':\n  tfps.run_main(print)\n", ["stray"], 0, ""),  # it takes arguments
])
def test_the_flag_check_runs_no_main_and_no_tensorflow(tmp_path, source, args, status, line):
  script = tmp_path / "script.py"
  script.write_text(source)
  result = subprocess.run([sys.executable, "-c", CHECK + "; print('tensorflow' in sys.modules)", str(script), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
  assert result.returncode == status, result.stderr
  assert result.stderr.strip() == line
  assert result.stdout == ("" if status else "False\n")  # no main ran, TensorFlow never loaded
