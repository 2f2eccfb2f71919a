"""Draws `ReportSeries` into a PNG with matplotlib (imported here only, so the rest of tfps does not need it)."""

from tfps.errors import UsageError
from tfps.report import series as series_lib

_STYLES = {"validation": "o", "sidecar": "x", "window": "s-"}  # by the curve label's first word; else a line with dots
_COLORS = {"validation": "C1", "sidecar": "C2", "window": "C3"}  # the same in every panel
INSTALL_HINT = "tfps-report needs matplotlib: pip install 'tfps[report]' (or pip install matplotlib)"


def _pyplot():
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UsageError(INSTALL_HINT) from None
  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def write_png(report: series_lib.ReportSeries, out_path: str, title: str) -> str:
  """Writes one panel per series group (loss, AUC, examples/s; a stream's lag) against step, restarts as dashed
  lines."""
  plt = _pyplot()
  names = list(report.panels)
  figure, axes = plt.subplots(len(names), 1, figsize=(9, 3.2 * len(names)), sharex=True, squeeze=False)
  for axis, name in zip(axes[:, 0], names):
    for curve in report.panels[name]:
      kind = curve.label.split()[0]
      axis.plot(curve.steps, curve.values, _STYLES.get(kind, ".-"), color=_COLORS.get(kind, "C0"), label=curve.label,
                markersize=6)
    for index, step in enumerate(report.restart_steps):
      axis.axvline(step, color="red", linestyle="--", linewidth=1, label="restart" if index == 0 else None)
    axis.set_ylabel(name)
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
      axis.legend(fontsize=8, loc="best")
  axes[-1, 0].set_xlabel("optimizer step")
  figure.suptitle(title, fontsize=10)
  figure.tight_layout()
  figure.savefig(out_path, format="png", dpi=100)
  plt.close(figure)
  return out_path
