"""The stream position a checkpoint holds: `model_dir/checkpoints/stream-N.json` beside `ckpt-N`.

The file of checkpoint N holds the position just after the last example of the steps that checkpoint holds (per
Kafka partition the next offset; for a folder the slice and lines read). It is written (atomically, by a rename)
before the checkpoint, so a checkpoint that exists always has its position; a position file without its checkpoint
(the chief died between the two) is never read, and is removed with the checkpoints the manager drops.
"""

import json
import os
import re
from typing import Optional

from absl import logging
import tensorflow as tf

from tfps.training import checkpoints as checkpoints_lib

_NAME = re.compile(r"stream-(\d+)\.json$")


def positions_path(model_dir: str, number: int) -> str:
  """Where checkpoint `number`'s stream position is."""
  return os.path.join(checkpoints_lib.checkpoint_dir(model_dir), f"stream-{int(number)}.json")


def write_positions(model_dir: str, number: int, positions: dict, stream: str) -> None:
  """Writes checkpoint `number`'s position (of the stream named `stream`) atomically; call before saving it."""
  path = positions_path(model_dir, number)
  tf.io.gfile.makedirs(os.path.dirname(path))
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    json.dump({"stream": stream, "positions": positions}, f)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def read_positions(model_dir: str, checkpoint: Optional[str]) -> Optional[dict]:
  """The position `checkpoint` (a `ckpt-N` path) holds, or None where it holds none (trained on files)."""
  if not checkpoint:
    return None
  path = positions_path(model_dir, checkpoints_lib.checkpoint_number(checkpoint))
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)["positions"]


def newest_positions(model_dir: str) -> Optional[dict]:
  """The position the newest checkpoint of `model_dir` holds (None: no checkpoint, or one not trained on a stream:
  the stream starts where its source starts)."""
  latest = tf.train.latest_checkpoint(checkpoints_lib.checkpoint_dir(model_dir))
  positions = read_positions(model_dir, latest)
  if latest and positions is None:
    logging.warning("%s holds no stream position (it was not trained on a stream); the stream starts where its "
                    "source starts", latest)
  return positions


def prune_positions(model_dir: str, kept_checkpoints) -> None:
  """Removes the position files of checkpoints no longer kept (`kept_checkpoints`: their paths)."""
  kept = {checkpoints_lib.checkpoint_number(path) for path in kept_checkpoints}
  folder = checkpoints_lib.checkpoint_dir(model_dir)
  for name in tf.io.gfile.listdir(folder):
    match = _NAME.match(name)
    if match and int(match.group(1)) not in kept:
      tf.io.gfile.remove(os.path.join(folder, name))
