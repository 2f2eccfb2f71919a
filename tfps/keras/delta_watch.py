"""`tfps-delta watch`: keeps a served export current with a folder of delta exports.

The served exports sit in TF Serving's layout: `serving_dir/<version>/` a SavedModel each, named by the export
version it holds (the last delta applied, or a base). Each new state is applied (`tfps.keras.deltas.apply`) into a
hidden temporary folder and renamed to its number in one step, so TF Serving, which loads the highest complete
version, serves the old model or the new one, never a mix. The newest `keep` versions stay.

A chain that cannot be applied (a gap, a delta of another base or model) is refused in one line; the last good
version stays served, and the watch goes on looking (a missing delta may still come).

Each version swapped in that applied deltas gets a freshness record in `serving_dir/freshness.jsonl`
(`tfps.training.delta_freshness`): from its examples' write times to the swap; the watch tells it with the version and
sums it up when it stops.
"""

import os
import threading
import time
from typing import Callable, Optional, Tuple

from tfps.keras import deltas as keras_deltas
from tfps.training import delta_files
from tfps.training import delta_freshness


def serve_newest(folder: str, serving_dir: str, keep: int) -> Optional[Tuple[str, Optional[dict]]]:
  """Applies what is new in `folder` since the newest version served in `serving_dir`, as a new version there, and
  removes all but the newest `keep` versions; returns the new version's folder and its freshness record (None where
  it applied no delta of a stream run), None when nothing was new. A chain that cannot be applied raises a one-line
  `DeltaError` and writes nothing."""
  versions = delta_files.served_versions(serving_dir)
  served = versions[max(versions)] if versions else None
  todo = delta_files.next_to_serve(folder, served)
  if todo is None:
    return None
  start, delta_paths, version = todo
  path = keras_deltas.apply(start, delta_paths, os.path.join(serving_dir, str(version)))
  swapped_at, record = time.time(), None
  if delta_paths:
    manifests = [delta_files.read_manifest(delta) for delta in delta_paths]
    record = delta_freshness.version_record(version, manifests[-1]["step"], manifests, delta_paths, swapped_at)
    if record is not None:
      delta_freshness.append(serving_dir, record)
  delta_files.prune(serving_dir, keep)
  return path, record


def watch(folder: str, serving_dir: str, *, keep: int = 3, interval_secs: float = 1.0, once: bool = False,
          stop: Optional[threading.Event] = None, report: Callable[[str, bool], None] = lambda line, ok: None) -> bool:
  """Serves the newest state of the delta exports in `folder` under `serving_dir`, looking again every
  `interval_secs` until `stop` is set (or, with `once`, once).

  `report(line, ok)` hears each version served (`ok`, with its freshness) and each refusal (one line, told once
  until the next version is served). When it stops, a line sums up the freshness of the versions it served. Returns
  False when the last look was refused, else True.
  """
  stop = stop or threading.Event()
  told, measured = None, []
  while True:
    try:
      served = serve_newest(folder, serving_dir, keep)
      ok = True
      if served is not None:
        told = None
        report(_served_line(*served, measured), True)
    except (delta_files.DeltaError, OSError) as e:
      ok, line = False, str(e).splitlines()[0]
      if line != told:
        told = line
        report(f"{line}; still serving the last good version", False)
    if once or stop.wait(interval_secs):
      summary = delta_freshness.summary_line(measured)
      if summary is not None:
        report(summary, True)
      return ok


def _served_line(path: str, record: Optional[dict], measured: list) -> str:
  """The line telling version `path` is served: its step and, where it applied deltas of a stream run, its freshness
  (`record`, added to `measured`)."""
  step = delta_files.read_manifest(path)["step"]
  if record is None:
    return f"serving {path} (step {step})"
  measured.append(record)
  return f"serving {path} (step {step}; {delta_freshness.describe(record)})"
