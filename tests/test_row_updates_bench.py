"""bench/row_updates.py: one update of a table's rows by TensorFlow's kernel, rows at once under the lock, without
it, and under it without the optimizer's sum per row, in one process; every variant leaves the kernel's values. And
bench/gathers.py: one gather of a batch's rows."""

import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_every_variant_is_timed_and_leaves_the_kernels_values(subprocess_env):
  command = [sys.executable, "bench/row_updates.py", "--rows=5000", "--batch_rows=300", "--applies=3", "--repeats=2"]
  result = subprocess.run(command, cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  rows = {match[0]: match[1:] for match in re.findall(r"^\| (\w+) \| ([\d.]+) \(([\d., ]+)\) \| ([\d.]+) \| (\w+) \|$",
                                                        result.stdout, re.M)}
  assert set(rows) == {"kernel", "locked", "lockfree", "unsummed"}, result.stdout
  for variant, (median, runs, ratio, same) in rows.items():
    assert float(median) > 0 and len(runs.split(", ")) == 2 and same == "yes", (variant, result.stdout)
  assert rows["kernel"][2] == "1.00"


def test_gathers_bench_times_cold_and_hot_rows_and_the_call_alone(subprocess_env):
  command = [sys.executable, "bench/gathers.py", "--rows=20000", "--batch_rows=500", "--calls=3",
             "--intra_op_threads=1"]
  result = subprocess.run(command, cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "500 rows per gather from a 20,000 x 16 table, intra-op threads 1" in result.stdout, result.stdout
  rows = dict(re.findall(r"^\| (cold|hot|overhead) \| ([\d.]+) \| [\d.]+ \|$", result.stdout, re.M))
  assert set(rows) == {"cold", "hot", "overhead"} and all(float(cpu) >= 0 for cpu in rows.values()), result.stdout
