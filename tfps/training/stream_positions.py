"""The stream position a checkpoint holds: `model_dir/checkpoints/stream-N.json` beside `ckpt-N`.

The file of checkpoint N holds the position just after the last example of the steps that checkpoint holds (per
Kafka partition the next offset; for a folder the slice and lines read). It is written (atomically, by a rename)
before the checkpoint, so a checkpoint that exists always has its position; a position file without its checkpoint
(the chief died between the two) is never read, and is removed with the checkpoints the manager drops.

With a held-out share (`tfps.data.stream.holdout`), `window-N.csv` beside it holds the held-out window current at
checkpoint N (the newest held-out messages, as delimited lines) and `stream-N.json` says what it is; inline and
sidecar evaluation read it (`tfps.training.window_evaluation`).
"""

import json
import os
import re
from typing import Optional, Tuple

from absl import logging
import tensorflow as tf

from tfps.errors import UsageError
from tfps.training import checkpoints as checkpoints_lib

_NAME = re.compile(r"(?:stream-(\d+)\.json|window-(\d+)\.csv)$")


def positions_path(model_dir: str, number: int) -> str:
  """Where checkpoint `number`'s stream position is."""
  return os.path.join(checkpoints_lib.checkpoint_dir(model_dir), f"stream-{int(number)}.json")


def window_path(model_dir: str, number: int) -> str:
  """Where the held-out window of checkpoint `number` is."""
  return os.path.join(checkpoints_lib.checkpoint_dir(model_dir), f"window-{int(number)}.csv")


def write_positions(model_dir: str, number: int, positions: dict, stream: str, window: Optional[dict] = None) -> None:
  """Writes checkpoint `number`'s position (of the stream named `stream`; `window`: what its held-out window is)
  atomically; call before saving it."""
  _write_atomically(positions_path(model_dir, number),
                    json.dumps({"stream": stream, "positions": positions, **({"window": window} if window else {})}))


def write_window(model_dir: str, number: int, lines, header: Optional[str] = None) -> None:
  """Writes checkpoint `number`'s held-out window (`lines`: bytes, one record each; `header`: a first line where the
  feature spec has one) atomically; call before its position."""
  text = "".join(line.decode("utf-8", "replace") + "\n" for line in lines)
  _write_atomically(window_path(model_dir, number), (header + "\n" if header is not None else "") + text)


def _write_atomically(path: str, text: str) -> None:
  tf.io.gfile.makedirs(os.path.dirname(path))
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    f.write(text)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def read_record(model_dir: str, number: int) -> Optional[dict]:
  """What `stream-N.json` of checkpoint `number` holds (`stream`, `positions`, `window`?), or None."""
  path = positions_path(model_dir, number)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def read_positions(model_dir: str, checkpoint: Optional[str]) -> Optional[dict]:
  """The position `checkpoint` (a `ckpt-N` path) holds, or None where it holds none (trained on files)."""
  record = read_record(model_dir, checkpoints_lib.checkpoint_number(checkpoint)) if checkpoint else None
  return None if record is None else record["positions"]


def newest_record(model_dir: str) -> Tuple[Optional[str], Optional[dict]]:
  """`(checkpoint, record)`: the newest checkpoint of `model_dir` and what its `stream-N.json` holds (`read_record`:
  the stream and its position); None for what there is not (no checkpoint, or one not trained on a stream, which is
  logged: the stream then starts where its source starts)."""
  latest = tf.train.latest_checkpoint(checkpoints_lib.checkpoint_dir(model_dir))
  record = read_record(model_dir, checkpoints_lib.checkpoint_number(latest)) if latest else None
  if latest and record is None:
    logging.warning("%s holds no stream position (it was not trained on a stream); the stream starts where its "
                    "source starts", latest)
  return latest, record


def check_same_stream(checkpoint: str, record: dict, stream: str) -> None:
  """Raises `UsageError` where `record` (of `checkpoint`) holds the position of another stream than `stream` (a
  source's name): another Kafka topic, or another kind of source, whose offsets or slice names would be taken as this
  one's (records skipped or trained twice, silently). The brokers' addresses and a folder's path may change between
  runs."""
  if _identity(record["stream"]) != _identity(stream):
    raise UsageError(f"{checkpoint} holds the position of {record['stream']!r}, and this run reads {stream!r}: that "
                     "position is not this stream's; read the same stream, or train on this one in a new model_dir")


def _identity(stream: str) -> str:
  """What must not change between runs: a Kafka stream's topic ("kafka TOPIC@BROKERS"), another source's kind."""
  kind = stream.split(" ", 1)[0]
  return stream.split("@", 1)[0] if kind == "kafka" else kind


def prune_positions(model_dir: str, kept_checkpoints) -> None:
  """Removes the position and window files of checkpoints no longer kept (`kept_checkpoints`: their paths)."""
  kept = {checkpoints_lib.checkpoint_number(path) for path in kept_checkpoints}
  folder = checkpoints_lib.checkpoint_dir(model_dir)
  for name in tf.io.gfile.listdir(folder):
    match = _NAME.match(name)
    if match and int(match.group(1) or match.group(2)) not in kept:
      tf.io.gfile.remove(os.path.join(folder, name))
