"""`tfps-report MODEL_DIR [--out FILE.png] [--serving DIR]`: plots a run's records (default output:
MODEL_DIR/run/report.png); for a stream run it also prints the table of its evaluations on the held-out windows, and
with `--serving` (the folder `tfps-delta watch` serves) the freshness of each served version, plotted and tabled."""

import os
from typing import Optional, Sequence

from absl import app
from absl import flags

from tfps.cli import flags as flags_lib
from tfps.errors import UsageError
from tfps.errors import refuse
from tfps.report import plot
from tfps.report import series as series_lib
from tfps import run_records
from tfps.training import delta_freshness

REPORT_FILE = "report.png"
PROGRAM = "tfps-report"
USAGE = "usage: tfps-report MODEL_DIR [--out FILE.png] [--serving DIR]"


def freshness_records(serving_dir: Optional[str]) -> list:
  """The freshness records of the served versions in `serving_dir` ([] without one); a one-line `UsageError` where it
  is not a folder."""
  if serving_dir is None:
    return []
  if not os.path.isdir(serving_dir):
    raise UsageError(f"--serving {serving_dir!r} is not a directory (give the folder tfps-delta watch --serving= "
                     "keeps current)")
  return delta_freshness.read(serving_dir)


def write_report(model_dir: str, out_path: Optional[str] = None, serving_dir: Optional[str] = None) -> str:
  """Writes the report of the run in `model_dir` to `out_path` (default `model_dir/run/report.png`), with the
  freshness of the versions served in `serving_dir` where given; returns it."""
  if not os.path.isdir(model_dir):
    raise UsageError(f"model_dir {model_dir!r} is not a directory")
  run = run_records.read_run(model_dir)
  if not run["progress"] and not run["evaluations"]:
    raise UsageError(f"no run records in {model_dir!r}: expected {run_records.run_dir(model_dir)}/"
                     f"{run_records.PROGRESS_FILE} or eval/metrics.jsonl (written by tfps.fit or tfps.Estimator)")
  out_path = out_path or os.path.join(run_records.run_dir(model_dir), REPORT_FILE)
  if os.path.isdir(out_path):
    raise UsageError(f"--out {out_path!r} is a folder; give the path of a .png file")
  try:
    return plot.write_png(series_lib.build_series(run, freshness_records(serving_dir)), out_path,
                          title=os.path.abspath(model_dir))
  except OSError as e:
    raise UsageError(f"--out {out_path!r} cannot be written ({e.strerror or e})") from None


def window_lines(model_dir: str) -> list:
  """The table of a stream run's evaluations on its held-out windows ([] for other runs)."""
  return series_lib.window_table(run_records.read_run(model_dir))


def main(argv: Sequence[str]) -> None:
  if len(argv) != 2:
    refuse(PROGRAM, f"give one MODEL_DIR (got {len(argv) - 1} arguments); {USAGE}")
  try:
    path = write_report(argv[1], flags.FLAGS.out, flags.FLAGS.serving)
    table = window_lines(argv[1])
    if table:
      print("evaluations on the newest held-out window of the stream:\n" + "\n".join(table))
    served = freshness_records(flags.FLAGS.serving)
    if served:
      print("served versions (tfps-delta watch):\n" + "\n".join(delta_freshness.table(served)))
      print(delta_freshness.summary_line(served) or "no served version has write times: freshness not measured")
    print(path)
  except UsageError as e:
    refuse(PROGRAM, str(e))


def run(argv: Optional[Sequence[str]] = None) -> None:
  """Console-script entry point of `tfps-report`: bad arguments or flags give one line on stderr and status 2."""
  flags_lib.define_report_flags(flags.FLAGS)
  flags_lib.show_usage_in_help(f"{USAGE}\n\nPlots the run records of MODEL_DIR (written by tfps.fit or "
                               "tfps.Estimator): loss, AUC and examples/s against the step; with --serving, the "
                               "freshness of the versions tfps-delta watch served there.\n")
  app.run(main, argv=argv, flags_parser=flags_lib.command_line_parser(PROGRAM))


if __name__ == "__main__":
  run()
