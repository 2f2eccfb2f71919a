"""A Kafka topic as a stream source: confluent-kafka, explicit assignment of partitions at given offsets.

A consumer group's `subscribe()` would move partitions between consumers at its rebalances; the chief reads every
partition itself and starts each at the offset its checkpoint holds (`assign`), so nothing is read twice or skipped
across a restart. The group id is used for offset commits alone: lag monitors read the group's committed offsets,
which the trainer advances only after the checkpoint that holds them (`commit`).
"""

import time
from typing import Callable, Dict, List, Optional, Sequence

from absl import logging

from tfps.data.stream.sources import BrokerUnreachableError, Positions, Record, Source, StreamError

STARTS = ("earliest", "latest", "committed")
_BACKOFF_SECS = (0.5, 1.0, 2.0, 4.0)
_WARN_EVERY_SECS = 60.0


def _kafka():
  import confluent_kafka  # pylint: disable=g-import-not-at-top  (only where a Kafka stream is read)
  return confluent_kafka


def _error_logger(name: str) -> Callable:
  """The consumer's `error_cb`: librdkafka's errors (brokers down, lost connections) as one warning per kind a
  minute. A function of its own, not a method: a consumer holding its source would be freed only by the garbage
  collector, whose close of it (at any later moment) waits for the consumer group."""
  warned = {}  # Kafka error code -> when it was last logged

  def on_error(error) -> None:
    now = time.monotonic()
    if now - warned.get(error.code(), -_WARN_EVERY_SECS) < _WARN_EVERY_SECS:
      return
    warned[error.code()] = now
    down = error.name() == "_ALL_BROKERS_DOWN"
    logging.warning("%s: %s%s", name, error.str(), "; no record is read until a broker answers" if down else "")

  return on_error


