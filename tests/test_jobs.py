"""Real multi-process runs under tfps-launch: the main job, and a chief killed mid-run that a new run resumes."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

from fixtures.launcher import QUICK_STOP
import psutil
import pytest

from tfps.cluster import console
from tfps.cluster import tasks as tasks_lib
from tfps.report import series
from tfps import run_records
from tfps.testing import applied_steps
from tfps.training import checkpoints as checkpoints_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "tfps.cluster.launch", QUICK_STOP]

pytestmark = pytest.mark.slow


def start(args, env, log_path):
  log = open(log_path, "w")
  return subprocess.Popen(LAUNCH + args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                          start_new_session=True)


def descendants(process):
  try:
    return psutil.Process(process.pid).children(recursive=True)
  except psutil.NoSuchProcess:
    return []


@pytest.fixture
def launched():
  """Starts launcher runs; whatever is left of them at the end of the test is killed and reported."""
  runs = []
  yield runs
  leftovers = []
  for run in runs:
    for child in descendants(run) + [psutil.Process(run.pid)] if run.poll() is None else descendants(run):
      leftovers.append(child)
      child.kill()
  assert not leftovers, f"processes left behind: {leftovers}"


@pytest.fixture
def popen(tmp_path, subprocess_env):
  """`popen(name, argv)` starts a program in the repository, its stderr to `tmp_path/<name>.err` (`finish` waits for
  it); any still running at the end of the test are killed."""
  started = []

  def start(name, argv):
    with open(tmp_path / f"{name}.err", "w") as err:
      started.append(subprocess.Popen(argv, cwd=REPO, env=subprocess_env, stdout=subprocess.DEVNULL, stderr=err))
    started[-1].err_path = tmp_path / f"{name}.err"
    return started[-1]
  yield start
  for process in started:
    if process.poll() is None:
      process.kill()
      process.wait()


def finish(process, timeout_secs):
  """The exit status and stderr of a process `popen` started."""
  code = process.wait(timeout=timeout_secs)
  return code, process.err_path.read_text()


def wait_for(predicate, timeout_secs, what):
  deadline = time.monotonic() + timeout_secs
  while time.monotonic() < deadline:
    if predicate():
      return
    time.sleep(0.2)
  raise AssertionError(f"timed out after {timeout_secs}s waiting for {what}")


def test_killed_chief_resumes_at_the_next_epoch(tmp_path, subprocess_env, launched):
  model_dir = tmp_path / "run"
  script_args = ["--", f"--model_dir={model_dir}", "--epochs=4", "--steps_per_epoch=40", "--vocab_size=2000",
                 "--batch_size=32", "--count_applied_steps"]
  first = start(["--num_workers=1", "--max_restarts=0", f"--log_dir={tmp_path / 'logs1'}", "scripts/train_keras.py",
                 *script_args],
                subprocess_env, tmp_path / "first.out")
  launched.append(first)
  wait_for(lambda: checkpoints_lib.is_registered(str(model_dir), 2), 240, "the epoch-2 checkpoint")
  chief = [tasks_lib.find_task(tmp_path / "logs1", "chief:0", descendants(first))]
  chief[0].send_signal(signal.SIGKILL)
  assert first.wait(timeout=60) == 128 + signal.SIGKILL
  assert "task chief:0 was killed by SIGKILL; last lines of" in (tmp_path / "first.out").read_text()
  assert not (model_dir / "checkpoints" / "FINAL").exists()

  second = start(["--num_workers=1", f"--log_dir={tmp_path / 'logs2'}", "scripts/train_keras.py", *script_args],
                 subprocess_env, tmp_path / "second.out")
  launched.append(second)
  assert second.wait(timeout=300) == 0, (tmp_path / "second.out").read_text()[-3000:]
  output = (tmp_path / "second.out").read_text()
  resumed = [line for line in output.splitlines() if "Resumed from " in line]
  assert resumed and "ckpt-2 at epoch 3/4 (step 80)" in resumed[0], resumed
  final = json.loads((model_dir / "checkpoints" / "FINAL").read_text())
  assert final["step"] == 4 * 40  # not 6 x 40: epochs 1-2 were not run again
  chief_log = (tmp_path / "logs2" / "chief-0.log").read_text()
  assert applied_steps.applied_per_ps(final["last_checkpoint"], chief_log) == {"ps:0": 4 * 40}  # applied once, too
  assert final["last_checkpoint"].endswith("ckpt-4")


def test_main_job_trains_and_the_sidecar_reports_auc(tmp_path, subprocess_env, launched, popen):
  """The main job's program, its evaluator sidecar, the report and the standalone sidecar: 2 epochs of 60 steps (the
  README's bound) on 16,000 generated rows, 2,000 held out for the evaluations of the test's programs (val_auc 0.72
  measured; 0.73 on 40,000 rows)."""
  model_dir = tmp_path / "run"
  args = ["--num_ps=1", "--num_workers=2", "--evaluator", f"--log_dir={tmp_path / 'logs'}", "scripts/train.py", "--",
          "--flagfile=configs/main.cfg", f"--model_dir={model_dir}", f"--data_dir={tmp_path / 'data'}",
          "--synthetic_rows=16000", "--epochs=2", "--steps_per_epoch=60", "--batch_size=256"]
  quiet_env = {key: value for key, value in subprocess_env.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
  run = start(args, quiet_env, tmp_path / "main.out")
  launched.append(run)
  assert run.wait(timeout=400) == 0, (tmp_path / "main.out").read_text()[-3000:]
  output = (tmp_path / "main.out").read_text()
  final_line = [line for line in output.splitlines() if "Final: " in line][0]
  val_auc = float(final_line.split("val_auc ")[1].split()[0])
  assert val_auc > 0.6, final_line
  # Quiet console: TensorFlow's noise is in the chief's log only.
  noise = [line for line in output.splitlines() if not console.ConsoleFilter().keep(line.encode() + b"\n")]
  assert noise == [] and "Could not find cuda" not in output and "session config" not in output
  logs = tmp_path / "logs"  # the chief's own, or the fork server's, which imported TensorFlow for every task
  assert "Could not find cuda" in (logs / "chief-0.log").read_text() + (logs / "forkserver.log").read_text()
  evaluations = [json.loads(line) for line in (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()]
  assert evaluations and evaluations[-1]["checkpoint"].endswith("ckpt-2")
  assert [(e["checkpoint_number"], e["step"]) for e in evaluations[-1:]] == [(2, 120)]  # the optimizer step
  summary = output[output.index("tfps-launch: run summary"):]
  assert "  steps 120 in " in summary and "examples/s" in summary
  assert f"final validation metrics: auc {val_auc:.4f}" in summary
  assert f"sidecar best checkpoint: {model_dir}/checkpoints/ckpt-" in summary and "restarts: none" in summary
  assert f"TensorBoard logs: {model_dir}/logs" in summary and f"checkpoints: {model_dir}/checkpoints" in summary
  # The report, the standalone sidecar on the finished run (every checkpoint, best by loss) and the standalone sidecar
  # refusing an unknown metric run side by side; the refusal on a copy of the run, before it evaluates anything.
  shutil.copytree(model_dir, tmp_path / "copy")
  sidecar = [sys.executable, "scripts/sidecar_eval.py", "--flagfile=configs/main.cfg",
             f"--data_dir={tmp_path / 'data'}", "--synthetic_rows=16000", "--batch_size=256", "--poll_secs=0.1"]
  report = popen("report", [sys.executable, "-m", "tfps.report.cli", str(model_dir)])
  refused = popen("refused", sidecar + [f"--model_dir={tmp_path / 'copy'}", "--best_metric=nope"])
  code, report_err = finish(report, 120)
  assert code == 0, report_err
  assert (model_dir / "run" / "report.png").read_bytes()[:4] == b"\x89PNG"
  sidecar_auc = series.build_series(run_records.read_run(str(model_dir))).panels["auc"][-1]
  assert sidecar_auc.label == "sidecar auc" and sidecar_auc.values == [e["metrics"]["auc"] for e in evaluations]
  assert evaluations[-1]["metrics"]["auc"] == pytest.approx(val_auc, abs=1e-3)  # same weights, same data
  best = json.loads((model_dir / "best" / "best.json").read_text())
  assert best["metric"] == "auc"
  assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
      "chief-0.log", "evaluator-0.log", "forkserver.log", "ps-0.log", "tasks.json", "worker-0.log", "worker-1.log"]

  # A sidecar does not evaluate again a checkpoint metrics.jsonl has a record of: moved away, every one is; the best
  # kept by AUC is not compared with losses.
  (model_dir / "eval" / "metrics.jsonl").rename(model_dir / "eval" / "metrics.jsonl.first")
  result = subprocess.run(sidecar + [f"--model_dir={model_dir}", "--evaluate_every_checkpoint", "--best_metric=loss"],
                          cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  again = [json.loads(line) for line in (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()]
  assert [os.path.basename(e["checkpoint"]) for e in again] == ["ckpt-1", "ckpt-2"]
  best = json.loads((model_dir / "best" / "best.json").read_text())
  assert best["metric"] == "loss"
  assert best["value"] == min(e["metrics"]["loss"] for e in again)
  assert "The best checkpoint kept so far was chosen by auc; choosing by loss from now on" in result.stderr
  code, refused_err = finish(refused, 300)
  assert code == 2
  assert "sidecar_eval.py: `best_metric` 'nope' is not one of the model's metrics: auc, loss" in refused_err
  assert "Traceback" not in refused_err
  assert (tmp_path / "copy" / "eval" / "metrics.jsonl").read_text() == (
      model_dir / "eval" / "metrics.jsonl.first").read_text()  # nothing evaluated


def test_unreachable_ps_is_named_within_the_connect_timeout(tmp_path, subprocess_env):
  free_port = __import__("portpicker").pick_unused_port()
  started = time.monotonic()
  result = subprocess.run(
      [sys.executable, "scripts/train_keras.py", "--job_name=chief", f"--ps_hosts=127.0.0.1:{free_port}",
       "--worker_hosts=127.0.0.1:1", "--connect_timeout_secs=3", f"--model_dir={tmp_path}"],
      cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=120)
  assert result.returncode == 3  # a lost task: started again once the ps is there, it runs
  assert re.search(rf"train_keras.py: task ps:0 at 127.0.0.1:{free_port} .*connection refused.*; check that the task "
                   "runs there and was started with this address", result.stderr)
  assert "Traceback" not in result.stderr
  assert time.monotonic() - started < 60
