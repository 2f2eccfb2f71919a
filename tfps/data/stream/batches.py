"""Records of a stream parsed with a feature spec into fixed-size batches, each with the stream position after it.

Parsing reuses the file reader's code (`tfps.data.delimited.parse_lines`, and the row pattern that decides which rows
are malformed), run eagerly on the chief: under ParameterServerStrategy a dataset function runs as a graph on the
workers, where a Python generator hangs (tensorflow#48957), so the chief reads the stream and hands each step its
batch (`tfps.training.online`). A record is a delimited line as the spec describes, or (`record_format="json"`) a
JSON object with the spec's columns (a column it lacks, or holds as null, is missing).
"""

import collections
import dataclasses
import functools
import itertools
import json
import time
from typing import Callable, Optional, Tuple

from absl import logging
import tensorflow as tf

from tfps import checks
from tfps.data import delimited
from tfps.data.spec import FeatureSpec, row_pattern
from tfps.data.stream import holdout
from tfps.data.stream.holdout import HeldOut
from tfps.data.stream.sources import MalformedRecordError, Positions, Source

RECORD_FORMATS = ("delimited", "json")
_READ_CHUNK = 4096


@dataclasses.dataclass
class Batch:
  """One batch of a stream, parsed when its `element` is first asked for (`StreamBatches.stacked` parses the
  batches of a scheduled function at once instead).

  Attributes:
    lines: its records' lines.
    positions: the stream's position just after the batch's last record (malformed and held-out records before it
      included).
    size: its examples: `batch_size`, or fewer in a partial batch (`idle_flush_secs`).
    parse: `fn(lines tensor) -> element`, the stream's parse for a batch of its size.
    written: `(oldest, newest)` write time of its examples (`Record.timestamp`, seconds since the epoch), or None
      where the source gives none.
  """

  lines: list
  positions: Positions
  size: int
  parse: Callable = dataclasses.field(repr=False, compare=False)
  written: Optional[Tuple[float, float]] = None

  @functools.cached_property
  def element(self) -> tuple:
    """`(features, label)` tensors of `size` examples, as the file reader yields them."""
    return self.parse(tf.constant(self.lines))


