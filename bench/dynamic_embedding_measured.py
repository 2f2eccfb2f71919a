"""`tfps.layers.DynamicEmbedding` measured against hashed tables, fixed tables and tf-keras's experimental layer.

Every run is real processes: `bench/dynamic_embedding_run.py` under `tfps-launch` (through `bench/runner.py`, which
samples each task's peak RSS), or alone with `--single`. Experiments (`--experiments`):

* `movielens`: MovieLens 100K with raw user and movie ids, 2 ps + 2 workers: dynamic against hashed tables at equal
  rows (a quarter of each table's distinct ids), same model, epochs and seeds; AUC on u1.test of each, the
  difference. Also dynamic with a row for every id (`--reference_fraction`) as the collision-free reference.
* `criteo`: generated Criteo-schema rows with about ten million distinct ids (one short pass), 2 ps + 2 workers:
  dynamic against hashed at a quarter of the distinct ids: AUC of each, and each ps's peak RSS.
* `spread`: a dynamic table whose ids exceed one ps's share, over `--spread_ps` ps: rows in use per shard, peak RSS
  per ps.
* `step_time`: seconds per step of dynamic against hashed (a fixed table) of the same rows on the cluster, and
  tf-keras's experimental `DynamicEmbedding` tried on the same cluster (its error is recorded) and, since it cannot
  run there, all three alone in one process at `--single_capacity` rows (also CPU seconds per step, steadier than
  wall time on a loaded machine).
* `bf16_rows`: a dynamic table (generated Criteo-schema rows, 2 ps + 2 workers) with and without `--bf16_rows`,
  alternating: bytes over the ps's sockets per example and examples/s of each.

Runs of the two sides alternate. Writes `--json_out` with every run and a summary per experiment.

  .venv/bin/python bench/dynamic_embedding_measured.py      # all five: over an hour on 2 cores at load ~30
  .venv/bin/python bench/dynamic_embedding_measured.py --experiments=movielens --seeds=0
  (the commands behind bench/results/dynamic_embedding_measured_*.json: docs/dynamic_embeddings_measured.md)
"""

import json
import os
import statistics
import sys
from typing import Dict, List

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position

SCRIPT = os.path.join(runner.ROOT, "bench", "dynamic_embedding_run.py")
EXPERIMENTS = ("movielens", "criteo", "spread", "step_time", "bf16_rows")
_EXPERIMENTS = flags.DEFINE_list("experiments", list(EXPERIMENTS), f"Any of {', '.join(EXPERIMENTS)}.")
_DATA_DIR = flags.DEFINE_string("data_dir", os.path.join(os.path.dirname(runner.ROOT), "shared", "data", "ml-100k"),
                                "The MovieLens 100K folder (read in place, never copied).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1"], "movielens: seeds; each side trains once per seed.")
_ML_EPOCHS = flags.DEFINE_integer("movielens_epochs", 10, "movielens: epochs (passes over u1.base).", lower_bound=2)
_ML_STEPS = flags.DEFINE_integer("movielens_steps", 0, "movielens: steps per epoch (0: a pass over u1.base).",
                                 lower_bound=0)
_REFERENCE = flags.DEFINE_float("reference_fraction", 1.0, "movielens: rows / distinct ids of the collision-free "
                                "reference run (0: none).", lower_bound=0)
_CRITEO_ROWS = flags.DEFINE_integer("criteo_rows", 1_000_000, "criteo: training rows (about 10.2 million distinct "
                                    "ids at the defaults).", lower_bound=1)
_CRITEO_EVAL = flags.DEFINE_integer("criteo_eval_rows", 100_000, "criteo: held-out rows.", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_per_column", 1_000_000, "criteo, spread, step_time: ranks per column.",
                              lower_bound=1)
_SPREAD_PS = flags.DEFINE_integer("spread_ps", 4, "spread: ps tasks.", lower_bound=2)
_SPREAD_ROWS = flags.DEFINE_integer("spread_rows", 200_000, "spread: training rows.", lower_bound=1)
_SPREAD_FRACTION = flags.DEFINE_float("spread_capacity_fraction", 0.25, "spread: rows / distinct ids (above 1: room "
                                      "for every id, so the rows in use show how the ids spread).", lower_bound=0)
