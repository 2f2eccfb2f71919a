"""One run of the dynamic-embedding measurements (`bench/dynamic_embedding_measured.py`): train, evaluate, report.

Every role of a cluster runs this script under `tfps-launch` (ps and workers serve; the chief trains with `tfps.fit`
and measures); with `--single` it trains alone with plain tf-keras `fit` (no strategy). `--table`:

* `dynamic`: `tfps.layers.DynamicEmbedding` on the raw ids;
* `hashed`: the raw ids hashed (`tf_keras.layers.Hashing`) into a `tf_keras.layers.Embedding` of as many rows;
* `keras_dynamic`: tf-keras's experimental `DynamicEmbedding` (LFU over a fixed-size vocabulary) of as many rows.

`--data=movielens`: one table each for the raw user and movie ids of MovieLens 100K, rows = `--capacity_fraction` of
each one's distinct ids; a small MLP; AUC of `rating >= 4` on `u1.test`. `--data=criteo`: generated Criteo-schema
rows (`bench/dynamic_embedding_data.py`) with one table for all 26 categorical columns, rows = `--capacity` or
`--capacity_fraction` of the distinct ids the chief counts in the training split; AUC on a held-out split.

The chief's JSON (`--benchmark_json`): AUC, examples/s and seconds per step of the epochs after the first (tracing),
this process's CPU seconds per step over those epochs (alone: the
whole training's, and steadier than wall time on a loaded machine), and for a dynamic table its occupancy, admitted, fallbacks and each shard's rows in use.
"""

import os
import sys
import time
import traceback

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position
import tf_keras  # pylint: disable=g-import-not-at-top,wrong-import-position

from bench import chief_result  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import dynamic_embedding_data as data_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import epoch_timer  # pylint: disable=g-import-not-at-top,wrong-import-position

tfps.define_flags()
tfps.define_mode_flags()  # e.g. --bf16_rows on the cluster
_DATA = flags.DEFINE_enum("data", "movielens", ["movielens", "criteo"], "What to train on.")
_TABLE = flags.DEFINE_enum("table", "dynamic", ["dynamic", "hashed", "keras_dynamic"], "The embedding table.")
_SINGLE = flags.DEFINE_boolean("single", False, "Train in this process with tf-keras `fit`, no strategy.")
_FRACTION = flags.DEFINE_float("capacity_fraction", 0.25, "Rows of a table / its distinct ids.", lower_bound=0)
_CAPACITY = flags.DEFINE_integer("capacity", 0, "criteo: rows of the table (0: --capacity_fraction of the "
                                 "distinct ids).", lower_bound=0)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "movielens: the MovieLens 100K folder.")
