"""examples/online.py under tfps-launch as the README gives it, on its short schedule (`--clicks_per_phase=6000`):
after each of the two drifts of its planted click model the AUC on the newest held-out clicks falls, then recovers
before the next drift or the end; delta exports appear; the run exits 0 and leaves no process."""

import json
import pathlib
import subprocess
import sys
import uuid

import pytest

import marked_processes

REPO = pathlib.Path(__file__).resolve().parents[1]
RECOVERED_AUC = 0.72  # each phase's best of its last two evaluations reaches it
FALL = 0.12  # a drift's lowest evaluation is this far below the best of the last two before it, and they above it

pytestmark = pytest.mark.slow


def _run_example(tmp_path, subprocess_env) -> str:
  """The example's output (stdout and stderr) after it exited 0; no process of the run is left (a failure names any)."""
  mark, out = uuid.uuid4().hex, tmp_path / "out.txt"
  env = dict(subprocess_env, TMPDIR=str(tmp_path), **{marked_processes.MARK: mark})  # the run's folder: in tmp_path
  with open(out, "w", encoding="utf-8") as output:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfps.cli.launch", "--num_ps=1", "--num_workers=2", f"--log_dir={tmp_path / 'logs'}",
         "examples/online.py", "--", "--clicks_per_phase=6000"],
        cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
  try:
    code = launcher.wait(timeout=300)
  finally:
    left = marked_processes.end_launch(launcher, mark)
  assert not left, f"processes left behind: {left}"
  assert code == 0, out.read_text()[-3000:]
  return out.read_text()


def _lines(text: str, key: str) -> list:
  """The example's JSON lines that have `key`."""
  found = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
  return [line for line in found if key in line]


def test_the_online_example_falls_at_each_drift_and_recovers_and_exports_deltas(tmp_path, subprocess_env):
  text = _run_example(tmp_path, subprocess_env)
  evaluations, drifts = _lines(text, "newest_window_auc"), _lines(text, "drift")
  assert [d["drift"] for d in drifts] == [1, 2], text[-3000:]
  phases = [e["phase"] for e in evaluations]
  assert phases == sorted(phases) and all(phases.count(p) >= 3 for p in range(3)), evaluations
  auc = {p: [e["newest_window_auc"] for e in evaluations if e["phase"] == p] for p in range(3)}
  for phase in range(3):
    assert max(auc[phase][-2:]) >= RECOVERED_AUC, (phase, auc)  # learnt before the next drift, or the end
  for drift in (1, 2):
    assert min(auc[drift]) <= max(auc[drift - 1][-2:]) - FALL, (drift, auc)  # the drift shows
    assert max(auc[drift][-2:]) >= min(auc[drift]) + FALL, (drift, auc)  # and is recovered from
  deltas = _lines(text, "delta")
  assert [d["delta"] for d in deltas] == list(range(1, len(deltas) + 1)) and len(deltas) >= 2, deltas
  assert deltas[-1]["step"] >= evaluations[-1]["step"], (deltas, evaluations)  # the last one at the end of training
  assert all(d["rows_changed"] > 0 and pathlib.Path(d["folder"]).is_dir() for d in deltas), deltas