_STEP_ROWS = flags.DEFINE_integer("step_time_rows", 400_000, "step_time: training rows (tables hold all their ids).",
                                  lower_bound=1)
_STEP_SIDES = flags.DEFINE_list("step_time_sides", ["cluster", "single"], "step_time: cluster (tfps.fit, 2 ps + 2 "
                                  "workers) and/or single (one process).")
_STEP_REPEATS = flags.DEFINE_integer("step_time_repeats", 1, "step_time: cluster runs of hashed and dynamic each, "
                                     "alternating (medians).", lower_bound=1)
_SINGLE_CAPACITY = flags.DEFINE_integer("single_capacity", 20_000, "step_time: rows of the tables in the "
                                        "single-process comparison with tf-keras's layer.", lower_bound=1)
_SINGLE_STEPS = flags.DEFINE_integer("single_steps", 40, "step_time: steps per epoch in one process.", lower_bound=1)
_BF16_ROWS = flags.DEFINE_integer("bf16_rows_rows", 200_000, "bf16_rows: training rows.", lower_bound=1)
_BF16_REPEATS = flags.DEFINE_integer("bf16_rows_repeats", 2, "bf16_rows: runs of each side, alternating.",
                                     lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step (per worker).", lower_bound=1)
_SINGLE_PROCESS = flags.DEFINE_boolean("single_process", False, "Run every cluster run alone in one process instead "
                                       "(no ps memory, no keras_dynamic-on-cluster error): a smoke test of this "
                                       "script.")
_TIMEOUT = flags.DEFINE_float("timeout_secs", 1200, "Longest a run may take.", lower_bound=1)
_JSON_OUT = flags.DEFINE_string("json_out", os.path.join(runner.ROOT, "bench", "results",
                                                         "dynamic_embedding_measured.json"), "Results (JSON).")


def _run(name: str, args: List[str], num_ps: int = 2, num_workers: int = 2) -> dict:
  """One run of `dynamic_embedding_run.py ARGS` (alone when `num_ps` is 0); the chief's JSON with per-task peaks."""
  if _SINGLE_PROCESS.value and num_ps:
    args, num_ps = args + ["--single"], 0
  print(f"run {name}: {' '.join(args)}", flush=True)
  result = runner.run(args + [f"--batch_size={_BATCH.value}"], num_ps=num_ps, num_workers=num_workers,
                      log_dir=runner.log_dir(f"dynamic_embedding_{name}"), timeout_secs=_TIMEOUT.value,
                      script=SCRIPT)
  result["name"] = name
  print(f"  -> auc {result.get('auc')}, {result.get('examples_per_sec')} ex/s {result.get('error', '')}", flush=True)
  return result


def _ps_peaks(result: dict) -> Dict[str, int]:
  """`{ps task: peak RSS bytes}` of a cluster run."""
  return {task: summary["peak_rss_bytes"] for task, summary in sorted(result.get("tasks", {}).items())
          if task.startswith("ps:")}


def _shards(result: dict) -> Dict[str, list]:
  return {table: [shard["in_use"] for shard in report["shards"]] for table, report in result["tables"].items()}


def movielens() -> dict:
  """AUC of dynamic and hashed tables at a quarter of the ids (and the reference), per seed, alternating."""
  common = ["--data=movielens", f"--data_dir={_DATA_DIR.value}", f"--epochs={_ML_EPOCHS.value}",
            f"--steps_per_epoch={_ML_STEPS.value}"]
  runs = []
  for seed in _SEEDS.value:
    for table in ("hashed", "dynamic"):
      runs.append(_run(f"movielens_{table}_s{seed}", common + [f"--table={table}", f"--seed={seed}"]))
    if _REFERENCE.value:
      runs.append(_run(f"movielens_reference_s{seed}", common + ["--table=dynamic", f"--seed={seed}",
                                                                 f"--capacity_fraction={_REFERENCE.value}"]))
  def auc(name):
    return [run["auc"] for run in runs if run["name"].startswith(f"movielens_{name}_")]
  summary = {name: statistics.mean(auc(name)) for name in ("hashed", "dynamic", "reference") if auc(name)}
  summary["auc_dynamic_minus_hashed"] = summary["dynamic"] - summary["hashed"]
  summary["fallbacks_per_table"] = {run["name"]: {t: r["fallbacks"] for t, r in run["tables"].items()}
                                    for run in runs if run["tables"]}
  return {"summary": summary, "runs": runs}


def criteo() -> dict:
  """AUC and per-ps peak RSS of dynamic and hashed tables of a quarter of ~10M distinct ids."""
  common = ["--data=criteo", f"--rows={_CRITEO_ROWS.value}", f"--eval_rows={_CRITEO_EVAL.value}",
            f"--vocab_per_column={_VOCAB.value}", "--dim=8"]
  runs = [_run(f"criteo_{table}", common + [f"--table={table}"]) for table in ("hashed", "dynamic")]
  hashed, dynamic = runs
  return {"summary": {"distinct_ids": dynamic["distinct_ids"], "table_rows": dynamic["table_rows"],
                      "auc": {"hashed": hashed["auc"], "dynamic": dynamic["auc"]},
                      "auc_dynamic_minus_hashed": dynamic["auc"] - hashed["auc"],
                      "ps_peak_rss_bytes": {"hashed": _ps_peaks(hashed), "dynamic": _ps_peaks(dynamic)},
                      "dynamic_shard_rows_in_use": _shards(dynamic),
                      "dynamic_table": {k: v for k, v in dynamic["tables"]["categorical_table"].items()
                                        if k != "shards"},
                      "step_secs": {"hashed": hashed["step_secs"], "dynamic": dynamic["step_secs"]}},
          "runs": runs}


def spread() -> dict:
  """Rows in use per shard and peak RSS per ps of a full dynamic table over `--spread_ps` ps."""
  result = _run(f"spread_{_SPREAD_PS.value}ps_{_SPREAD_FRACTION.value:g}", [
      "--data=criteo", "--table=dynamic", f"--rows={_SPREAD_ROWS.value}", "--eval_rows=20000",
      f"--vocab_per_column={_VOCAB.value}", "--dim=8", f"--capacity_fraction={_SPREAD_FRACTION.value}"],
      num_ps=_SPREAD_PS.value)
  table = result["tables"]["categorical_table"]
  return {"summary": {"num_ps": _SPREAD_PS.value, "distinct_ids": result["distinct_ids"],
                      "table_rows": result["table_rows"], "shards": table["shards"],
                      "live_ids": table["occupancy"],
                      "live_ids_over_one_ps_share": table["occupancy"] / max(s["rows"] for s in table["shards"]),
                      "fallbacks": table["fallbacks"], "ps_peak_rss_bytes": _ps_peaks(result)},
          "runs": [result]}


def step_time() -> dict:
  """Seconds per step: dynamic against hashed of the same rows (cluster), and tf-keras's layer (alone)."""
  runs, summary = [], {}
  if "cluster" in _STEP_SIDES.value:
    cluster = ["--data=criteo", f"--rows={_STEP_ROWS.value}", "--eval_rows=20000",
               f"--vocab_per_column={_VOCAB.value}", "--dim=8", "--capacity_fraction=1.0"]
    runs += [_run(f"step_time_{table}_{repeat}", cluster + [f"--table={table}"])
             for repeat in range(_STEP_REPEATS.value) for table in ("hashed", "dynamic")]
    runs.append(_run("step_time_keras_dynamic", cluster + ["--table=keras_dynamic"]))
    measured = {table: [run["step_secs"] for run in runs if run["table"] == table] for table in ("hashed", "dynamic")}
    secs = {table: statistics.median(values) for table, values in measured.items()}
    secs["keras_dynamic"] = runs[-1].get("step_secs")
    summary.update(cluster_step_secs=secs, cluster_step_secs_runs=measured,
                   cluster_dynamic_vs_hashed=secs["dynamic"] / secs["hashed"],
                   keras_dynamic_on_cluster=runs[-1].get("error", "ran"),
                   keras_dynamic_error_where=runs[-1].get("error_where"), cluster_table_rows=runs[0]["table_rows"])
  if "single" in _STEP_SIDES.value:
    single = ["--data=criteo", "--single", f"--rows={_STEP_ROWS.value}", "--eval_rows=2560",
              f"--vocab_per_column={_VOCAB.value}", "--dim=8", f"--capacity={_SINGLE_CAPACITY.value}",
              f"--steps_per_epoch={_SINGLE_STEPS.value}", "--epochs=3"]
    alone = [_run(f"step_time_single_{table}", single + [f"--table={table}"], num_ps=0)
             for table in ("hashed", "dynamic", "keras_dynamic")]
    runs += alone
    secs = {run["table"]: run["step_secs"] for run in alone}
    cpu = {run["table"]: run["cpu_secs_per_step"] for run in alone}
    summary.update(single_step_secs=secs, single_cpu_secs_per_step=cpu,
                   single_cpu_dynamic_vs_hashed=cpu["dynamic"] / cpu["hashed"],
                   single_cpu_keras_dynamic_vs_hashed=cpu["keras_dynamic"] / cpu["hashed"],
                   single_table_rows=_SINGLE_CAPACITY.value)
  return {"summary": summary, "runs": runs}


def bf16_rows() -> dict:
  """Bytes over the ps's sockets per example and examples/s of a dynamic table's runs with and without `--bf16_rows`
  (rows and their gradients as bfloat16), alternating; medians."""
  common = ["--data=criteo", "--table=dynamic", f"--rows={_BF16_ROWS.value}", "--eval_rows=5000",
            f"--vocab_per_column={_VOCAB.value}", "--dim=16", "--capacity_fraction=1.0"]
  runs, sides = [], {"float32": [], "bf16_rows": []}
  for repeat in range(_BF16_REPEATS.value):
    for side, extra in (("float32", []), ("bf16_rows", ["--bf16_rows"])):
      result = _run(f"bf16_rows_{side}_{repeat}", common + extra)
      ps = [summary for task, summary in result["tasks"].items() if task.startswith("ps:")]
      # The examples of the measured epochs, and the ps's bytes over the same span.
      examples = result["steps_per_epoch"] * _BATCH.value * len(result["window_examples_per_sec"])
      sides[side].append({"examples_per_sec": result["examples_per_sec"],
                          "ps_bytes_per_example": sum(task["span_network_bytes"] for task in ps) / examples})
      runs.append(result)
  summary = {side: {key: statistics.median(run[key] for run in measured) for key in measured[0]}
             for side, measured in sides.items()}
  summary["bytes_bf16_vs_float32"] = (summary["bf16_rows"]["ps_bytes_per_example"]
                                      / summary["float32"]["ps_bytes_per_example"])
  summary["speed_bf16_vs_float32"] = (summary["bf16_rows"]["examples_per_sec"]
                                      / summary["float32"]["examples_per_sec"])
  summary["runs"] = sides
  return {"summary": summary, "runs": runs}


def main(argv):
  del argv
  unknown = [name for name in _EXPERIMENTS.value if name not in EXPERIMENTS]
  if unknown:
    raise app.UsageError(f"--experiments names {unknown[0]!r}; allowed: {', '.join(EXPERIMENTS)}")
  if _SINGLE_PROCESS.value and "bf16_rows" in _EXPERIMENTS.value:
    raise app.UsageError("--experiments=bf16_rows measures the ps's traffic: it needs a cluster, not --single_process")
  functions = {"movielens": movielens, "criteo": criteo, "spread": spread, "step_time": step_time,
               "bf16_rows": bf16_rows}
  results = {}
  for name in _EXPERIMENTS.value:
    results[name] = functions[name]()
    print(json.dumps({name: results[name]["summary"]}, indent=1), flush=True)
  os.makedirs(os.path.dirname(os.path.abspath(_JSON_OUT.value)), exist_ok=True)
  with open(_JSON_OUT.value, "w", encoding="utf-8") as out:
    json.dump({"batch_size": _BATCH.value, "experiments": results}, out, indent=1)


if __name__ == "__main__":
  app.run(main)
