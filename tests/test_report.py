"""Run records, the launcher's summary and tfps-report on records written by hand (no TensorFlow, no cluster)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tfps.cluster import summary as summary_lib
from tfps.report import cli
from tfps.report import series as series_lib
from tfps import run_records
from tfps.training import delta_freshness

REPO = pathlib.Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(model_dir: pathlib.Path):
  """A run of 3 epochs x 100 steps with a restart at ~step 150, as tfps.fit and tfps-launch write it."""
  recorder = run_records.RunRecorder(str(model_dir), batch_size=32)
  progress = [(50, 0.69, 900.0), (100, 0.60, 950.0), (150, 0.55, 1000.0), (250, 0.50, 800.0)]
  for step, loss, speed in progress:
    recorder.progress(step, {"loss": loss}, speed)
  for step, loss, auc in [(100, 0.62, 0.70), (200, 0.55, 0.75), (300, 0.50, 0.80)]:
    recorder.progress(step, {"loss": loss, "auc": auc})
    recorder.validation(step, {"loss": loss + 0.01, "auc": auc - 0.01})
  (model_dir / "eval").mkdir()
  with open(model_dir / "eval" / "metrics.jsonl", "w") as f:
    for number, auc in [(1, 0.69), (2, 0.74), (3, 0.79)]:
      f.write(json.dumps({"checkpoint": f"{model_dir}/checkpoints/ckpt-{number}", "checkpoint_number": number,
                          "step": 100 * number, "metrics": {"loss": 0.7 - auc / 3, "auc": auc}}) + "\n")
  (model_dir / "best").mkdir()
  (model_dir / "best" / "best.json").write_text(json.dumps(
      {"checkpoint": f"{model_dir}/checkpoints/ckpt-3", "copy": f"{model_dir}/best/ckpt-3", "metric": "auc",
       "value": 0.79, "step": 300}))
  records = run_records.read_jsonl(str(model_dir / "run" / "progress.jsonl"))
  restart_time = (records[2]["time"] + records[3]["time"]) / 2  # between the step-150 and step-250 lines
  summary_lib.record_restarts(str(model_dir), [{"time": restart_time, "restart": 1, "task": "ps:0",
                                                "cause": "ps:0 was killed by SIGKILL",
                                                "restarted": "ps, workers, chief"}])
  recorder.finish(300, {"loss": 0.5, "auc": 0.8, "val_loss": 0.51, "val_auc": 0.79}, export_dir=str(model_dir / "x"))


def test_series_are_the_records(tmp_path):
  write_run(tmp_path)
  run = run_records.read_run(str(tmp_path))
  report = series_lib.build_series(run)
  assert list(report.panels) == ["loss", "auc", "examples/s"]
  training_loss, validation_loss, sidecar_loss = report.panels["loss"]
  train = [r for r in run["progress"] if r["kind"] == "train"]
  assert sorted(zip(training_loss.steps, training_loss.values)) == sorted(
      (r["step"], r["metrics"]["loss"]) for r in train)
  assert validation_loss.steps == [100, 200, 300] and validation_loss.values == pytest.approx([0.63, 0.56, 0.51])
  assert sidecar_loss.steps == [e["step"] for e in run["evaluations"]]
  assert [c.values for c in report.panels["auc"]][2] == [0.69, 0.74, 0.79]
  assert report.panels["examples/s"][0].label == "examples/s while training (no evaluations or checkpoints)"
  assert report.panels["examples/s"][0].steps == [50, 100, 150, 250]
  assert report.panels["examples/s"][0].values == [900.0, 950.0, 1000.0, 800.0]
  assert report.restart_steps == [150] and report.restart_labels == ["ps:0 was killed by SIGKILL"]


def test_report_is_a_png(tmp_path):
  write_run(tmp_path)
  path = cli.write_report(str(tmp_path), str(tmp_path / "r.png"))
  data = pathlib.Path(path).read_bytes()
  assert data[:8] == PNG_MAGIC and len(data) > 20_000
  width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
  assert (width, height) == (900, 960)  # 9 x (3 panels x 3.2) inches at 100 dpi


def test_summary_lines(tmp_path):
  write_run(tmp_path)
  lines = summary_lib.summary_lines(str(tmp_path), [{"restart": 1, "cause": "ps:0 was killed by SIGKILL",
                                                     "restarted": "ps, workers, chief"}], launch_secs=75)
  text = "\n".join(lines)
  assert lines[0].startswith("steps 300 in ") and "launch wall time 1m15s" in lines[0]
  assert "of wall time (training with its evaluations and checkpoints), " in lines[0]
  assert "examples/s over it" in lines[0]
  # what tfps-report plots: the progress records' rates, training alone
  assert lines[1] == ("training alone (no evaluations or checkpoints): 925 examples/s, the median of 4 progress "
                      "records (tfps-report's examples/s)")
  assert "final training metrics: auc 0.8000 | loss 0.5000" in text
  assert "final validation metrics: auc 0.7900 | loss 0.5100" in text
  assert f"sidecar best checkpoint: {tmp_path}/checkpoints/ckpt-3 (step 300): auc 0.7900" in text
  assert f"sidecar evaluations: 3 in {tmp_path}/eval; last at step 300: auc 0.7900 | loss 0.4367" in text
  assert "restarts: 1\n  1. ps:0 was killed by SIGKILL; restarted ps, workers, chief" in text
  assert f"checkpoints: {tmp_path}/checkpoints" in text and f"export: {tmp_path}/x" in text


def run_report(*args, prelude=""):
  code = f"{prelude}import sys; from tfps.report import cli; cli.run(['tfps-report', *sys.argv[1:]])"
  return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_report_command_errors_are_one_line(tmp_path):
  none = run_report()
  assert none.returncode == 2 and none.stderr == (
      "tfps-report: give one MODEL_DIR (got 0 arguments); usage: tfps-report MODEL_DIR [--out FILE.png] "
      "[--serving DIR]\n")
  bad_flag = run_report("--bogus", str(tmp_path))
  assert bad_flag.returncode == 2 and bad_flag.stderr == "tfps-report: Unknown command line flag 'bogus'\n"
  missing = run_report(str(tmp_path / "nope"))
  assert missing.returncode == 2 and missing.stderr.strip() == (
      f"tfps-report: model_dir '{tmp_path / 'nope'}' is not a directory")
  empty = run_report(str(tmp_path))
  assert empty.returncode == 2 and "no run records in" in empty.stderr and len(empty.stderr.splitlines()) == 1
  write_run(tmp_path)
  no_matplotlib = run_report(str(tmp_path), prelude="import sys; sys.modules['matplotlib'] = None; ")
  assert no_matplotlib.returncode == 2
  assert no_matplotlib.stderr.strip() == "tfps-report: " + cli.plot.INSTALL_HINT
  for out, said in [(tmp_path, f"--out '{tmp_path}' is a folder; give the path of a .png file"),
                    ("/proc/nope/x.png", "--out '/proc/nope/x.png' cannot be written (No such file or directory)")]:
    refused = run_report(str(tmp_path), f"--out={out}")
    assert refused.returncode == 2 and refused.stderr == f"tfps-report: {said}\n", refused.stderr
  with open(tmp_path / "run" / run_records.PROGRESS_FILE, "a", encoding="utf-8") as f:
    f.write('{"step": 7, "kind": "train", "metrics": {"loss": 0.7}}\n')  # a record without its time
  written = run_report(str(tmp_path))
  assert written.returncode == 0, written.stderr
  assert (tmp_path / "run" / "report.png").read_bytes()[:8] == PNG_MAGIC


def write_stream_run(model_dir: pathlib.Path):
  """A stream run as tfps.estimator.online writes it: progress lines with the lag, two window evaluations, the
  stream's part of the summary."""
  recorder = run_records.RunRecorder(str(model_dir))
  for step, lag_messages, lag_secs in [(10, 500, 4.0), (20, 120, 1.5), (30, 0, 0.0)]:
    recorder.progress(step, {"loss": 0.6, "lag_secs": lag_secs, "malformed_records": 1, "lag_messages": lag_messages},
                      2000.0)
  for step, auc in [(20, 0.71), (30, 0.74)]:
    run_records.record_window(str(model_dir), step, {"loss": 0.55, "auc": auc, "examples": 200},
                              {"messages": 200, "newest": "clicks/3@117", "newest_time": 1.7e9, "held_out": 210,
                               "positions": {"3": 118}})
  recorder.finish(30, {"loss": 0.6}, examples=7680)
  run_records.add_to_summary(str(model_dir), "stream", {
      "stream": "kafka clicks@h:1", "messages_applied": 7680, "held_out": 210, "lag_secs": 0.0, "lag_messages": 0,
      "malformed_records": 1, "last_windows": [{"step": 20, "loss": 0.55, "auc": 0.71, "examples": 200},
                                               {"step": 30, "loss": 0.55, "auc": 0.74, "examples": 200}]})


