"""bench/quality.py end to end in a tiny mode: both sides (one process, and tfps-launch with 2 workers and 2 ps) train
at once, and the report has every model's metrics, finite and in range, and no process is left behind."""

import json
import math
import pathlib
import subprocess
import sys

import pytest

import needs
REPO = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_quality_bench_writes_both_sides_metrics(tmp_path, shared_data, subprocess_env, processes_naming):
  data_dir = shared_data / "ml-100k"
  needs.require((data_dir / "u1.base").is_file(), f"MovieLens 100K at {data_dir}")
  out = tmp_path / "quality.json"
  command = [sys.executable, "bench/quality.py", f"--data_dir={data_dir}", "--epochs=1", "--retrieval_epochs=2",
             "--max_rows=2000", "--seeds=0", "--models=wide_deep,retrieval", f"--json_out={out}",
             f"--logs={tmp_path / 'logs'}", "--sides_at_once", "--tfps_flags=--pipelined_updates"]
  result = subprocess.run(command, cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=400)
  try:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["settings"]["steps_per_epoch"] == 2000 // 256 and report["settings"]["shuffle_buffer"] == 100_000
    assert report["tfps_cluster"] == {"num_workers": 2, "num_ps": 2, "min_shard_bytes": 48 << 10,
                                      "flags": ["--pipelined_updates"]}
    assert "(async, updates pipelined)" in (tmp_path / "logs" / "tfps" / "chief-0.log").read_text()
    rows = {(row["model"], row["metric"]): row for row in report["comparison"]}
    assert set(rows) == {("wide_deep", "auc"), ("retrieval", "top_10"), ("retrieval", "top_100")}
    for row in rows.values():
      for side in ("single", "tfps"):
        assert 0.0 <= row[side]["mean"] <= 1.0 and len(row[side]["values"]) == 1, row
      assert math.isfinite(row["diff"])
    assert isinstance(rows[("wide_deep", "auc")]["holds"], bool) and "relative_diff" in rows[("retrieval", "top_100")]
    for side in ("single", "tfps"):
      assert [run["model"] for run in report[side]] == ["wide_deep", "retrieval"]
      assert report[side][1]["examples"] == 20_000  # every u1.test pair ranked against all movies
      # the retrieval model trains its own number of epochs
      assert [run["optimizer_steps"] for run in report[side]] == [2000 // 256, 2 * (2000 // 256)]
    assert "| wide_deep | auc |" in result.stdout
  finally:
    leftovers = processes_naming(str(tmp_path))
    for process in leftovers:
      process.kill()
    assert not leftovers, f"processes left behind: {leftovers}"
