"""Online training under real kills (tfps-launch, 1 ps, 2 workers, the mock Kafka cluster in this process): on the
Estimator path a worker SIGKILLed while messages flow, then the chief, then the ps (for each of the two the launcher
restarts ps, workers and chief, which resumes from its newest checkpoint and that checkpoint's offsets), on the Keras
path a worker; then SIGTERM: every message is applied exactly once, counted per message in the final checkpoint
(tests/online_stream.py), and the group's offsets are the topic's end. And the online script on a folder stream: on
the Estimator path with held-out windows, its sidecar and deltas; on the Keras path in sync mode."""

import contextlib
import json
import pathlib
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import psutil
import pytest

import marked_processes
import online_stream
from tfps.cluster import tasks as tasks_lib
from tfps.data.stream import folder
from tfps.data.stream import holdout
from tfps.data.stream.sources import Record
from tfps.training import deltas
from tfps.training import stream_positions

REPO = pathlib.Path(__file__).resolve().parents[1]
WAVE = 320  # messages per wave: 40 steps of 8
GROUP = "online-test"

pytestmark = pytest.mark.slow


_LOG_DIRS = {}  # a run's mark: its log folder (where the launcher names its tasks' pids)


def _task(mark: str, name: str):
  """The live process of task `name` ("worker:1") among the processes marked `mark`, or None."""
  return tasks_lib.find_task(_LOG_DIRS[mark], name, marked_processes.marked(mark))


def _produce_slowly(bootstrap: str, ids) -> threading.Thread:
  """Writes the messages of `ids` 8 at a time, every 50 ms, in a thread (started)."""
  def run():
    ids_list = list(ids)
    for start in range(0, len(ids_list), 8):
      online_stream.produce(bootstrap, ids_list[start:start + 8])
      time.sleep(0.05)
  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  return thread


def _checkpoints(model_dir: pathlib.Path):
  return sorted(int(path.name[5:-6]) for path in (model_dir / "checkpoints").glob("ckpt-*.index"))


@contextlib.contextmanager
def _online_run(tmp_path, subprocess_env, bootstrap: str, *args: str):
  """tfps-launch (1 ps, 2 workers) running the counting fixture on the topic at `bootstrap` with `args`; yields
  `(launcher, model_dir, out, mark, alive)`. Afterwards no process of the run is left (a failure names any)."""
  model_dir, out, mark = tmp_path / "run", tmp_path / "out.txt", uuid.uuid4().hex
  env = dict(subprocess_env, **{marked_processes.MARK: mark})
  _LOG_DIRS[mark] = tmp_path / "logs"
  command = [sys.executable, "-m", "tfps.cli.launch", "--num_workers=2", "--num_ps=1", "--max_restarts=3",
             "--expose_ports",  # the mock brokers listen in this network namespace: tasks run in it too
             f"--log_dir={tmp_path / 'logs'}", "tests/fixtures/online_count_train.py", "--",
             f"--model_dir={model_dir}", f"--bootstrap={bootstrap}", f"--group={GROUP}", *args]
  with open(out, "w", encoding="utf-8") as output:
    launcher = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
  try:
    yield launcher, model_dir, out, mark, lambda: launcher.poll() is None
  finally:
    left = marked_processes.marked(mark)
    marked_processes.kill_marked(mark)
    if launcher.poll() is None:
      launcher.kill()
      launcher.wait()
  assert not left, f"processes left behind: {left}"


def _stop_and_count(launcher, bootstrap: str, mark: str, model_dir, out, alive) -> np.ndarray:
  """Once the group committed the topic's end: SIGTERM to the chief, exit 0; the last checkpoint's position is the
  topic's end. Returns its counting table."""
  ends = online_stream.end_offsets(bootstrap)
  online_stream.wait_for(lambda: online_stream.committed(bootstrap, GROUP) == ends, "the end offsets committed",
                         480, alive)
  online_stream.wait_for(lambda: _task(mark, "chief:0"), "chief:0", 60, alive).send_signal(signal.SIGTERM)
  assert launcher.wait(timeout=120) == 0, out.read_text()[-3000:]
  latest = str(model_dir / "checkpoints" / f"ckpt-{_checkpoints(model_dir)[-1]}")
  assert stream_positions.read_positions(str(model_dir), latest) == ends
  return online_stream.counts_in(latest)


