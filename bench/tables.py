"""The measured tables of docs/performance.md, rendered from the results files they cite.

  .venv/bin/python bench/tables.py            # rewrites every generated block of docs/performance.md
  .venv/bin/python bench/tables.py --check    # exits 1 naming each block that differs from what its results give

A generated block sits between `<!-- tables.py: NAME -->` and `<!-- /tables.py -->`; `BLOCKS` says which results
each one is rendered from. Every verdict is computed from the unrounded numbers beside it (a ratio of 1.098 misses a
target of 1.10, and is shown as 1.098). Reads JSON only: no TensorFlow.
"""

import json
import os
import re
import statistics
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import aims  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import report  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import scale_summary  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import throughput  # pylint: disable=g-import-not-at-top,wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
DOC = os.path.join(ROOT, "docs", "performance.md")

_CHECK = flags.DEFINE_boolean("check", False, "Only compare: exit 1 if a block differs from its results.")

# Today's defaults (each metric's variables on one ps, the loss metric updated once per scheduled function), 2026-11-28
# evening: tfps.fit and the Estimator path beside the tutorial's peer, the FixedShards peer, one process and the
# ps's floor, 3 alternating repetitions each, at every shape and both batches (and `--unrolled_steps=4` at 1x1).
DEFAULTS = ("defaults_4/b256_1x1", "defaults_4/b256_more", "defaults_4/b4096")
# Pipelined updates beside the default and the tutorial's peer at 1x1 and 2x2, batch 256: two series of 3
# alternating repetitions, one after the other.
OVERLAP = ("overlap/b256", "overlap/b256_again")
_PATHS = {"fit": "tfps.fit", "estimator": "Estimator path", "keras_pss": "plain PSS `Model.fit`",
          "keras_pss_fixed": "plain PSS `Model.fit`, FixedShards", "ps_floor": "the ps's floor",
          "single": "one process"}
_PEERS = {"min_size": "the tutorial's peer", "fixed": "the FixedShards peer"}
_OPTIONS = {"unpacked": "`--nopacked_reads`", "packed": "`--packed_reads`", "pipelined": "`--pipelined_updates`",
            "spin": "`--thread_spinning`", "lockfree": "`--lockfree_row_updates`", "bf16": "`--bf16_rows`",
            "nolock": "`--norecords_lock`",
            "per_feature": "a table per feature", "unroll1": "`--unrolled_steps=1`",
            "unroll4": "`--unrolled_steps=4`"}
# (switch, results file, variant with it, variant without it): each pair ran side by side in one series.
SWITCHES = (
    ("`--nopacked_reads`", "packed_default/b256_1x1", "fit_1x1+unpacked", "fit_1x1"),
    ("`--pipelined_updates`", "sleeping_default/b4096", "fit_1x1+pipelined", "fit_1x1"),
    ("`--pipelined_updates`", OVERLAP[0], "fit_1x1+pipelined", "fit_1x1"),
    ("`--pipelined_updates`", OVERLAP[0], "fit_2x2+pipelined", "fit_2x2"),
    ("`--pipelined_updates`", OVERLAP[1], "fit_1x1+pipelined", "fit_1x1"),
    ("`--pipelined_updates`", OVERLAP[1], "fit_2x2+pipelined", "fit_2x2"),
    ("`--unrolled_steps=4`", "unrolled_steps/ab", "fit_1x1", "fit_1x1+unroll1"),
    ("`--unrolled_steps=4`", "unrolled_steps/b4096_2x2", "fit_2x2", "fit_2x2+unroll1"),
    ("`--unrolled_steps=4`", "one_box/b4096_2x2", "fit_2x2+unroll4", "fit_2x2"),
    ("`--unrolled_steps=4`", DEFAULTS[0], "fit_1x1+unroll4", "fit_1x1"),
    ("`--bf16_rows`", "bf16_rows/b256", "fit_1x1+bf16", "fit_1x1"),
    ("`--bf16_rows`", "bf16_rows/b4096", "fit_2x2+bf16", "fit_2x2"),
    ("`--lockfree_row_updates`", "defaults_locked_rows/b256_1x1.json", "fit_1x1+lockfree", "fit_1x1"),
    ("`--thread_spinning`", "sleeping_default", "fit_1x1+spin", "fit_1x1"),
)


