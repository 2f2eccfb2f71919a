"""Tables (Markdown) and plots (PNG, with matplotlib from the `bench` extra) of the benchmark results."""

from typing import Optional

_SHAPES = {"1x1": "1 ps + 1 worker", "2x2": "2 ps + 2 workers", "4x2": "4 ps + 2 workers"}
_NAMES = {"single": "single process (tf-keras, no strategy)",
          "single+per_feature": "single process, one table per feature", "fit_1x1": "tfps.fit, 1 ps + 1 worker",
          "fit_1x1+per_feature": "tfps.fit, 1 ps + 1 worker, one table per feature",
          "fit_2x2": "tfps.fit, 2 ps + 2 workers", "estimator_1x1": "Estimator path, 1 ps + 1 worker",
          "estimator_2x2": "Estimator path, 2 ps + 2 workers",
          "tutorial_1x1": "tutorial loop (1 step/schedule, fetch loss), 1 ps + 1 worker",
          **{f"keras_pss_{shape}": f"plain PSS Model.fit, the tutorial's MinSizePartitioner (no tfps), {name}"
             for shape, name in _SHAPES.items()},
          **{f"keras_pss_fixed_{shape}": f"plain PSS Model.fit, FixedShardsPartitioner (no tfps), {name}"
             for shape, name in _SHAPES.items()}}


def _load(runs: dict) -> str:
  return (f"load average (1/5/15 min) before {'/'.join(f'{x:.1f}' for x in runs['load_before'])}, after "
          f"{'/'.join(f'{x:.1f}' for x in runs['load_after'])}")


def throughput_table(summary: dict, runs: dict) -> str:
  lines = ["| variant | batch | examples/s (median) | x best single | vs keras_pss | vs keras_pss_fixed | step ms | "
           "ps CPU ms/step | CPU ms/step, all tasks | CPU/example x single |", "|" + " --- |" * 10]
  for row in summary["rows"]:
    ratio = "-" if row["vs_single"] is None else f"{row['vs_single']:.2f}"
    peer, fixed = ("-" if row.get(field) is None else f"{row[field]:.2f}"
                   for field in ("vs_keras_pss", "vs_keras_pss_fixed"))
    cpu = row.get("cpu_ms_per_step", {})
    ps_cpu = f"{cpu['ps']:.1f}" if "ps" in cpu else "-"
    total = f"{cpu['total']:.1f}" if cpu else "-"
    vs_single = "-" if row.get("cpu_vs_single") is None else f"{row['cpu_vs_single']:.2f}"
    lines.append(f"| {_NAMES.get(row['variant'], row['variant'])} | {row['batch_size']} | "
                 f"{row['examples_per_sec']:,.0f} | {ratio} | {peer} | {fixed} | {1000 * row['step_secs']:.1f} | "
                 f"{ps_cpu} | {total} | {vs_single} |")
  lines.append("")
  if summary.get("trivial_functions_per_sec"):
    lines.append(f"Trivial scheduled function: {summary['trivial_functions_per_sec']:,.0f} per second.")
  for row in summary["rows"]:
    cores = ", ".join(f"{task} {value:.2f}" for task, value in row.get("cores", {}).items())
    if "chief_schedule_share" in row:
      lines.append(f"{row['variant']} batch {row['batch_size']}: chief inside schedule "
                   f"{100 * row['chief_schedule_share']:.2f}% of wall time, chief CPU "
                   f"{100 * row['chief_cpu_share']:.2f}%; cores used: {cores}")
    elif cores:
      lines.append(f"{row['variant']} batch {row['batch_size']}: cores used: {cores}")
    if row.get("ps_vs_floor") is not None:
      lines.append(f"{row['variant']} batch {row['batch_size']}: ps CPU per step {row['ps_vs_floor']:.2f}x the ps's "
                   "floor (ps_floor: the same training written directly in TensorFlow, nothing else on the ps)")
  lines.append("")
  lines.append("| target | measured | holds |")
  lines.append("| --- | --- | --- |")
  for name, (value, holds) in summary["targets"].items():
    lines.append(f"| {name} | {value} | {'-' if holds is None else ('yes' if holds else 'no')} |")
  lines.append("")
  lines.append(_load(runs))
  return "\n".join(lines)