def test_each_message_applied_once_across_worker_chief_and_ps_kills(tmp_path, subprocess_env):
  holder, bootstrap = online_stream.mock_cluster()
  online_stream.produce(bootstrap, range(WAVE))
  with _online_run(tmp_path, subprocess_env, bootstrap) as (launcher, model_dir, out, mark, alive):
    online_stream.wait_for(lambda: _checkpoints(model_dir), "a first checkpoint", 480, alive)
    flow = _produce_slowly(bootstrap, range(WAVE, 2 * WAVE))
    time.sleep(0.5)
    online_stream.wait_for(lambda: _task(mark, "worker:1"), "worker:1", 60, alive).send_signal(signal.SIGKILL)
    flow.join()
    before = _checkpoints(model_dir)[-1]
    flow = _produce_slowly(bootstrap, range(2 * WAVE, 3 * WAVE))
    online_stream.wait_for(lambda: _checkpoints(model_dir)[-1] > before, "a checkpoint in the third wave", 120, alive)
    online_stream.wait_for(lambda: _task(mark, "chief:0"), "chief:0", 60, alive).send_signal(signal.SIGKILL)
    flow.join()
    online_stream.wait_for(lambda: online_stream.committed(bootstrap, GROUP) == online_stream.end_offsets(bootstrap),
                           "the third wave committed", 480, alive)
    flow = _produce_slowly(bootstrap, range(3 * WAVE, 4 * WAVE))
    time.sleep(0.5)
    online_stream.wait_for(lambda: _task(mark, "ps:0"), "ps:0", 60, alive).send_signal(signal.SIGKILL)
    flow.join()
    counts = _stop_and_count(launcher, bootstrap, mark, model_dir, out, alive)
  del holder
  np.testing.assert_array_equal(counts[:4 * WAVE], np.ones(4 * WAVE))  # every message applied once, none twice
  assert not counts[4 * WAVE:].any()
  text = out.read_text()
  assert "restarting worker:1 alone" in text, text[-3000:]
  assert "chief:0 failed; restarting the training cluster" in text, text[-3000:]
  assert "ps:0 failed; restarting the training cluster" in text, text[-3000:]
  assert "Stopping at step" in text, text[-3000:]