_ROWS = flags.DEFINE_integer("rows", 1_000_000, "criteo: training rows (one pass over them in all).", lower_bound=1)
_EVAL_ROWS = flags.DEFINE_integer("eval_rows", 100_000, "criteo: held-out rows.", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_per_column", 1_000_000, "criteo: ranks per categorical column.", lower_bound=1)
_ZIPF = flags.DEFINE_float("zipf_exponent", 0.8, "criteo: exponent of the id ranks' power law.")
_EPOCHS = flags.DEFINE_integer("epochs", 4, "Epochs; the first is not timed.", lower_bound=2)
_STEPS = flags.DEFINE_integer("steps_per_epoch", 0, "Steps per epoch (0: one pass over the training rows over all "
                              "epochs for criteo; one pass per epoch for movielens).", lower_bound=0)
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step (per worker).", lower_bound=1)
_DIM = flags.DEFINE_integer("dim", 16, "Width of an embedding row.", lower_bound=1)
_LR = flags.DEFINE_float("learning_rate", 0.1, "Adagrad learning rate.", lower_bound=0)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the model's initial values and of the data order.")
_SPE = flags.DEFINE_integer("steps_per_execution", 20, "Steps per scheduled function.", lower_bound=1)
_JSON = flags.DEFINE_string("benchmark_json", None, "Where the chief writes its result.")
_LINGER = flags.DEFINE_float("linger_secs", 1.5, "Seconds the chief waits before exiting (the driver reads the ps "
                             "memory peaks meanwhile).", lower_bound=0)
MOVIELENS_TRAIN_ROWS = 80_000  # u1.base


def _table(name: str, rows: int):
  """`ids -> [..., dim]` vectors of the chosen kind, `rows` rows."""
  if _TABLE.value == "dynamic":
    return tfps.layers.DynamicEmbedding(rows, _DIM.value, name=name)
  if _TABLE.value == "keras_dynamic":  # string ids: its vocabulary update concatenates an "UNK" string to the ids
    layer = tf_keras.layers.experimental.DynamicEmbedding(rows, _DIM.value, initial_vocabulary=tf.string, name=name)
    return lambda ids: layer(tf.strings.as_string(ids))
  hashing = tf_keras.layers.Hashing(rows, name=f"{name}_hashing")
  embedding = tf_keras.layers.Embedding(rows, _DIM.value, name=name)
  return lambda ids: embedding(hashing(ids))


def _compile(inputs: dict, embedded: list, dense=None) -> tf_keras.Model:
  parts = [tf_keras.layers.Flatten()(vectors) for vectors in embedded] + ([dense] if dense is not None else [])
  hidden = tf_keras.layers.Dense(64, activation="relu")(tf_keras.layers.Concatenate()(parts))
  hidden = tf_keras.layers.Dense(32, activation="relu")(hidden)
  model = tf_keras.Model(inputs, tf_keras.layers.Dense(1, activation="sigmoid")(hidden))
  model.compile(tf_keras.optimizers.legacy.Adagrad(_LR.value), "binary_crossentropy",
                metrics=[tf_keras.metrics.AUC(name="auc")], steps_per_execution=_SPE.value)
  return model


def movielens_setup():
  """`(build_model, train_fn, test_fn, steps_per_epoch, facts)` of MovieLens with raw user and movie ids."""
  from tfps.data import movielens  # pylint: disable=g-import-not-at-top
  tables = movielens.load_tables(_DATA_DIR.value)
  distinct = {"user_id": tables.num_users, "movie_id": tables.num_movies}
  rows = {name: max(1, round(_FRACTION.value * count)) for name, count in distinct.items()}

  def build():
    tf_keras.utils.set_random_seed(_SEED.value)
    inputs = {name: tf_keras.Input((), dtype="int64", name=name) for name in distinct}
    return _compile(inputs, [_table(f"{name}_table", rows[name])(inputs[name]) for name in distinct])

  steps = _STEPS.value or MOVIELENS_TRAIN_ROWS // _BATCH.value
  train = data_lib.movielens_dataset_fn(_DATA_DIR.value, "u1.base", _BATCH.value, repeat=True, seed=_SEED.value)
  test = data_lib.movielens_dataset_fn(_DATA_DIR.value, "u1.test", _BATCH.value, repeat=False, seed=0)
  return build, train, test, steps, {"distinct_ids": distinct, "table_rows": rows}


def criteo_setup():
  """`(build_model, train_fn, test_fn, steps_per_epoch, facts)` of generated Criteo-schema rows."""
  train_data = data_lib.GeneratedCriteo(_ROWS.value, _VOCAB.value, _ZIPF.value, seed=2 * _SEED.value + 1)
  test_data = data_lib.GeneratedCriteo(_EVAL_ROWS.value, _VOCAB.value, _ZIPF.value, seed=2 * _SEED.value + 2)
  start = time.monotonic()
  distinct = train_data.distinct_ids()
  count_secs = time.monotonic() - start
  rows = _CAPACITY.value or max(1, round(_FRACTION.value * distinct))

  def build():
    tf_keras.utils.set_random_seed(_SEED.value)
    inputs = {"categorical": tf_keras.Input((data_lib.NUM_CATEGORICAL,), dtype="int64", name="categorical"),
              "integer": tf_keras.Input((data_lib.NUM_DENSE,), name="integer")}
    return _compile(inputs, [_table("categorical_table", rows)(inputs["categorical"])], inputs["integer"])

  steps = _STEPS.value or max(1, _ROWS.value // (_BATCH.value * _EPOCHS.value))
  return (build, train_data.dataset_fn(_BATCH.value, repeat=True), test_data.dataset_fn(_BATCH.value, repeat=False), steps,
          {"distinct_ids": distinct, "table_rows": rows, "count_secs": round(count_secs, 1), "rows": _ROWS.value,
           "eval_rows": _EVAL_ROWS.value, "vocab_per_column": _VOCAB.value, "zipf_exponent": _ZIPF.value})


class _KerasVocabularyUpdate(tf_keras.callbacks.Callback):
  """Updates the vocabulary of every tf-keras experimental DynamicEmbedding at each epoch's end (its
  `UpdateEmbeddingCallback` does the same on a timer, from a thread)."""

  def on_epoch_end(self, epoch, logs=None):
    for layer in self.model.layers:
      if isinstance(layer, tf_keras.layers.experimental.DynamicEmbedding):
        layer.update_embeddings(self.model.distribute_strategy)


def evaluate_alone(model: tf_keras.Model, dataset: tf.data.Dataset) -> dict:
  """AUC and mean loss of `model` over `dataset` in this process (`Model.evaluate` cannot: with steps_per_execution
  it needs a step count, and the test split's is unknown). Test batches are training-sized: tf-keras's experimental
  DynamicEmbedding learns its vocabulary in every call, and fails on a batch with more new ids than its table."""
  auc, loss = tf_keras.metrics.AUC(), tf_keras.metrics.Mean()
  for features, labels in dataset:
    predictions = tf.reshape(model(features, training=False), [-1])
    auc.update_state(labels, predictions)
    loss.update_state(tf_keras.losses.binary_crossentropy(labels[:, None], predictions[:, None]))
  return {"auc": float(auc.result()), "loss": float(loss.result())}


def table_report(model: tf_keras.Model) -> dict:
  """Per dynamic table: `table_metrics()` and each shard's rows in use and rows."""
  report = {}
  for layer in model.layers:
    if isinstance(layer, tfps.layers.DynamicEmbedding):
      report[layer.name] = dict(layer.table_metrics(), shards=[
          {"device": shard.device, "rows": int(shard.rows), "in_use": int(shard.rows - shard.num_free.numpy())}
          for shard in layer.shards])
  return report


def train_and_evaluate(config) -> dict:
  """Trains (on the cluster of `config`, or alone when it is None); AUC, rates and table occupancy."""
  build, train_fn, test_fn, steps, facts = movielens_setup() if _DATA.value == "movielens" else criteo_setup()
  timer = epoch_timer.EpochTimer()
  start = time.monotonic()
  if config is None:
    model = build()
    model.fit(train_fn(None), epochs=_EPOCHS.value, steps_per_epoch=steps,
              callbacks=[timer.callback, _KerasVocabularyUpdate()], verbose=0)
    logs = evaluate_alone(model, test_fn(None))
  else:
    model = tfps.fit(build, train_fn, epochs=_EPOCHS.value, steps_per_epoch=steps, callbacks=[timer.callback],
                     batch_size=_BATCH.value, cluster=config, log_every_secs=30, sync_mode=tfps.mode_from_flags(),
                     strategy_options=tfps.strategy_options_from_flags()).model
    logs = tfps.evaluate(model, test_fn, exact=True)
  train_secs = time.monotonic() - start
  rates = epoch_timer.rates(timer.seconds, steps * _BATCH.value, steps)
  return dict(facts, auc=float(logs["auc"]), loss=float(logs["loss"]), steps_per_epoch=steps,
              optimizer_steps=int(model.optimizer.iterations.numpy()), train_and_eval_secs=round(train_secs, 1),
              measured_span=timer.span, tables=table_report(model),
              cpu_secs_per_step=sum(timer.cpu) / (steps * len(timer.cpu)), **rates)


def main(argv):
  del argv
  if _DATA.value == "movielens" and not _DATA_DIR.value:
    raise app.UsageError("--data=movielens needs --data_dir (the MovieLens 100K folder)")
  if _ZIPF.value <= 0 or _ZIPF.value == 1:
    raise app.UsageError(f"--zipf_exponent ({_ZIPF.value}) must be positive and not 1")
  if _SINGLE.value:
    result = train_and_evaluate(None)
  else:
    try:
      result = tfps.run_task(train_and_evaluate, cluster=tfps.config_from_flags())
    except AttributeError as error:  # tf-keras's experimental DynamicEmbedding under ParameterServerStrategy
      if _TABLE.value != "keras_dynamic":
        raise
      frames = traceback.extract_tb(error.__traceback__)
      result = {"error": f"{type(error).__name__}: {error}",
                "error_where": [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames[-4:]]}
  result = dict(result, data=_DATA.value, table=_TABLE.value, single=_SINGLE.value, epochs=_EPOCHS.value,
                batch_size=_BATCH.value, dim=_DIM.value, capacity_fraction=_FRACTION.value, seed=_SEED.value,
                learning_rate=_LR.value, load_average=os.getloadavg())
  chief_result.write_and_exit(result, _JSON.value, _LINGER.value)


if __name__ == "__main__":
  tfps.run_main(main)