class StreamBatches:
  """Fixed-size batches of `source`'s records; malformed records are counted and skipped (with `strict`: the first
  one raises `MalformedRecordError` naming its partition and offset).

  With `held_out` (a `tfps.data.stream.holdout.HeldOut`), the messages it takes go to its window, never into a batch.
  With `idle_flush_secs`, a record that has waited that long for its batch to fill is trained in a partial batch.

  Attributes:
    malformed: records skipped so far.
    records: records read so far.
    held_out: the `HeldOut`, or None.
  """

  def __init__(self, source: Source, spec: FeatureSpec, *, batch_size: int, record_format: str = "delimited",
               strict: bool = False, held_out: Optional[HeldOut] = None, idle_flush_secs: Optional[float] = None):
    checks.positive_int("batch_size", batch_size)
    checks.one_of("record_format", record_format, RECORD_FORMATS)
    if idle_flush_secs is not None:
      checks.non_negative_number("idle_flush_secs", idle_flush_secs, "number of seconds")
    self.source, self.spec, self.batch_size = source, spec, batch_size
    self._json, self._strict = record_format == "json", strict
    self.held_out, self._flush_secs = held_out, idle_flush_secs
    self._oldest_wait: Optional[float] = None  # when the oldest well-formed record in `_pending` was read
    self._pattern = row_pattern(spec)
    self._positions = dict(source.positions())
    self._pending = collections.deque()  # (record, line or None where malformed or held out, when read), in order
    self._good = 0  # the well-formed records in `_pending`
    self.malformed = self.records = 0
    self._warn_at = 100  # malformed records at which the next warning is due where most records are malformed

    def parse(lines):  # the file reader's parse; every tensor `batch_size` long, as the trace says
      return tf.nest.map_structure(lambda t: tf.ensure_shape(t, [batch_size] + t.shape[1:]),
                                   delimited.parse_lines(lines, spec))

    def parse_stacked(lines):  # `steps * batch_size` lines -> every tensor `[steps, batch_size, ...]`
      return tf.nest.map_structure(lambda t: tf.reshape(t, [-1, batch_size] + t.shape[1:].as_list()),
                                   delimited.parse_lines(lines, spec))

    self._parse = tf.function(parse, autograph=False, input_signature=[tf.TensorSpec([batch_size], tf.string)])
    self._parse_partial = tf.function(lambda lines: delimited.parse_lines(lines, spec), autograph=False,
                                      input_signature=[tf.TensorSpec([None], tf.string)])
    self._parse_stacked = tf.function(parse_stacked, autograph=False,
                                      input_signature=[tf.TensorSpec([None], tf.string)])

  @property
  def element_spec(self):
    """The `tf.TensorSpec`s of a batch's `(features, label)`."""
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype),
                                 self._parse.get_concrete_function().structured_outputs)

  def window_input_fn(self, batch_size: int):
    """`fn(path) -> input_fn` of a held-out window file of this stream (`holdout.window_input_fn`)."""
    return holdout.window_input_fn(self.spec, batch_size)

  @property
  def idle_flush_secs(self) -> Optional[float]:
    """How long a record waits for its batch to fill before a partial batch is made (None: never)."""
    return self._flush_secs

  def positions(self) -> Positions:
    """The position after the last batch returned."""
    return dict(self._positions)

  def lag(self, positions: Optional[Positions] = None):
    """`(messages, seconds)` behind the newest record written, from `positions` (default: after the last batch
    returned; `Source.lag`); seconds from the oldest record read and not yet in a batch, where one is."""
    messages, seconds = self.source.lag(self._positions if positions is None else positions)
    stamps = [record.timestamp for record, _, _ in self._pending if record.timestamp is not None]
    if stamps:
      seconds = max(time.time() - stamps[0], 0.0)
    return messages, seconds

  def stacked(self, batches, size: int):
    """The `batches`' elements stacked along a new first dimension, padded to `size` with the last one (a scheduled
    function's argument; it runs only the steps it is given): full batches parsed at once, in one call."""
    if any(batch.size != self.batch_size for batch in batches):
      elements = [batch.element for batch in batches]
      elements += [elements[-1]] * (size - len(elements))
      return tf.nest.map_structure(lambda *tensors: tf.stack(tensors), *elements)
    lines = [line for batch in batches for line in batch.lines] + batches[-1].lines * (size - len(batches))
    return tf.nest.map_structure(lambda t: tf.ensure_shape(t, [size] + t.shape[1:]),
                                 self._parse_stacked(tf.constant(lines)))

  def next_batch(self, timeout_secs: float) -> Optional[Batch]:
    """The next full batch, or None where the stream gave none within `timeout_secs` (the records read so far wait
    for the next call); a partial batch where a record has waited `idle_flush_secs` for its batch to fill."""
    deadline = time.monotonic() + timeout_secs
    while self._good < self.batch_size:
      if self._flush_due():
        return self._take(self._good)
      wait_until = deadline if self._flush_secs is None or not self._good else min(
          deadline, self._oldest_wait + self._flush_secs)
      records = self.source.read(_READ_CHUNK, max(wait_until - time.monotonic(), 0.0))
      if not records:
        if self._flush_due():
          return self._take(self._good)
        if time.monotonic() >= deadline:
          return None
        continue
      self.records += len(records)
      self._add(records)
    return self._take(self.batch_size)

  def _flush_due(self) -> bool:
    return (self._flush_secs is not None and self._good > 0 and
            time.monotonic() - self._oldest_wait >= self._flush_secs)

  def _add(self, records) -> None:
    """Appends `records` to the pending ones; the held-out ones go to the window (and are never trained on)."""
    now, lines = time.monotonic(), self._checked(records)
    if self.held_out is None:  # one step for all of them
      good = len(lines) - lines.count(None)
      if good and not self._good:
        self._oldest_wait = now
      self._good += good
      self._pending.extend(zip(records, lines, itertools.repeat(now)))
      return
    for record, line in zip(records, lines):
      if line is not None and self.held_out is not None and self.held_out.takes(record):
        self.held_out.add(record, line)
        line = None
      if line is not None:
        self._oldest_wait = now if not self._good else self._oldest_wait
        self._good += 1
      self._pending.append((record, line, now))

  def _take(self, size: int) -> Batch:
    """The batch of the next `size` well-formed pending records (a partial one: all of them)."""
    lines, positions, pending, stamps = [], dict(self._positions), self._pending, []
    while len(lines) < size:
      record, line, _ = pending.popleft()
      positions[record.key] = record.after
      if line is not None:
        lines.append(line)
        if record.timestamp is not None:
          stamps.append(record.timestamp)
    while pending and pending[0][1] is None:  # malformed or held out records next: passed too
      record, _, _ = pending.popleft()
      positions[record.key] = record.after
    self._good -= size
    self._oldest_wait = next((read for _, line, read in pending if line is not None), None)
    self._positions = positions
    parse = self._parse if size == self.batch_size else self._parse_partial
    return Batch(lines, dict(positions), size, parse, (min(stamps), max(stamps)) if stamps else None)

  def _checked(self, records) -> list:
    """Each record's line, or None where it is malformed (counted; raised with `strict`)."""
    lines = [self._line(record.value) for record in records] if self._json else [r.value for r in records]
    given = [line if line is not None else b"" for line in lines] if self._json else lines
    ok = tf.strings.regex_full_match(tf.constant(given, tf.string), self._pattern).numpy()
    if not self._json and ok.all():
      return lines
    for index, record in enumerate(records):
      if lines[index] is None or not ok[index]:
        if self._strict:
          raise MalformedRecordError(f"{self.source.name}: record {record.where} is malformed: "
                                     f"{record.value[:120]!r}; expected {self.spec.describe_row()}")
        self.malformed += 1
        if self.malformed == 1:
          logging.warning("%s: record %s is malformed and skipped: %r (malformed records are counted in the "
                          "progress lines)", self.source.name, record.where, record.value[:120])
        lines[index] = None
    if self.malformed >= self._warn_at:
      self._warn_at *= 10
      if self.malformed > 0.9 * self.records:
        logging.warning("%s: %d of the %d records read so far are malformed; does the feature spec describe this "
                        "stream? (expected %s)", self.source.name, self.malformed, self.records,
                        self.spec.describe_row())
    return lines

  def _line(self, value: bytes) -> Optional[bytes]:
    """The record as a delimited line; None where a JSON record is not an object."""
    if not self._json:
      return value
    try:
      row = json.loads(value)
    except (ValueError, UnicodeDecodeError):
      return None
    if not isinstance(row, dict):
      return None
    missing = self.spec.missing[0] if self.spec.missing else ""
    return self.spec.delimiter.join(missing if row.get(c) is None else str(row[c]) for c in self.spec.columns
                                    ).encode("utf-8")
