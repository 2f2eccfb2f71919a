"""What one run of the table-size bench does on the chief (bench/scale_run.py runs it under `tfps-launch`).

The model: `NUM_IDS` id features per example into one table of `table_rows` x `DIM`, an MLP of 32, legacy Adagrad,
so the ps hold `table_rows x DIM x 4 B x 2` (rows plus accumulators). `table="hashed"`: the raw ids hashed into a
`tf_keras.layers.Embedding` of that many rows, sharded over the ps; `table="dynamic"`: `tfps.layers.DynamicEmbedding`
on the raw ids. The ids follow one power law over `RAW_IDS` raw ids at every size, so a step touches as many rows
whatever the table's size.

A dynamic table is filled before its steps are timed: after the first epoch the chief admits more fresh ids than it
has rows (`fill_count`; chunks scheduled on the workers), so the measured steps and the ps's memory are those of a
full table and id map.
With `save_to` the chief writes a checkpoint after the measured epochs (timed) and reads a few rows back (`probe`);
with `resume_from` it does not train: it resumes from that checkpoint as `tfps.fit` would (bench/resume.py), on
however many ps its cluster has, and reads the same rows.
"""

import dataclasses
import os
import time
from typing import Optional

import numpy as np
import tensorflow as tf
import tf_keras

import tfps
from bench import epoch_timer
from bench import resume
from bench import scale_summary

NUM_IDS, RAW_IDS, NUM_BATCHES = 8, 10**9, 16
DIM = scale_summary.DIM
TABLE = "table"
FILL_CHUNK = 1 << 17  # fresh ids admitted per scheduled function
FILL_BASE = 1 << 62  # fresh ids start here: no raw id of the data reaches it


@dataclasses.dataclass(frozen=True)
class Settings:
  """One run: `table` ("hashed" or "dynamic") of `table_rows` rows; `steps` per epoch, `measure` timed epochs after
  the first; `save_to` / `resume_from` a checkpoint folder; `strategy_options` as `tfps.fit` takes them."""

  table: str = "hashed"
  table_rows: int = 100_000
  batch_size: int = 256
  steps: int = 200
  measure: int = 3
  save_to: Optional[str] = None
  resume_from: Optional[str] = None
  strategy_options: Optional[tfps.StrategyOptions] = None


def dataset_fn(settings: Settings):
  """`input_context -> Dataset`: `NUM_BATCHES` batches of power-law raw ids (per worker), repeated."""

  def fn(input_context=None):
    rng = np.random.default_rng(input_context.input_pipeline_id if input_context else 0)
    ranks = np.minimum(rng.zipf(1.2, size=(NUM_BATCHES * settings.batch_size, NUM_IDS)), RAW_IDS)
    ids = ranks.astype(np.int64) * 1_000_003 + 17
    labels = (ranks[:, 0] % 2).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).batch(
        settings.batch_size, drop_remainder=True).cache().repeat()

  return fn


def build_model_fn(settings: Settings):
  """`() -> compiled model` of `settings`."""

  def build():
    ids = tf_keras.Input((NUM_IDS,), dtype="int64", name="ids")
    if settings.table == "dynamic":
      vectors = tfps.layers.DynamicEmbedding(settings.table_rows, DIM, name=TABLE)(ids)
    else:
      hashed = tf_keras.layers.Hashing(settings.table_rows, name="hashing")(ids)
      vectors = tf_keras.layers.Embedding(settings.table_rows, DIM, name=TABLE)(hashed)
    hidden = tf_keras.layers.Dense(32, activation="relu")(tf_keras.layers.Flatten()(vectors))
    model = tf_keras.Model({"ids": ids}, tf_keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.05), "binary_crossentropy", steps_per_execution=20)
    return model

  return build


def fill_table(model: tf_keras.Model, count: int) -> None:
  """Admits `count` fresh ids into the model's dynamic table, in chunks scheduled on the workers."""
  layer = model.get_layer(TABLE)
  strategy = model.distribute_strategy
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)  # the strategy's own

  @tf.function
  def admit(start, stop):
    def replica():
      rows = layer.rows_of(FILL_BASE + tf.range(start, stop), training=True)
      return tf.reduce_sum(tf.cast(rows >= 0, tf.int64))
    return strategy.run(replica)

  for start in range(0, count, FILL_CHUNK):
    coordinator.schedule(admit, args=(tf.constant(start, tf.int64), tf.constant(min(start + FILL_CHUNK, count),
                                                                                  tf.int64)))
  coordinator.join()


