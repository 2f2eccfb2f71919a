"""`--embedding=dynamic`: the bundled Wide&Deep on MovieLens 100K with DynamicEmbedding tables keyed by the raw user
and movie ids, under tfps-launch (2 ps, every table sharded; one worker: the tables' shards are on the ps, and
tests/test_dynamic_embedding_chaos.py has two workers train them), exported and served with no cluster; flag
errors."""

import pathlib
import subprocess
import sys

from absl import flags
import numpy as np
import psutil
import pytest
import tensorflow as tf
import tf_keras

from tfps.models import flags as model_flags
from tfps.models.layers import DynamicTables

REPO = pathlib.Path(__file__).resolve().parents[1]


def _parse(argv):
  flag_values = flags.FlagValues()
  model_flags.define_model_flags(flag_values)
  flag_values(["prog"] + argv)
  return flag_values


@pytest.mark.parametrize("argv, message", [
    (["--embedding=dynamic", "--stack_tables"], "--embedding=dynamic and --stack_tables exclude each other"),
    (["--embedding=table"], "value should be one of <hashed|dynamic>"),
])
def test_flag_errors(argv, message):
  with pytest.raises(flags.IllegalFlagValueError, match=message):
    _parse(argv)


def test_sharded_tables_of_a_small_id_space_get_slack_for_uneven_shards():
  tables = DynamicTables(1_000_000, num_shards=2, min_shard_bytes=0)
  users = tables.table(944, 16, "users")  # 472 per shard + 4 x 22 + 4
  assert (users.capacity, users.num_shards) == (2 * 564, 2)
  assert tables.table(10**12, 16, "raw").capacity == 1_000_000  # the flag bounds a large id space
  whole = DynamicTables(1_000_000, num_shards=2).table(944, 16, "small")  # 60 KB: one shard, no slack
  assert (whole.capacity, whole.num_shards) == (944, 1)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 9 min at a load average of 30 on 2 cores (launch and export), 103 ex/s
def test_wide_deep_movielens_with_dynamic_tables_trains_and_serves_raw_ids(tmp_path, subprocess_env, shared_data):
  out, export = tmp_path / "out.txt", tmp_path / "export"
  command = [sys.executable, "-m", "tfps.cluster.launch", "--num_ps=2", "--num_workers=1",
             f"--log_dir={tmp_path / 'logs'}", "scripts/train.py", "--", "--flagfile=configs/wide_deep_movielens.cfg",
             f"--data_dir={shared_data / 'ml-100k'}", "--embedding=dynamic", "--min_shard_bytes=0",
             f"--model_dir={tmp_path / 'run'}", f"--export_dir={export}", "--epochs=1", "--steps_per_epoch=120"]
  with open(out, "w", encoding="utf-8") as output:
    launcher = subprocess.Popen(command, cwd=REPO, env=subprocess_env, stdout=output, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
  try:
    code = launcher.wait(timeout=600)
  finally:
    leftovers = psutil.Process(launcher.pid).children(recursive=True) if launcher.poll() is None else []
    for process in leftovers + ([psutil.Process(launcher.pid)] if launcher.poll() is None else []):
      process.kill()
  assert code == 0, out.read_text()[-3000:]
  summary = out.read_text().split("tfps-launch: run summary")[1]
  val_auc = float(summary.split("final validation metrics: auc ")[1].split()[0])
  # 120 steps in one epoch: every epoch ends with an exact evaluation of all of u1.test (20,000 ratings), one is enough.
  assert val_auc > 0.58, summary  # 0.6026 measured after 2 epochs of 60 steps (0.6144 after 200 steps); 0.5 is chance
  training = summary.split("final training metrics: ")[1].split("\n")[0]
  # Every table has a row per raw id seen: 943 users and 1,650 movies of u1.base are more than 120 batches of 256
  # cover, none falls back (shards with slack), and nothing was evicted.
  assert "embedding_user_id/fallbacks 0.0000" in training and "wide_movie_id/fallbacks 0.0000" in training, training
  assert "embedding_user_id/occupancy 9" in training, training  # 900-943 users seen
  # The SavedModel holds the maps: it answers u1.test's raw ids, with no cluster, with the chief's AUC.
  served = tf.saved_model.load(str(export)).signatures["serving_default"]
  from tfps.data import movielens  # pylint: disable=g-import-not-at-top
  dataset = movielens.movielens_dataset_fn(str(shared_data / "ml-100k"), "u1.test", batch_size=4096, repeat=False,
                                           shuffle_buffer=0, drop_remainder=False)(None)
  auc, examples = tf_keras.metrics.AUC(from_logits=True), 0
  for features, labels in dataset:
    inputs = {name: value for name, value in features.items() if name in served.structured_input_signature[1]}
    auc.update_state(labels, list(served(**inputs).values())[0])
    examples += len(labels)
  assert examples == 20000
  assert float(auc.result()) == pytest.approx(val_auc, abs=2e-3)
  # An unknown raw user id reads zeros in its tables: an answer, not an error.
  unknown = {name: value[:2] for name, value in inputs.items()}
  unknown["user_id"] = tf.constant([10**9, 10**9 + 1], tf.int64)
  answer = list(served(**unknown).values())[0].numpy()
  assert answer.shape == (2, 1) and np.isfinite(answer).all()
