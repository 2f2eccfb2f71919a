"""When delta exports are written, one driver for both training paths (`tfps.training.deltas` writes them).

A `DeltaSchedule` writes a base when training starts, then a delta at the first point with no step in flight (on
the Keras path an epoch's end, or a pause between two executions of steps within an epoch; a step-log line or a
checkpoint on the Estimator path, on files or on a stream) at least `secs` seconds after the last export, and one at
the end of training where anything was trained since.

On a stream each export's manifest holds `stream`: the stream's name and the position `to` just after the last
example the export holds (per Kafka partition the next offset; for a folder the slice and lines read), and a delta
also `from`, the position after the examples of the export before it: the examples in `[from, to)` are those whose
updates the delta is the first to ship, and `written`, the oldest and newest time those examples were written to the
stream (`WriteSpan`; `tfps.training.delta_freshness` turns them into each served version's freshness).
"""

import time
from typing import Callable, Optional, Sequence, Tuple

from absl import logging

from tfps.errors import UsageError
from tfps.training import deltas

DELTAS_SUBDIR = "deltas"  # the folder of exports in model_dir


def refuse_tables(secs, tables: Sequence, whole_export: str) -> None:
  """A one-line `UsageError` where one of `tables` (table layers, or the table states a model_fn's layers share)
  cannot say what its deltas hold (no `delta_shards()`: its id maps would not be in the deltas); `whole_export`
  names the export to use instead."""
  names = [getattr(table, "name", type(table).__name__) for table in tables
           if not callable(getattr(table, "delta_shards", None))]
  if names:
    raise UsageError(f"`delta_export_secs` ({secs}) cannot export table layers without `delta_shards` "
                     f"({', '.join(names)}): their id maps are not in the deltas; export whole SavedModels "
                     f"({whole_export}) for them")


class WriteSpan:
  """The oldest and newest write time (seconds since the epoch) of the examples trained since the last export: the
  stream loop adds each batch's, the schedule puts them in a delta's manifest and clears them once it is written."""

  def __init__(self):
    self.oldest: Optional[float] = None
    self.newest: Optional[float] = None

  def add(self, written: Optional[Tuple[float, float]]) -> None:
    """Adds a batch's `(oldest, newest)` write time (None: its source gives none)."""
    if written is not None:
      self.oldest = written[0] if self.oldest is None else min(self.oldest, written[0])
      self.newest = written[1] if self.newest is None else max(self.newest, written[1])

  def describe(self) -> dict:
    """`{"written": {"oldest": t, "newest": t}}` for a manifest's `stream`; {} where no write time was seen."""
    return {} if self.oldest is None else {"written": {"oldest": self.oldest, "newest": self.newest}}

  def clear(self) -> None:
    self.oldest = self.newest = None


# (the stream's name, the position after the last example trained on[, the `WriteSpan` of the examples since the last
# export])
Stream = Optional[tuple]


class DeltaSchedule:
  """Writes `writer`'s base and deltas (a `deltas.DeltaWriter`) every `secs` seconds; `step()` reads the step,
  `export(folder)` writes the base's SavedModel, `base_extra` adds to the base's manifest (`saved_model`).

  A delta that cannot be written (a full disk) is logged and its rows stay marked: the next delta carries them (and
  its `stream.from` stays where the last written export left off), and the previous one stays valid.
  """

  def __init__(self, writer: deltas.DeltaWriter, secs: float, step: Callable[[], int],
               export: Callable[[str], None], base_extra: Optional[dict] = None):
    self.writer, self.secs, self._step, self._export, self._base_extra = writer, secs, step, export, base_extra
    self._last, self._written_step, self._position = 0.0, -1, None

  def begin(self, stream: Stream = None) -> Optional[str]:
    """Writes the base at the current step, unless this schedule wrote one already (a later `train` call of the same
    model goes on with its chain); returns its path or None."""
    if self.writer.base is not None:
      return None
    step = self._step()
    position = {} if stream is None else {"stream": {"name": stream[0], "to": stream[1]}}
    path = self.writer.write_base(self._export, step, dict(self._base_extra or {}, **position))
    logging.info("Wrote the base export %s at step %d", path, step)
    self._wrote(step, stream)
    return path

  def due(self) -> bool:
    """Whether `secs` have passed since the last export."""
    return time.monotonic() - self._last >= self.secs

  def maybe_write(self, stream: Stream = None) -> Optional[str]:
    """A delta if one is due and a step was trained since the last export (no step may be in flight); returns its
    path or None."""
    return self.finish(stream) if self.due() else None

  def finish(self, stream: Stream = None) -> Optional[str]:
    """At the end of training: a delta if anything was trained since the last export."""
    return self.write(stream) if self._step() != self._written_step else None

  def write(self, stream: Stream = None) -> Optional[str]:
    """A delta of what changed since the last export, at the current step (no step may be in flight); returns its
    path, or None where it could not be written (logged; the next delta carries its rows)."""
    step, started = self._step(), time.monotonic()
    extra = None
    if stream is not None:
      start = self._position if self._position is not None else stream[1]
      extra = {"stream": {"name": stream[0], "from": start, "to": stream[1], **_span(stream).describe()}}
    try:
      path = self.writer.write_delta(step, extra)
    except OSError as e:
      logging.warning("Could not write a delta at step %d (%s); the last delta stays valid and the next one carries "
                      "its rows", step, e)
      return None
    logging.info("Wrote delta %s at step %d in %.3f s", path, step, time.monotonic() - started)
    self._wrote(step, stream)
    return path

  def _wrote(self, step: int, stream: Stream) -> None:
    self._last, self._written_step = time.monotonic(), step
    if stream is not None:
      self._position = stream[1]
      _span(stream).clear()


def _span(stream: tuple) -> WriteSpan:
  return stream[2] if len(stream) > 2 else WriteSpan()
