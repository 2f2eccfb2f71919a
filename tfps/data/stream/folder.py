"""A folder of slices as a stream source: files that appear over time (hourly slices), read in name order, each once
it is complete: a slice completed before an earlier one waits for it (a warning names both), and a slice that
appears behind the one being read is named in a warning and never read.

A slice is complete when its `.done` marker is there (`complete="marker"`: `slice-0004.csv` with
`slice-0004.csv.done`), or as soon as it matches the pattern (`complete="rename"`: the writer writes another name,
e.g. `.slice-0004.csv.tmp`, and renames it when done). The position is the slice and the lines read from it, so a
restarted chief goes on at the next line. The folder may be on shared storage (`tf.io.gfile`). A record's write time
(`Record.timestamp`) is its slice's complete time: the marker's modification time, or the slice's (its last write,
before the rename).
"""

import fnmatch
import os
import time
from typing import List, Optional, Tuple

from absl import logging
import tensorflow as tf

from tfps.data.stream.sources import Positions, Record, Source, StreamError

COMPLETE = ("marker", "rename")
DONE_SUFFIX = ".done"
KEY = "folder"


class FolderSource(Source):
  """The complete slices of `folder` matching `pattern`, in name order.

  Args:
    folder: the folder slices appear in.
    pattern: the slices' names (a glob, default `*`; markers, hidden files and folders are never slices).
    complete: `marker` or `rename` (see the module docstring).
    skip_header: the first line of every slice is a header.
    positions: `{"folder": [slice name, lines read]}` to start at (a checkpoint's).
    poll_secs: how often to look for a new slice while waiting.
  """

  def __init__(self, folder: str, *, pattern: str = "*", complete: str = "marker", skip_header: bool = False,
               positions: Optional[Positions] = None, poll_secs: float = 0.2):
    if complete not in COMPLETE:
      raise StreamError(f"folder stream completion {complete!r} must be one of {', '.join(COMPLETE)}")
    if not tf.io.gfile.isdir(folder):
      raise StreamError(f"stream folder {folder!r} does not exist")
    self.name = f"folder {folder}"
    self._folder, self._pattern, self._complete = folder, pattern, complete
    self._skip_header, self._poll_secs = skip_header, poll_secs
    self._slice, self._line = (positions or {}).get(KEY, [None, 0])
    self._lines: Optional[List[bytes]] = None  # the current slice's lines, once opened
    self._written: Optional[float] = None  # the current slice's complete time, once opened
    self._seen = set()  # the slices seen so far (a slice that appears behind the position is named once)
    self._waiting_for: Optional[str] = None  # an incomplete slice a later complete one waits for (warned once)
    if self._slice is not None and self._slice not in self._complete_slices():
      raise StreamError(f"{self.name}: slice {self._slice!r}, read up to line {self._line}, has vanished; "
                        "its unread lines are lost")

  def _complete_slices(self) -> List[str]:
    return self._slices()[0]

  def _slices(self) -> Tuple[List[str], List[str]]:
    """`(complete, incomplete)` slices in name order (incomplete: a slice without its marker yet)."""
    names = set(tf.io.gfile.listdir(self._folder))
    slices = sorted(n for n in names if fnmatch.fnmatch(n, self._pattern) and not n.endswith(DONE_SUFFIX)
                    and not n.startswith(".") and not tf.io.gfile.isdir(os.path.join(self._folder, n)))
    if self._complete == "marker":
      return [n for n in slices if n + DONE_SUFFIX in names], [n for n in slices if n + DONE_SUFFIX not in names]
    return slices, []

  def _next_slice(self) -> Optional[str]:
    """The slice to read after the current one: the next in name order once it is complete (a later slice completed
    first waits for it); None while there is none. Slices that appear before the current one are never read: each is
    named once in a warning."""
    complete, incomplete = self._slices()
    passed = [n for n in complete + incomplete if self._slice is not None and n < self._slice and n not in self._seen]
    if passed and self._seen:
      logging.warning("%s: slice(s) %s appeared after %s was read; slices are read in name order, so they are not "
                      "read", self.name, ", ".join(passed), self._slice)
    self._seen.update(complete + incomplete)
    later = sorted(n for n in complete + incomplete if self._slice is None or n > self._slice)
    if not later or later[0] not in complete:
      ahead = next((n for n in later if n in complete), None)
      if ahead is not None and later[0] != self._waiting_for:
        logging.warning("%s: waiting for slice %s to be complete (its %s marker) before %s, which is", self.name,
                        later[0], DONE_SUFFIX, ahead)
        self._waiting_for = later[0]
      return None
    return later[0]

  def _open(self, name: str) -> None:
    path = os.path.join(self._folder, name)
    try:
      with tf.io.gfile.GFile(path, "rb") as f:
        self._lines = f.read().splitlines()
    except tf.errors.NotFoundError:
      raise StreamError(f"{self.name}: slice {name!r} vanished while it was read") from None
    self._slice = name
    self._written = self._complete_time(name)

  def _complete_time(self, name: str) -> float:
    """When slice `name` was complete (seconds since the epoch): its marker's or its own modification time (from
    `os.stat` on a local folder: `tf.io.gfile.stat` gives whole seconds)."""
    path = os.path.join(self._folder, name + (DONE_SUFFIX if self._complete == "marker" else ""))
    if "://" not in path:
      return os.path.getmtime(path if os.path.exists(path) else os.path.join(self._folder, name))
    try:
      return tf.io.gfile.stat(path).mtime_nsec / 1e9
    except tf.errors.NotFoundError:  # a marker removed since: the slice's own time
      return tf.io.gfile.stat(os.path.join(self._folder, name)).mtime_nsec / 1e9

  def _advance(self) -> bool:
    """Moves to the next complete slice when the current one is read; False when there is none yet."""
    if self._lines is None and self._slice is not None:
      self._open(self._slice)
      return True
    name = self._next_slice()
    if name is None:
      return False
    self._open(name)
    self._line = 0
    return True

  def read(self, max_records: int, timeout_secs: float) -> List[Record]:
    deadline, records = time.monotonic() + timeout_secs, []
    while len(records) < max_records:
      if self._lines is None or self._line >= len(self._lines):
        if not self._advance():
          if records or time.monotonic() >= deadline:
            break
          time.sleep(self._poll_secs)
          continue
        continue
      if self._line == 0 and self._skip_header:
        self._line = 1
        continue
      self._line += 1
      records.append(Record(self._lines[self._line - 1], KEY, [self._slice, self._line],
                            f"{self._slice}:{self._line}", self._written))
    return records

  def positions(self) -> Positions:
    return {} if self._slice is None else {KEY: [self._slice, self._line]}

  def lag(self, positions: Positions):
    """`(None, seconds)`: the age of the oldest complete slice not read yet (0 when every one was)."""
    del positions  # the slices after the one being read are what is behind
    later = [n for n in self._complete_slices() if self._slice is None or n > self._slice]
    if not later:
      return None, 0.0
    return None, max(time.time() - tf.io.gfile.stat(os.path.join(self._folder, later[0])).mtime_nsec / 1e9, 0.0)
