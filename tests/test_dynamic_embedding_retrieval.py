"""`--embedding=dynamic` for the two-tower retrieval model under tfps-launch (2 ps, every table sharded): both
towers keyed by raw ids, the serving export answers raw user ids as the checkpoint does, top-K retrieval works on
the trained towers, and a resume on another number of ps is refused with one line, the checkpoint untouched."""

import hashlib
import pathlib
import subprocess
import sys

from absl import flags
import numpy as np
import psutil
import pytest
import tensorflow as tf

from tfps import models
from tfps.models import flags as model_flags
from tfps.models.layers import DynamicTables
from tfps.training import checkpoints as checkpoints_lib

REPO = pathlib.Path(__file__).resolve().parents[1]


def _launch(tmp_path, name, num_ps, *train_flags, max_restarts=3):
  """Runs tfps-launch with one worker; returns (exit status, output)."""
  out = tmp_path / f"{name}.txt"
  command = [sys.executable, "-m", "tfps.cluster.launch", f"--num_ps={num_ps}", "--num_workers=1",
             f"--max_restarts={max_restarts}",
             f"--log_dir={tmp_path / name}", "scripts/train.py", "--", *train_flags]
  with open(out, "w", encoding="utf-8") as output:
    launcher = subprocess.Popen(command, cwd=REPO, env=_launch.env, stdout=output, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
  try:
    code = launcher.wait(timeout=600)
  finally:
    if launcher.poll() is None:
      for process in psutil.Process(launcher.pid).children(recursive=True) + [psutil.Process(launcher.pid)]:
        process.kill()
      launcher.wait()
  return code, out.read_text()


def _files(directory: pathlib.Path) -> dict:
  return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_retrieval_with_dynamic_tables_trains_serves_raw_ids_and_refuses_another_ps_count(tmp_path, subprocess_env,
                                                                                          shared_data):
  _launch.env = subprocess_env
  run, export = tmp_path / "run", tmp_path / "export"
  model = ["--flagfile=configs/retrieval_movielens.cfg", f"--data_dir={shared_data / 'ml-100k'}",
           "--embedding=dynamic", "--min_shard_bytes=0"]
  code, out = _launch(tmp_path, "train", 2, *model, f"--model_dir={run}", f"--export_dir={export}", "--epochs=1",
                      "--steps_per_epoch=40")
  assert code == 0, out[-3000:]
  training = out.split("tfps-launch: run summary")[1].split("final training metrics: ")[1].split("\n")[0]
  # 40 batches of 256 ratings see most of the 943 users and many of the 1,682 movies, each on a row of its own.
  occupancy = {name: float(training.split(f"{name}/occupancy ")[1].split()[0])
               for name in ("embedding_user_id", "embedding_movie_id")}
  assert occupancy["embedding_user_id"] > 500 and occupancy["embedding_movie_id"] > 500, training
  assert "embedding_user_id/fallbacks 0.0000" in training and "embedding_movie_id/fallbacks 0.0000" in training

  # Outside the cluster: the model restored from the checkpoint, with both towers' maps.
  flag_values = flags.FlagValues()
  model_flags.define_model_flags(flag_values)
  flag_values(["prog"] + model[:3])
  data = model_flags.data_from_flags(flag_values)
  restored = models.build_retrieval(data.categorical, data.dense, embedding_dim=32, layer_sizes=(64, 32),
                                    dynamic=DynamicTables(1_000_000, num_shards=2, min_shard_bytes=0))
  features = next(iter(data.eval_dataset_fn(None)))[0]
  restored(features)
  last = checkpoints_lib.list_checkpoints(str(run))[-1]
  tf.train.Checkpoint(model=restored).read(last).expect_partial().assert_existing_objects_matched()

  # The export answers raw user ids with the query embeddings of the checkpoint; an unknown id gets an answer.
  served = tf.saved_model.load(str(export)).signatures["serving_default"]
  inputs = {name: value for name, value in features.items() if name in served.structured_input_signature[1]}
  assert "user_id" in inputs
  np.testing.assert_allclose(list(served(**inputs).values())[0].numpy(), restored(features).numpy(), atol=1e-5)
  unknown = {name: value[:2] for name, value in inputs.items()}
  unknown["user_id"] = tf.constant([10**9, 10**9 + 1], tf.int64)
  answer = list(served(**unknown).values())[0].numpy()
  assert answer.shape == (2, 32) and np.isfinite(answer).all()

  # Top-K over every candidate movie, its ids the raw movie ids: above chance (100 of 1,682 movies).
  top_k = models.evaluate_top_k(restored, data.eval_dataset_fn(None), data.candidates(), ks=(100,), steps=2)
  assert top_k["top_100"] > 0.08, top_k  # 0.101 measured after 40 steps; chance 0.059 (its sd over 8,192: 0.003)

  # Resuming on 1 ps: refused with one line naming both shard counts; the checkpoint is left as it was.
  before = _files(pathlib.Path(checkpoints_lib.checkpoint_dir(str(run))))
  code, out = _launch(tmp_path, "resume", 1, *model, f"--model_dir={run}", "--epochs=2", "--steps_per_epoch=40",
                      max_restarts=0)  # (the launcher restarts a chief that exits with status 2 like a crashed one)
  assert code != 0
  refusal = [line for line in out.splitlines() if line.startswith("train.py: checkpoint ")]
  assert refusal and "dynamic table 'embedding_user_id'" in refusal[0], out[-3000:]
  assert "in 2 shard(s) and this run makes 1" in refusal[0] and "resume with the number of ps" in refusal[0]
  assert "Traceback" not in out, out[-3000:]
  assert _files(pathlib.Path(checkpoints_lib.checkpoint_dir(str(run)))) == before