def _pyplot():
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("matplotlib is not installed (pip install -e '.[bench]'); no plot drawn")
    return None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def plot_throughput(summary: dict, path: str) -> Optional[str]:
  """Bars of examples/s relative to single-process tf-keras, one group per batch size."""
  plt = _pyplot()
  if plt is None:
    return None
  batches = sorted({row["batch_size"] for row in summary["rows"]})
  variants = [v for v in _NAMES if any(row["variant"] == v for row in summary["rows"])]
  fig, ax = plt.subplots(figsize=(11, 4.5))
  width = 0.8 / max(len(variants), 1)
  for i, variant in enumerate(variants):
    values = [next((row["vs_single"] or 0 for row in summary["rows"]
                    if row["variant"] == variant and row["batch_size"] == batch), 0) for batch in batches]
    positions = [b + i * width for b in range(len(batches))]
    ax.bar(positions, values, width, label=_NAMES[variant])
  ax.axhline(0.8, color="black", linestyle="--", linewidth=1, label="target for tfps: 0.8 x single")
  ax.set_xticks([b + width * (len(variants) - 1) / 2 for b in range(len(batches))])
  ax.set_xticklabels([f"batch {b}" for b in batches])
  ax.set_ylabel("examples/s / faster single process")
  ax.set_title("Wide&Deep, synthetic Criteo schema, legacy Adagrad, 2-core machine")
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def scaling_table(summary: dict) -> str:
  lines = ["| table rows | ps | step ms | vs median step | state/ps MiB | baseline MiB | ps peak RSS MiB (each) | "
           "(peak - baseline) / share | limit MiB | holds |", "|" + " --- |" * 10]
  for row in summary["rows"]:
    peaks = ", ".join(f"{p / 2**20:,.0f}" for p in row["ps_peak_rss_bytes"])
    ratio = "-" if row.get("step_vs_smallest") is None else f"{row['step_vs_smallest']:.2f}"
    lines.append(f"| {row['table_rows']:,} | {row['num_ps']} | {1000 * row['step_secs']:.1f} | {ratio} | "
                 f"{row['state_bytes'] / row['num_ps'] / 2**20:,.0f} | {row['baseline_bytes'] / 2**20:,.0f} | "
                 f"{peaks} | "
                 f"{row['peak_over_baseline_vs_state_per_ps']:.2f} | {row['limit_bytes'] / 2**20:,.0f} | "
                 f"{'yes' if row['rss_holds'] else 'no'} |")
  lines.append("")
  lines.append("baseline: peak RSS of a ps in the same training with tables of ~1,000 rows; limit = 1.2 x state/num_ps "
               "+ baseline; state = rows x (dim 16 + wide 1) x 4 B x 2 (Adagrad accumulators) + MLP.")
  lines.append(_load(summary["runs"]))
  return "\n".join(lines)


def plot_scaling(summary: dict, path: str) -> Optional[str]:
  """Step time by table size, and each ps's peak RSS against its limit, by number of ps."""
  plt = _pyplot()
  if plt is None:
    return None
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  for num_ps in sorted({row["num_ps"] for row in summary["rows"]}):
    rows = [row for row in summary["rows"] if row["num_ps"] == num_ps]
    left.plot([row["table_rows"] for row in rows], [1000 * row["step_secs"] for row in rows], marker="o",
              label=f"{num_ps} ps")
    peak, = right.plot([row["table_rows"] for row in rows], [max(row["ps_peak_rss_bytes"]) / 2**20 for row in rows],
                       marker="o", label=f"{num_ps} ps: largest ps peak")
    right.plot([row["table_rows"] for row in rows], [row["limit_bytes"] / 2**20 for row in rows], linestyle="--",
               color=peak.get_color(), label=f"{num_ps} ps: limit")
  return _save_size_plot(plt, fig, "rows of the large table", "peak RSS per ps (MiB)",
                         "Wide&Deep, one table grown; the step should not grow, each ps should hold its share", path)


