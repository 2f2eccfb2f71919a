"""bench/runner.py: each bench run has its own folder of task logs; a process run alone whose measured windows are shorter than the sampling period still gets its
CPU (its own count); a task whose span holds fewer than two samples gets its CPU at the span's ends, interpolated."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position

# A benchmark that burns 50 ms of CPU inside its measured span (however long that takes on a busy machine), counts
# it itself, and writes its JSON.
_BENCHMARK = textwrap.dedent("""\
    import json, os, sys, time
    path = sys.argv[-1].split("=", 1)[1]
    time.sleep(1.0)  # long enough for samples before the span
    start, cpu = time.time(), sum(os.times()[:2])
    while sum(os.times()[:2]) - cpu < 0.05 and time.time() - start < 10:
      pass
    end = time.time()
    cores = (sum(os.times()[:2]) - cpu) / (end - start)
    with open(path, "w") as out:
      json.dump({"measured_span": [start, end], "process_cores": cores}, out)
    time.sleep(0.6)
    """)


def test_a_short_window_alone_gets_the_process_own_cpu(tmp_path):
  script = tmp_path / "bench.py"
  script.write_text(_BENCHMARK)
  result = runner.run([], log_dir=str(tmp_path / "logs"), script=str(script), timeout_secs=60)
  single = result["tasks"]["single:0"]
  assert single["peak_rss_bytes"] > 0
  assert single["cores"] == result["process_cores"] > 0  # its own count of a busy loop's CPU (a share of a core that
  # other processes may take most of)


def test_a_runs_environment_reaches_its_process(tmp_path):
  script = tmp_path / "bench.py"
  script.write_text("import json, os, sys\n"
                    "json.dump({'threads': os.environ.get('TF_NUM_INTRAOP_THREADS')}, open(sys.argv[-1][17:], 'w'))\n")
  result = runner.run([], log_dir=str(tmp_path / "logs"), script=str(script), timeout_secs=60,
                      env={"TF_NUM_INTRAOP_THREADS": "1"})
  assert result["threads"] == "1"


def test_a_span_between_two_samples_gets_the_cpu_interpolated_at_its_ends():
  # (time, CPU seconds, peak RSS, network bytes, RSS): 0.5 cores until t=10.5, then 1 core; the span holds no sample.
  series = [(10.0, 2.0, 1, 0, 1), (10.5, 2.25, 1, 0, 1), (11.0, 2.75, 1, 0, 1)]
  assert runner._task_summary(series, [10.6, 10.9])["cores"] == pytest.approx(1.0)
  assert runner._task_summary(series, [10.25, 10.75])["cores"] == pytest.approx(0.75)  # 0.125 + 0.25 CPU s in 0.5 s
  assert runner._task_summary(series, [10.0, 10.5])["cores"] == pytest.approx(0.5)  # two samples inside: theirs
  assert "cores" not in runner._task_summary(series, [10.6, 11.2])  # no sample after the span's end


def test_a_tasks_rss_is_that_of_its_last_sample_that_has_one():
  # The last sample of a task that has just exited reads no RSS from /proc.
  series = [(10.0, 2.0, 300, 0, 200), (10.5, 2.25, 500, 0, 450), (11.0, 2.5, 500, 0, 0)]
  summary = runner._task_summary(series, None)
  assert summary["peak_rss_bytes"] == 500 and summary["rss_bytes"] == 450


def test_each_bench_run_has_its_own_log_folder(tmp_path):
  """Two benches at once (or a bench and a test) once wrote their task logs into one /tmp/tfps_bench_logs."""
  env = {name: value for name, value in os.environ.items() if name != "TFPS_BENCH_LOGS"}
  env["TMPDIR"] = str(tmp_path)  # the folders made go there
  code = "from bench import runner; print(runner.log_dir('scale_a'))"
  given = str(tmp_path / "given")
  runs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=run_env, stdout=subprocess.PIPE, text=True)
          for run_env in (env, env, dict(env, TFPS_BENCH_LOGS=given))]
  (printed_a, folder_a), (printed_b, folder_b), outputs = [run.communicate(timeout=60)[0].splitlines() for run in runs]
  assert folder_a != folder_b
  for printed, folder in ((printed_a, folder_a), (printed_b, folder_b)):
    root = os.path.dirname(folder)
    assert printed == f"task logs: {root}" and os.path.isdir(root)
    assert os.path.basename(folder) == "scale_a" and os.path.dirname(root) == str(tmp_path)
  assert outputs == [os.path.join(given, "scale_a")]  # as the bench tests choose it, nothing printed


def test_a_runs_folder_is_kept_only_where_asked(tmp_path):
  """`bench/worker_kills.py --keep_inexact`: the folder of a run not exact on every ps, copied before it is removed."""
  run = tmp_path / "run"
  (run / "logs").mkdir(parents=True)
  (run / "logs" / "ps-0.log").write_text("the ps's last lines")
  assert runner.keep_folder(str(run), None, "run_1") is None
  kept = runner.keep_folder(str(run), str(tmp_path / "kept"), "run_3")
  assert kept == str(tmp_path / "kept" / "run_3")
  assert (tmp_path / "kept" / "run_3" / "logs" / "ps-0.log").read_text() == "the ps's last lines"
