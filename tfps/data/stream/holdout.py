"""The held-out share of a stream: messages never trained on; the newest of them are the evaluation window.

A message is held out when the CRC-32 of its position (Kafka: partition and offset; a folder: slice and line) is
divisible by `every`: about one message in `every`, the same ones whichever process reads them, so a chief restarted
from a checkpoint holds out the messages it held out before and never trains on them. The positions pass over a
held-out message as over a trained one (`tfps.data.stream.batches`), so exactly-once is unchanged.
"""

import collections
import json
import time
import zlib
from typing import Callable, List, Optional

from tfps.errors import UsageError
from tfps.data import delimited
from tfps.data.spec import FeatureSpec
from tfps.data.stream.sources import Record


class HeldOut:
  """Picks the held-out messages of a stream and keeps the newest `window` of them.

  Attributes:
    every: about one message in `every` is held out.
    count: messages held out so far (well-formed ones; a malformed message is only counted malformed).
    newest_where: how the newest held-out message is named (`clicks/3@117`), or None.
    newest_time: when it was written (the source's timestamp, else when it was read), or None.
  """

  def __init__(self, every: int, window: int):
    for name, value, low in (("holdout_every", every, 2), ("holdout_window", window, 1)):
      if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(f"{name} must be an integer >= {low}, got {value!r}")
    self.every = every
    self._lines = collections.deque(maxlen=window)
    self.count = 0
    self.newest_where: Optional[str] = None
    self.newest_time: Optional[float] = None

  def takes(self, record: Record) -> bool:
    """Whether `record` is held out (decided by its position alone)."""
    return zlib.crc32(f"{record.key}:{json.dumps(record.after)}".encode()) % self.every == 0

  def add(self, record: Record, line: bytes) -> None:
    """Keeps `line` (the record as a delimited line) as the newest of the window."""
    self._lines.append(line)
    self.count += 1
    self.newest_where = record.where
    self.newest_time = record.timestamp if record.timestamp is not None else time.time()

  def window(self) -> List[bytes]:
    """The newest held-out lines, oldest first."""
    return list(self._lines)

  def describe(self) -> dict:
    """What the window is: its size, the newest message in it and when it was written, the messages held out."""
    return {"messages": len(self._lines), "newest": self.newest_where, "newest_time": self.newest_time,
            "held_out": self.count}


def window_input_fn(spec: FeatureSpec, batch_size: int) -> Callable[[str], Callable]:
  """`fn(path) -> input_fn` of a window file (`checkpoints/window-N.csv`, or a copy): its lines read once, in order,
  parsed with `spec`, in batches of `batch_size` (the last one smaller)."""
  return lambda path: delimited.delimited_dataset_fn(path, spec, batch_size=batch_size, repeat=False, scan=False,
                                                     shuffle_buffer=0, drop_remainder=False)
