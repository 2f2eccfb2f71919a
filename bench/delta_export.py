"""Bytes and time of delta exports against the full export when about 1% of a table's rows changed, the time to apply
each delta, and what marking the rows costs training.

  .venv/bin/python bench/delta_export.py                  # ~35 min; 10^6 rows, then the training cost
  .venv/bin/python bench/delta_export.py --big_rows=10000000 --parts=sizes   # the 10^7-row table too (~5 min more)
  .venv/bin/python bench/delta_export.py --parts=training  # the training cost only (~14 min a path), into the results
  .venv/bin/python bench/delta_export.py --parts=training --paths=estimator   # the Estimator path's only (~16 min)

Sizes (`--parts` all or sizes): for `--rows` (and `--big_rows`), trains on an in-process cluster (1 ps, 1 worker) a
model with one rows x `--dim` table and a small dense layer, with `tfps.fit(..., delta_export_secs=0)`: the base
export before the first step, a delta after each of 2 epochs. Every id a batch looks up is one of `--changed` x rows
fixed ids, so at most that share of the rows changes. Records the base's bytes (the full SavedModel), each delta's
bytes, rows and ratio, the seconds each write took on the chief (training waits for them: they run at an epoch's end)
beside each epoch's checkpoint, and the seconds to apply each delta as `tfps-delta watch` does (the served version
before it loaded, the delta applied, the new version saved), with the part that applies the rows apart.

Training cost (`--parts` all or training): for each of `--series` (`secs:epochs:steps[:tracking]`; default a delta
every 30 s in runs of 4 epochs of 3,000 steps, and every 3 s in runs of 3 epochs of 1,000 steps with the tracking
variant), `--throughput_repeats` runs of each variant, the order turned at each repeat: with deltas every `secs`
(written where due, within epochs too: the steps scheduled so far waited for, the delta written, training goes on),
tracking only (the rows marked on the ps each step, no delta written while measured) and without. Each run's
examples/s and examples per CPU-second of this process (the in-process cluster's every task) from the first epoch's end
to the end of training (each epoch's checkpoint and backup in every variant; examples/s also without the checkpoints'
seconds), the seconds of each delta's write, of each pause within an epoch (from the moment the delta is found due to
its end: the steps in flight finishing, the write) and of each epoch's checkpoint, and the load average before and
after; the medians and their ratios to the runs without.
For each of `--paths`: `fit` (`tfps.fit`, into `training`) and `estimator` (`tfps.Estimator` with the same model as
a model_fn, `RunConfig(delta_export_secs=secs, save_checkpoints_steps=steps)`, into `training_estimator`): there the
first `train` call (to the end of the first "epoch": the tracing, the base, a checkpoint) is not measured, the
second (to `epochs` x `steps`) is, from its loop's start to the delta at its end (not measured, as on `tfps.fit`);
a delta's pause is the seconds the loop waits at a step-log line or checkpoint while it is written (no step is in
flight there in any variant), a checkpoint's the seconds its save takes.
Writes to `--out` (default bench/results/delta_export.json); `--parts=training` replaces the training part of each
path measured there.
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
from tfps.keras import deltas as keras_deltas  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.training import deltas  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.training import loop  # pylint: disable=g-import-not-at-top,wrong-import-position

_ROWS = flags.DEFINE_integer("rows", 1_000_000, "Rows of the table.", lower_bound=1)
_BIG_ROWS = flags.DEFINE_integer("big_rows", 0, "Rows of a second, larger table measured the same way (0: none).",
                                 lower_bound=0)
_DIM = flags.DEFINE_integer("dim", 16, "Width of the table.", lower_bound=1)
_CHANGED = flags.DEFINE_float("changed", 0.01, "Share of the rows the batches look up (an upper bound of the rows "
                              "changed).", lower_bound=0.0, upper_bound=1.0)
_STEPS = flags.DEFINE_integer("steps", 20, "Steps per epoch (2 epochs, a delta after each) at --rows; at --big_rows "
                             "as many times more as it has more rows.", lower_bound=1)
_PARTS = flags.DEFINE_enum("parts", "all", ["all", "sizes", "training"], "What to measure.")
_REPEATS = flags.DEFINE_integer("throughput_repeats", 3, "Alternating runs of each variant whose examples/s are "
                                "compared, in each series.", lower_bound=1)
_SERIES = flags.DEFINE_list("series", ["30:4:3000", "3:3:1000:tracking"], "The training-cost series, each "
                            "`secs:epochs:steps[:tracking]`: a delta every `secs` seconds, runs of `epochs` epochs of "
                            "`steps` steps (the first epoch not measured), and with `tracking` a third variant that "
                            "marks the rows but writes no delta while measured.")
_ESTIMATOR_SERIES = flags.DEFINE_list("estimator_series", ["30:4:10000", "3:3:3000:tracking"], "The series on the "
                                      "Estimator path, as --series (longer runs: it trains about twice as fast, and "
                                      "a delta every 30 s must come while measured).")
_PATHS = flags.DEFINE_list("paths", ["fit", "estimator"], "The training paths whose training cost is measured: fit, "
                           "estimator or both.")
flags.register_validator("paths", lambda paths: bool(paths) and set(paths) <= {"fit", "estimator"},
                         "--paths takes fit, estimator or both (fit,estimator)")
_OUT = flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                               "delta_export.json"), "Where to write the results.")
IDS, BATCH = 8, 256
RESULTS_KEY = {"fit": "training", "estimator": "training_estimator"}  # where each path's training cost goes
NEVER = 1e9  # `delta_export_secs` of the tracking variant: the base, then a delta only at the end of training
_rows = [1_000_000]  # the table's rows in the run being measured


def build_model():
  ids = tf_keras.Input((IDS,), dtype="int64", name="ids")
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(_rows[0], _DIM.value, name="table")(ids))
  model = tf_keras.Model({"ids": ids}, tf_keras.layers.Dense(1, activation="sigmoid")(
      tf_keras.layers.Dense(32, activation="relu")(embedded)))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "binary_crossentropy")
  return model


def model_fn(features, labels, mode):
  """`build_model`'s model on the Estimator path."""
  embedded = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(_rows[0], _DIM.value, name="table")(features["ids"]))
  logits = tf_keras.layers.Dense(1)(tf_keras.layers.Dense(32, activation="relu")(embedded))[:, 0]
  if mode == tfps.ModeKeys.PREDICT:
    return tfps.EstimatorSpec(mode, predictions={"probability": tf.sigmoid(logits)})
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
  return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.Adagrad(0.1))


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