def test_a_stream_run_shows_its_lag_and_its_windows(tmp_path):
  write_stream_run(tmp_path)
  run = run_records.read_run(str(tmp_path))
  report = series_lib.build_series(run)
  assert list(report.panels) == ["loss", "auc", "examples/s", "lag (messages)", "lag (seconds)"]
  assert report.panels["lag (messages)"][0].values == [500, 120, 0]
  assert report.panels["lag (seconds)"][0].steps == [10, 20, 30]
  window_auc, = report.panels["auc"]
  assert window_auc.label.startswith("window auc") and window_auc.values == [0.71, 0.74]
  table = series_lib.window_table(run)
  assert table[0].split() == ["step", "time", "(UTC)", "messages", "newest", "message", "loss", "auc"]
  assert table[2].split()[0] == "30" and table[2].split()[-4:] == ["200", "clicks/3@117", "0.5500", "0.7400"]
  text = "\n".join(summary_lib.summary_lines(str(tmp_path), [], launch_secs=10))
  assert ("stream kafka clicks@h:1: 7,680 messages applied in this run, 210 held out, 1 malformed; final lag 0 "
          "messages and 0.0 s") in text
  assert "newest held-out windows: step 20: auc 0.7100 loss 0.5500; step 30: auc 0.7400 loss 0.5500" in text
  printed = run_report(str(tmp_path))
  assert printed.returncode == 0, printed.stderr
  assert printed.stdout.splitlines()[0] == "evaluations on the newest held-out window of the stream:"
  assert printed.stdout.splitlines()[3].split()[0] == "30"


