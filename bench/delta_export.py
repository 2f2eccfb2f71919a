"""Bytes and time of a delta export against the full export, when about 1% of a table's rows changed.

  .venv/bin/python bench/delta_export.py   # ~6 min; --rows, --dim, --changed, --steps, --throughput_repeats

Trains, on an in-process cluster (1 ps, 1 worker), a model with one `--rows` x `--dim` table and a small dense
layer, with `tfps.fit(..., delta_export_secs=0)`: the base export is written before the first step, a delta after each
of the 2 epochs. Every id a batch looks up is one of `--changed` x `--rows` fixed ids, so at most that share of the
rows changes. Prints and writes to `--out` (default bench/results/delta_export.json): the base's bytes (the full
SavedModel), each delta's bytes and rows, their ratio, the seconds each write took on the chief (training waits for
them: they run at an epoch's end) beside the seconds of each epoch's checkpoint, and the seconds `tfps.delta.apply`
takes to apply both deltas to the base. Then, `--throughput_repeats` times alternating, the seconds of an epoch of 100
steps with the rows marked for deltas and without (medians of epochs 2-4; the table is the same, each epoch's
checkpoint included in both), and the ratio of their medians.
"""

import json
import os
import sys
import tempfile
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position
import tf_keras  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `tfps`

import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.keras import callbacks as callbacks_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.training import deltas  # pylint: disable=g-import-not-at-top,wrong-import-position

_ROWS = flags.DEFINE_integer("rows", 1_000_000, "Rows of the table.", lower_bound=1)
_DIM = flags.DEFINE_integer("dim", 16, "Width of the table.", lower_bound=1)
_CHANGED = flags.DEFINE_float("changed", 0.01, "Share of the rows the batches look up (an upper bound of the rows "
                              "changed).", lower_bound=0.0, upper_bound=1.0)
_STEPS = flags.DEFINE_integer("steps", 20, "Steps per epoch (2 epochs, a delta after each).", lower_bound=1)
_REPEATS = flags.DEFINE_integer("throughput_repeats", 3, "Alternating runs with and without delta export whose step "
                                "time is compared (0: none).", lower_bound=0)
_OUT = flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                               "delta_export.json"), "Where to write the results.")
IDS, BATCH = 8, 256


def build_model():
  ids = tf_keras.Input((IDS,), dtype="int64", name="ids")
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(_ROWS.value, _DIM.value, name="table")(ids))
  model = tf_keras.Model({"ids": ids}, tf_keras.layers.Dense(1, activation="sigmoid")(
      tf_keras.layers.Dense(32, activation="relu")(embedded)))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "binary_crossentropy")
  return model


def train_fn(input_context):
  del input_context
  rng = np.random.default_rng(0)
  pool = rng.choice(_ROWS.value, max(1, int(_ROWS.value * _CHANGED.value)), replace=False)
  ids = pool[rng.integers(0, len(pool), size=(16 * BATCH, IDS))].astype(np.int64)
  labels = (ids.sum(axis=1) % 2).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat().batch(BATCH, drop_remainder=True)


def folder_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def timed(owner, name: str, seconds: list):
  """Replaces `owner.name` by a wrapper appending each call's seconds to `seconds`."""
  original = getattr(owner, name)

  def wrapper(*args, **kwargs):
    start = time.perf_counter()
    try:
      return original(*args, **kwargs)
    finally:
      seconds.append(time.perf_counter() - start)

  setattr(owner, name, wrapper)


class EpochTimes(tf_keras.callbacks.Callback):
  """Seconds from each epoch's start to its end, the epoch's checkpoint included (as in both variants)."""

  def __init__(self):
    super().__init__()
    self.seconds, self._start = [], 0.0

  def on_epoch_begin(self, epoch, logs=None):
    self._start = time.perf_counter()

  def on_epoch_end(self, epoch, logs=None):
    self.seconds.append(time.perf_counter() - self._start)


def step_times(cluster, scratch: str) -> dict:
  """Median seconds per epoch (of 100 steps, the first left out) with the rows marked (a delta only at the end)
  and without, `--throughput_repeats` alternating runs each."""
  times = {"without": [], "with_deltas": []}
  for repeat in range(_REPEATS.value):
    for variant in times:
      timer = EpochTimes()
      tfps.fit(build_model, train_fn, epochs=4, steps_per_epoch=100, cluster=cluster, num_shards=1,
               model_dir=os.path.join(scratch, f"{variant}_{repeat}"), callbacks=[timer],
               delta_export_secs=3600 if variant == "with_deltas" else None)
      times[variant].append(round(float(np.median(timer.seconds[1:])), 3))
  return {"epoch_secs": times, "ratio_of_medians": round(float(np.median(times["with_deltas"]) /
                                                              np.median(times["without"])), 3)}


def main(argv):
  del argv
  cluster = tfps.testing.local_cluster(num_workers=1, num_ps=1)
  writes = {"write_base": [], "write_delta": [], "checkpoint": []}
  for name in ("write_base", "write_delta"):
    timed(deltas.DeltaWriter, name, writes[name])
  timed(callbacks_lib.EpochCheckpoint, "on_epoch_end", writes["checkpoint"])
  with tempfile.TemporaryDirectory() as scratch:
    model_dir = os.path.join(scratch, "run")
    tfps.fit(build_model, train_fn, epochs=2, steps_per_epoch=_STEPS.value, model_dir=model_dir, cluster=cluster,
             delta_export_secs=0, num_shards=1)
    folder = os.path.join(model_dir, "deltas")
    names = sorted(os.listdir(folder))
    base, delta_paths = os.path.join(folder, names[0]), [os.path.join(folder, name) for name in names[1:]]
    start = time.perf_counter()
    tfps.delta.apply(base, delta_paths, os.path.join(scratch, "served"))
    apply_secs = time.perf_counter() - start
    base_bytes = folder_bytes(base)
    results = {"rows": _ROWS.value, "dim": _DIM.value, "changed_at_most": _CHANGED.value, "base_bytes": base_bytes,
               "base_write_secs": round(writes["write_base"][0], 3), "apply_secs_both_deltas": round(apply_secs, 3),
               "checkpoint_secs": [round(secs, 3) for secs in writes["checkpoint"]],
               "deltas": []}
    for path, secs in zip(delta_paths, writes["write_delta"]):
      table = deltas.read_manifest(path)["variables"][0]
      results["deltas"].append({"name": os.path.basename(path), "bytes": folder_bytes(path), "rows": table["rows"],
                                "rows_share": round(table["rows"] / _ROWS.value, 5),
                                "ratio_to_full": round(folder_bytes(path) / base_bytes, 5),
                                "write_secs": round(secs, 3)})
  for delta in results["deltas"]:
    print(f"{delta['name']}: {delta['rows']:,} rows changed ({delta['rows_share']:.2%} of {_ROWS.value:,}), "
          f"{delta['bytes']:,} bytes against the full export's {base_bytes:,}: {delta['ratio_to_full']:.4f}x; "
          f"written in {delta['write_secs']} s (the full export: {results['base_write_secs']} s)")
  print(f"applying both deltas to the base: {results['apply_secs_both_deltas']} s; the epochs' checkpoints took "
        f"{results['checkpoint_secs']} s")
  if _REPEATS.value:
    with tempfile.TemporaryDirectory() as scratch:
      results["training"] = step_times(cluster, scratch)
    print(f"seconds per epoch of 100 steps, with rows marked for deltas: {results['training']['epoch_secs']}; "
          f"with / without: {results['training']['ratio_of_medians']}x")
  os.makedirs(os.path.dirname(_OUT.value), exist_ok=True)
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  print(f"results in {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
