"""tfps.training.sidecar.follow_checkpoints without a cluster: a run's checkpoints followed to its FINAL marker however
the chief spelled model_dir, each evaluated once across sidecar restarts, and an idle timeout that ends in one
line."""

import os

import pytest
import tensorflow as tf

from tfps import errors
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import sidecar


def _run_with_final(model_dir: str, final_model_dir: str) -> None:
  """Two checkpoints in `model_dir`, and the FINAL marker the chief writes, naming the last under `final_model_dir`."""
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(global_step=tf.Variable(7, dtype=tf.int64)),
                                       checkpoints_lib.checkpoint_dir(model_dir), max_to_keep=None)
  manager.save(checkpoint_number=1)
  last = manager.save(checkpoint_number=2)
  checkpoints_lib.write_final_marker(model_dir, os.path.join(checkpoints_lib.checkpoint_dir(final_model_dir),
                                                             os.path.basename(last)), 2)


def test_the_final_checkpoint_is_known_by_name_when_the_chief_spelled_model_dir_otherwise(tmp_path, monkeypatch):
  _run_with_final(str(tmp_path / "run"), "/mnt/elsewhere/run")  # another mount of the same storage
  monkeypatch.chdir(tmp_path)
  evaluated = []
  records = sidecar.follow_checkpoints("run", lambda path: evaluated.append(path) or {"loss": 0.5},
                                       evaluate_every_checkpoint=True, poll_secs=0.05, idle_timeout_secs=5)
  assert [os.path.basename(path) for path in evaluated] == ["ckpt-1", "ckpt-2"] and len(records) == 2


def test_no_checkpoint_within_the_idle_timeout_is_a_tfps_error(tmp_path, info_log):
  with pytest.raises(errors.IdleTimeoutError, match=r"^no new checkpoint in .* for 0.3s; is training running\?$"):
    sidecar.follow_checkpoints(str(tmp_path), lambda path: {}, poll_secs=0.05, idle_timeout_secs=0.3)
  assert isinstance(errors.IdleTimeoutError("x"), (errors.TfpsError, TimeoutError))
  assert f"Waiting for a checkpoint in {tmp_path}/checkpoints (up to 0.3 s)" in info_log.text


def test_a_sidecar_started_again_evaluates_only_what_no_earlier_one_recorded(tmp_path, info_log):
  """A restarted sidecar (or one run again on a finished run) writes no second record of a checkpoint."""
  model_dir = str(tmp_path / "run")
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(global_step=tf.Variable(7, dtype=tf.int64)),
                                       checkpoints_lib.checkpoint_dir(model_dir), max_to_keep=None)
  manager.save(checkpoint_number=1)
  evaluated = []
  evaluate = lambda path: evaluated.append(os.path.basename(path)) or {"loss": 0.5}
  with pytest.raises(errors.IdleTimeoutError):  # the first sidecar ends (its pod is lost) after ckpt-1
    sidecar.follow_checkpoints(model_dir, evaluate, evaluate_every_checkpoint=True, poll_secs=0.05,
                               idle_timeout_secs=0.3)
  last = manager.save(checkpoint_number=2)
  checkpoints_lib.write_final_marker(model_dir, last, 7)
  records = sidecar.follow_checkpoints(model_dir, evaluate, evaluate_every_checkpoint=True, poll_secs=0.05,
                                       idle_timeout_secs=5)
  assert evaluated == ["ckpt-1", "ckpt-2"] and [record["checkpoint_number"] for record in records] == [2]
  assert "holds the evaluations of 1 checkpoint(s) (of an earlier sidecar): not evaluated again" in info_log.text
  assert sidecar.follow_checkpoints(model_dir, evaluate, poll_secs=0.05, idle_timeout_secs=5) == []  # run again
  assert evaluated == ["ckpt-1", "ckpt-2"]
  assert [record["checkpoint_number"] for record in sidecar.read_evaluations(model_dir)] == [1, 2]
  # A run resumed with other epochs may write another step under a name used before: that one is evaluated.
  manager.checkpoint.global_step.assign(9)
  checkpoints_lib.write_final_marker(model_dir, manager.save(checkpoint_number=2), 9)
  records = sidecar.follow_checkpoints(model_dir, evaluate, poll_secs=0.05, idle_timeout_secs=5)
  assert [(record["checkpoint_number"], record["step"]) for record in records] == [(2, 9)]
