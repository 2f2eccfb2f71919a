"""Online training under real kills (tfps-launch, 2 workers, the mock Kafka cluster in this process), each kill in
its own wave of messages, the chief's once a checkpoint holds part of its wave (the launcher restarts ps, workers and
chief after a chief or ps kill; the chief resumes from its newest checkpoint and that checkpoint's offsets):

- the Estimator path in async mode, 1 ps: a worker, then the chief SIGKILLed;
- the Estimator path in geo mode, 2 ps: a worker, then ps:1;
- the Keras path in sync mode, 2 ps: a worker, the chief, then ps:1;

then SIGTERM: every message is applied exactly once, counted per message in the final checkpoint
(tests/online_stream.py: a row per message, the table sharded over every ps), and the group's offsets are the topic's
end. And the online script on a folder stream: on the Estimator path with held-out windows, its sidecar and deltas;
on the Keras path with held-out windows and its sidecar, stopped by SIGTERM (the sidecar ends with it)."""

import contextlib
import json
import pathlib
import re
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
from tfps.training import delta_freshness
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
  """The steps of the checkpoints a restarted chief may resume from: those the checkpoint state file lists (a
  checkpoint's `.index` is written before the state file names it; a kill between resumes from the one before)."""
  state = model_dir / "checkpoints" / "checkpoint"
  text = state.read_text() if state.is_file() else ""
  return sorted(int(step) for step in re.findall(r'^all_model_checkpoint_paths: ".*ckpt-(\d+)"$', text, re.M))


@contextlib.contextmanager
def _launch(tmp_path, subprocess_env, launcher_flags, *command: str):
  """tfps-launch with `launcher_flags` running `command` (a script and its flags); yields `(launcher, out, mark,
  alive)`. Afterwards no process of the run is left (a failure names any)."""
  out, mark = tmp_path / "out.txt", uuid.uuid4().hex
  env = dict(subprocess_env, **{marked_processes.MARK: mark})
  _LOG_DIRS[mark] = tmp_path / "logs"
  with open(out, "w", encoding="utf-8") as output:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfps.cli.launch", f"--log_dir={tmp_path / 'logs'}", *launcher_flags, *command],
        cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
  try:
    yield launcher, out, mark, lambda: launcher.poll() is None
  finally:
    left = marked_processes.end_launch(launcher, mark)
  assert not left, f"processes left behind: {left}"


@contextlib.contextmanager
def _online_run(tmp_path, subprocess_env, bootstrap: str, *args: str, num_ps: int = 1):
  """tfps-launch (`num_ps` ps, 2 workers) running the counting fixture on the topic at `bootstrap` with `args`;
  yields `(launcher, model_dir, out, mark, alive)`."""
  model_dir = tmp_path / "run"
  launcher_flags = ["--num_workers=2", f"--num_ps={num_ps}", "--max_restarts=3",
                    "--expose_ports"]  # the mock brokers listen in this network namespace: tasks run in it too
  with _launch(tmp_path, subprocess_env, launcher_flags, "tests/fixtures/online_count_train.py", "--",
               f"--model_dir={model_dir}", f"--bootstrap={bootstrap}", f"--group={GROUP}", *args) as (
                   launcher, out, mark, alive):
    yield launcher, model_dir, out, mark, alive


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


def _kill_while_flowing(bootstrap: str, mark: str, task: str, ids, alive) -> None:
  """Writes the messages of `ids` slowly and SIGKILLs `task` while they flow."""
  flow = _produce_slowly(bootstrap, ids)
  time.sleep(0.5)
  online_stream.wait_for(lambda: _task(mark, task), task, 60, alive).send_signal(signal.SIGKILL)
  flow.join()


def _wait_committed(bootstrap: str, what: str, alive) -> None:
  online_stream.wait_for(lambda: online_stream.committed(bootstrap, GROUP) == online_stream.end_offsets(bootstrap),
                         what, 480, alive)


def _kill_chief_in_a_checkpointed_wave(bootstrap: str, mark: str, model_dir, ids, alive) -> int:
  """Writes the messages of `ids` slowly and SIGKILLs the chief once a checkpoint holds some of them (the restarted
  chief resumes in the middle of the wave); returns the step of the newest checkpoint before the wave."""
  before = _checkpoints(model_dir)[-1]
  flow = _produce_slowly(bootstrap, ids)
  online_stream.wait_for(lambda: _checkpoints(model_dir)[-1] > before, "a checkpoint in the chief's wave", 120, alive)
  online_stream.wait_for(lambda: _task(mark, "chief:0"), "chief:0", 60, alive).send_signal(signal.SIGKILL)
  flow.join()
  return before