def _save_size_plot(plt, fig, xlabel: str, memory_label: str, title: str, path: str) -> str:
  """Labels a plot of step time (left) and ps memory (right) against table rows, and writes it to `path`."""
  left, right = fig.axes
  for ax in (left, right):
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7)
  left.set_ylabel("step time (ms)")
  left.set_ylim(bottom=0)
  right.set_ylabel(memory_label)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def host_delay_table(summary: dict) -> str:
  lines = ["| delay per host (ms) | round trip added (ms) | examples/s (median) | vs no delay | step ms | busiest "
           "delayer: packets/s, CPU share |", "| --- | --- | --- | --- | --- | --- |"]
  for row in summary["rows"]:
    ratio = "-" if row["vs_no_delay"] is None else f"{row['vs_no_delay']:.2f}"
    load = (f"{row['busiest_delayer_packets_per_sec']:,}, {100 * row['busiest_delayer_cpu_share']:.1f}%"
            if row["delay_ms"] else "-")
    delay = "0 (through the delayers, held 1 us)" if 0 < row["delay_ms"] < 0.01 else f"{row['delay_ms']:g}"
    lines.append(f"| {delay} | {2 * row['delay_ms']:g} | {row['examples_per_sec']:,.0f} | {ratio} | "
                 f"{1000 * row['step_secs']:.1f} | {load} |")
  lines += ["", _load(summary)]
  return "\n".join(lines)