def test_a_stream_run_with_served_deltas_shows_their_freshness(tmp_path):
  """`--serving`: the freshness records `tfps-delta watch` wrote, plotted at their steps and tabled; a version whose
  delta holds no write times is a line of its own; a serving folder that is not one is refused in one line."""
  write_stream_run(tmp_path / "run_dir")
  serving = tmp_path / "serving"
  serving.mkdir()
  for version, step, oldest, newest in [(1, 10, 100.0, 101.5), (2, 20, 103.0, 104.0)]:
    delta_freshness.append(str(serving), {
        "version": version, "step": step, "swapped_at": 106.0 + version, "deltas": [version],
        "written": {"oldest": oldest, "newest": newest}, "exported_at": 105.0 + version,
        "freshness_secs": 106.0 + version - oldest, "newest_freshness_secs": 106.0 + version - newest})
  delta_freshness.append(str(serving), {"version": 3, "step": 30, "swapped_at": 110.0, "deltas": [3],
                                        "missing": ["delta-000003"]})
  records = delta_freshness.read(str(serving))
  report = series_lib.build_series(run_records.read_run(str(tmp_path / "run_dir")), records)
  oldest, newest = report.panels[series_lib.FRESHNESS_PANEL]
  assert (oldest.steps, oldest.values, newest.values) == ([10, 20], [7.0, 5.0], [5.5, 4.0])
  printed = run_report(str(tmp_path / "run_dir"), f"--serving={serving}")
  assert printed.returncode == 0, printed.stderr
  lines = printed.stdout.splitlines()
  start = lines.index("served versions (tfps-delta watch):")
  assert lines[start + 1].split()[:2] == ["version", "step"]
  assert lines[start + 2].split()[:2] == ["1", "10"] and lines[start + 2].split()[-4:] == ["7.00", "5.50", "6.00",
                                                                                           "1.00"]
  assert lines[start + 4].endswith("freshness not measured: delta-000003 holds no write times of its stream's "
                                   "examples (written by an older tfps, which did not record them)")
  assert lines[start + 5] == ("freshness of 2 served version(s), from an example's write to the version serving it: "
                              "median 6.00 s, worst 7.00 s (1 version(s) without write times)")
  missing = run_report(str(tmp_path / "run_dir"), f"--serving={tmp_path / 'nope'}")
  assert missing.returncode == 2 and missing.stderr == (
      f"tfps-report: --serving '{tmp_path / 'nope'}' is not a directory (give the folder tfps-delta watch --serving= "
      "keeps current)\n")
