"""bench/transfers.py: the tensors a training step moves between ps and worker, counted in the partitioned graphs
TensorFlow runs; the Estimator path moves no more per step than the Keras path (the same runner, and its step count
made on the ps: no round trip to the worker)."""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _count(path: str, out: pathlib.Path, env: dict) -> dict:
  command = [sys.executable, "bench/transfers.py", f"--path={path}", f"--json_out={out}"]
  result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return json.loads(out.read_text())


def test_estimator_step_moves_no_more_tensors_than_the_keras_step(tmp_path, subprocess_env):
  estimator = _count("estimator", tmp_path / "estimator.json", subprocess_env)
  fit = _count("fit", tmp_path / "fit.json", subprocess_env)
  for counted in (estimator, fit):
    assert "job:ps" in counted["file"] and "_steps_" in counted["file"]
    # Every step reads the 10 dense weights and looks up the 2 tables on the ps, and sends their gradients there.
    assert counted["per_step"]["send"] >= 12 and counted["per_step"]["recv"] >= 3, counted
  total = lambda counted: counted["per_step"]["send"] + counted["per_step"]["recv"]
  assert total(estimator) <= total(fit), (estimator["per_step_names"], fit["per_step_names"])
  # The step count is made on the ps: nothing the worker casts comes back to the ps after the updates.
  assert not [name for name in estimator["per_step_names"] if name.startswith("_Recv") and "/Cast" in name]