def _applied_once_across_kills(tmp_path, subprocess_env, wave: int, kills, *args: str, num_ps: int) -> None:
  """A first wave of `wave` messages, then one wave per task of `kills`, SIGKILLed while its wave flows (the chief
  once a checkpoint holds part of its wave: the chief started again resumes from a checkpoint of that wave), each wave
  committed before the next; then SIGTERM: exit 0, each message counted once in the last checkpoint (on every ps),
  none after them, and the group's offsets at the topic's end."""
  holder, bootstrap = online_stream.mock_cluster()
  online_stream.produce(bootstrap, range(wave))
  chief_wave_from = None
  with _online_run(tmp_path, subprocess_env, bootstrap, *args, num_ps=num_ps) as (
      launcher, model_dir, out, mark, alive):
    online_stream.wait_for(lambda: _checkpoints(model_dir), "a first checkpoint", 480, alive)
    for index, task in enumerate(kills, 1):
      ids = range(index * wave, (index + 1) * wave)
      if task == "chief:0":
        chief_wave_from = _kill_chief_in_a_checkpointed_wave(bootstrap, mark, model_dir, ids, alive)
      else:
        _kill_while_flowing(bootstrap, mark, task, ids, alive)
      _wait_committed(bootstrap, f"the wave of the {task} kill committed", alive)
    counts = _stop_and_count(launcher, bootstrap, mark, model_dir, out, alive)
  del holder
  messages = (len(kills) + 1) * wave
  np.testing.assert_array_equal(counts[:messages], np.ones(messages))  # every message applied once, none twice
  assert not counts[messages:].any()
  text = out.read_text()
  assert "Stopping at step" in text, text[-3000:]
  placements = {tuple(sorted(re.findall(r"/job:ps/replica:0/task:(\d+)/", line)))
                for line in re.findall(r"counting table on (.*)", text)}
  assert tuple(str(ps) for ps in range(num_ps)) in placements, placements  # a shard of the table on each ps
  for task in kills:
    expected = f"restarting {task} alone" if task.startswith("worker") else f"{task} failed; restarting the training"
    assert expected in text, text[-3000:]
  if chief_wave_from is not None:  # the chief started again resumed from a checkpoint of its wave
    resumed = re.search(r"Training on .* from step (\d+)", text[text.index("chief:0 failed"):])
    assert resumed and int(resumed.group(1)) > chief_wave_from, text[-3000:]


def test_the_estimator_path_in_async_mode_applies_each_message_once_across_worker_and_chief_kills(tmp_path,
                                                                                                 subprocess_env):
  """The Estimator path, async, 1 ps: a worker SIGKILLed while the second wave flows (the launcher restarts it
  alone), the chief while the third does once a checkpoint holds some of it (the launcher restarts the cluster; the
  chief resumes from its newest checkpoint and that checkpoint's offsets). Its ps kill is the geo run's."""
  _applied_once_across_kills(tmp_path, subprocess_env, WAVE, ["worker:1", "chief:0"], num_ps=1)


def test_the_keras_path_in_sync_mode_applies_each_message_once_across_worker_chief_and_ps_kills(tmp_path,
                                                                                               subprocess_env):
  """The Keras path (tfps.keras.online) in sync mode on 2 ps (each step one batch per worker slot, the table sharded
  over both): a worker SIGKILLed while the second wave flows, the chief while the third does once a checkpoint holds
  some of it, ps:1 while the fourth does."""
  _applied_once_across_kills(tmp_path, subprocess_env, WAVE // 2, ["worker:1", "chief:0", "ps:1"], "--path=keras",
                             "--sync_mode=sync", num_ps=2)  # waves of 10 sync steps of 2 batches of 8


