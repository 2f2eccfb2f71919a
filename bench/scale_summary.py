"""The summary of the table-size bench (bench/scale.py): step time, ps memory per row, checkpoint speed, and what a
table of 10^9 rows would need. Reads the runs' JSON only: no TensorFlow, no flags.

ps memory is each ps's peak RSS (`VmHWM`, sampled by bench/runner.py) less the peak of a ps in the same training with
a table of 1,000 rows (`baseline`: TensorFlow, the server, traced functions, buffers); it is set against the ps's
share of the rows plus their Adagrad accumulators (`state`).
"""

import math
import statistics
from typing import Dict, List

# The bounds of ps memory over baseline, x its share of rows plus accumulators (the dynamic table's id map included).
RSS_BOUND = {"hashed": 1.3, "dynamic": 2.0}
STEP_SPREAD = 1.15  # slowest size's step / fastest's, per kind of table
PS_MEMORY_GIB = (32, 64)  # ps machine sizes the advice for 10^9 rows is given for
PS_MEMORY_USE = 0.9  # of a ps machine's memory its peak may reach (a restore's included)
GB = 1e9
DIM = 16  # floats per row


def state_bytes(table_rows: int) -> int:
  """Bytes of a table's rows plus their Adagrad accumulators (float32)."""
  return table_rows * DIM * 4 * 2


def _peaks(results: List[dict], num_ps: int, field: str = "peak_rss_bytes") -> List[int]:
  return [max(r["tasks"][f"ps:{i}"][field] for r in results) for i in range(num_ps)]


def size_row(table: str, table_rows: int, results: List[dict], baseline: int) -> dict:
  """One (table, rows): median step time over `results` (the runs), each ps's largest peak, memory against state."""
  first = results[0]
  num_ps, state = first["num_ps"], first["state_bytes"]
  peaks = _peaks(results, num_ps)
  over = (max(peaks) - baseline) / (state / num_ps)
  row = {"table": table, "table_rows": table_rows, "num_ps": num_ps, "runs": len(results),
         "step_secs": statistics.median(r["step_secs"] for r in results),
         "step_secs_runs": [r["step_secs"] for r in results], "load_runs": [r["load_average"][0] for r in results],
         "state_bytes": state, "baseline_bytes": baseline, "ps_peak_rss_bytes": peaks,
         "ps_end_rss_bytes": _peaks(results, num_ps, "rss_bytes"), "over_baseline_vs_state": over,
         "rss_bound": RSS_BOUND[table], "rss_holds": over <= RSS_BOUND[table],
         "bytes_per_row": (sum(peaks) - num_ps * baseline) / table_rows}
  if table == "dynamic":
    row["occupancy"] = min(r["table_metrics"]["occupancy"] for r in results)
    row["fill_secs"] = statistics.median(r["fill_secs"] for r in results)
  return row


def checkpoint_row(save: dict, resumed: dict, baseline: int) -> dict:
  """Save and resume times of one checkpoint, per GB of checkpoint, whether the rows read back are the saved, and
  the resuming ps's peak over baseline against their share of the state (`restore_factor`)."""
  size = save["checkpoint_bytes"] / GB
  share = save["state_bytes"] / resumed["num_ps"]
  return {"restore_factor": (max(_peaks([resumed], resumed["num_ps"])) - baseline) / share,
          "save_factor": (max(_peaks([save], save["num_ps"])) - baseline) / (save["state_bytes"] / save["num_ps"]),
          "table": save["table"], "table_rows": save["table_rows"], "checkpoint_bytes": save["checkpoint_bytes"],
          "saved_on_ps": save["num_ps"], "resumed_on_ps": resumed["num_ps"], "shards": resumed["shards"],
          "save_secs": save["save_secs"], "save_secs_per_gb": save["save_secs"] / size,
          "create_secs": resumed["create_secs"], "restore_secs": resumed["restore_secs"],
          "restore_secs_per_gb": resumed["restore_secs"] / size, "resume_secs": resumed["resume_secs"],
          "step_saved": save["step"], "step_restored": resumed["step"], "rows_read_back_equal":
          save["probe"] == resumed["probe"], "load": [save["load_average"][0], resumed["load_average"][0]]}


def save_row(save: dict, baseline: int) -> dict:
  """A checkpoint's save alone (its resume failed or was skipped): the save's fields of `checkpoint_row`."""
  return {"table": save["table"], "table_rows": save["table_rows"], "checkpoint_bytes": save["checkpoint_bytes"],
          "saved_on_ps": save["num_ps"], "save_secs": save["save_secs"],
          "save_secs_per_gb": save["save_secs"] / (save["checkpoint_bytes"] / GB),
          "save_factor": (max(_peaks([save], save["num_ps"])) - baseline) / (save["state_bytes"] / save["num_ps"]),
          "resumed_on_ps": None, "load": [save["load_average"][0]]}