class RunWindow(tf_keras.callbacks.Callback):
  """Wall and CPU seconds (of this process: the in-process cluster's every task) from the first epoch's end to the end
  of training, before the delta written at the end: tfps's own work at epoch ends (checkpoint, backup, a delta) and
  within epochs (a delta's pause) falls inside. User callbacks run after tfps's but before the delta export's."""

  def __init__(self):
    super().__init__()
    self.start, self.wall, self.cpu, self.writes = None, 0.0, 0.0, {}

  def on_epoch_end(self, epoch, logs=None):
    if epoch == 0:
      self.start = (time.perf_counter(), _cpu(), {name: len(seconds) for name, seconds in WRITES.items()})

  def on_train_end(self, logs=None):
    self.wall, self.cpu = time.perf_counter() - self.start[0], _cpu() - self.start[1]
    self.writes = {name: [round(secs, 3) for secs in seconds[self.start[2][name]:]] for name, seconds in WRITES.items()}


def _cpu() -> float:
  times = os.times()
  return times.user + times.system


WRITES = {"write_base": [], "write_delta": [], "checkpoint": [], "apply_rows": [], "pause": []}
MARKS = []  # (wall, CPU seconds, writes so far) at each start of an Estimator training loop and of its last delta


def mark(owner, name: str) -> None:
  """Replaces `owner.name` by a wrapper appending to `MARKS` the moment of each call's start."""
  original = getattr(owner, name)

  def wrapper(*args, **kwargs):
    MARKS.append((time.perf_counter(), _cpu(), {key: len(seconds) for key, seconds in WRITES.items()}))
    return original(*args, **kwargs)

  setattr(owner, name, wrapper)


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
           delta_export_secs=0, num_shards=1, steps_per_execution=steps)  # one execution an epoch: a delta after it
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


def fit_window(cluster, model_dir: str, series: dict, secs):
  """A `tfps.fit` run of `series`: wall and CPU seconds from the first epoch's end to the end of training, and the
  seconds of each write in that window."""
  window = RunWindow()
  tfps.fit(build_model, train_fn, epochs=series["epochs"], steps_per_epoch=series["steps"], cluster=cluster,
           num_shards=1, model_dir=model_dir, callbacks=[window], delta_export_secs=secs)
  return window.wall, window.cpu, window.writes


def estimator_window(cluster, model_dir: str, series: dict, secs):
  """A `tfps.Estimator` run of `series`: the first `steps` not measured, then wall and CPU seconds from the second
  `train` call's loop start to its last delta's (at the end of training), and the seconds of each write between."""
  config = tfps.RunConfig(save_checkpoints_steps=series["steps"], delta_export_secs=secs)
  estimator = tfps.Estimator(model_fn, model_dir=model_dir, config=config, cluster=cluster)
  estimator.train(train_fn, max_steps=series["steps"])
  first = len(MARKS)
  estimator.train(train_fn, max_steps=series["steps"] * series["epochs"])
  (start, start_cpu, since), (end, end_cpu, until) = MARKS[first:first + 2]
  return end - start, end_cpu - start_cpu, {name: [round(secs, 3) for secs in WRITES[name][since[name]:until[name]]]
                                            for name in WRITES}


