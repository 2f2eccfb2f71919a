"""What every stream source gives: records with the position after each one, and the errors a stream can raise."""

from typing import Dict, List, NamedTuple, Optional

from tfps.errors import TfpsError, UnreachableTaskError

# A stream's position: {partition key: value}, JSON-able; applying each record's `after` in order gives the position
# after it (Kafka: {"3": 118}, the next offset of partition 3; a folder: {"folder": ["slice-0004.csv", 120]}).
Positions = Dict[str, object]


class StreamError(TfpsError, ValueError):
  """A stream cannot be read as asked (a topic or partition missing, a bad start, a vanished slice); one line."""


class MalformedRecordError(StreamError):
  """A record does not parse and the stream is read strictly; the message names its partition and offset."""


class BrokerUnreachableError(UnreachableTaskError):
  """No broker answered within the connect timeout (exit status 3: started again once the brokers are back, the
  chief resumes from its checkpoint)."""


class Record(NamedTuple):
  """One message of a stream (a named tuple: a stream makes one per message, and a frozen dataclass costs several
  times as much to make).

  Attributes:
    value: the record's bytes (a delimited line, or a JSON object).
    key: its partition key in `Positions`.
    after: the position of `key` just after this record.
    where: how errors name it (`clicks/3@117`, `slice-0004.csv:120`).
    timestamp: when it was written (seconds since the epoch), where the source knows it.
  """

  value: bytes
  key: str
  after: object
  where: str
  timestamp: Optional[float] = None


class Source:
  """A stream of records in order. Subclasses implement:

    read(max_records, timeout_secs) -> [Record]: up to `max_records` next records, waiting up to `timeout_secs`
      for the first one (an empty list when none came);
    positions() -> Positions: where the next `read` starts;
    lag(positions) -> (messages, seconds): how far the newest record written is ahead of `positions` (messages:
      None where the source cannot count them; seconds: the age of the last record read while some are unread);
  and may override `commit(positions)` (tell the outside which records are safely applied) and `close()`.

  Attributes:
    name: how log lines and errors call the stream.
  """

  name = "stream"

  def read(self, max_records: int, timeout_secs: float) -> List[Record]:
    raise NotImplementedError(f"{type(self).__name__} must implement `read(max_records, timeout_secs)`")

  def positions(self) -> Positions:
    raise NotImplementedError(f"{type(self).__name__} must implement `positions()`")

  def lag(self, positions: Positions):
    raise NotImplementedError(f"{type(self).__name__} must implement `lag(positions)`")

  def commit(self, positions: Positions) -> None:
    """Records outside the trainer that every record before `positions` is applied and checkpointed."""
    del positions

  def close(self) -> None:
    """Releases the connection or files."""
