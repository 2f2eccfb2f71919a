"""Bytes and time of delta exports against the full export when about 1% of a table's rows changed, the time to apply
each delta, and what marking the rows costs training.

  .venv/bin/python bench/delta_export.py                  # ~10 min; 10^6 rows, then the training cost
  .venv/bin/python bench/delta_export.py --big_rows=10000000 --parts=sizes   # the 10^7-row table too (~5 min more)
  .venv/bin/python bench/delta_export.py --parts=training  # the training cost only, into the existing results

Sizes (`--parts` all or sizes): for `--rows` (and `--big_rows`), trains on an in-process cluster (1 ps, 1 worker) a
model with one rows x `--dim` table and a small dense layer, with `tfps.fit(..., delta_export_secs=0)`: the base
export before the first step, a delta after each of 2 epochs. Every id a batch looks up is one of `--changed` x rows
fixed ids, so at most that share of the rows changes. Records the base's bytes (the full SavedModel), each delta's
bytes, rows and ratio, the seconds each write took on the chief (training waits for them: they run at an epoch's end)
beside each epoch's checkpoint, and the seconds to apply each delta as `tfps-delta watch` does (the served version
before it loaded, the delta applied, the new version saved), with the part that applies the rows apart.

Training cost (`--parts` all or training): `--throughput_repeats` times, alternating which goes first, a run of
`--throughput_epochs` epochs of 100 steps with a delta at the first epoch end `--delta_every_secs` seconds after the
last (the rows marked, the deltas written while training waits) and one without deltas; examples/s over epochs 2 to
the last (each epoch's checkpoint in both), the medians and their ratio, and the load average beside each run.
Writes to `--out` (default bench/results/delta_export.json); `--parts=training` replaces the training part there.
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
_BIG_ROWS = flags.DEFINE_integer("big_rows", 0, "Rows of a second, larger table measured the same way (0: none).",
                                 lower_bound=0)
_DIM = flags.DEFINE_integer("dim", 16, "Width of the table.", lower_bound=1)
_CHANGED = flags.DEFINE_float("changed", 0.01, "Share of the rows the batches look up (an upper bound of the rows "
                              "changed).", lower_bound=0.0, upper_bound=1.0)
_STEPS = flags.DEFINE_integer("steps", 20, "Steps per epoch (2 epochs, a delta after each) at --rows; at --big_rows "
                             "as many times more as it has more rows.", lower_bound=1)
_PARTS = flags.DEFINE_enum("parts", "all", ["all", "sizes", "training"], "What to measure.")
_REPEATS = flags.DEFINE_integer("throughput_repeats", 3, "Alternating runs with and without deltas whose examples/s "
                                "are compared.", lower_bound=1)
_EPOCHS = flags.DEFINE_integer("throughput_epochs", 8, "Epochs of 100 steps in each of those runs.", lower_bound=3)
_EVERY = flags.DEFINE_float("delta_every_secs", 3.0, "Seconds between deltas in the runs with deltas (30 s in a "
                            "long run, scaled to the short one).", lower_bound=0.0)
_OUT = flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                               "delta_export.json"), "Where to write the results.")
IDS, BATCH, THROUGHPUT_STEPS = 8, 256, 100
_rows = [1_000_000]  # the table's rows in the run being measured


def build_model():
  ids = tf_keras.Input((IDS,), dtype="int64", name="ids")
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(_rows[0], _DIM.value, name="table")(ids))
  model = tf_keras.Model({"ids": ids}, tf_keras.layers.Dense(1, activation="sigmoid")(
      tf_keras.layers.Dense(32, activation="relu")(embedded)))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "binary_crossentropy")
  return model


def train_fn(input_context):
  del input_context
  rng = np.random.default_rng(0)
  pool = rng.choice(_rows[0], max(1, int(_rows[0] * _CHANGED.value)), replace=False)
  batches = max(16, 4 * len(pool) // (BATCH * IDS))  # each id of the pool looked up about 4 times in a pass
  ids = pool[rng.integers(0, len(pool), size=(batches * BATCH, IDS))].astype(np.int64)
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
  """Seconds from each epoch's start to its end, tfps's own epoch-end work (checkpoint, delta) included: user
  callbacks run after tfps's."""

  def __init__(self):
    super().__init__()
    self.seconds, self._start = [], 0.0

  def on_epoch_begin(self, epoch, logs=None):
    self._start = time.perf_counter()

  def on_epoch_end(self, epoch, logs=None):
    self.seconds.append(time.perf_counter() - self._start)


WRITES = {"write_base": [], "write_delta": [], "checkpoint": [], "apply_rows": []}


def apply_times(base: str, delta_paths, scratch: str) -> list:
  """Seconds to apply each delta as `tfps-delta watch` does: the version before it loaded, the delta applied, the
  new version saved (and of that, applying the rows)."""
  times, served = [], base
  for number, path in enumerate(delta_paths):
    del WRITES["apply_rows"][:]
    start = time.perf_counter()
    served = tfps.delta.apply(served, [path], os.path.join(scratch, f"served_{_rows[0]}_{number}"))
    times.append({"apply_secs": round(time.perf_counter() - start, 3),
                  "rows_applied_secs": round(WRITES["apply_rows"][0], 4)})
  return times


