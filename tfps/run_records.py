"""Run records: what a training run did, as JSON files in `model_dir/run/`, for the launcher's summary and tfps-report.

- `progress.jsonl`: one record per progress line and per evaluation of the chief:
  `{"time", "step", "kind": "train"|"validation"|"window", "metrics": {...}, "examples_per_sec"?, "window"?}`
  (`window`: an evaluation on a stream's held-out window, with what the window is);
- `summary.json`: written when training ends: steps, wall time, examples/s, final metrics, where things are;
- `restarts.jsonl`: one record per restart by `tfps-launch`: `{"time", "restart", "task", "cause"}`.
The sidecar evaluator's records stay in `model_dir/eval/metrics.jsonl` (`step` is the optimizer step of the
checkpoint, `checkpoint_number` its number) and its best checkpoint in `model_dir/best/best.json`.

Written by the chief with plain file I/O (a local or mounted model_dir). Imports no TensorFlow.
"""

import json
import os
import time
from typing import Dict, List, Optional

RUN_SUBDIR = "run"
PROGRESS_FILE = "progress.jsonl"
SUMMARY_FILE = "summary.json"
RESTARTS_FILE = "restarts.jsonl"
LAUNCH_DIR_ENV = "TFPS_LAUNCH_LOG_DIR"  # set by tfps-launch: where the chief says which model_dir it trains
MODEL_DIR_POINTER = "model_dir.json"
VALIDATION_PREFIX = "val_"
WINDOW_KIND = "window"


def run_dir(model_dir: str) -> str:
  return os.path.join(model_dir, RUN_SUBDIR)


def progress_path(model_dir: str) -> str:
  return os.path.join(run_dir(model_dir), PROGRESS_FILE)


def append_jsonl(path: str, record: dict) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "a", encoding="utf-8") as f:
    f.write(json.dumps(record) + "\n")


def read_jsonl(path: str) -> List[dict]:
  """The records of a JSON-lines file ([] if it does not exist); a torn last line (a killed writer) is skipped."""
  if not os.path.exists(path):
    return []
  records = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return records


def read_json(path: str) -> Optional[dict]:
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


class RunRecorder:
  """Writes the chief's run records into `model_dir/run/`; one per training call.

  Args:
    model_dir: the run's model_dir.
    batch_size: examples per step, for examples/s in the summary (None: steps/s only).
    start_step: the optimizer step training starts (or resumes) at.
  """

  def __init__(self, model_dir: str, *, batch_size: Optional[int] = None, start_step: int = 0):
    self.model_dir = model_dir
    self.batch_size = batch_size
    self.start_step = start_step
    self._start = time.time()
    os.makedirs(run_dir(model_dir), exist_ok=True)
    summary_path = os.path.join(run_dir(model_dir), SUMMARY_FILE)
    if os.path.exists(summary_path):  # a previous run's: this one writes its own at its end
      os.remove(summary_path)
    tell_launcher(model_dir)

  def progress(self, step: int, metrics: Dict[str, float], examples_per_sec: Optional[float] = None) -> None:
    """A training progress record (the metrics are running means of the current epoch or interval)."""
    record = {"time": time.time(), "step": int(step), "kind": "train", "metrics": _floats(metrics)}
    if examples_per_sec is not None:
      record["examples_per_sec"] = float(examples_per_sec)
    append_jsonl(os.path.join(run_dir(self.model_dir), PROGRESS_FILE), record)

  def validation(self, step: int, metrics: Dict[str, float]) -> None:
    """An inline evaluation by the chief, at optimizer step `step`."""
    record_validation(self.model_dir, step, metrics)

  def finish(self, step: int, final_metrics: Dict[str, float], examples: Optional[int] = None, **where: str) -> dict:
    """Writes `summary.json` at the end of training; `examples` trained in this run (default: steps x batch size);
    `where` adds locations (e.g. tensorboard=...)."""
    wall_secs = time.time() - self._start
    steps_run = max(int(step) - self.start_step, 0)
    if examples is None and self.batch_size:
      examples = steps_run * self.batch_size
    summary = {"steps": int(step), "steps_this_run": steps_run, "wall_secs": wall_secs,
               "steps_per_sec": steps_run / wall_secs if wall_secs > 0 else None,
               "examples_per_sec": examples / wall_secs if examples is not None and wall_secs > 0 else None,
               "final_metrics": {**_floats(final_metrics), **self._measured_during_run()},
               "model_dir": os.path.abspath(self.model_dir),
               "checkpoints": os.path.abspath(os.path.join(self.model_dir, "checkpoints")),
               **{key: os.path.abspath(value) for key, value in where.items() if value}}
    write_summary(self.model_dir, summary)
    return summary

  def _measured_during_run(self) -> Dict[str, float]:
    """Metrics `update_summary` added while training ran (inline evaluations after checkpoints)."""
    return final_metrics(self.model_dir)


