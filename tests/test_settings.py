"""Settings as objects: `StrategyOptions` and `TrainingMode` passed whole and checked where a path takes them, and the
one checkpoint writer of both paths. No cluster: each check fails before anything connects."""

import json

import pytest
import tensorflow as tf

import tfps
from tfps.cli import flags as flags_lib
from tfps.training import checkpoints as checkpoints_lib
from absl import flags


def _model_fn(features, labels, mode):
  del features, labels, mode


@pytest.mark.parametrize("settings,message", [
    ({"num_shards": 0}, r"`num_shards` \(0\) must be a positive integer or None"),
    ({"min_shard_bytes": -1}, r"`min_shard_bytes` \(-1\)"),
    ({"connect_timeout_secs": "soon"}, r"`connect_timeout_secs` \('soon'\)"),
    ({"thread_spinning": "yes"}, r"`thread_spinning` \('yes'\) must be True or False"),
    ({"num_shard": 2}, r"unknown strategy option 'num_shard'; allowed: num_shards, min_shard_bytes"),
])
def test_both_paths_check_their_strategy_options_when_called(tmp_path, settings, message):
  with pytest.raises(tfps.UsageError, match=message):
    tfps.Estimator(_model_fn, model_dir=str(tmp_path), strategy_options=settings)
  with pytest.raises(tfps.UsageError, match=message):
    tfps.fit(lambda: None, lambda context: None, epochs=1, steps_per_epoch=1, strategy_options=settings)


def test_strategy_options_come_from_flags_whole_and_still_spread_as_keywords():
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["prog", "--num_shards=3", "--thread_spinning"])
  options = flags_lib.strategy_options_from_flags(flag_values)
  assert options == tfps.StrategyOptions(num_shards=3, thread_spinning=True)
  assert dict(**options)["num_shards"] == 3  # `tfps.fit(**options)` as with the dict of before
  assert flags_lib.strategy_options_from_flags(flags.FlagValues()) == tfps.StrategyOptions()


def test_fit_refuses_an_unknown_keyword_in_one_line():
  with pytest.raises(TypeError, match="fit\\(\\) got an unexpected keyword argument 'epoch_count'"):
    tfps.fit(lambda: None, lambda context: None, epochs=1, steps_per_epoch=1, epoch_count=3)


def test_run_config_takes_the_mode_whole_or_its_fields():
  mode = tfps.TrainingMode("geo", geo_steps=5)
  config = tfps.RunConfig(mode=mode, log_step_count_steps=10)
  assert config == tfps.RunConfig(sync_mode="geo", geo_steps=5, log_step_count_steps=10)
  assert config.mode is mode and config.training_mode is mode and config.geo_steps == 5
  assert config.replace(model_dir="/tmp/x").mode is mode
  assert config.replace(sync_mode="sync", geo_steps=None).mode == tfps.TrainingMode("sync")
  with pytest.raises(tfps.UsageError, match="RunConfig got `mode` and sync_mode: give the mode whole or its fields"):
    tfps.RunConfig(mode=mode, sync_mode="geo")
  with pytest.raises(TypeError, match="RunConfig got an unexpected argument 'geo_step'"):
    tfps.RunConfig(geo_step=5)


def test_the_checkpoint_writer_clears_saves_and_writes_final(tmp_path):
  model_dir = str(tmp_path)
  checkpoints_lib.write_final_marker(model_dir, "old", step=1)  # an earlier run's
  step, weight = tf.Variable(0, dtype=tf.int64), tf.Variable(1.0)
  writer = checkpoints_lib.CheckpointWriter(model_dir, step, max_to_keep=2, weight=weight)
  writer.begin()
  assert not writer.finished()
  for number in (1, 2, 3):
    step.assign(number * 10)
    writer.save(checkpoint_number=number)
  assert [checkpoints_lib.checkpoint_number(path) for path in writer.checkpoints] == [2, 3]
  assert checkpoints_lib.checkpoint_step(writer.latest_checkpoint) == 30
  writer.finish()
  marker = json.loads((tmp_path / "checkpoints" / "FINAL").read_text())
  assert marker == {"last_checkpoint": writer.latest_checkpoint, "step": 30}