def examples_per_sec(cluster, scratch: str, series: dict, variant: str, repeat: int) -> dict:
  """One run of `variant` ("with_deltas", "tracking" or "without") in `series` on its path: examples/s and examples
  per CPU-second over epochs 2 on, and the seconds of each delta's write, pause and checkpoint in that window."""
  load_before = os.getloadavg()[0]
  model_dir = os.path.join(scratch, f"{series['path']}_{series['delta_every_secs']:g}_{variant}_{repeat}")
  secs = {"with_deltas": series["delta_every_secs"], "tracking": NEVER, "without": None}[variant]
  run = {"fit": fit_window, "estimator": estimator_window}[series["path"]]
  wall, cpu, since = run(cluster, model_dir, series, secs)
  examples = series["steps"] * BATCH * (series["epochs"] - 1)
  checkpoints = sum(since["checkpoint"])  # the same work in every variant, and the most uneven under load
  return {"examples_per_sec": round(examples / wall, 1), "examples_per_cpu_sec": round(examples / cpu, 1),
          "examples_per_sec_besides_checkpoints": round(examples / (wall - checkpoints), 1),
          "wall_secs": round(wall, 1), "deltas_written": len(since["write_delta"]),
          "delta_write_secs": since["write_delta"], "delta_pause_secs": since["pause"],
          "checkpoint_secs": since["checkpoint"],
          "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def parse_series(text: str, path: str) -> dict:
  secs, epochs, steps, *tracking = text.split(":")
  return {"path": path, "delta_every_secs": float(secs), "epochs": int(epochs), "steps": int(steps),
          "variants": ["without", "with_deltas"] + (["tracking"] if tracking == ["tracking"] else [])}


def training_cost(cluster, scratch: str, series: dict) -> dict:
  """`--throughput_repeats` runs of each variant of `series`, the order turned at each repeat so that each variant
  runs first, and beside the others, as often; the medians and their ratios to the runs without."""
  _rows[0] = _ROWS.value
  variants = series["variants"]
  runs = {variant: [] for variant in variants}
  for repeat in range(_REPEATS.value):
    for variant in variants[repeat % len(variants):] + variants[:repeat % len(variants)]:
      runs[variant].append(examples_per_sec(cluster, scratch, series, variant, repeat))
      print(f"{series['path']}, {series['delta_every_secs']:g} s, {variant} run {repeat + 1}: {runs[variant][-1]}", flush=True)
  medians = {key: {variant: float(np.median([run[key] for run in done])) for variant, done in runs.items()}
             for key in ("examples_per_sec", "examples_per_cpu_sec", "examples_per_sec_besides_checkpoints")}
  ratios = {key: {variant: round(value / medians[key]["without"], 3) for variant, value in by_variant.items()
                  if variant != "without"} for key, by_variant in medians.items()}
  return dict(series, rows=_ROWS.value, batch_size=BATCH, runs=runs, medians=medians, ratios_to_without=ratios,
              measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def time_pauses() -> None:
  """Adds to `WRITES["pause"]` each delta's pause within an epoch: from the moment `drive_fit` finds it due (it then
  waits for the steps scheduled so far and settles the counter) until the delta is written; on the Estimator path
  the seconds its loop spends writing a delta at a step-log line or checkpoint (where it waits for its steps anyway).
  """
  estimator_due = loop.TrainLoop._wrote_delta_due  # pylint: disable=protected-access

  def timed_estimator_due(self):
    start = time.perf_counter()
    wrote = estimator_due(self)
    if wrote:
      WRITES["pause"].append(time.perf_counter() - start)
    return wrote

  loop.TrainLoop._wrote_delta_due = timed_estimator_due  # pylint: disable=protected-access
  found = []
  due, run = keras_deltas.DeltaExport.due, keras_deltas.DeltaExport.run

  def timed_due(self):
    result = due(self)
    if result:
      found.append(time.perf_counter())
    return result

  def timed_run(self):
    run(self)
    WRITES["pause"].append(time.perf_counter() - found.pop())

  keras_deltas.DeltaExport.due, keras_deltas.DeltaExport.run = timed_due, timed_run


def main(argv):
  del argv
  cluster = tfps.testing.local_cluster(num_workers=1, num_ps=1)
  for name in ("write_base", "write_delta"):
    timed(deltas.DeltaWriter, name, WRITES[name])
  timed(callbacks_lib.EpochCheckpoint, "on_epoch_end", WRITES["checkpoint"])
  timed(deltas, "apply_delta", WRITES["apply_rows"])
  timed(loop.TrainLoop, "_save", WRITES["checkpoint"])  # the Estimator path's checkpoints (tfps.fit's are the above)
  for name in ("run", "_finish_deltas"):
    mark(loop.TrainLoop, name)
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
    time_pauses()
    for path in _PATHS.value:
      with tempfile.TemporaryDirectory() as scratch:
        results[RESULTS_KEY[path]] = [training_cost(cluster, scratch, parse_series(text, path))
                                      for text in {"fit": _SERIES, "estimator": _ESTIMATOR_SERIES}[path].value]
    for series in (one for path in _PATHS.value for one in results[RESULTS_KEY[path]]):
      print(f"{series['path']}: a delta every {series['delta_every_secs']:g} s, against without (medians): examples/s "
            f"{series['ratios_to_without']['examples_per_sec']}, examples per CPU-second "
            f"{series['ratios_to_without']['examples_per_cpu_sec']}")
  os.makedirs(os.path.dirname(_OUT.value), exist_ok=True)
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  print(f"results in {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
