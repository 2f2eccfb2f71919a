"""Throughput of every training path side by side, as ratios to single-process tf-keras and to the plain-PSS peer.

  .venv/bin/python bench/throughput.py                      # both batch sizes, 2 alternating repetitions (~10 min)
  .venv/bin/python bench/throughput.py --quick              # batch 256 only, 1 repetition (~3 min)

Variants, each on Wide&Deep over in-memory Criteo-schema batches (`bench/workload.py`) with legacy Adagrad: `single`
(tf-keras fit, no strategy; with stacked and with per-feature tables, the faster is the ceiling), `fit` and
`estimator` with 1 ps + 1 worker and 2 ps + 2 workers (real processes under `tfps-launch`), `keras_pss` (the peer:
plain tf-keras `Model.fit` under ParameterServerStrategy as TensorFlow's tutorial writes it, variables split by
`MinSizePartitioner(256 KiB, max_shards=#ps)`, no tfps code, `bench/plain_pss_train.py`; each fit/estimator row gets
its ratio to the peer of the same cluster shape and batch, `vs_keras_pss`), `keras_pss_fixed` (the same peer with
every variable split by `FixedShardsPartitioner(#ps)`, the peer of the tables measured before; `vs_keras_pss_fixed`),
`tutorial` (one step per `schedule`, loss fetched every step; 1 ps + 1 worker), and a trivial scheduled function
(`--notrivial`: not).
Variants run in a shuffled order within each repetition; each run measures `--measure` windows after a warm-up;
the table shows the median over repetitions of each run's median window. Every process is sampled for CPU time
(`bench/runner.py`): each row has its CPU milliseconds per step per role and over all tasks, and each cluster row its
CPU per example as a multiple of the leanest single-process variant's at the same batch. The targets are
`bench/aims.py`'s, each verdict computed from the unrounded value.
Writes `--out/throughput.json` and `--out/throughput.png` (with matplotlib, the `bench` extra).
"""

import json
import os
import random
import re
import statistics
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import aims  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import report  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position

