"""bench/dynamic_embedding_measured.py end to end at tiny sizes: both sides trained, evaluated and reported."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "dynamic_embedding_measured.py")


@pytest.mark.slow
def test_dynamic_and_hashed_sides_are_trained_evaluated_and_reported(tmp_path, shared_data):
  out = tmp_path / "measured.json"
  env = dict(os.environ, TFPS_BENCH_LOGS=str(tmp_path / "logs"))
  completed = subprocess.run(
      [sys.executable, SCRIPT, "--experiments=movielens,criteo", "--single_process", "--seeds=0",
       "--reference_fraction=0", "--movielens_epochs=2", "--movielens_steps=10", f"--data_dir={shared_data / 'ml-100k'}",
       "--criteo_rows=4000", "--criteo_eval_rows=1024", "--vocab_per_column=2000", f"--json_out={out}"],
      capture_output=True, text=True, timeout=400, env=env, check=False, cwd=REPO)
  assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]
  experiments = json.loads(out.read_text())["experiments"]

  movielens = experiments["movielens"]
  assert [run["table"] for run in movielens["runs"]] == ["hashed", "dynamic"]
  for run in movielens["runs"]:
    assert 0.3 < run["auc"] < 1 and run["examples_per_sec"] > 0
    assert run["distinct_ids"] == {"user_id": 943, "movie_id": 1682}
    assert run["table_rows"] == {"user_id": 236, "movie_id": 420}  # a quarter of the distinct ids
  dynamic = movielens["runs"][1]["tables"]
  assert dynamic["user_id_table"]["occupancy"] == 236  # every row taken, the rest of the users fall back
  assert dynamic["user_id_table"]["fallbacks"] > 0
  summary = movielens["summary"]
  assert summary["auc_dynamic_minus_hashed"] == pytest.approx(summary["dynamic"] - summary["hashed"])

  criteo = experiments["criteo"]["summary"]
  assert 4000 < criteo["distinct_ids"] <= 4000 * 26
  assert criteo["table_rows"] == round(criteo["distinct_ids"] / 4)
  assert set(criteo["auc"]) == {"hashed", "dynamic"} and all(0.3 < auc < 1 for auc in criteo["auc"].values())
  assert criteo["dynamic_table"]["occupancy"] == criteo["table_rows"]
  assert sum(sum(rows) for rows in criteo["dynamic_shard_rows_in_use"].values()) == criteo["table_rows"]
  assert criteo["step_secs"]["hashed"] > 0 and criteo["step_secs"]["dynamic"] > 0


@pytest.mark.slow
def test_bf16_rows_halve_most_of_a_dynamic_tables_traffic(tmp_path):
  out = tmp_path / "bf16.json"
  env = dict(os.environ, TFPS_BENCH_LOGS=str(tmp_path / "logs"))
  result = subprocess.run(
      [sys.executable, SCRIPT, "--experiments=bf16_rows", "--bf16_rows_rows=20000", "--bf16_rows_repeats=1",
       "--vocab_per_column=10000", f"--json_out={out}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  summary = json.loads(out.read_text())["experiments"]["bf16_rows"]["summary"]
  # Rows and their gradients are most of the ps's bytes: both as bfloat16 measured 0.68 of float32's at this size,
  # the gradients alone 0.83 (the rows crossed as float32 before 2026-11-27).
  assert 0.5 < summary["bytes_bf16_vs_float32"] < 0.76, summary
  assert summary["bf16_rows"]["examples_per_sec"] > 0 and summary["float32"]["examples_per_sec"] > 0


def test_bf16_rows_need_a_cluster():
  result = subprocess.run([sys.executable, SCRIPT, "--experiments=bf16_rows", "--single_process"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1].endswith(
      "--experiments=bf16_rows measures the ps's traffic: it needs a cluster, not --single_process")