def advice(rows: List[dict], factors: Dict[str, float], table_rows: int = 10**9) -> Dict[str, dict]:
  """Per kind of table, from the bytes per row measured at its largest size: what `table_rows` rows need in all,
  and for each of `factors` (a resume's peak against its share: `{"resharded": ..., "same_ps": ...}`) how many ps of
  each of `PS_MEMORY_GIB` keep a ps's peak (share x factor + baseline) within `PS_MEMORY_USE` of its memory."""
  return {table: {kind: _advice(rows, table, max(1.0, factor), table_rows) for kind, factor in factors.items()
                  if table == "hashed" or kind == "same_ps"}  # a dynamic table restores into as many shards only
          for table in sorted({row["table"] for row in rows})}


def _advice(rows: List[dict], table: str, factor: float, table_rows: int) -> dict:
  largest = max((row for row in rows if row["table"] == table), key=lambda row: row["table_rows"])
  total = largest["bytes_per_row"] * table_rows
  ps = {}
  for gib in PS_MEMORY_GIB:
    count = max(1, math.ceil(factor * total / (PS_MEMORY_USE * gib * 2**30 - largest["baseline_bytes"])))
    ps[str(gib)] = {"num_ps": count, "gib_per_ps": (total / count + largest["baseline_bytes"]) / 2**30,
                    "peak_gib_per_ps": (factor * total / count + largest["baseline_bytes"]) / 2**30}
  return {"from_rows": largest["table_rows"], "bytes_per_row": largest["bytes_per_row"], "table_rows": table_rows,
          "total_gib": total / 2**30, "restore_factor": factor, "ps": ps}


def _factors(checkpoints: List[dict]) -> Dict[str, float]:
  """The largest resume peak against its share, on another number of ps and on the same (1.0 where none ran)."""
  resumes = [row for row in checkpoints if row["resumed_on_ps"] is not None]
  return {kind: max((row["restore_factor"] for row in resumes if (row["resumed_on_ps"] == row["saved_on_ps"]) == same),
                    default=1.0) for kind, same in (("resharded", False), ("same_ps", True))}


def largest_restore_factors(checkpoints: List[dict]) -> Dict[str, float]:
  """`_factors` of the resumes of the largest table resumed only: at small sizes a ps's share is within how much its
  baseline moves between runs."""
  resumes = [row for row in checkpoints if row["resumed_on_ps"] is not None]
  largest = max((row["table_rows"] for row in resumes), default=0)
  return _factors([row for row in resumes if row["table_rows"] == largest])


def summarize(runs: dict) -> dict:
  """`runs` (bench/scale.py's `measure`) summarized: a row per (table, rows), the checkpoint, the targets, advice."""
  grouped = {}
  for result in runs["results"]:
    grouped.setdefault((result["table"], result["table_rows"]), []).append(result)
  baseline = max(runs["baseline"]["tasks"][f"ps:{i}"]["peak_rss_bytes"] for i in range(runs["baseline"]["num_ps"]))
  rows = [size_row(table, size, results, baseline) for (table, size), results in sorted(grouped.items())]
  targets, spread = {}, {}
  for table in sorted({row["table"] for row in rows}):
    steps = [row["step_secs"] for row in rows if row["table"] == table]
    median = statistics.median(steps)
    for row in rows:
      if row["table"] == table:
        row["step_vs_median"] = row["step_secs"] / median
    spread[table] = max(steps) / min(steps)
    targets[f"{table}: slowest step / fastest <= {STEP_SPREAD} over the sizes"] = [round(spread[table], 3),
                                                                                   spread[table] <= STEP_SPREAD]
    worst = max(row["over_baseline_vs_state"] for row in rows if row["table"] == table)
    targets[f"{table}: ps memory over baseline <= {RSS_BOUND[table]}x its share of rows + slots"] = [
        round(worst, 3), worst <= RSS_BOUND[table]]
  saved = runs.get("checkpoints", []) + ([runs["checkpoint"]] if runs.get("checkpoint") else [])  # (one, before)
  checkpoints = [checkpoint_row(pair["save"], pair["resume"], baseline) for pair in saved]
  resumed = {pair["save"]["save_secs"] for pair in saved}
  checkpoints += [save_row(result, baseline) for result in runs["results"]
                  if "save_secs" in result and result["save_secs"] not in resumed]  # saved, never resumed
  summary = {"rows": rows, "step_spread": spread, "targets": targets, "checkpoints": checkpoints,
             "advice": advice(rows, _factors(checkpoints)),
             "baseline_bytes": baseline, "load_before": runs["load_before"], "load_after": runs["load_after"],
             "skipped": runs.get("skipped", []),
             "failed": [dict(run, error=run["error"][-300:]) for run in runs.get("failed", [])]}
  return summary
