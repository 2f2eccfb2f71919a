"""The series a report plots, taken from a run's records (`tfps.run_records.read_run`). No plotting here."""

import bisect
import dataclasses
import time
from typing import Dict, List, Optional, Sequence

LOSS = "loss"
# The progress records measure training alone; the launcher's summary also gives examples/s over the training call's
# wall time, evaluations and checkpoints included
SPEED_LABEL = "examples/s while training (no evaluations or checkpoints)"
WINDOW_KIND = "window"  # run_records.WINDOW_KIND: an evaluation on a stream's held-out window
LAG_PANELS = (("lag_messages", "lag (messages)"), ("lag_secs", "lag (seconds)"))
FRESHNESS_PANEL = "freshness (seconds)"


@dataclasses.dataclass(frozen=True)
class Curve:
  """One plotted line: `values[i]` at optimizer step `steps[i]`."""

  label: str
  steps: List[int]
  values: List[float]


@dataclasses.dataclass(frozen=True)
class ReportSeries:
  """Everything a report shows: curves per panel (loss, the AUC metric, examples/s) and the steps of restarts."""

  panels: Dict[str, List[Curve]]
  restart_steps: List[int]
  restart_labels: List[str]


def auc_metric(run: dict) -> Optional[str]:
  """The name of the run's AUC metric (the first name containing "auc"), or None."""
  names = [name for record in run["progress"] + run["evaluations"] for name in record.get("metrics", {})]
  return next((name for name in names if "auc" in name.lower()), None)


def _curve(label: str, records: Sequence[dict], metric: str) -> Curve:
  points = sorted((record["step"], record["metrics"][metric]) for record in records
                  if record.get("step") is not None and metric in record.get("metrics", {}))
  return Curve(label, [step for step, _ in points], [value for _, value in points])


def restart_steps(progress: Sequence[dict], restarts: Sequence[dict]) -> List[int]:
  """The step each restart happened at: that of the last progress record written before it (0 before any)."""
  timed = sorted((record["time"], record["step"]) for record in progress if "time" in record and "step" in record)
  times = [time for time, _ in timed]
  steps = []
  for restart in restarts:
    index = bisect.bisect_right(times, restart["time"]) - 1
    steps.append(timed[index][1] if index >= 0 else 0)
  return steps


def build_series(run: dict, freshness: Sequence[dict] = ()) -> ReportSeries:
  """The report's series from `run` (as `run_records.read_run` returns it); a stream run adds its held-out windows'
  evaluations to the loss and AUC panels and its lag in panels of its own, and with `freshness` (the served versions'
  records, `tfps.training.delta_freshness.read`) their freshness at their steps."""
  train = [r for r in run["progress"] if r.get("kind") == "train"]
  validation = [r for r in run["progress"] if r.get("kind") == "validation"]
  windows = [r for r in run["progress"] if r.get("kind") == WINDOW_KIND]
  panels = {}
  for metric in (LOSS, auc_metric(run)):
    if metric is None:
      continue
    curves = [_curve(f"training {metric}", train, metric), _curve(f"validation {metric} (chief)", validation, metric),
              _curve(f"window {metric} (newest held-out messages, chief)", windows, metric),
              _curve(f"sidecar {metric}", run["evaluations"], metric)]
    panels[metric] = [curve for curve in curves if curve.steps]
  speed = [r for r in train if r.get("examples_per_sec") is not None]
  panels["examples/s"] = [Curve(SPEED_LABEL, [r["step"] for r in speed], [r["examples_per_sec"] for r in speed])]
  for metric, panel in LAG_PANELS:
    curve = _curve(f"{metric} (after the chunk's last batch)", train, metric)
    if curve.steps:
      panels[panel] = [curve]
  measured = [record for record in freshness if "freshness_secs" in record]
  if measured:
    steps = [record["step"] for record in measured]
    panels[FRESHNESS_PANEL] = [
        Curve("served version: oldest example's write to its swap", steps, [r["freshness_secs"] for r in measured]),
        Curve("served version: newest example's write to its swap", steps,
              [r["newest_freshness_secs"] for r in measured])]
  return ReportSeries(panels=panels, restart_steps=restart_steps(run["progress"], run["restarts"]),
                      restart_labels=[r.get("cause", "restart") for r in run["restarts"]])


def window_table(run: dict) -> List[str]:
  """A stream run's evaluations on its held-out windows as text lines (a header, then one per window: step, time,
  the window's messages and newest message, loss and AUC); [] for a run without them."""
  windows = [r for r in run["progress"] if r.get("kind") == WINDOW_KIND]
  if not windows:
    return []
  auc = auc_metric(run)
  lines = [f"{'step':>8} {'time (UTC)':>19} {'messages':>8}  {'newest message':<24} {'loss':>7} {auc or 'auc':>7}"]
  for record in windows:
    window, metrics = record.get("window", {}), record["metrics"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record["time"]))
    auc_text = f"{metrics[auc]:.4f}" if auc in metrics else "-"
    lines.append(f"{record['step']:>8} {when:>19} {window.get('messages', 0):>8}  {str(window.get('newest')):<24} "
                 f"{metrics.get(LOSS, float('nan')):>7.4f} {auc_text:>7}")
  return lines
