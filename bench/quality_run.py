"""One side of the quality benchmark (`bench/quality.py`): trains and evaluates the MovieLens 100K models.

`--mode=single` trains in this process with plain tf-keras (no strategy); `--mode=tfps` is one absl script for every
role of a parameter-server cluster, run under `tfps-launch`: ps and workers serve, the chief trains with `tfps.fit`.
Both sides build the same models with the same optimizer, learning rate, epochs, batch size, steps per epoch and
seed, and evaluate the same way on the whole test split: ranking AUC over every test rating (single: `Model.evaluate`
on the finite set; tfps: `tfps.evaluate(..., exact=True)` on the workers), and retrieval top-K accuracy of every test
pair against all 1,682 movies with `tfps.models.evaluate_top_k` (outside any strategy scope). The chief (or the
single process) writes `{"mode", "runs": [{"model", "seed", "auc" | "top_10", "top_100", ...}]}` to `--json_out`.

  tfps-launch --num_ps=2 --num_workers=2 bench/quality_run.py -- --mode=tfps --data_dir=../shared/data/ml-100k \
      --json_out=/tmp/tfps_quality.json
"""

import json
import os
import time
from typing import Callable, Dict

from absl import flags
from absl import logging

import tfps
import tensorflow as tf
import tf_keras

from tfps import models
from tfps.data import movielens

tfps.define_flags()
tfps.define_mode_flags()
_MODE = flags.DEFINE_enum("mode", "single", ("single", "tfps"), "single: no strategy; tfps: tfps.fit on the cluster.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "The MovieLens 100K folder (ml-100k).", required=True)
_MODELS = flags.DEFINE_list("models", ["wide_deep", "retrieval"], "Models to train: wide_deep, dcn, retrieval.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds; every model is trained once per seed.")
_EPOCHS = flags.DEFINE_integer("epochs", 10, "Epochs of the ranking models.", lower_bound=1)
_RETRIEVAL_EPOCHS = flags.DEFINE_integer("retrieval_epochs", 20, "Epochs of the retrieval model.", lower_bound=1)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 256, "Examples per step (per worker under tfps).", lower_bound=1)
_MAX_ROWS = flags.DEFINE_integer("max_rows", 0, "Training rows per epoch (0: all of u1.base); for quick runs.",
                                 lower_bound=0)
_SHUFFLE_BUFFER = flags.DEFINE_integer("shuffle_buffer", 100_000, "Training rows in the shuffle buffer; u1.base is "
                                      "sorted by user, so the default holds all of it.", lower_bound=0)
_STREAMS = flags.DEFINE_integer("streams", 1, "single mode: alternate batches of this many independently shuffled "
                               "passes over u1.base, as tfps workers each read their own (a diagnostic: the data "
                               "order of N workers without their asynchrony).", lower_bound=1)
_RANKING_LR = flags.DEFINE_float("ranking_learning_rate", 0.2, "Adagrad learning rate of the ranking models.")
_RETRIEVAL_LR = flags.DEFINE_float("retrieval_learning_rate", 0.05, "Adagrad learning rate of the retrieval model.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Where the results go (JSON).", required=True)
_STACK = flags.DEFINE_boolean("stack_tables", False, "Wide&Deep and DCN: one table for all categorical features "
                              "(`--stack_tables` of scripts/train.py).")

TRAIN_SPLIT, TEST_SPLIT = "u1.base", "u1.test"
EVAL_BATCH_SIZE = 4096
KS = (10, 100)
MODEL_OPTIONS = {  # as configs/*_movielens.cfg
    "wide_deep": {"embedding_dim": 16, "deep_layers": (64, 32)},
    "dcn": {"embedding_dim": 16, "num_cross_layers": 2, "deep_layers": (64, 32)},
    "retrieval": {"embedding_dim": 32, "layer_sizes": (64, 32)},
}


def count_rows(data_dir: str, split: str) -> int:
  """Ratings in `split`."""
  with open(os.path.join(data_dir, split), encoding="latin-1") as f:
    return sum(1 for line in f if line.strip())


