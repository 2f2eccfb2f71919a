"""The launcher's end-of-run summary, from the run records the chief and the sidecar evaluator wrote.

The chief tells the launcher its model_dir through `log_dir/model_dir.json` (see `tfps.run_records`;
removed after the summary); the launcher adds its restarts to `model_dir/run/restarts.jsonl` and prints what the run
did and where its files are.
Imports no TensorFlow.
"""

import os
import statistics
from typing import List, Optional, Sequence

from tfps.formatting import format_duration, format_rate
from tfps import run_records


def model_dir_of_launch(log_dir: str) -> Optional[str]:
  """The model_dir the chief of this launch trained into, or None if it did not say (no tfps training ran)."""
  pointer = run_records.read_json(os.path.join(log_dir, run_records.MODEL_DIR_POINTER))
  return pointer and pointer.get("model_dir")


def record_restarts(model_dir: str, restarts: Sequence[dict]) -> None:
  for restart in restarts:
    run_records.append_jsonl(os.path.join(run_records.run_dir(model_dir), run_records.RESTARTS_FILE), restart)


def _metrics_text(metrics: dict) -> str:
  return " | ".join(f"{name} {value:.4f}" for name, value in sorted(metrics.items()))


def _training_rates(progress: Sequence[dict]) -> List[str]:
  """The line of the examples/s the progress records measured over training alone (what tfps-report plots): their
  median (a record of an interval a checkpoint or another process slowed is far from the rest)."""
  rates = [r["examples_per_sec"] for r in progress if r.get("kind") == "train" and r.get("examples_per_sec")]
  if not rates:
    return []
  return [f"training alone (no evaluations or checkpoints): {format_rate(statistics.median(rates))} examples/s, the "
          f"median of {len(rates)} progress records (tfps-report's examples/s)"]


def _stream_lines(stream: Optional[dict]) -> List[str]:
  """A stream run's lines: messages applied, held out and malformed, the final lag, the last windows' evaluations."""
  if not stream:
    return []
  held_out = f", {stream['held_out']:,} held out" if stream.get("held_out") is not None else ""
  lag = f"{stream['lag_messages']:,} messages and " if stream.get("lag_messages") is not None else ""
  lines = [f"stream {stream.get('stream')}: {stream.get('messages_applied', 0):,} messages applied in this run"
           f"{held_out}, {stream.get('malformed_records', 0):,} malformed; final lag {lag}"
           f"{stream.get('lag_secs', 0):.1f} s"]
  windows = stream.get("last_windows") or []
  if windows:
    lines.append("newest held-out windows: " + "; ".join(
        f"step {w['step']}: " + " ".join(f"{k} {v:.4f}" for k, v in sorted(w.items()) if k in ("auc", "loss"))
        for w in windows))
  return lines


def _freshness_lines(freshness: Optional[dict]) -> List[str]:
  """The served versions' freshness (`tfps-delta watch` beside the run: scripts/train_online.py --serve_deltas)."""
  if not freshness:
    return []
  return [f"{freshness.get('line') or 'no served version has write times: freshness not measured'} "
          f"(served in {freshness.get('serving')}; tfps-report MODEL_DIR --serving=... tables it)"]


def summary_lines(model_dir: Optional[str], restarts: Sequence[dict], launch_secs: float) -> List[str]:
  """The summary as lines of text (restarts: the supervisor's restart records)."""
  lines = []
  run = run_records.read_run(model_dir) if model_dir else None
  summary = run and run["summary"]
  if summary:
    speed = summary.get("examples_per_sec")
    speed_text = f", {format_rate(speed)} examples/s over it" if speed else ""
    lines.append(f"steps {summary.get('steps')} in {format_duration(summary.get('wall_secs', 0))} of wall time "
                 f"(training with its evaluations and checkpoints){speed_text} (launch wall time "
                 f"{format_duration(launch_secs)})")
    lines += _training_rates(run["progress"])
    train, validation = run_records.split_metrics(summary.get("final_metrics", {}))
    if train:
      lines.append(f"final training metrics: {_metrics_text(train)}")
    if validation:
      lines.append(f"final validation metrics: {_metrics_text(validation)}")
    lines += _stream_lines(summary.get("stream"))
    lines += _freshness_lines(summary.get("freshness"))
  else:
    lines.append(f"no run summary{' in ' + model_dir if model_dir else ''} (training did not finish, or the script "
                 f"does not train with a model_dir); launch wall time {format_duration(launch_secs)}")
  if run and run["best"]:
    best = run["best"]
    step = f" (step {best['step']})" if best.get("step") is not None else ""
    lines.append(f"sidecar best checkpoint: {best['checkpoint']}{step}: {best['metric']} {best['value']:.4f}; "
                 f"copy in {os.path.dirname(best['copy'])}")
  if run and run["evaluations"]:
    last = run["evaluations"][-1]
    lines.append(f"sidecar evaluations: {len(run['evaluations'])} in {os.path.join(model_dir, 'eval')}; last at step "
                 f"{last.get('step')}: {_metrics_text(last.get('metrics', {}))}")
  if restarts:
    lines.append(f"restarts: {len(restarts)}")
    lines += [f"  {r['restart']}. {r['cause']}; restarted {r['restarted']}" for r in restarts]
  else:
    lines.append("restarts: none")
  if summary:
    for key, label in (("checkpoints", "checkpoints"), ("tensorboard", "TensorBoard logs"), ("export_dir", "export")):
      if summary.get(key):
        lines.append(f"{label}: {summary[key]}")
    lines.append(f"run records: {run_records.run_dir(model_dir)} (plot them: tfps-report {model_dir})")
  return lines


def report_run(log_dir: str, restarts: Sequence[dict], launch_secs: float, stream) -> None:
  """Writes the restarts into the run records, prints the summary to `stream` and removes the chief's pointer."""
  model_dir = model_dir_of_launch(log_dir)
  if model_dir:
    record_restarts(model_dir, restarts)
    os.remove(os.path.join(log_dir, run_records.MODEL_DIR_POINTER))
  stream.write("tfps-launch: run summary\n" + "".join(f"  {line}\n" for line in summary_lines(model_dir, restarts,
                                                                                              launch_secs)))
  stream.flush()