def plot_host_delay(summary: dict, path: str) -> Optional[str]:
  """Examples/s against the delay each host adds to every packet it receives."""
  plt = _pyplot()
  if plt is None:
    return None
  fig, ax = plt.subplots(figsize=(6, 4))
  for run in summary["runs"]:
    ax.scatter([run["delay_ms"]] * len(run["window_examples_per_sec"]), run["window_examples_per_sec"], s=8,
               color="grey", alpha=0.5)
  rows = [row for row in summary["rows"] if not 0 < row["delay_ms"] < 0.01]
  ax.plot([row["delay_ms"] for row in rows], [row["examples_per_sec"] for row in rows], marker="o",
          label="median (grey: each measured window)")
  for row in summary["rows"]:
    if 0 < row["delay_ms"] < 0.01:
      ax.scatter([0], [row["examples_per_sec"]], marker="x", color="red", zorder=3,
                 label="0 ms, every packet through the delayers")
  ax.set_xlabel("delay per host, ms (round trip + 2x)")
  ax.set_ylabel("examples/s")
  ax.set_ylim(bottom=0)
  ax.legend(fontsize=8)
  ax.set_title(f"tfps.fit, 2 ps + 2 workers on test hosts, batch {summary['batch_size']}", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def scale_table(summary: dict) -> str:
  """bench/scale.py: step time and ps memory per table size (each verdict from the unrounded value beside it)."""
  lines = ["| table | rows | step ms (runs) | x median | load | rows + slots per ps MiB | largest ps peak - baseline "
           "MiB | x rows + slots | bound | holds | bytes per row |", "|" + " --- |" * 11]
  for row in sorted(summary["rows"], key=lambda r: (r["table"] != "hashed", r["table_rows"])):
    runs = ", ".join(f"{1000 * secs:.1f}" for secs in row["step_secs_runs"])
    load = ", ".join(f"{value:.1f}" for value in row["load_runs"])
    over = max(row["ps_peak_rss_bytes"]) - row["baseline_bytes"]
    lines.append(f"| {row['table']} | {row['table_rows']:.0e} | {1000 * row['step_secs']:.1f} ({runs}) | "
                 f"{row['step_vs_median']:.2f} | {load} | {row['state_bytes'] / row['num_ps'] / 2**20:,.0f} | "
                 f"{over / 2**20:,.0f} | {row['over_baseline_vs_state']:.2f} | {row['rss_bound']} | "
                 f"{'yes' if row['rss_holds'] else 'no'} | {row['bytes_per_row']:.0f} |")
  return "\n".join(lines)


def checkpoint_table(summary: dict) -> str:
  """bench/scale.py: each checkpoint's save and its resume on the same or another number of ps, per GB."""
  lines = [
      "| checkpoint | GB | save s | s per GB | resumed on | create s | restore s | restore s per GB | step | rows "
      "read back equal | ps peak - baseline x share: saving, resuming | load |", "|" + " --- |" * 12]
  for row in summary["checkpoints"]:
    if row["resumed_on_ps"] is None:
      lines.append(f"| {row['table']} {row['table_rows']:.0e} rows, saved on {row['saved_on_ps']} ps | "
                   f"{row['checkpoint_bytes'] / 1e9:.2f} | {row['save_secs']:.1f} | {row['save_secs_per_gb']:.1f} | "
                   f"not resumed | | | | | | {row['save_factor']:.2f}, - | {row['load'][0]:.1f} |")
      continue
    lines.append(
        f"| {row['table']} {row['table_rows']:.0e} rows, saved on {row['saved_on_ps']} ps | "
        f"{row['checkpoint_bytes'] / 1e9:.2f} | {row['save_secs']:.1f} | {row['save_secs_per_gb']:.1f} | "
        f"{row['resumed_on_ps']} ps ({row['shards']} shards) | {row['create_secs']:.1f} | "
        f"{row['restore_secs']:.1f} | {row['restore_secs_per_gb']:.1f} | {row['step_saved']} -> "
        f"{row['step_restored']} | {'yes' if row['rows_read_back_equal'] else 'no'} | "
        f"{row['save_factor']:.2f}, {row['restore_factor']:.2f} | {row['load'][0]:.1f}, {row['load'][1]:.1f} |")
  return "\n".join(lines)


def advice_table(summary: dict) -> str:
  """bench/scale.py: what a table of 10^9 rows needs, from the bytes per row and the resume peaks measured."""
  lines = ["| table | rows | from bytes per row at | state GiB | resume | peak x share | ps of 64 GiB: count, GiB held "
           "each, peak | ps of 32 GiB: count, GiB held each, peak |", "|" + " --- |" * 8]
  for table, kinds in sorted(summary["advice"].items()):
    for kind, advice in kinds.items():
      cells = [f"{p['num_ps']}, {p['gib_per_ps']:.1f}, {p['peak_gib_per_ps']:.1f}"
               for p in (advice["ps"]["64"], advice["ps"]["32"])]
      lines.append(f"| {table} | {advice['table_rows']:.0e} | {advice['bytes_per_row']:.0f} B, "
                   f"{advice['from_rows']:.0e} rows | {advice['total_gib']:.0f} | "
                   f"{'on another number of ps' if kind == 'resharded' else 'on as many ps'} | "
                   f"{advice['restore_factor']:.2f} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines)


def plot_scale(summary: dict, path: str) -> Optional[str]:
  """Step time, and the ps's bytes per row over baseline against the bounds, by table size and kind."""
  plt = _pyplot()
  if plt is None:
    return None
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  for table in ("hashed", "dynamic"):
    rows = sorted((r for r in summary["rows"] if r["table"] == table), key=lambda r: r["table_rows"])
    if not rows:
      continue
    sizes = [row["table_rows"] for row in rows]
    left.plot(sizes, [1000 * row["step_secs"] for row in rows], marker="o", label=table)
    line, = right.plot(sizes, [row["bytes_per_row"] for row in rows], marker="o", label=f"{table}: measured")
    bound = rows[0]["rss_bound"] * rows[0]["state_bytes"] / rows[0]["table_rows"]
    right.axhline(bound, linestyle="--", color=line.get_color(), label=f"{table}: bound ({rows[0]['rss_bound']}x)")
  first = summary["rows"][0]
  right.axhline(first["state_bytes"] / first["table_rows"], linestyle=":", color="gray",
                label="rows + Adagrad slots")
  right.set_ylim(bottom=0)
  return _save_size_plot(plt, fig, "rows of the table (2 ps + 2 workers)", "ps bytes per row over baseline (all ps)",
                         "One table grown, dim 16, Adagrad: the step should stay flat, the ps hold only the rows", path)
