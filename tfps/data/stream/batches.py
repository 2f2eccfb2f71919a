"""Records of a stream parsed with a feature spec into fixed-size batches, each with the stream position after it.

Parsing reuses the file reader's code (`tfps.data.delimited.parse_lines`, and the row pattern that decides which rows
are malformed), run eagerly on the chief: under ParameterServerStrategy a dataset function runs as a graph on the
workers, where a Python generator hangs (tensorflow#48957), so the chief reads the stream and hands each step its
batch (`tfps.training.online`). A record is a delimited line as the spec describes, or (`record_format="json"`) a
JSON object with the spec's columns (a column it lacks, or holds as null, is missing).
"""

import collections
import dataclasses
import json
import time
from typing import Optional

from absl import logging
import tensorflow as tf

from tfps import checks
from tfps.data import delimited
from tfps.data.spec import FeatureSpec, row_pattern
from tfps.data.stream.sources import MalformedRecordError, Positions, Source

RECORD_FORMATS = ("delimited", "json")
_READ_CHUNK = 4096


@dataclasses.dataclass
class Batch:
  """One batch of a stream.

  Attributes:
    element: `(features, label)` tensors of `batch_size` examples, as the file reader yields them.
    positions: the stream's position just after the batch's last record (malformed records before it included).
  """

  element: tuple
  positions: Positions


class StreamBatches:
  """Fixed-size batches of `source`'s records; malformed records are counted and skipped (with `strict`: the first
  one raises `MalformedRecordError` naming its partition and offset).

  Attributes:
    malformed: records skipped so far.
    records: records read so far.
  """

  def __init__(self, source: Source, spec: FeatureSpec, *, batch_size: int, record_format: str = "delimited",
               strict: bool = False):
    checks.positive_int("batch_size", batch_size)
    checks.one_of("record_format", record_format, RECORD_FORMATS)
    self.source, self.spec, self.batch_size = source, spec, batch_size
    self._json, self._strict = record_format == "json", strict
    self._pattern = row_pattern(spec)
    self._positions = dict(source.positions())
    self._pending = collections.deque()  # (record, line or None where malformed), in stream order
    self._good = 0  # the well-formed records in `_pending`
    self.malformed = self.records = 0

    def parse(lines):  # the file reader's parse; every tensor `batch_size` long, as the trace says
      return tf.nest.map_structure(lambda t: tf.ensure_shape(t, [batch_size] + t.shape[1:]),
                                   delimited.parse_lines(lines, spec))

    self._parse = tf.function(parse, autograph=False, input_signature=[tf.TensorSpec([batch_size], tf.string)])

  @property
  def element_spec(self):
    """The `tf.TensorSpec`s of a batch's `(features, label)`."""
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype),
                                 self._parse.get_concrete_function().structured_outputs)

  def positions(self) -> Positions:
    """The position after the last batch returned."""
    return dict(self._positions)

  def lag(self, positions: Optional[Positions] = None):
    """`(messages, seconds)` behind the newest record written, from `positions` (default: after the last batch
    returned; `Source.lag`); seconds from the oldest record read and not yet in a batch, where one is."""
    messages, seconds = self.source.lag(self._positions if positions is None else positions)
    stamps = [record.timestamp for record, _ in self._pending if record.timestamp is not None]
    if stamps:
      seconds = max(time.time() - stamps[0], 0.0)
    return messages, seconds

  def next_batch(self, timeout_secs: float) -> Optional[Batch]:
    """The next full batch, or None where the stream gave none within `timeout_secs` (the records read so far wait
    for the next call)."""
    deadline = time.monotonic() + timeout_secs
    while self._good < self.batch_size:
      records = self.source.read(_READ_CHUNK, max(deadline - time.monotonic(), 0.0))
      if not records:
        return None
      self.records += len(records)
      checked = self._checked(records)
      self._good += sum(line is not None for line in checked)
      self._pending.extend(zip(records, checked))
    lines, positions = [], dict(self._positions)
    while len(lines) < self.batch_size:
      record, line = self._pending.popleft()
      positions[record.key] = record.after
      if line is not None:
        lines.append(line)
    self._good -= self.batch_size
    self._positions = positions
    return Batch(self._parse(tf.constant(lines)), dict(positions))

  def _checked(self, records) -> list:
    """Each record's line, or None where it is malformed (counted; raised with `strict`)."""
    lines = [self._line(record.value) for record in records]
    given = [line if line is not None else b"" for line in lines]
    ok = tf.strings.regex_full_match(tf.constant(given, tf.string), self._pattern).numpy()
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
