"""Checkpoint convention of a model_dir, one for both training paths and the sidecar evaluator.

* `model_dir/checkpoints/ckpt-N`: TensorFlow checkpoints with a `checkpoint` state file (written last and atomically,
  so a reader never sees a half-written checkpoint as the newest). N is the checkpoint number: the epoch on the Keras
  path, the global step on the Estimator path.
* Every checkpoint holds the step under `STEP_KEY` (`global_step`): the number of optimizer steps applied (the
  optimizer's `iterations` on the Keras path, the global step on the Estimator path); `checkpoint_step` reads it.
* `model_dir/checkpoints/FINAL`: a JSON marker `{"last_checkpoint": path, "step": step}` the chief writes when
  training ends; the sidecar evaluator exits after `last_checkpoint`, ps and workers given the model_dir exit
  (`tfps.cluster.job_end`, which owns the marker's place since servers, a lower layer, read it).

`CheckpointWriter` is the chief's side of it on both paths: clear the marker when training begins, save, write FINAL.
"""

import json
import os
from typing import List, Optional

from absl import logging
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


def is_registered(model_dir: str, number: int) -> bool:
  """Whether checkpoint `ckpt-<number>` is whole and listed (the state file names it: it is written last); its files,
  its `.index` among them, exist a moment before."""
  return any(checkpoint_number(path) == number for path in list_checkpoints(model_dir))


def copy_checkpoint(path: str, folder: str) -> str:
  """Puts checkpoint `path`'s files into `folder` (made if missing) and returns the path of the copy there. On a local
  filesystem each file is a hard link (no bytes copied: a checkpoint's files are never written again, and deleting
  the original leaves the link whole), elsewhere (another filesystem, a remote one) a copy. Raises
  `tf.errors.NotFoundError` where the checkpoint is (being) deleted."""
  sources = tf.io.gfile.glob(path + ".*")
  if not sources:
    raise tf.errors.NotFoundError(None, None, f"no files of checkpoint {path}")
  tf.io.gfile.makedirs(folder)
  local = "://" not in path and "://" not in folder
  for source in sources:
    destination = os.path.join(folder, os.path.basename(source))
    if local:
      try:
        os.link(source, destination)
        continue
      except FileNotFoundError:
        raise tf.errors.NotFoundError(None, None, f"{source} was deleted") from None
      except OSError:  # another filesystem, or one without links
        pass
    tf.io.gfile.copy(source, destination, overwrite=True)
  return os.path.join(folder, os.path.basename(path))


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


class CheckpointWriter:
  """The chief's checkpoints of a run in `model_dir`, the same on both paths (`tfps.fit`'s `EpochCheckpoint`, the
  Estimator path's `TrainLoop`).

  `begin()` clears the FINAL marker of an earlier run, `save(checkpoint_number=N)` writes `ckpt-N` (the model's
  objects and, under `STEP_KEY`, `step`), `finish()` writes FINAL naming the newest checkpoint and the step.

  Args:
    model_dir: the run's folder; checkpoints go to `model_dir/checkpoints`.
    step: the variable counting the optimizer steps applied (the Keras optimizer's `iterations`, the global step).
    max_to_keep: checkpoints kept (None keeps all).
    **objects: what else each checkpoint holds (`model=...`, `optimizer=...`).
  """

  def __init__(self, model_dir: str, step: tf.Variable, max_to_keep: Optional[int] = 5, **objects):
    self.model_dir = model_dir
    self.step = step
    self.checkpoint = tf.train.Checkpoint(**objects, **{STEP_KEY: step})
    self._manager = tf.train.CheckpointManager(self.checkpoint, checkpoint_dir(model_dir), max_to_keep=max_to_keep,
                                               checkpoint_name="ckpt")

  @property
  def latest_checkpoint(self) -> Optional[str]:
    """The newest checkpoint of `model_dir` (an earlier run's too), or None."""
    return self._manager.latest_checkpoint

  @property
  def checkpoints(self) -> List[str]:
    """The checkpoints kept, oldest first."""
    return list(self._manager.checkpoints)

  def begin(self) -> None:
    """Training begins: the FINAL marker of an earlier run is removed (a sidecar would stop at it)."""
    clear_final_marker(self.model_dir)

  def save(self, checkpoint_number: int) -> str:
    """Writes `ckpt-<checkpoint_number>` and returns its path."""
    path = self._manager.save(checkpoint_number=checkpoint_number)
    logging.info("Saved checkpoint %s", path)
    return path

  def finish(self) -> None:
    """Training ended: FINAL names the newest checkpoint and the step (the sidecar evaluator exits after it)."""
    write_final_marker(self.model_dir, self.latest_checkpoint, step=int(self.step.numpy()))

  def finished(self) -> bool:
    """Whether FINAL is written (training ended)."""
    return read_final_marker(self.model_dir) is not None
