"""tfps.models.flags and the configs/ flagfiles: each parses, and builds its data and model."""

import pathlib
import re

from absl import flags
import numpy as np
import pytest

import needs
import tensorflow as tf

import tfps
from tfps.models import flags as model_flags

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
MODEL_CONFIGS = sorted(p.name for p in CONFIGS.glob("*.cfg") if p.stem.endswith(("_criteo", "_movielens",
                                                                                   "_synthetic")))


def _parse(argv):
  flag_values = flags.FlagValues()
  tfps.define_flags(flag_values)
  model_flags.define_model_flags(flag_values)
  model_flags.define_model_flags(flag_values)  # a second call is harmless
  flag_values(["prog"] + argv)
  return flag_values


def _data_args(config, shared_data, tmp_path):
  if config.endswith("_criteo.cfg"):
    sample = str(shared_data / "criteo" / "criteo_sample.csv")
    return [f"--train_files={sample}", f"--eval_files={sample}", "--num_buckets=1000", "--eval_batch_size=50"]
  if config.endswith("_movielens.cfg"):
    needs.require((shared_data / "ml-100k" / "u.data").is_file(), f"MovieLens 100K at {shared_data / 'ml-100k'}")
    return [f"--data_dir={shared_data / 'ml-100k'}"]
  return [f"--data_dir={tmp_path}", "--synthetic_rows=2000", "--synthetic_vocab_size=100", "--num_buckets=100",
          "--eval_batch_size=250"]


def test_every_model_and_data_has_a_config():
  assert {"wide_deep_criteo.cfg", "dcn_criteo.cfg", "retrieval_movielens.cfg", "wide_deep_synthetic.cfg",
          "dcn_synthetic.cfg"} <= set(MODEL_CONFIGS)


@pytest.mark.parametrize("config", MODEL_CONFIGS)
def test_config_builds_data_and_model(config, shared_data, tmp_path):
  flag_values = _parse([f"--flagfile={CONFIGS / config}"] + _data_args(config, shared_data, tmp_path))
  model_name, data_name = config[:-len(".cfg")].rsplit("_", 1)
  assert (flag_values.model, flag_values.data) == (model_name, data_name)
  data = model_flags.data_from_flags(flag_values)
  model = model_flags.model_from_flags(data, flag_values)
  features, labels = next(iter(data.eval_dataset_fn(None)))
  outputs = model(features)
  assert outputs.shape[0] == labels.shape[0] and np.all(np.isfinite(outputs.numpy()))
  assert (data.candidates is not None) == (data_name == "movielens")


@pytest.mark.parametrize("argv, message", [
    (["--model=retrieval", "--data=synthetic"], "--model=retrieval needs --data=movielens"),
    (["--data=movielens"], "--data=movielens needs --data_dir"),
    (["--data=movielens", "--data_dir=ml", "--num_buckets=5000"],  # was ignored without a word
     "--num_buckets (5000) is for --data=criteo and synthetic; --data=movielens takes its bucket counts from the "
     "MovieLens tables"),
    (["--data=criteo", "--data_dir=crit", "--train_files=a", "--eval_files=b"],
     "--data_dir (crit) is for --data=movielens and synthetic; --data=criteo reads --train_files and --eval_files"),
    (["--data=criteo", "--train_files=a.csv"], "--data=criteo needs --train_files and --eval_files"),
    (["--num_buckets=5,6"], "--num_buckets has 2 values; give 1 or 26"),
    (["--deep_layers=64,x"], "--deep_layers must be comma-separated positive integers"),
])
def test_flag_errors(argv, message):
  with pytest.raises(flags.IllegalFlagValueError, match=re.escape(message)):
    _parse(argv)


def test_synthetic_data_is_generated_by_the_first_dataset_call_once(tmp_path):
  flag_values = _parse([f"--data_dir={tmp_path}", "--synthetic_rows=300", "--synthetic_files=3", "--batch_size=8"])
  data = model_flags.data_from_flags(flag_values)
  assert not list(tmp_path.iterdir())  # ps and workers parse the same flags: they generate nothing

  @tf.function
  def first_label_batch():  # the first call may come while ParameterServerStrategy traces the dataset function
    return next(iter(data.train_dataset_fn(None)))[1]

  assert first_label_batch().shape == (8,)
  stamp = (tmp_path / "part-00000-of-00003.csv").stat().st_mtime_ns
  again = model_flags.data_from_flags(flag_values)
  assert sum(int(labels.shape[0]) for _, labels in again.eval_dataset_fn(None)) == 100  # the held-out last file
  assert (tmp_path / "part-00000-of-00003.csv").stat().st_mtime_ns == stamp



def test_seed_gives_the_same_initial_values_whatever_python_random_holds(tmp_path):
  """`--seed` seeds tf-keras, whose initializers draw their seeds from Python's `random` (reseeded in each forked
  task): the same initial model at every launch."""
  import random  # pylint: disable=g-import-not-at-top

  def initial_weights(seed, python_seed):
    random.seed(python_seed)  # another launch: another state of Python's generator
    flag_values = _parse([f"--data_dir={tmp_path}", "--num_buckets=100", "--deep_layers=4", f"--seed={seed}"])
    data = model_flags.data_from_flags(flag_values)  # generates nothing until a dataset is asked for
    model = model_flags.model_from_flags(data, flag_values)
    model({**{name: tf.zeros([2], tf.int64) for name in data.categorical},
           **{name: tf.zeros([2, width]) for name, width in data.dense.items()}})
    return [w.numpy() for w in model.weights]

  state = random.getstate()
  try:
    weights, again, other = initial_weights(3, 1), initial_weights(3, 2), initial_weights(4, 1)
  finally:
    random.setstate(state)
  assert len(weights) == len(again) > 4 and all(np.array_equal(a, b) for a, b in zip(weights, again))
  assert not all(np.array_equal(a, b) for a, b in zip(weights, other))