def fill_count(table_rows: int) -> int:
  """Fresh ids that fill every shard of a dynamic table of `table_rows` rows: ids fall into shards by hash, unevenly,
  so 5% more than its rows, and 1,000 more for a small table (the rest read the default: `fallbacks`)."""
  return table_rows + table_rows // 20 + 1000


class _Fill(tf_keras.callbacks.Callback):
  """Fills the dynamic table at the end of the first epoch (untimed), noting `fill_secs` in `facts`."""

  def __init__(self, count: int, facts: dict):
    super().__init__()
    self.count, self.facts = count, facts

  def on_epoch_end(self, epoch, logs=None):
    if epoch == 0:
      start = time.monotonic()
      fill_table(self.model, fill_count(self.count))
      self.facts["fill_secs"] = time.monotonic() - start


def probe(model: tf_keras.Model, table_rows: int) -> list:
  """Four rows of the table (first, thirds, last) as lists of floats, each gathered on its shard's ps (a lookup on
  the chief would first read the whole shard over, and gRPC refuses a tensor over 2 GB)."""
  table = model.get_layer(TABLE).embeddings
  shards, start = [], 0
  for shard in getattr(table, "variables", [table]):
    shards.append((start, start + shard.shape[0], shard))
    start += shard.shape[0]
  values = []
  for row in (0, table_rows // 3, 2 * table_rows // 3, table_rows - 1):
    low, _, shard = next(bounds for bounds in shards if bounds[0] <= row < bounds[1])
    with tf.device(shard.device):
      values.append(shard.sparse_read([row - low]).numpy()[0].tolist())
  return values


def folder_bytes(path: str) -> int:
  """Bytes of the files under `path`."""
  return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


def _train(cluster, settings: Settings) -> dict:
  facts = {}
  timer = epoch_timer.EpochTimer()
  callbacks = [timer.callback] + ([_Fill(settings.table_rows, facts)] if settings.table == "dynamic" else [])
  start = time.monotonic()
  model = tfps.fit(build_model_fn(settings), dataset_fn(settings), epochs=1 + settings.measure,
                   steps_per_epoch=settings.steps, callbacks=callbacks, cluster=cluster,
                   batch_size=settings.batch_size, log_every_secs=60, strategy_options=settings.strategy_options).model
  facts.update(epoch_timer.rates(timer.seconds, settings.steps * settings.batch_size, settings.steps),
               window_step_secs=[seconds / settings.steps for seconds in timer.seconds], measured_span=timer.span,
               train_secs=time.monotonic() - start, step=int(model.optimizer.iterations.numpy()))
  if settings.table == "dynamic":
    facts["table_metrics"] = {key: int(value) for key, value in model.get_layer(TABLE).table_metrics().items()}
  if settings.save_to:
    start = time.monotonic()
    facts["checkpoint"] = tf.train.Checkpoint(model=model).write(os.path.join(settings.save_to, "ckpt"))
    facts["save_secs"] = time.monotonic() - start
    facts["checkpoint_bytes"] = folder_bytes(settings.save_to)
    facts["probe"] = probe(model, settings.table_rows)
  return facts


def _resume(cluster, settings: Settings) -> dict:
  path = os.path.join(settings.resume_from, "ckpt")  # as `_train` wrote it
  model, facts = resume.timed_resume(cluster, build_model_fn(settings), dataset_fn(settings)(), path,
                                     settings.strategy_options, table=TABLE)
  return dict(facts, checkpoint_bytes=folder_bytes(settings.resume_from), probe=probe(model, settings.table_rows))


def run(cluster, settings: Settings) -> dict:
  """Trains and times (or resumes, with `settings.resume_from`) on `cluster`; the chief's facts and `settings`."""
  if settings.table not in ("hashed", "dynamic"):
    raise ValueError(f"table ({settings.table!r}) must be 'hashed' or 'dynamic'")
  facts = _resume(cluster, settings) if settings.resume_from else _train(cluster, settings)
  return dict(facts, table=settings.table, table_rows=settings.table_rows, dim=DIM, ids_per_example=NUM_IDS,
              batch_size=settings.batch_size, steps_per_epoch=settings.steps, measured_epochs=settings.measure,
              num_ps=cluster.num_ps, num_workers=cluster.num_workers,
              state_bytes=scale_summary.state_bytes(settings.table_rows), load_average=os.getloadavg(),
              resumed=bool(settings.resume_from))