class KafkaSource(Source):
  """The partitions of `topic` read in order from given offsets.

  Args:
    bootstrap: `host:port[,host:port...]` of the brokers.
    topic: the topic.
    group_id: the consumer group offsets are committed to.
    partitions: the partitions to read (default: all of the topic's).
    start: where a partition without a position in `positions` starts: `earliest` (the oldest record kept),
      `latest` (the next record written), `committed` (the group's committed offset).
    positions: `{partition: offset}` to start at (a checkpoint's), as strings or ints.
    connect_timeout_secs: how long to retry (with backoff) reaching the brokers before `BrokerUnreachableError`.
    options: more librdkafka settings (e.g. security).
  """

  def __init__(self, bootstrap: str, topic: str, *, group_id: str = "tfps", partitions: Optional[Sequence[int]] = None,
               start: str = "committed", positions: Optional[Positions] = None, connect_timeout_secs: float = 60,
               options: Optional[Dict[str, object]] = None):
    if start not in STARTS:
      raise StreamError(f"stream start {start!r} must be one of {', '.join(STARTS)}")
    self.name = f"kafka {topic}@{bootstrap}"
    self._topic, self._bootstrap = topic, bootstrap
    kafka = _kafka()
    # librdkafka's own log lines (a "Connection refused" per broker and retry, 20 a second) are off; its errors reach
    # tfps's log through `_error_logger`. `options={"log_level": 7}` turns them on again.
    self._consumer = kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group_id, "enable.auto.commit": False,
                                     "auto.offset.reset": "error", "enable.partition.eof": False, "log_level": 0,
                                     "error_cb": _error_logger(self.name), **(options or {})})
    known = self._partitions_of_topic(connect_timeout_secs)
    chosen = sorted(known) if partitions is None else list(partitions)
    missing = [p for p in chosen if p not in known]
    if missing:
      raise StreamError(f"{self.name}: partition(s) {missing} not in the topic (it has {sorted(known)})")
    self._next = self._starts(chosen, dict(positions or {}), start)
    # The positions of partitions not read this time, carried into every position this run gives: a later run that
    # reads them starts where the checkpoint left them, not at `start`.
    self._carried = {str(p): int(offset) for p, offset in (positions or {}).items() if int(p) not in self._next}
    self._newest_time: Optional[float] = None
    self._consumer.assign([kafka.TopicPartition(topic, p, offset) for p, offset in sorted(self._next.items())])
    logging.info("%s: reading partitions %s from offsets %s", self.name, chosen,
                 [self._next[p] for p in chosen])

  def _partitions_of_topic(self, timeout_secs: float) -> List[int]:
    """The topic's partitions, retrying with backoff until `timeout_secs`."""
    kafka, deadline, attempt = _kafka(), time.monotonic() + timeout_secs, 0
    while True:
      try:
        metadata = self._consumer.list_topics(self._topic, timeout=max(1.0, min(5.0, timeout_secs)))
        break
      except kafka.KafkaException as e:
        left = deadline - time.monotonic()
        if left <= 0:
          raise BrokerUnreachableError(f"{self.name}: no broker at {self._bootstrap} answered within "
                                       f"{timeout_secs:g} s ({e.args[0].str()})") from None
        wait = min(_BACKOFF_SECS[min(attempt, len(_BACKOFF_SECS) - 1)], left)
        logging.warning("%s: brokers %s did not answer (%s); retrying in %.1f s", self.name, self._bootstrap,
                        e.args[0].str(), wait)
        time.sleep(wait)
        attempt += 1
    topic = metadata.topics.get(self._topic)
    if topic is None or topic.error is not None:
      raise StreamError(f"{self.name}: topic {self._topic!r} not found at {self._bootstrap}"
                        + (f" ({topic.error.str()})" if topic is not None else ""))
    return sorted(topic.partitions)

  def _starts(self, partitions: List[int], positions: Positions, start: str) -> Dict[int, int]:
    """Each partition's first offset: its position, else `start`; a position outside the offsets kept is refused."""
    kafka, starts, committed = _kafka(), {}, None
    for p in partitions:
      low, high = self._consumer.get_watermark_offsets(kafka.TopicPartition(self._topic, p), timeout=10)
      if str(p) in positions:
        offset = int(positions[str(p)])
        if not low <= offset <= high:
          raise StreamError(f"{self.name}: partition {p}: the checkpoint's offset {offset} is outside the offsets "
                            f"kept ({low}..{high}); records were deleted before they were trained on")
      elif start == "earliest":
        offset = low
      elif start == "latest":
        offset = high
      else:
        if committed is None:
          committed = {tp.partition: tp.offset for tp in self._consumer.committed(
              [kafka.TopicPartition(self._topic, q) for q in partitions], timeout=10)}
        offset = committed[p]
        if offset < 0:
          raise StreamError(f"{self.name}: partition {p} has no committed offset for this group; start with "
                            "--stream_start=earliest or latest")
        if not low <= offset <= high:
          raise StreamError(f"{self.name}: partition {p}: the committed offset {offset} is outside the offsets kept "
                            f"({low}..{high}); start with --stream_start=earliest or latest")
      starts[p] = offset
    return starts

  def read(self, max_records: int, timeout_secs: float) -> List[Record]:
    # `consume` waits for all of `max_records` until its timeout: wait for the first alone, then take what came.
    first = self._consumer.poll(timeout_secs)
    if first is None:
      return []
    records, topic, next_offsets = [], self._topic, self._next
    for message in [first] + (self._consumer.consume(max_records - 1, timeout=0) if max_records > 1 else []):
      if message.error() is not None:
        raise StreamError(f"{self.name}: partition {message.partition()}: {message.error().str()}")
      p, offset = message.partition(), message.offset()
      next_offsets[p] = offset + 1
      kind, stamp = message.timestamp()
      records.append(Record(message.value() or b"", str(p), offset + 1, f"{topic}/{p}@{offset}",
                            stamp / 1000 if kind else None))
    self._newest_time = records[-1].timestamp
    return records

  def positions(self) -> Positions:
    read = {str(p): offset for p, offset in self._next.items()}
    return dict(sorted({**self._carried, **read}.items(), key=lambda item: int(item[0])))

  def lag(self, positions: Positions):
    """`(messages, seconds)`: the records written after `positions`, over the assigned partitions, and the age of
    the last record read while some are unread (0 when none are)."""
    kafka, behind = _kafka(), 0
    for p, offset in self._next.items():
      partition = kafka.TopicPartition(self._topic, p)
      # The high watermark of the consumer's last fetch (free); asked of the broker (a round trip) before the first.
      _, high = self._consumer.get_watermark_offsets(partition, cached=True)
      if high < 0:
        _, high = self._consumer.get_watermark_offsets(partition, timeout=10, cached=False)
      behind += max(high - int(positions.get(str(p), offset)), 0)
    seconds = time.time() - self._newest_time if behind and self._newest_time is not None else 0.0
    return behind, seconds

  def commit(self, positions: Positions) -> None:
    kafka = _kafka()
    offsets = [kafka.TopicPartition(self._topic, int(p), int(offset)) for p, offset in sorted(positions.items())]
    if not offsets:
      return
    try:
      self._consumer.commit(offsets=offsets, asynchronous=False)
    except kafka.KafkaException as e:  # the checkpoint holds the position; the group's offsets are for monitors
      logging.warning("%s: committing offsets %s failed (%s); the checkpoint holds them, the next commit catches up",
                      self.name, {tp.partition: tp.offset for tp in offsets}, e.args[0].str())

  def close(self) -> None:
    self._consumer.close()
