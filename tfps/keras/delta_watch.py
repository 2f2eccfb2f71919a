"""`tfps-delta watch`: keeps a served export current with a folder of delta exports.

The served exports sit in TF Serving's layout: `serving_dir/<version>/` a SavedModel each, named by the export
version it holds (the last delta applied, or a base). Each new state is applied (`tfps.keras.deltas.apply`) into a
hidden temporary folder and renamed to its number in one step, so TF Serving, which loads the highest complete
version, serves the old model or the new one, never a mix. The newest `keep` versions stay.

A chain that cannot be applied (a gap, a delta of another base or model) is refused in one line; the last good
version stays served, and the watch goes on looking (a missing delta may still come).
"""

import os
import threading
from typing import Callable, Optional

from tfps.keras import deltas as keras_deltas
from tfps.training import delta_files


def serve_newest(folder: str, serving_dir: str, keep: int) -> Optional[str]:
  """Applies what is new in `folder` since the newest version served in `serving_dir`, as a new version there, and
  removes all but the newest `keep` versions; returns the new version's folder, None when nothing was new. A chain
  that cannot be applied raises a one-line `DeltaError` and writes nothing."""
  versions = delta_files.served_versions(serving_dir)
  served = versions[max(versions)] if versions else None
  todo = delta_files.next_to_serve(folder, served)
  if todo is None:
    return None
  start, delta_paths, version = todo
  path = keras_deltas.apply(start, delta_paths, os.path.join(serving_dir, str(version)))
  delta_files.prune(serving_dir, keep)
  return path


def watch(folder: str, serving_dir: str, *, keep: int = 3, interval_secs: float = 1.0, once: bool = False,
          stop: Optional[threading.Event] = None, report: Callable[[str, bool], None] = lambda line, ok: None) -> bool:
  """Serves the newest state of the delta exports in `folder` under `serving_dir`, looking again every
  `interval_secs` until `stop` is set (or, with `once`, once).

  `report(line, ok)` hears each version served (`ok`) and each refusal (one line, told once until the next version
  is served). Returns False when the last look was refused, else True.
  """
  stop = stop or threading.Event()
  told = None
  while True:
    try:
      path = serve_newest(folder, serving_dir, keep)
      ok = True
      if path is not None:
        told = None
        step = delta_files.read_manifest(path)["step"]
        report(f"serving {path} (step {step})", True)
    except (delta_files.DeltaError, OSError) as e:
      ok, line = False, str(e).splitlines()[0]
      if line != told:
        told = line
        report(f"{line}; still serving the last good version", False)
    if once or stop.wait(interval_secs):
      return ok