def load(name: str) -> dict:
  """The results file `name` (a folder of bench/results holding throughput.json, or a .json path under it); a
  throughput row sampled for CPU before its summary held CPU per step gets it, as bench/throughput.py computes it."""
  path = os.path.join(RESULTS, name)
  with open(path if name.endswith(".json") else os.path.join(path, "throughput.json"), encoding="utf-8") as f:
    result = json.load(f)
  for row in result.get("summary", {}).get("rows", []):
    if row.get("cores") and "cpu_ms_per_step" not in row:
      row["cpu_ms_per_step"] = throughput.cpu_ms_per_step(row)
  return result


def shape(variant: str) -> tuple:
  """`(path, "<ps>x<workers>" or "", options)` of a throughput variant (`bench/throughput.py`'s names)."""
  path, num_ps, num_workers, options = throughput.variant_shape(variant)
  return path, f"{num_ps}x{num_workers}" if num_ps else "", options


def peer_kind(result: dict) -> str:
  """The partitioner of the `keras_pss_*` peer in a throughput result: runs before the peer recorded its own were
  all FixedShardsPartitioner's ("fixed"); since, "min_size" (TensorFlow's tutorial) unless run as fixed."""
  kinds = {run.get("partitioner", "fixed") for run in result["runs"]["results"]
           if shape(run["variant"])[0] == "keras_pss"}
  return kinds.pop() if len(kinds) == 1 else "fixed"


def rows(names) -> list:
  """Every summary row of the results `names`, each with its `file` and `peer` (the partitioner of its peer)."""
  out = []
  for name in names:
    result = load(name)
    kind = peer_kind(result)
    for row in result["summary"]["rows"]:
      path = shape(row["variant"])[0]
      out.append(dict(row, file=name, peer={"keras_pss": kind, "keras_pss_fixed": "fixed"}.get(path)))
  return out


def peer_ratio(row: dict, all_rows: list, kind: str):
  """The row's examples/s over its peer's of partitioner `kind` (same file, shape, batch), or None."""
  path, size, _ = shape(row["variant"])
  for peer in all_rows:
    peer_path, peer_size, peer_options = shape(peer["variant"])
    if (peer["file"] == row["file"] and peer["peer"] == kind and peer_size == size and not peer_options
        and peer["batch_size"] == row["batch_size"] and path in ("fit", "estimator")):
      return row["examples_per_sec"] / peer["examples_per_sec"]
  return None


def label(variant: str, peer=None) -> str:
  """A reader's name of `variant` (its path, shape and switches); a plain peer's names its partitioner `peer`."""
  path, size, options = shape(variant)
  text = _PATHS.get(path, path)
  if peer == "fixed" and path == "keras_pss":
    text += ", FixedShards"
  elif peer == "min_size":
    text += ", tutorial (MinSize)"
  if path == "ps_floor" and "packed" in options:
    return f"{text} {size}, dense variables in one"
  return " ".join(filter(None, [text, size] + [_OPTIONS.get(o, o) for o in options]))


def _cpu(row: dict, part: str) -> str:
  value = row.get("cpu_ms_per_step", {}).get(part)
  return "" if value is None else f"{value:.2f}"


def _ratio(value, digits: int = 2) -> str:
  return "" if value is None else f"{value:.{digits}f}"


def _order(row: dict) -> tuple:
  path, size, options = shape(row["variant"])
  order = ["fit", "estimator", "keras_pss", "keras_pss_fixed", "ps_floor", "single"]
  return (size or "9", order.index(path) if path in order else 99, options)


def series_table(names, batch: int) -> str:
  """ex/s (runs), against each peer present, against one process, CPU per step: a row per variant at `batch`."""
  all_rows = rows(names)
  kinds = sorted({row["peer"] for row in all_rows if row["peer"]}, reverse=True)  # min_size (the tutorial's) first
  peers = "".join(f" x {_PEERS[kind]} |" for kind in kinds)
  lines = [f"| variant, batch {batch} | examples/s (runs) |{peers} x one process | ps CPU ms/step | "
           "all tasks CPU ms/step | CPU per example x one process | results |", "|" + " --- |" * (7 + len(kinds))]
  for row in sorted((r for r in all_rows if r["batch_size"] == batch), key=_order):
    runs = ", ".join(f"{rate:,.0f}" for rate in row["runs"])
    ratios = "".join(f" {_ratio(peer_ratio(row, all_rows, kind))} |" for kind in kinds)
    lines.append(f"| {label(row['variant'], row['peer'])} | {row['examples_per_sec']:,.0f} ({runs}) |{ratios} "
                 f"{_ratio(row.get('vs_single'))} | {_cpu(row, 'ps')} | {_cpu(row, 'total')} | "
                 f"{_ratio(row.get('cpu_vs_single'))} | `{row['file']}` |")
  return "\n".join(lines)