def test_the_estimator_path_in_geo_mode_applies_each_message_once_across_worker_and_ps_kills(tmp_path,
                                                                                              subprocess_env):
  """The Estimator path in geo mode (rounds of 3 steps on a worker's copy, its difference pushed) on 2 ps, the table
  sharded over both: a worker SIGKILLed while the second wave flows, ps:1 while the third does."""
  _applied_once_across_kills(tmp_path, subprocess_env, WAVE, ["worker:1", "ps:1"], "--sync_mode=geo", num_ps=2)


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
  step 4 and the sidecar every checkpoint, the launcher's summary gives the stream, the last delta
  (--delta_export_secs) is at the last step and position, and the watch the chief ran (--serve_deltas) served it with
  its freshness, summed up in the launcher's summary."""
  slices, spec, written = _folder_stream(tmp_path)
  model_dir = tmp_path / "run"
  steps = -(-(128 - _held_out_lines(written)) // 16)
  text = _run_script(tmp_path, subprocess_env, ["--num_workers=1", "--evaluator"],
                     [f"--stream_folder={slices}", f"--feature_spec={spec}", f"--max_steps={steps}",
                      "--steps_per_execution=2", "--save_checkpoints_steps=4", "--stream_holdout_every=8",
                      "--stream_eval_every_steps=4", "--stream_idle_flush_secs=1", f"--model_dir={model_dir}",
                      "--delta_export_secs=0", f"--serve_deltas={tmp_path / 'serving'}"])
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
  served = delta_freshness.read(str(tmp_path / "serving"))
  assert served and served[-1]["version"] == last["version"] and served[-1]["freshness_secs"] > 0
  assert f"{delta_freshness.summary_line(served)} (served in {tmp_path / 'serving'}; tfps-report" in text, text


def test_the_online_script_on_the_keras_path_evaluates_windows_and_its_sidecar_ends_after_sigterm(tmp_path,
                                                                                                   subprocess_env):
  """scripts/train_online.py --stream=folder --path=keras under tfps-launch with its sidecar: Wide&Deep on the two
  slices with one message in about 8 held out, until every trained message is in a checkpoint; then SIGTERM to the
  chief: the run ends with exit 0 within seconds, the sidecar too (it saw FINAL: without it, it would wait an hour
  for a checkpoint), after evaluating the last checkpoint on its window; the chief evaluated the windows inline; the
  Keras model's metrics are in the progress lines; the last delta (--delta_export_secs) ships up to the stream's end."""
  slices, spec, written = _folder_stream(tmp_path)
  model_dir, held_out = tmp_path / "run", _held_out_lines(written)
  steps = -(-(128 - held_out) // 16)
  script = ["scripts/train_online.py", "--", "--stream=folder", "--data=csv", "--batch_size=16", "--deep_layers=8",
            "--embedding_dim=4", "--log_step_count_steps=2", "--path=keras", f"--stream_folder={slices}",
            f"--feature_spec={spec}", "--steps_per_execution=2", "--save_checkpoints_steps=4",
            "--stream_holdout_every=8", "--stream_eval_every_steps=4", "--stream_idle_flush_secs=1",
            "--delta_export_secs=0", f"--model_dir={model_dir}"]
  with _launch(tmp_path, subprocess_env, ["--num_workers=1", "--evaluator"], *script) as (launcher, out, mark, alive):
    online_stream.wait_for(lambda: steps in _checkpoints(model_dir), f"ckpt-{steps}", 480, alive)
    online_stream.wait_for(lambda: _task(mark, "chief:0"), "chief:0", 60, alive).send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    assert launcher.wait(timeout=120) == 0, out.read_text()[-3000:]
    ended_secs = time.monotonic() - stopped
  text = out.read_text()
  assert ended_secs < 30, (ended_secs, text[-3000:])
  assert "Stopping at step" in text and "newest held-out windows: step 4: auc " in text, text[-3000:]
  assert " | auc " in (model_dir / "loss.log").read_text()  # the Keras model's metrics in its lines
  latest = str(model_dir / "checkpoints" / f"ckpt-{steps}")
  assert stream_positions.read_positions(str(model_dir), latest) == {"folder": ["clicks-1.csv", 65]}
  last = deltas.read_manifest(str(sorted((model_dir / "deltas").iterdir())[-1]))  # --delta_export_secs: to the end
  assert last["stream"]["to"] == {"folder": ["clicks-1.csv", 65]} and last["version"] > 1, last
  sidecar = [json.loads(line) for line in (model_dir / "eval" / "metrics.jsonl").read_text().splitlines()]
  assert sidecar[-1]["step"] == steps and sidecar[-1]["metrics"]["examples"] == held_out
  assert 0 <= sidecar[-1]["metrics"]["auc"] <= 1