def test_the_keras_path_applies_each_message_once_across_a_worker_kill(tmp_path, subprocess_env):
  """The Keras path (tfps.keras.online): a worker SIGKILLed while the second of two waves flows (the launcher
  restarts it alone), then SIGTERM (the chief may still be waiting for the worker to rejoin then; it ends once it has):
  exit 0, each message counted once, the position the topic's end."""
  holder, bootstrap = online_stream.mock_cluster()
  online_stream.produce(bootstrap, range(WAVE // 2))
  with _online_run(tmp_path, subprocess_env, bootstrap, "--path=keras") as (launcher, model_dir, out, mark, alive):
    online_stream.wait_for(lambda: _checkpoints(model_dir), "a first checkpoint", 480, alive)
    flow = _produce_slowly(bootstrap, range(WAVE // 2, WAVE))
    time.sleep(0.5)
    online_stream.wait_for(lambda: _task(mark, "worker:1"), "worker:1", 60, alive).send_signal(signal.SIGKILL)
    flow.join()
    counts = _stop_and_count(launcher, bootstrap, mark, model_dir, out, alive)
  del holder
  np.testing.assert_array_equal(counts[:WAVE], np.ones(WAVE))
  assert not counts[WAVE:].any()
  text = out.read_text()
  assert "restarting worker:1 alone" in text, text[-3000:]
  assert "Stopping at step" in text, text[-3000:]


def _held_out_lines(slices) -> int:
  """How many well-formed lines of `slices` ({name: rows}) `--stream_holdout_every=8` holds out."""
  picker = holdout.HeldOut(8, 1)
  return sum(picker.takes(Record(b"", folder.KEY, [name, line], "")) for name, rows in slices.items()
             for line, row in enumerate(rows, 1) if row != "bad,row")


def _folder_stream(tmp_path):
  """Two slices of 64 clicks (the second starting with a malformed line), done-marked; `(slices, spec, {name: rows})`."""
  slices, spec = tmp_path / "slices", tmp_path / "clicks.spec.json"
  slices.mkdir()
  spec.write_text(json.dumps(online_stream.SPEC.to_dict()))
  written = {}
  for index, ids in enumerate((range(64), range(64, 128))):
    rows = written[f"clicks-{index}.csv"] = (["bad,row"] if index else []) + [f"{i},{i % 2},{i / 10}" for i in ids]
    (slices / f"clicks-{index}.csv").write_text("".join(row + "\n" for row in rows))
    (slices / f"clicks-{index}.csv.done").write_text("")
  return slices, spec, written


def _run_script(tmp_path, subprocess_env, launcher_flags, script_flags) -> str:
  """tfps-launch scripts/train_online.py with the flags; its output, after asserting exit 0."""
  out = tmp_path / "out.txt"
  command = [sys.executable, "-m", "tfps.cli.launch", "--num_ps=1", f"--log_dir={tmp_path / 'logs'}", *launcher_flags,
             "scripts/train_online.py", "--", "--stream=folder", "--data=csv", "--batch_size=16", "--deep_layers=8",
             "--embedding_dim=4", "--log_step_count_steps=2", *script_flags]
  with open(out, "w", encoding="utf-8") as output:
    code = subprocess.run(command, cwd=REPO, env=subprocess_env, stdout=output, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, timeout=480, check=False).returncode
  text = out.read_text()
  assert code == 0, text[-3000:]
  return text


def test_the_online_script_trains_a_bundled_model_on_a_folder_stream(tmp_path, subprocess_env):
  """scripts/train_online.py --stream=folder under tfps-launch with its sidecar: Wide&Deep on two slices (the second
  starting with a malformed line) with one message in about 8 held out, to the step that trains the last one (a
  partial batch); the last checkpoint's position is the end of the second slice, the chief evaluated the window at
  step 4 and the sidecar every checkpoint, the launcher's summary gives the stream, and the last delta
  (--delta_export_secs) is at the last step and position."""
  slices, spec, written = _folder_stream(tmp_path)
  model_dir = tmp_path / "run"
  steps = -(-(128 - _held_out_lines(written)) // 16)
  text = _run_script(tmp_path, subprocess_env, ["--num_workers=1", "--evaluator"],
                     [f"--stream_folder={slices}", f"--feature_spec={spec}", f"--max_steps={steps}",
                      "--steps_per_execution=2", "--save_checkpoints_steps=4", "--stream_holdout_every=8",
                      "--stream_eval_every_steps=4", "--stream_idle_flush_secs=1", f"--model_dir={model_dir}",
                      "--delta_export_secs=0"])
  assert "malformed_records 1" in (model_dir / "loss.log").read_text()
  latest = str(model_dir / "checkpoints" / f"ckpt-{steps}")
  assert stream_positions.read_positions(str(model_dir), latest) == {"folder": ["clicks-1.csv", 65]}
  assert f"stream folder {slices}: {128 - _held_out_lines(written)} messages applied in this run" in text, text
  assert "newest held-out windows: step 4: auc " in text
  sidecar = [json.loads(line) for line in (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()]
  assert sidecar[-1]["step"] == steps and sidecar[-1]["metrics"]["examples"] == _held_out_lines(written)
  exports = sorted((model_dir / "deltas").iterdir())  # --delta_export_secs=0: a delta at every step log line
  assert exports[0].name == "base-000000"
  assert [path.name for path in exports[1:]] == [f"delta-{v:06d}" for v in range(1, len(exports))]
  last = deltas.read_manifest(str(exports[-1]))
  assert last["step"] == steps and last["stream"]["to"] == {"folder": ["clicks-1.csv", 65]}


def test_the_online_script_trains_on_the_keras_path_in_sync_mode(tmp_path, subprocess_env):
  """scripts/train_online.py --stream=folder --path=keras --sync_mode=sync under tfps-launch (2 workers): Wide&Deep on
  the two slices, each step on one batch per worker, to --max_steps; the Keras model's metrics in its progress lines,
  and the last checkpoint's position is the end of the second slice."""
  slices, spec, _ = _folder_stream(tmp_path)
  model_dir = tmp_path / "run"
  _run_script(tmp_path, subprocess_env, ["--num_workers=2"],
              [f"--stream_folder={slices}", f"--feature_spec={spec}", "--path=keras", "--sync_mode=sync",
               "--max_steps=4", "--save_checkpoints_steps=2", f"--model_dir={model_dir}"])
  lines = (model_dir / "loss.log").read_text()
  assert "malformed_records 1" in lines and " | auc " in lines, lines  # the Keras model's metrics in its lines
  latest = str(model_dir / "checkpoints" / "ckpt-4")
  assert stream_positions.read_positions(str(model_dir), latest) == {"folder": ["clicks-1.csv", 65]}