def tell_launcher(model_dir: str) -> None:
  """Under tfps-launch: tells it the run's model_dir (its end-of-run summary reads the run records there)."""
  launch_dir = os.environ.get(LAUNCH_DIR_ENV)
  if launch_dir and os.path.isdir(launch_dir):
    with open(os.path.join(launch_dir, MODEL_DIR_POINTER), "w", encoding="utf-8") as f:
      json.dump({"model_dir": os.path.abspath(model_dir)}, f)


def final_metrics(model_dir: str) -> Dict[str, float]:
  """The final metrics of the run in `model_dir` (its summary's), or none."""
  return (read_json(os.path.join(run_dir(model_dir), SUMMARY_FILE)) or {}).get("final_metrics", {})


def record_validation(model_dir: str, step: int, metrics: Dict[str, float]) -> None:
  """Appends an inline evaluation by the chief at optimizer step `step` to `progress.jsonl`."""
  append_jsonl(os.path.join(run_dir(model_dir), PROGRESS_FILE),
               {"time": time.time(), "step": int(step), "kind": "validation", "metrics": _floats(metrics)})


def record_window(model_dir: str, step: int, metrics: Dict[str, float], window: dict) -> None:
  """Appends an evaluation on a stream's held-out window (`window`: what it is) at optimizer step `step`."""
  append_jsonl(progress_path(model_dir), {"time": time.time(), "step": int(step), "kind": WINDOW_KIND,
                                          "metrics": _floats(metrics), "window": window})


def add_to_summary(model_dir: str, key: str, value) -> None:
  """Sets `key` of the summary to `value` (JSON-able), e.g. the stream's part."""
  summary = read_json(os.path.join(run_dir(model_dir), SUMMARY_FILE)) or {}
  summary[key] = value
  write_summary(model_dir, summary)


def write_summary(model_dir: str, summary: dict) -> None:
  path = os.path.join(run_dir(model_dir), SUMMARY_FILE)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  os.replace(path + ".tmp", path)


def update_summary(model_dir: str, final_metrics: Optional[Dict[str, float]] = None, **where: str) -> None:
  """Adds metrics measured after training (validation, prefixed `val_`) or places (export_dir=...) to the summary."""
  summary = read_json(os.path.join(run_dir(model_dir), SUMMARY_FILE)) or {}
  if final_metrics:
    summary["final_metrics"] = {**summary.get("final_metrics", {}), **_floats(final_metrics)}
  summary.update({key: os.path.abspath(value) for key, value in where.items() if value})
  write_summary(model_dir, summary)


def split_metrics(logs: Dict[str, float]):
  """tf-keras epoch logs -> (training metrics, validation metrics without the `val_` prefix)."""
  train = {name: value for name, value in logs.items() if not name.startswith(VALIDATION_PREFIX)}
  validation = {name[len(VALIDATION_PREFIX):]: value for name, value in logs.items()
                if name.startswith(VALIDATION_PREFIX)}
  return train, validation


def _floats(metrics: Dict) -> Dict[str, float]:
  result = {}
  for name, value in metrics.items():
    try:
      result[name] = float(value)
    except (TypeError, ValueError):
      continue
  return result


def read_run(model_dir: str) -> dict:
  """Every record of the run in `model_dir`: progress, summary, restarts, sidecar evaluations and best checkpoint."""
  return {"progress": read_jsonl(os.path.join(run_dir(model_dir), PROGRESS_FILE)),
          "summary": read_json(os.path.join(run_dir(model_dir), SUMMARY_FILE)),
          "restarts": read_jsonl(os.path.join(run_dir(model_dir), RESTARTS_FILE)),
          "evaluations": read_jsonl(os.path.join(model_dir, "eval", "metrics.jsonl")),
          "best": read_json(os.path.join(model_dir, "best", "best.json"))}