def _verdict(value, bound: float, at_most: bool) -> str:
  if value is None:
    return "not measured"
  holds = value <= bound if at_most else value >= bound
  return "yes" if holds else "no"


def targets_table(names) -> str:
  """Today's aims against the series `names`: each measured value with 3 decimals and its computed verdict (a row of
  a later series replaces an earlier one's of the same variant and batch; each is judged against its own file's peer)."""
  all_rows = rows(names)
  get = {(row["variant"], row["batch_size"]): row for row in all_rows}
  lines = ["| aimed at | measured | holds |", "| --- | --- | --- |"]
  for (variant, batch), row in sorted(get.items(), key=lambda kv: (kv[0][1], _order(kv[1]))):
    path, size, options = shape(variant)
    if path not in ("fit", "estimator") or options:
      continue
    tutorial, fixed = peer_ratio(row, all_rows, "min_size"), peer_ratio(row, all_rows, "fixed")
    aim = f"{label(variant)}, batch {batch} >= {aims.VS_TUTORIAL_PEER}x the tutorial's peer"
    if tutorial is not None:
      lines.append(f"| {aim} | {tutorial:.3f} | {_verdict(tutorial, aims.VS_TUTORIAL_PEER, False)} |")
    elif fixed is not None:
      lines.append(f"| {aim} | not measured yet (x the FixedShards peer: {fixed:.3f}) | pending |")
    if size == "1x1" and batch == min(b for _, b in get):
      cpu, speed, floor = row.get("cpu_vs_single"), row.get("vs_single"), row.get("ps_vs_floor")
      lines.append(f"| {label(variant)}, batch {batch}: CPU per example over all tasks <= {aims.CPU_VS_SINGLE}x one "
                   f"process | {_ratio(cpu, 3)} | {_verdict(cpu, aims.CPU_VS_SINGLE, True)} |")
      lines.append(f"| {label(variant)}, batch {batch}: >= {aims.VS_SINGLE}x one process's examples/s | "
                   f"{_ratio(speed, 3)} | {_verdict(speed, aims.VS_SINGLE, False)} |")
      lines.append(f"| {label(variant)}, batch {batch}: ps CPU per step <= {aims.PS_VS_FLOOR}x the ps's floor | "
                   f"{_ratio(floor, 3)} | {_verdict(floor, aims.PS_VS_FLOOR, True)} |")
  return "\n".join(lines)


def run_cpu_ms(name: str, variant: str, batch: int) -> list:
  """All tasks' CPU milliseconds per step of each run of `variant` at `batch` in the results `name`, in run order."""
  return [throughput.cpu_ms_per_step({"cores": {task: t["cores"] for task, t in run["tasks"].items()},
                                       "step_secs": run["step_secs"]})["total"]
          for run in load(name)["runs"]["results"] if run["variant"] == variant and run["batch_size"] == batch]


def cpu_target_rows(names, variant: str, default: str = "fit_1x1", batch: int = 256) -> list:
  """A row per series `names`: the 1x1 CPU aim for the default and `variant`, each the median of its runs' CPU per
  step over one process's, each run's CPU its own (steadier under load than median cores x median step)."""
  lines = []
  for name in names:
    median = {v: statistics.median(run_cpu_ms(name, v, batch)) for v in (variant, default, "single")}
    values = [median[default] / median["single"], median[variant] / median["single"]]
    loads = [run["load"] for run in load(name)["runs"]["results"]]
    lines.append(f"| {label(default)} / {_OPTIONS[shape(variant)[2][0]]}, batch {batch}: CPU per example over all "
                 f"tasks <= {aims.CPU_VS_SINGLE}x one process, `{name}`, load {min(loads):.0f}-{max(loads):.0f} | "
                 f"{values[0]:.3f} / {values[1]:.3f} (x the default's CPU: {median[variant] / median[default]:.3f}) | "
                 + " / ".join(_verdict(value, aims.CPU_VS_SINGLE, True) for value in values) + " |")
  return lines


