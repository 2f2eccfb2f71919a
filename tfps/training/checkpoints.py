"""Checkpoint layout of a model_dir, shared by the training paths and the sidecar evaluator.

`model_dir/checkpoints/ckpt-N` (TensorFlow checkpoints with a `checkpoint` state file, written last and atomically,
so a reader never sees a half-written checkpoint as the newest), and `model_dir/checkpoints/FINAL`, a JSON marker the
chief writes when training ends, naming the last checkpoint.
"""

import json
import os
from typing import List, Optional

import tensorflow as tf

CHECKPOINT_SUBDIR = "checkpoints"
FINAL_MARKER = "FINAL"


def checkpoint_dir(model_dir: str) -> str:
  return os.path.join(model_dir, CHECKPOINT_SUBDIR)


def list_checkpoints(model_dir: str) -> List[str]:
  """Paths of the checkpoints in `model_dir`, oldest first (those the state file lists)."""
  state = tf.train.get_checkpoint_state(checkpoint_dir(model_dir))
  return list(state.all_model_checkpoint_paths) if state else []


def checkpoint_number(path: str) -> int:
  """N of `.../ckpt-N`."""
  return int(path.rsplit("-", 1)[1])


def optimizer_step(path: str) -> Optional[int]:
  """The optimizer's step counter saved in checkpoint `path` (a Keras model's `optimizer.iterations`), or None."""
  reader = tf.train.load_checkpoint(path)
  for key in reader.get_variable_to_shape_map():
    if key.endswith(_OPTIMIZER_STEP_KEYS):
      return int(reader.get_tensor(key))
  return None


_OPTIMIZER_STEP_KEYS = ("optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE", "optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE")


def final_marker_path(model_dir: str) -> str:
  return os.path.join(checkpoint_dir(model_dir), FINAL_MARKER)


def write_final_marker(model_dir: str, last_checkpoint: Optional[str], **info) -> None:
  """Says that training in `model_dir` ended with `last_checkpoint`; the sidecar evaluator exits after it."""
  path = final_marker_path(model_dir)
  tf.io.gfile.makedirs(checkpoint_dir(model_dir))
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    json.dump({"last_checkpoint": last_checkpoint, **info}, f)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def read_final_marker(model_dir: str) -> Optional[dict]:
  """The marker `write_final_marker` wrote, or None while training goes on."""
  path = final_marker_path(model_dir)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def clear_final_marker(model_dir: str) -> None:
  """Removes the marker when a new training run starts in `model_dir`."""
  path = final_marker_path(model_dir)
  if tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)