_BATCHES = flags.DEFINE_list("batch_sizes", ["256", "4096"], "Batch sizes (per worker).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Repetitions of every variant, alternating.", lower_bound=1)
_MEASURE = flags.DEFINE_integer("measure", 2, "Measured windows per run.", lower_bound=1)
_WINDOW = flags.DEFINE_integer("window_examples", 80_000, "Examples per measured window (steps are rounded to "
                               "whole scheduled functions per worker: a multiple of 20 x workers).", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_size", 100_000, "Rows of each feature's table.", lower_bound=1)
_STACK = flags.DEFINE_boolean("stack_tables", True, "One deep and one wide table for all features.")
_VARIANTS = flags.DEFINE_list(
    "variants", ["single", "single+per_feature", "fit_1x1", "fit_2x2", "estimator_1x1", "estimator_2x2",
                 "keras_pss_1x1", "keras_pss_2x2", "tutorial_1x1"],
    "Variants to run: PATH or PATH_<ps>x<workers> (keras_pss_<ps>x<workers>: the plain-PSS peer as TensorFlow's "
    "tutorial writes it, MinSizePartitioner; keras_pss_fixed_<ps>x<workers>: the same with FixedShardsPartitioner, "
    "every variable split), then options, "
    "each after a `+` (e.g. fit_1x1+pipelined+spin): `+per_feature` for one table per feature instead of "
    "stacked, `+spe<N>` for N steps per scheduled function instead of the path's default, `+unroll<N>` for "
    "--unrolled_steps=N (N steps traced one after another per loop iteration; by default 4 up to batch 1024, else 1: "
    "`+unroll1` for the default before), `+packed` for "
    "--packed_reads (the dense variables of a ps read in one transfer: tfps's default), `+unpacked` for "
    "--nopacked_reads (each one read on its own), `+spin` for --thread_spinning (idle "
    "threads of ps and workers spin, TensorFlow's default; `+nospin`: they sleep, tfps's default), `+lockfree` "
    "for --lockfree_row_updates (a legacy Adagrad's table rows updated without a lock), `+pipelined` for "
    "--pipelined_updates (a step's updates applied while the next step computes), `+bf16` for --bf16_rows (table "
    "rows and their gradients cross as bfloat16), `+nolock` for --norecords_lock (no ps holds a lock from its "
    "decision on a step to its record), `+intra<N>` / `+inter<N>` for N intra-op / inter-op threads in "
    "every process of the run (TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS; TensorFlow's default: one per "
    "core). `ps_floor_<ps>x<workers>`: the workload trained by a loop written "
    "directly in TensorFlow, nothing on the ps but the work it must do, its variables laid out over the ps as "
    "tfps's (`bench/ps_floor_train.py`; `+packed`, 1 ps only: its dense variables in one variable); each tfps row "
    "gets its ps CPU per step per ps (the mean over its ps) over the floor's (`ps_vs_floor`). The tutorial loop "
    "runs at the smallest batch size only (its target is there).")
_START_SECS = flags.DEFINE_float("start_timeout_secs", 300.0, "Seconds every variant's processes may take to "
                                  "start and answer (a loaded machine starts TensorFlow slowly).", lower_bound=1)
_QUICK = flags.DEFINE_boolean("quick", False, "Batch 256 only, 1 repetition, 1 window.")
_TRIVIAL = flags.DEFINE_boolean("trivial", True, "Also measure the trivial scheduled function (1 ps + 1 worker) in "
                                "each repetition.")
_OUT = flags.DEFINE_string("out", "bench/results",
                          "Folder for throughput.json and throughput.png (task logs: $TFPS_BENCH_LOGS, else a new "
                          "folder per run, printed at its first task).")


# `+option` -> the flag of train_bench.py it sets; the plain peer has none of these, so a variant with one is compared
# with the peer of its shape.
_FLAG_OPTIONS = {"packed": "--packed_reads", "unpacked": "--nopacked_reads", "spin": "--thread_spinning",
                 "nospin": "--nothread_spinning",
                 "lockfree": "--lockfree_row_updates", "pipelined": "--pipelined_updates", "bf16": "--bf16_rows",
                 "nolock": "--norecords_lock"}


# `+option<N>` -> the environment variable it sets to N in every process of the run.
_ENV_OPTIONS = {"intra": "TF_NUM_INTRAOP_THREADS", "inter": "TF_NUM_INTEROP_THREADS"}


def _option_env(options) -> tuple:
  """`(environment, options left)`: the variables `options` set (`+intra<N>`, `+inter<N>`), and the other options."""
  env, rest = {}, []
  for option in options:
    match = re.fullmatch(r"(intra|inter)([1-9][0-9]*)", option)
    if match:
      env[_ENV_OPTIONS[match.group(1)]] = match.group(2)
    else:
      rest.append(option)
  return env, tuple(rest)


def window_steps(variant: str, batch_size: int) -> int:
  """Steps per window (and of the warm-up): about `--window_examples`, a whole number of scheduled functions for
  each worker (20 steps each, or `+spe<N>`'s), so that every window keeps every worker busy and the warm-up runs
  each worker's first function (a window of one function at batch 4096 measured one of two workers at a time)."""
  _, _, num_workers, options = variant_shape(variant)
  per_function = next((int(option[3:]) for option in options if re.fullmatch(r"spe[1-9][0-9]*", option)), 20)
  unit = per_function * max(1, num_workers)
  return max(unit, round(_WINDOW.value / batch_size / unit) * unit)


def variant_shape(variant: str) -> tuple:
  """`(path, num_ps, num_workers, options)` of "PATH[_<ps>x<workers>][+option...]" (0, 0 for one process)."""
  name, *options = variant.split("+")
  path, _, shape = name.rpartition("_") if name[-1:].isdigit() else (name, "", "")
  num_ps, num_workers = (int(n) for n in shape.split("x")) if shape else (0, 0)
  return path, num_ps, num_workers, tuple(options)


def _option_args(variant: str) -> list:
  """The flags of train_bench.py (plain_pss_train.py for the ps floor) the variant's options set; raises
  `app.UsageError` on an unknown option."""
  path, num_ps, _, options = variant_shape(variant)
  options = _option_env(options)[1]
  if path == "ps_floor" and (set(options) - {"packed"} or (options and num_ps != 1)):
    raise app.UsageError(f"--variants: {variant!r}: the ps floor's one option is packed, with 1 ps only "
                         "(ps_floor_1x<workers>+packed)")
  if path == "ps_floor":
    return ["--packed_dense"] if options else []
  if path in PEERS and set(options) - {"per_feature"}:
    raise app.UsageError(f"--variants: {variant!r}: the plain peer's one option is per_feature")
  args = []
  for option in options:
    if option in _FLAG_OPTIONS:
      args.append(_FLAG_OPTIONS[option])
    elif re.fullmatch(r"spe[1-9][0-9]*", option):
      args.append(f"--steps_per_execution={int(option[3:])}")
    elif re.fullmatch(r"unroll[1-9][0-9]*", option):
      args.append(f"--unrolled_steps={int(option[6:])}")
    elif option != "per_feature":
      raise app.UsageError(f"--variants: {variant!r} has the option {option!r}; allowed: per_feature, spe<N>, "
                           "unroll<N>, intra<N>, inter<N>, " + ", ".join(_FLAG_OPTIONS))
  return args


# Paths run by plain_pss_train.py (no tfps code) -> its flags for them.
_PLAIN_PATHS = {"keras_pss": [], "keras_pss_fixed": ["--partitioner=fixed"], "ps_floor": ["--path=ps_floor"]}
# The peers each fit/estimator row is compared with: path -> the row's ratio field.
PEERS = {"keras_pss": "vs_keras_pss", "keras_pss_fixed": "vs_keras_pss_fixed"}


def _path_args(path: str) -> list:
  """The flags that select `path` in its script (plain_pss_train.py for the peers and the floor)."""
  return _PLAIN_PATHS.get(path, [f"--path={path}"])


def _peer_has(option: str) -> bool:
  """Whether the plain peer has `option` too (else a variant with it is compared with the peer without it)."""
  return not (option.startswith(("spe", "unroll", "intra", "inter")) or option in _FLAG_OPTIONS)


def _run(variant: str, batch_size: int, repeat: int) -> dict:
  path, num_ps, num_workers, options = variant_shape(variant)
  plain = path in _PLAIN_PATHS  # plain_pss_train.py: no tfps code
  args = _path_args(path) + [
      f"--batch_size={batch_size}", f"--steps={window_steps(variant, batch_size)}",
      f"--measure={1 if _QUICK.value else _MEASURE.value}", f"--vocab_size={_VOCAB.value}",
      f"--stack_tables={_STACK.value and 'per_feature' not in options}"]
  args.extend(_option_args(variant))
  if plain:  # processes may start slowly on a shared machine; the tfps variants wait as long (--connect_timeout_secs)
    args.append(f"--start_timeout_secs={_START_SECS.value}")
  else:
    args.append(f"--connect_timeout_secs={_START_SECS.value}")
  log_dir = runner.log_dir(f"{variant.replace('+', '_')}_b{batch_size}_r{repeat}")
  return runner.run(args, num_ps=num_ps, num_workers=num_workers, log_dir=log_dir, plain=plain,
                    env=_option_env(options)[0])


def _trivial(repeat: int) -> dict:
  return runner.run(["--path=trivial", f"--measure={_MEASURE.value}"], num_ps=1, num_workers=1,
                    log_dir=runner.log_dir(f"trivial_r{repeat}"))


def measure() -> dict:
  """Runs every (variant, batch) `--repeats` times in shuffled order; returns every run's result."""
  batches = [256] if _QUICK.value else [int(b) for b in _BATCHES.value]
  repeats = 1 if _QUICK.value else _REPEATS.value
  runs = {"load_before": os.getloadavg(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "results": []}
  for repeat in range(repeats):
    order = [(variant, batch) for variant in _VARIANTS.value for batch in batches
             if not variant.startswith("tutorial") or batch == min(batches)]
    order += [("trivial", 0)] if _TRIVIAL.value else []
    random.Random(repeat).shuffle(order)
    for variant, batch in order:
      print(f"repeat {repeat + 1}/{repeats}: {variant} batch {batch} ...", flush=True)
      result = _trivial(repeat) if variant == "trivial" else _run(variant, batch, repeat)
      runs["results"].append(dict(result, variant=variant, repeat=repeat, load=os.getloadavg()[0]))
  runs["load_after"] = os.getloadavg()
  return runs


def summarize(runs: dict) -> dict:
  """Median examples/s per (variant, batch), ratios to the faster single-process variant, coordinator costs, and
  the targets."""
  by_key = {}
  for result in runs["results"]:
    if result["variant"] != "trivial":
      by_key.setdefault((result["variant"], result["batch_size"]), []).append(result)
  rows = []
  ceiling = {}  # batch -> the faster of the single-process variants (stacked or per-feature tables)
  for (variant, batch), results in by_key.items():
    if variant.startswith("single"):
      ceiling[batch] = max(ceiling.get(batch, 0), statistics.median(r["examples_per_sec"] for r in results))
  for (variant, batch), results in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    rate = statistics.median(r["examples_per_sec"] for r in results)
    ratio = rate / ceiling[batch] if batch in ceiling else None
    row = {"variant": variant, "batch_size": batch, "examples_per_sec": rate, "vs_single": ratio,
           "runs": [r["examples_per_sec"] for r in results], "step_secs": statistics.median(
               r["step_secs"] for r in results)}
    if variant.startswith(("fit", "estimator")):
      row["chief_schedule_share"] = statistics.median(r["chief_schedule_share"] for r in results)
      row["chief_cpu_share"] = statistics.median(r["chief_cpu_share"] for r in results)
    row["cores"] = _median_cores(results)
    if row["cores"]:
      row["cpu_ms_per_step"] = cpu_ms_per_step(row)
    rows.append(row)
  _add_peer_ratios(rows)
  _add_cpu_ratios(rows)
  _add_floor_ratios(rows)
  trivial = [r["functions_per_sec"] for r in runs["results"] if r["variant"] == "trivial"]
  summary = {"rows": rows, "trivial_functions_per_sec": statistics.median(trivial) if trivial else None}
  summary["targets"] = _targets(rows, summary["trivial_functions_per_sec"])
  return summary


def _add_peer_ratios(rows) -> None:
  """`vs_keras_pss` (`vs_keras_pss_fixed`) of every fit/estimator row: its rate over the tutorial's peer's (the
  FixedShards peer's) of the same shape and batch."""
  peers = {}  # (peer path, (num_ps, num_workers, options), batch) -> examples/s
  for row in rows:
    path, *shape = variant_shape(row["variant"])
    if path in PEERS:
      peers[(path, tuple(shape), row["batch_size"])] = row["examples_per_sec"]
  for row in rows:
    path, num_ps, num_workers, options = variant_shape(row["variant"])
    if path not in ("fit", "estimator"):
      continue
    for peer, field in PEERS.items():
      key = (peer, (num_ps, num_workers, tuple(filter(_peer_has, options))), row["batch_size"])
      if key in peers:
        row[field] = row["examples_per_sec"] / peers[key]


def _add_floor_ratios(rows) -> None:
  """`ps_vs_floor` of every fit/estimator row: its ps CPU per step, per ps (the mean over its ps: their sum over the
  number of ps, as `cpu_ms_per_step` sums them), over the ps floor's (`ps_floor`, same shape and batch: the workload
  trained by a loop written directly in TensorFlow, nothing else on the ps); `ps_vs_floor_largest`: its busiest ps's
  over the floor's busiest ps's."""
  measured = [(row, variant_shape(row["variant"])) for row in rows if "cpu_ms_per_step" in row]
  floor = {(num_ps, num_workers, row["batch_size"]): row
           for row, (path, num_ps, num_workers, options) in measured if path == "ps_floor" and not options}
  for row, (path, num_ps, num_workers, _) in measured:
    base = floor.get((num_ps, num_workers, row["batch_size"]))
    if path in ("fit", "estimator") and base is not None:
      row["ps_vs_floor"] = row["cpu_ms_per_step"]["ps"] / base["cpu_ms_per_step"]["ps"]
      row["ps_vs_floor_of"] = "the mean over the ps"
      row["ps_vs_floor_largest"] = _largest_ps(row) / _largest_ps(base)


def _largest_ps(row) -> float:
  """The CPU per step of the busiest ps of `row` (its cores over the measured windows times the step time)."""
  return max(cores for task, cores in row["cores"].items() if task.startswith("ps:")) * row["step_secs"] * 1000


def cpu_ms_per_step(row) -> dict:
  """CPU milliseconds per step of `batch_size` examples, per role (`ps`, `worker`, `chief`, `single`) and `total`:
  each task's cores over the measured windows times the step time."""
  per_role = {}
  for task, cores in row["cores"].items():
    role = task.split(":")[0]
    per_role[role] = per_role.get(role, 0.0) + 1000 * cores * row["step_secs"]
  return dict(per_role, total=sum(per_role.values()))


def _add_cpu_ratios(rows) -> None:
  """`cpu_vs_single` of every cluster row: its CPU per example over all tasks over the leanest single-process
  variant's at the same batch (a step holds `batch_size` examples in both)."""
  single = {}
  for row in rows:
    if row["variant"].startswith("single") and "cpu_ms_per_step" in row:
      total = row["cpu_ms_per_step"]["total"]
      single[row["batch_size"]] = min(single.get(row["batch_size"], total), total)
  for row in rows:
    if not row["variant"].startswith("single") and "cpu_ms_per_step" in row and row["batch_size"] in single:
      row["cpu_vs_single"] = row["cpu_ms_per_step"]["total"] / single[row["batch_size"]]


def _median_cores(results):
  tasks = {task for r in results for task in r.get("tasks", {})}
  return {task: statistics.median(r["tasks"][task]["cores"] for r in results
                                  if "cores" in r.get("tasks", {}).get(task, {})) for task in sorted(tasks)
          if any("cores" in r.get("tasks", {}).get(task, {}) for r in results)}


def _targets(rows, trivial_rate) -> dict:
  """Each aim of `bench/aims.py` the rows can tell: `name -> (value, holds)`, the verdict from the unrounded value."""
  get = {(row["variant"], row["batch_size"]): row for row in rows}
  targets = {}
  for (variant, batch), row in get.items():
    one_by_one = variant in ("fit_1x1", "estimator_1x1") and batch == 256
    if one_by_one and row["vs_single"] is not None:
      targets[f"{variant} >= {aims.VS_SINGLE} x single at batch 256"] = (
          round(row["vs_single"], 3), row["vs_single"] >= aims.VS_SINGLE)
    if one_by_one and ("tutorial_1x1", 256) in get:
      ratio = row["examples_per_sec"] / get[("tutorial_1x1", 256)]["examples_per_sec"]
      targets[f"{variant} >= 4 x tutorial at batch 256"] = (round(ratio, 2), ratio >= 4)
    if row.get("ps_vs_floor") is not None:
      targets[f"{variant} ps CPU per step <= {aims.PS_VS_FLOOR} x the ps's floor at batch {batch}"] = (
          round(row["ps_vs_floor"], 3), row["ps_vs_floor"] <= aims.PS_VS_FLOOR)
    if variant.startswith("ps_floor") and "cpu_ms_per_step" in row:
      targets[f"{variant} (the ps's floor) ps CPU per step at batch {batch}"] = (
          round(row["cpu_ms_per_step"]["ps"], 2), None)
    if one_by_one and row.get("cpu_vs_single") is not None:
      targets[f"{variant} CPU per example <= {aims.CPU_VS_SINGLE} x single at batch 256"] = (
          round(row["cpu_vs_single"], 3), row["cpu_vs_single"] <= aims.CPU_VS_SINGLE)
    if row.get("vs_keras_pss") is not None:
      targets[f"{variant} >= {aims.VS_TUTORIAL_PEER} x keras_pss (the tutorial's peer) at batch {batch}"] = (
          round(row["vs_keras_pss"], 3), row["vs_keras_pss"] >= aims.VS_TUTORIAL_PEER)
    if variant.startswith("fit"):
      # The coordinator's share of a step: the chief's time inside schedule (blocking the loop), and its CPU time.
      share = max(row["chief_schedule_share"], row["chief_cpu_share"])
      targets[f"coordinator < 5% of step time ({variant}, batch {batch})"] = (
          round(share, 4), share < aims.COORDINATOR_SHARE)
  if trivial_rate:
    targets["trivial scheduled functions per second"] = (round(trivial_rate), None)
  return targets


def main(argv):
  del argv
  for variant in _VARIANTS.value:
    _option_args(variant)  # an unknown option fails here, before any run
  os.makedirs(_OUT.value, exist_ok=True)
  runs = measure()
  summary = summarize(runs)
  result = {"runs": runs, "summary": summary, "command": " ".join(sys.argv)}
  with open(os.path.join(_OUT.value, "throughput.json"), "w", encoding="utf-8") as out:
    json.dump(result, out, indent=2)
  print(report.throughput_table(summary, runs))
  plot = report.plot_throughput(summary, os.path.join(_OUT.value, "throughput.png"))
  print(f"Wrote {os.path.join(_OUT.value, 'throughput.json')}" + (f" and {plot}" if plot else ""))


if __name__ == "__main__":
  app.run(main)