def floor_target_rows(names, size: str = "2x2", batch: int = 256) -> list:
  """A row per series `names` and path: the ps's CPU per step at `size` over the floor's, per ps (the mean over the
  ps), with the series' load."""
  lines = []
  for name in names:
    loads = [run["load"] for run in load(name)["runs"]["results"]]
    for row in rows((name,)):
      if row["batch_size"] == batch and row.get("ps_vs_floor") and row["variant"] in (f"fit_{size}",
                                                                                      f"estimator_{size}"):
        lines.append(f"| {label(row['variant'])}, batch {batch}: ps CPU per step, per ps, <= {aims.PS_VS_FLOOR}x "
                     f"the ps's floor, `{name}`, load {min(loads):.0f}-{max(loads):.0f} | {row['ps_vs_floor']:.3f} | "
                     f"{_verdict(row['ps_vs_floor'], aims.PS_VS_FLOOR, True)} |")
  return lines


def recent_targets() -> str:
  """The aims against today's defaults (`DEFAULTS`): tfps.fit and the Estimator path at every shape and both batches,
  the 1x1 CPU aim with each run's own CPU beside 4 steps per loop iteration (`--unrolled_steps=4`), and the ps's
  floor at 2x2."""
  return "\n".join([targets_table(DEFAULTS)] + cpu_target_rows(DEFAULTS[:1], "fit_1x1+unroll4")
                   + floor_target_rows(DEFAULTS[1:2]))


def switches_table() -> str:
  """Each switch against the default, the two run side by side in one series (medians)."""
  lines = ["| switch | variant, batch | examples/s with / without | ratio | all tasks CPU ms/step with / without | "
           "x the FixedShards peer with / without | results |", "|" + " --- |" * 7]
  for switch, name, on, off in SWITCHES:
    result = load(name)
    get = {row["variant"]: row for row in result["summary"]["rows"]}
    kind = peer_kind(result)
    with_, without = get[on], get[off]
    cpu = (f"{_cpu(with_, 'total')} / {_cpu(without, 'total')}" if _cpu(with_, "total") and _cpu(without, "total")
           else "")
    peer = ""
    if kind == "fixed" and with_.get("vs_keras_pss") and without.get("vs_keras_pss"):
      peer = f"{with_['vs_keras_pss']:.2f} / {without['vs_keras_pss']:.2f}"
    lines.append(f"| {switch} | `{on}` / `{off}`, {with_['batch_size']} | {with_['examples_per_sec']:,.0f} / "
                 f"{without['examples_per_sec']:,.0f} | {with_['examples_per_sec'] / without['examples_per_sec']:.2f}"
                 f" | {cpu} | {peer} | `{name}` |")
  return "\n".join(lines)


def tasks_table(names, variants) -> str:
  """Step time and each role's CPU per step for `variants` ((variant, batch) pairs) of the results `names`."""
  get = {(row["variant"], row["batch_size"]): row for row in rows(names)}
  lines = ["| variant, batch | step ms | ps CPU ms/step | worker (one process: its own) | chief | all tasks | "
           "cores busy | results |",
           "|" + " --- |" * 8]
  for variant, batch in variants:
    row = get[(variant, batch)]
    step = 1000 * row["step_secs"]
    cpu = row["cpu_ms_per_step"]
    lines.append(f"| {label(variant, row['peer'])}, {batch} | {step:.1f} | {_cpu(row, 'ps')} | "
                 f"{_cpu(row, 'worker') or _cpu(row, 'single')} | {_cpu(row, 'chief')} | {cpu['total']:.2f} | "
                 f"{cpu['total'] / step:.2f} | `{row['file']}` |")
  return "\n".join(lines)


def profile_table(name: str) -> str:
  """The share of each kind of work in the sampled CPU of each task of the profile `name` (bench/profile_tasks.py)."""
  tasks = load(name)["tasks"]
  kinds = sorted({kind for task in tasks.values() for kind in task["kinds"]},
                 key=lambda kind: (kind == "other", -tasks["ps:0"]["kinds"].get(kind, 0)))
  lines = ["| kind of work | " + " | ".join(f"{task}, % of its CPU" for task in tasks) + " |",
           "|" + " --- |" * (len(tasks) + 1)]
  for kind in kinds:
    lines.append(f"| {kind} | " + " | ".join(f"{task['kinds'].get(kind, 0):.1f}" for task in tasks.values()) + " |")
  return "\n".join(lines)