def size_results(cluster, rows: int, scratch: str) -> dict:
  """Bytes and seconds of the base, each delta, and applying each, for a table of `rows` rows."""
  _rows[0] = rows
  load_before = os.getloadavg()[0]
  for seconds in WRITES.values():
    del seconds[:]
  model_dir = os.path.join(scratch, f"run_{rows}")
  steps = _STEPS.value * max(1, rows // _ROWS.value)  # as many lookups per row of the pool at each size
  tfps.fit(build_model, train_fn, epochs=2, steps_per_epoch=steps, model_dir=model_dir, cluster=cluster,
           delta_export_secs=0, num_shards=1)
  folder = os.path.join(model_dir, "deltas")
  names = sorted(os.listdir(folder))
  base, delta_paths = os.path.join(folder, names[0]), [os.path.join(folder, name) for name in names[1:]]
  applied = apply_times(base, delta_paths, scratch)
  base_bytes = folder_bytes(base)
  results = {"rows": rows, "dim": _DIM.value, "changed_at_most": _CHANGED.value, "steps_per_epoch": steps,
             "base_bytes": base_bytes,
             "base_write_secs": round(WRITES["write_base"][0], 3),
             "checkpoint_secs": [round(secs, 3) for secs in WRITES["checkpoint"]], "deltas": [],
             "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
  for path, secs, apply in zip(delta_paths, WRITES["write_delta"], applied):
    table = deltas.read_manifest(path)["variables"][0]
    results["deltas"].append(dict({"name": os.path.basename(path), "bytes": folder_bytes(path), "rows": table["rows"],
                                   "rows_share": round(table["rows"] / rows, 5),
                                   "ratio_to_full": round(folder_bytes(path) / base_bytes, 5),
                                   "write_secs": round(secs, 3)}, **apply))
  for delta in results["deltas"]:
    print(f"{rows:,} rows, {delta['name']}: {delta['rows']:,} rows changed ({delta['rows_share']:.2%}), "
          f"{delta['bytes']:,} bytes against the full export's {base_bytes:,}: {delta['ratio_to_full']:.4f}x; "
          f"written in {delta['write_secs']} s (the full export: {results['base_write_secs']} s); applied in "
          f"{delta['apply_secs']} s, its rows in {delta['rows_applied_secs']} s")
  return results


def examples_per_sec(cluster, scratch: str, variant: str, repeat: int) -> dict:
  """One run of `variant` (with deltas every `--delta_every_secs`, or without): examples/s over epochs 2 on."""
  timer, load_before = EpochTimes(), os.getloadavg()[0]
  model_dir = os.path.join(scratch, f"{variant}_{repeat}")
  tfps.fit(build_model, train_fn, epochs=_EPOCHS.value, steps_per_epoch=THROUGHPUT_STEPS, cluster=cluster,
           num_shards=1, model_dir=model_dir, callbacks=[timer],
           delta_export_secs=_EVERY.value if variant == "with_deltas" else None)
  written = len(os.listdir(os.path.join(model_dir, "deltas"))) - 1 if variant == "with_deltas" else 0
  seconds = sum(timer.seconds[1:])
  return {"examples_per_sec": round(THROUGHPUT_STEPS * BATCH * (len(timer.seconds) - 1) / seconds, 1),
          "deltas_written": written, "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def training_cost(cluster, scratch: str) -> dict:
  """Examples/s with deltas every `--delta_every_secs` and without, `--throughput_repeats` alternating runs each."""
  _rows[0] = _ROWS.value
  runs = {"without": [], "with_deltas": []}
  for repeat in range(_REPEATS.value):
    for variant in (("without", "with_deltas") if repeat % 2 == 0 else ("with_deltas", "without")):
      runs[variant].append(examples_per_sec(cluster, scratch, variant, repeat))
      print(f"{variant} run {repeat + 1}: {runs[variant][-1]}")
  medians = {variant: float(np.median([run["examples_per_sec"] for run in done])) for variant, done in runs.items()}
  return {"rows": _ROWS.value, "epochs": _EPOCHS.value, "steps_per_epoch": THROUGHPUT_STEPS, "batch_size": BATCH,
          "delta_every_secs": _EVERY.value, "runs": runs, "median_examples_per_sec": medians,
          "ratio_of_medians": round(medians["with_deltas"] / medians["without"], 3),
          "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv):
  del argv
  cluster = tfps.testing.local_cluster(num_workers=1, num_ps=1)
  for name in ("write_base", "write_delta"):
    timed(deltas.DeltaWriter, name, WRITES[name])
  timed(callbacks_lib.EpochCheckpoint, "on_epoch_end", WRITES["checkpoint"])
  timed(deltas, "apply_delta", WRITES["apply_rows"])
  results = {}
  if _PARTS.value == "training":
    with open(_OUT.value, encoding="utf-8") as f:
      results = json.load(f)
  else:
    sizes = [_ROWS.value] + ([_BIG_ROWS.value] if _BIG_ROWS.value else [])
    with tempfile.TemporaryDirectory() as scratch:
      measured = [size_results(cluster, rows, scratch) for rows in sizes]
    results = dict(measured[0], sizes=measured)  # the first size's figures at the top, as before
  if _PARTS.value != "sizes":
    with tempfile.TemporaryDirectory() as scratch:
      results["training"] = training_cost(cluster, scratch)
    print(f"examples/s with deltas every {_EVERY.value} s / without (medians): "
          f"{results['training']['ratio_of_medians']}x")
  os.makedirs(os.path.dirname(_OUT.value), exist_ok=True)
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  print(f"results in {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