def steps_per_epoch(data_dir: str, batch_size: int, max_rows: int = 0) -> int:
  """Optimizer steps per epoch, the same for both sides: training rows / batch size (at least 1)."""
  rows = count_rows(data_dir, TRAIN_SPLIT)
  return max(1, (min(rows, max_rows) if max_rows else rows) // batch_size)


def model_builder(name: str, tables: movielens.MovieLensTables, seed: int) -> Callable[[], tf_keras.Model]:
  """A function returning the compiled model `name`, its initial values drawn from `seed`."""
  categorical, dense = tables.feature_spec()
  learning_rate = _RETRIEVAL_LR.value if name == "retrieval" else _RANKING_LR.value

  def build():
    tf_keras.utils.set_random_seed(seed)
    options = dict(MODEL_OPTIONS[name], **({"stack_tables": True} if _STACK.value and name != "retrieval" else {}))
    model = models.build_model(name, categorical, dense, **options)
    return models.compile_model(model, optimizer="adagrad", learning_rate=learning_rate)

  return build


def train_dataset_fn(tables: movielens.MovieLensTables, seed: int) -> Callable:
  """Repeating batches shuffled with `seed`. Under tfps each worker reads its own half of the lines (the readers split
  by PSS worker), so the same seed still gives the workers different orders."""
  return movielens.movielens_dataset_fn(_DATA_DIR.value, TRAIN_SPLIT, batch_size=_BATCH_SIZE.value, tables=tables,
                                        shuffle_buffer=_SHUFFLE_BUFFER.value, seed=seed)


def test_dataset_fn(tables: movielens.MovieLensTables) -> Callable:
  """Every test rating once, the last partial batch kept."""
  return movielens.movielens_dataset_fn(_DATA_DIR.value, TEST_SPLIT, batch_size=EVAL_BATCH_SIZE, tables=tables,
                                        repeat=False, shuffle_buffer=0, drop_remainder=False)


def epochs_of(name: str) -> int:
  """The epochs model `name` trains for."""
  return _RETRIEVAL_EPOCHS.value if name == "retrieval" else _EPOCHS.value


def train_single(build: Callable, tables: movielens.MovieLensTables, seed: int, steps: int,
                 epochs: int) -> tf_keras.Model:
  """Plain tf-keras `fit`, no strategy; with `--streams` > 1 on batches taken in turn from that many streams, each
  shuffled with its own seed."""
  model = build()
  streams = [train_dataset_fn(tables, seed + 1000 * index)(None) for index in range(_STREAMS.value)]
  dataset = streams[0] if len(streams) == 1 else tf.data.Dataset.choose_from_datasets(
      streams, tf.data.Dataset.range(len(streams)).repeat())
  model.fit(dataset, epochs=epochs, steps_per_epoch=steps, verbose=0)
  return model


def train_tfps(build: Callable, tables: movielens.MovieLensTables, seed: int, steps: int,
               epochs: int) -> tf_keras.Model:
  """`tfps.fit` on this task's cluster (this process is the chief)."""
  history = tfps.fit(build, train_dataset_fn(tables, seed), epochs=epochs, steps_per_epoch=steps,
                     batch_size=_BATCH_SIZE.value, cluster=tfps.config_from_flags(),
                     sync_mode=tfps.mode_from_flags(), strategy_options=tfps.strategy_options_from_flags())
  return history.model


def evaluate(name: str, model: tf_keras.Model, tables: movielens.MovieLensTables) -> Dict[str, float]:
  """AUC (ranking) or top-K accuracy against every movie (retrieval) on the whole test split."""
  eval_fn = test_dataset_fn(tables)
  if name == "retrieval":
    result = models.evaluate_top_k(model, eval_fn(None), movielens.candidates_dataset(tables), ks=KS)
    return {f"top_{k}": result[f"top_{k}"] for k in KS} | {"examples": result["examples"]}
  if _MODE.value == "single":
    logs = model.evaluate(eval_fn(None), return_dict=True, verbose=0)
  else:
    logs = tfps.evaluate(model, eval_fn, exact=True)
  return {"auc": float(logs["auc"]), "loss": float(logs["loss"])}


def run_one(name: str, seed: int, tables: movielens.MovieLensTables, steps: int) -> dict:
  """Trains and evaluates model `name` with `seed`; returns its record."""
  train = train_single if _MODE.value == "single" else train_tfps
  start = time.monotonic()
  model = train(model_builder(name, tables, seed), tables, seed, steps, epochs_of(name))
  train_secs = time.monotonic() - start
  metrics = evaluate(name, model, tables)
  record = {"model": name, "seed": seed, **metrics, "epochs": epochs_of(name),
            "optimizer_steps": int(model.optimizer.iterations.numpy()),
            "train_secs": round(train_secs, 1)}
  logging.info("quality %s: %s", _MODE.value, record)
  return record


def main(argv):
  del argv
  if _MODE.value == "tfps":  # ps and worker tasks serve here until the launcher stops them
    tfps.run_task(lambda config: None, cluster=tfps.config_from_flags())
  unknown = [name for name in _MODELS.value if name not in MODEL_OPTIONS]
  if unknown:
    raise ValueError(f"--models names {unknown[0]!r}; allowed: {', '.join(MODEL_OPTIONS)}")
  tables = movielens.load_tables(_DATA_DIR.value)
  steps = steps_per_epoch(_DATA_DIR.value, _BATCH_SIZE.value, _MAX_ROWS.value)
  runs = [run_one(name, int(seed), tables, steps) for seed in _SEEDS.value for name in _MODELS.value]
  result = {"mode": _MODE.value, "epochs": _EPOCHS.value, "retrieval_epochs": _RETRIEVAL_EPOCHS.value,
            "batch_size": _BATCH_SIZE.value, "steps_per_epoch": steps,
            "shuffle_buffer": _SHUFFLE_BUFFER.value, "ranking_learning_rate": _RANKING_LR.value,
            "retrieval_learning_rate": _RETRIEVAL_LR.value, "tensorflow": tf.__version__, "runs": runs}
  os.makedirs(os.path.dirname(os.path.abspath(_JSON_OUT.value)), exist_ok=True)
  with open(_JSON_OUT.value + ".tmp", "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  os.replace(_JSON_OUT.value + ".tmp", _JSON_OUT.value)


if __name__ == "__main__":
  tfps.run_main(main)