def modes_table(name: str) -> str:
  """sync and geo against async (bench/modes.py): examples/s, the ps's bytes per example, validation AUC."""
  result = load(name)
  lines = ["| mode | rows per table | examples/s | x async | ps bytes per example | x async | validation AUC | "
           "AUC - async's |", "|" + " --- |" * 8]
  for row in sorted(result["rows"], key=lambda r: (["async", "sync", "geo"].index(r["mode"]), -r["vocab_size"])):
    lines.append(f"| {row['mode']} | {row['vocab_size']:,} | {row['examples_per_sec']:,.0f} | "
                 f"{row['speed_vs_async']:.2f} | {row['ps_bytes_per_example']:,.0f} | {row['traffic_vs_async']:.2f} | "
                 f"{row['val_auc']:.4f} | {row['auc_vs_async']:+.4f} |")
  return "\n".join(lines)


PROFILE = "loop_index/profile/profile.json"
SCALE = "scale/quiet/scale.json"  # a quiet hour, 2026-11-28 (the series before it: scale/scale.json)
DYNAMIC_AGAIN = "scale/dynamic_again/scale.json"  # the dynamic table alone, 3 repetitions, a later hour of 2026-11-28
RESTORE = {"before": "scale/restore_before/scale.json", "after": "scale/restore_same_ps/scale.json"}  # piecewise restore


def scale_targets(name: str = SCALE) -> str:
  """The aims of the scale series `name` over every size measured, each verdict as bench/scale_summary.py computed it
  from the unrounded value."""
  lines = ["| aimed at, over every size of one table | measured | holds |", "| --- | --- | --- |"]
  for aim, (value, holds) in load(name)["summary"]["targets"].items():
    lines.append(f"| {aim} | {value:.3f} | {'yes' if holds else 'no'} |")
  return "\n".join(lines)


def scale_advice() -> str:
  """What 10^9 rows need: bytes per row from the scale series, resume peaks from the piecewise restore's series."""
  factors = scale_summary.largest_restore_factors(load(RESTORE["after"])["summary"]["checkpoints"])
  return report.advice_table({"advice": scale_summary.advice(load(SCALE)["summary"]["rows"], factors)})


BLOCKS = {
    "defaults_b256": lambda: series_table(DEFAULTS[:2], 256),
    "defaults_b4096": lambda: series_table(DEFAULTS[2:], 4096),
    "recent_targets": recent_targets,
    "tasks": lambda: tasks_table(DEFAULTS, [("fit_1x1", 256), ("estimator_1x1", 256), ("keras_pss_1x1", 256),
                                            ("ps_floor_1x1", 256), ("single", 256), ("fit_1x1", 4096),
                                            ("single", 4096)]),
    "profile": lambda: profile_table(PROFILE),
    "switches": switches_table,
    "modes": lambda: modes_table("modes.json"),
    "scale": lambda: report.scale_table(load(SCALE)["summary"]),
    "scale_targets": scale_targets,
    "scale_dynamic_again": lambda: report.scale_table(load(DYNAMIC_AGAIN)["summary"]),
    "scale_dynamic_again_targets": lambda: scale_targets(DYNAMIC_AGAIN),
    "scale_checkpoint": lambda: report.checkpoint_table(load(SCALE)["summary"]),
    "scale_advice": scale_advice,
    "scale_restore_after": lambda: report.checkpoint_table(load(RESTORE["after"])["summary"]),
}
_BLOCK = re.compile(r"(<!-- tables\.py: (\w+) -->\n)(.*?)(<!-- /tables\.py -->)", re.S)


def render(text: str) -> str:
  """`text` with every generated block rendered from its results; raises KeyError naming an unknown block."""
  return _BLOCK.sub(lambda m: m.group(1) + BLOCKS[m.group(2)]() + "\n" + m.group(4), text)


def stale_blocks(text: str) -> list:
  """Names of the blocks of `text` that differ from what their results give."""
  return [m.group(2) for m in _BLOCK.finditer(text) if m.group(3) != BLOCKS[m.group(2)]() + "\n"]


def main(argv):
  del argv
  with open(DOC, encoding="utf-8") as f:
    text = f.read()
  if _CHECK.value:
    stale = stale_blocks(text)
    if stale:
      sys.exit(f"docs/performance.md: blocks differ from their results: {', '.join(stale)} "
               "(run bench/tables.py to rewrite them)")
    print("docs/performance.md: every generated block matches its results")
    return
  with open(DOC, "w", encoding="utf-8") as f:
    f.write(render(text))
  print(f"Rewrote the generated blocks of {DOC}")


if __name__ == "__main__":
  app.run(main)
