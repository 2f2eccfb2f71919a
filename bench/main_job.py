"""The main job as the README describes it, measured: `bash scripts/main.sh` (after set-up), then what it wrote.

Writes bench/results/main_job.json: the launch's wall time (the launcher's summary), the chief's `Final:` line, the
run's summary and progress records (`/tmp/tfps_main/run/`) and the sidecar's best checkpoint (`best/best.json`);
tests/test_figures.py checks the README's prose on the main job against it.
  .venv/bin/python bench/main_job.py --machine="otherwise idle"     # about 45 s on an idle 2-core machine
  .venv/bin/python bench/main_job.py --model_dir=/tmp/tfps_main --launch_wall_secs=43 --date=2026-11-27 \
      --machine="..."                        # a run made already, recorded as it is (its launch wall time as read)
"""

import datetime
import json
import os
import re
import subprocess
import sys
from typing import Optional

from absl import app
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN_MODEL_DIR = "/tmp/tfps_main"  # scripts/main.sh's run
CHIEF_LOG = os.path.join(ROOT, "logs", "main", "chief-0.log")
_LAUNCH_WALL = re.compile(r"launch wall time (?:(\d+)h)?(?:(\d+)m)?(\d+)s")

_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Record this finished run of the main job instead of running "
                                 "scripts/main.sh (give --launch_wall_secs).")
_WALL = flags.DEFINE_float("launch_wall_secs", None, "With --model_dir: the launch's wall time, as its summary said.")
_DATE = flags.DEFINE_string("date", None, "With --model_dir: the day it ran (default: today).")
_MACHINE = flags.DEFINE_string("machine", "", "What else the machine ran meanwhile, written beside the figures.")
_OUT = flags.DEFINE_string("out", os.path.join(ROOT, "bench", "results", "main_job.json"), "Result JSON.")


def launch_wall_secs(stdout: str) -> float:
  """The launch wall time the launcher's summary gives (`launch wall time 43s`, `1m05s`)."""
  found = _LAUNCH_WALL.findall(stdout)
  if not found:
    raise RuntimeError(f"no launch wall time in the launcher's output:\n{stdout[-3000:]}")
  hours, minutes, seconds = (int(part or 0) for part in found[-1])
  return float(hours * 3600 + minutes * 60 + seconds)


def final_line(log_path: str) -> Optional[str]:
  """The chief's last `Final: ...` line (scripts/train.py), without its log prefix."""
  if not os.path.exists(log_path):
    return None
  with open(log_path, encoding="utf-8", errors="replace") as log:
    lines = [line.strip() for line in log if "] Final: " in line or line.startswith("Final: ")]
  return lines[-1][lines[-1].index("Final: "):] if lines else None


def read_json(path: str):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def record(model_dir: str, wall_secs: float, date: str, chief_line: Optional[str]) -> dict:
  """The results of the main job's run in `model_dir`."""
  with open(os.path.join(model_dir, "run", "progress.jsonl"), encoding="utf-8") as f:
    progress = [json.loads(line) for line in f if line.strip()]
  return {"date": date, "machine": _MACHINE.value, "command": "bash scripts/main.sh", "launch_wall_secs": wall_secs,
          "final_line": chief_line, "summary": read_json(os.path.join(model_dir, "run", "summary.json")),
          "progress": progress, "best": read_json(os.path.join(model_dir, "best", "best.json"))}


def main(argv):
  del argv
  if _MODEL_DIR.value:
    if _WALL.value is None:
      raise app.UsageError("--model_dir records a run made already: give its --launch_wall_secs")
    results = record(_MODEL_DIR.value, _WALL.value, _DATE.value or datetime.date.today().isoformat(), None)
  else:
    run = subprocess.run(["bash", os.path.join(ROOT, "scripts", "main.sh")], cwd=ROOT, capture_output=True,
                         text=True, check=False)
    if run.returncode != 0:
      raise RuntimeError(f"scripts/main.sh exited {run.returncode}:\n{run.stderr[-3000:]}")
    results = record(MAIN_MODEL_DIR, launch_wall_secs(run.stdout), datetime.date.today().isoformat(),
                     final_line(CHIEF_LOG))
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  print(json.dumps({key: results[key] for key in ("date", "launch_wall_secs", "final_line")}))


if __name__ == "__main__":
  app.run(main)
