"""Checkpoint convention of a model_dir, one for both training paths and the sidecar evaluator.

* `model_dir/checkpoints/ckpt-N`: TensorFlow checkpoints with a `checkpoint` state file (written last and atomically,
  so a reader never sees a half-written checkpoint as the newest). N is the checkpoint number: the epoch on the Keras
  path, the global step on the Estimator path.
* Every checkpoint holds the step under `STEP_KEY` (`global_step`): the number of optimizer steps applied (the
  optimizer's `iterations` on the Keras path, the global step on the Estimator path); `checkpoint_step` reads it.
* `model_dir/checkpoints/FINAL`: a JSON marker `{"last_checkpoint": path, "step": step}` the chief writes when
  training ends; the sidecar evaluator exits after `last_checkpoint`, ps and workers given the model_dir exit
  (`tfps.cluster.job_end`, which owns the marker's place since servers, a lower layer, read it).
"""

import json
import os
from typing import List, Optional

import tensorflow as tf

from tfps.cluster import job_end

CHECKPOINT_SUBDIR = job_end.CHECKPOINT_SUBDIR
FINAL_MARKER = job_end.FINAL_MARKER
STEP_KEY = "global_step"  # the name of the step variable in every checkpoint: tf.train.Checkpoint(global_step=...)


def checkpoint_dir(model_dir: str) -> str:
  return os.path.join(model_dir, CHECKPOINT_SUBDIR)


def list_checkpoints(model_dir: str) -> List[str]:
  """Paths of the checkpoints in `model_dir`, oldest first (those the state file lists)."""
  state = tf.train.get_checkpoint_state(checkpoint_dir(model_dir))
  return list(state.all_model_checkpoint_paths) if state else []


def checkpoint_number(path: str) -> int:
  """N of `.../ckpt-N`."""
  return int(path.rsplit("-", 1)[1])


def checkpoint_step(path: str) -> int:
  """The step (optimizer steps applied) a checkpoint holds under `STEP_KEY`."""
  return int(tf.train.load_variable(path, f"{STEP_KEY}/.ATTRIBUTES/VARIABLE_VALUE"))


final_marker_path = job_end.final_marker_path


def write_final_marker(model_dir: str, last_checkpoint: Optional[str], step: int) -> None:
  """Says that training in `model_dir` ended at `step` with `last_checkpoint`; the sidecar evaluator exits after it."""
  path = final_marker_path(model_dir)
  tf.io.gfile.makedirs(checkpoint_dir(model_dir))
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    json.dump({"last_checkpoint": last_checkpoint, "step": int(step)}, f)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def read_final_marker(model_dir: str) -> Optional[dict]:
  """The marker `write_final_marker` wrote, or None while training goes on."""
  text = job_end.read_marker_text(model_dir)
  return None if text is None else json.loads(text)


def clear_final_marker(model_dir: str) -> None:
  """Removes the marker when a new training run starts in `model_dir`."""
  path = final_marker_path(model_dir)
  if tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)
