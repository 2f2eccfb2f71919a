"""Freshness of delta exports end to end: from a click being written to the stream to the served version that first
ships it, against the target (at most twice the delta interval plus the export time).

  .venv/bin/python bench/delta_freshness.py                        # ~2 min: a delta every 5 s, 60 s of slices
  .venv/bin/python bench/delta_freshness.py --delta_every_secs=10 --secs=120

Trains Wide&Deep on the Estimator path (an in-process cluster of 1 ps and 1 worker) on a folder stream, with
`delta_export_secs=--delta_every_secs`, while a `tfps-delta watch --interval=--watch_interval` process keeps a served
folder current. A producer thread writes a slice of `--slice_rows` clicks (then its `.done` marker: the slice's
complete time is its clicks' write time) every `--slice_every_secs`: first until the watch serves a delta (the first
steps trace the step function: warm-up, not measured), then for `--secs`, the slices measured. The run stops once the
watch serves the last slice. Each served version's freshness comes from the watch's records
(`serving/freshness.jsonl`): the swap time minus the oldest write time of the clicks its deltas first ship. Its export
time is the last of its deltas' write on the chief plus the time from that delta on disk to the swap (the watch's look
and the apply); the target for it: 2 x the delta interval + that export time. Writes `--out` (default
bench/results/delta_freshness.json) with every version, the medians and the load average before and after.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `tfps`

import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.data import spec as spec_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.data.stream import batches  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.data.stream import folder as folder_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.estimator import online  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.models import model_fns  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.training import delta_files  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.training import delta_freshness  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.training import deltas  # pylint: disable=g-import-not-at-top,wrong-import-position

_EVERY = flags.DEFINE_float("delta_every_secs", 5.0, "Seconds between delta exports.", lower_bound=0.1)
_SECS = flags.DEFINE_float("secs", 60.0, "Seconds of slices measured.", lower_bound=1.0)
_SLICE_EVERY = flags.DEFINE_float("slice_every_secs", 1.0, "Seconds between slices.", lower_bound=0.05)
_SLICE_ROWS = flags.DEFINE_integer("slice_rows", 2048, "Clicks per slice (a multiple of the batch, 256).",
                                   lower_bound=256)
_WATCH_INTERVAL = flags.DEFINE_float("watch_interval", 0.5, "tfps-delta watch --interval.", lower_bound=0.05)
_OUT = flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                               "delta_freshness.json"), "Where to write the results.")
USERS, ITEMS, BATCH = 10_000, 2_000, 256
SPEC = spec_lib.spec_from_dict({"name": "clicks", "columns": ["user", "item", "label", "hour"], "label": "label",
                                "numeric": {"hour": {"transform": "standardize", "mean": 12, "std": 7}},
                                "categorical": {"user": {"buckets": USERS, "encoding": "integer"},
                                                "item": {"buckets": ITEMS, "encoding": "integer"}}})


def write_slice(folder: str, index: int, rng) -> None:
  """Slice `index` of `--slice_rows` clicks (a click's chance planted per item), then its marker."""
  items = rng.integers(0, ITEMS, _SLICE_ROWS.value)
  labels = (rng.random(len(items)) < (items % 10) / 10).astype(int)
  lines = [f"{rng.integers(0, USERS)},{item},{label},{rng.integers(0, 24)}\n" for item, label in zip(items, labels)]
  name = os.path.join(folder, f"slice-{index:06d}.csv")
  with open(name, "w", encoding="utf-8") as f:
    f.write("".join(lines))
  open(name + folder_lib.DONE_SUFFIX, "w", encoding="utf-8").close()


def served_step(serving: str) -> int:
  versions = delta_files.served_versions(serving)
  return delta_files.read_manifest(versions[max(versions)])["step"] if versions else -1


def produce(folder: str, serving: str, state: dict) -> None:
  """Warm-up slices until the watch serves a delta, then `--secs` of measured slices; `state` gets the measured
  start and the last slice's name."""
  rng, index = np.random.default_rng(0), 0
  while served_step(serving) <= 0:
    write_slice(folder, index, rng)
    index += 1
    time.sleep(_SLICE_EVERY.value)
  state["measured_from"] = time.time()
  while time.time() - state["measured_from"] < _SECS.value:
    write_slice(folder, index, rng)
    state["last_slice"] = f"slice-{index:06d}.csv"
    index += 1
    time.sleep(_SLICE_EVERY.value)
  state["slices"] = index


def delta_write_times(seconds: dict) -> None:
  """Records each delta's write on the chief (`seconds[version]`)."""
  original = deltas.DeltaWriter.write_delta

  def write_delta(self, *args, **kwargs):
    start = time.perf_counter()
    path = original(self, *args, **kwargs)
    seconds[deltas.read_manifest(path)["version"]] = time.perf_counter() - start
    return path

  deltas.DeltaWriter.write_delta = write_delta


def train_and_serve(cluster, scratch: str) -> tuple:
  """The stream run beside its watch; `(freshness records, producer state, the watch's output)`."""
  stream, serving, deltas_dir = (os.path.join(scratch, name) for name in ("stream", "serving", "run/deltas"))
  os.makedirs(stream)
  os.makedirs(deltas_dir)
  config = tfps.RunConfig(delta_export_secs=_EVERY.value, save_checkpoints_steps=100_000, log_step_count_steps=10)
  categorical, dense = SPEC.model_features()
  estimator = tfps.Estimator(model_fns.build_model_fn("wide_deep", categorical, dense, deep_layers=[32],
                                                      learning_rate=0.1),
                             model_dir=os.path.join(scratch, "run"), cluster=cluster, config=config)
  state, stop = {}, threading.Event()
  watch = subprocess.Popen([sys.executable, "-m", "tfps.cli.delta", "watch", deltas_dir, f"--serving={serving}",
                            f"--interval={_WATCH_INTERVAL.value}", "--keep=2"], stdout=subprocess.PIPE, text=True)
  producer = threading.Thread(target=produce, args=(stream, serving, state), daemon=True)

  def stop_once_served():  # the last slice served: stop training
    while not stop.is_set():
      last = state.get("last_slice") if "slices" in state else None
      versions = delta_files.served_versions(serving)
      manifest = delta_files.read_manifest(versions[max(versions)]) if versions else {}
      if last and manifest.get("stream", {}).get("to") == {folder_lib.KEY: [last, _SLICE_ROWS.value]}:
        stop.set()
      time.sleep(0.2)

  def make(positions):
    source = folder_lib.FolderSource(stream, pattern="slice-*.csv", positions=positions, poll_secs=0.05)
    return batches.StreamBatches(source, SPEC, batch_size=BATCH)

  producer.start()
  threading.Thread(target=stop_once_served, daemon=True).start()
  try:
    online.train_on_stream(estimator, make, stop=stop)
  finally:
    stop.set()
    watch.terminate()
    out = watch.communicate(timeout=60)[0]
  return delta_freshness.read(serving), state, out


def judged(record: dict, writes: dict, every: float) -> dict:
  """A version's record with its export time and the target for it."""
  export = writes[record["deltas"][-1]] + record["swapped_at"] - record["exported_at"]
  bound = 2 * every + export
  return dict(record, export_secs=round(export, 3), target_secs=round(bound, 3),
              within_target=record["freshness_secs"] <= bound)


def write(results: dict) -> None:
  """Writes `results` to `--out`."""
  os.makedirs(os.path.dirname(_OUT.value), exist_ok=True)
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  print(f"results in {_OUT.value}")


def main(argv):
  del argv
  cluster = tfps.testing.local_cluster(num_workers=1, num_ps=1)
  writes = {}
  delta_write_times(writes)
  load_before = os.getloadavg()
  with tempfile.TemporaryDirectory() as scratch:
    records, state, out = train_and_serve(cluster, scratch)
  measured = [judged(r, writes, _EVERY.value) for r in records
              if "freshness_secs" in r and r["written"]["oldest"] >= state["measured_from"]]
  freshness = [r["freshness_secs"] for r in measured]
  results = {
      "delta_every_secs": _EVERY.value, "watch_interval_secs": _WATCH_INTERVAL.value, "secs": _SECS.value,
      "slice_every_secs": _SLICE_EVERY.value, "slice_rows": _SLICE_ROWS.value, "batch_size": BATCH,
      "model": "wide_deep", "slices": state["slices"], "versions": measured,
      "warm_up_versions": [r for r in records if "freshness_secs" not in r
                           or r["written"]["oldest"] < state["measured_from"]],
      "median_freshness_secs": round(statistics.median(freshness), 3), "max_freshness_secs": max(freshness),
      "median_export_secs": round(statistics.median(r["export_secs"] for r in measured), 3),
      "within_target": sum(r["within_target"] for r in measured),
      "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
      "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "watch_summary": out.splitlines()[-1]}
  print(f"{len(measured)} versions: freshness median {results['median_freshness_secs']} s, worst "
        f"{results['max_freshness_secs']} s; {results['within_target']} of {len(measured)} within 2 x "
        f"{_EVERY.value} s + the export time (median {results['median_export_secs']} s); load "
        f"{results['load_average']}")
  write(results)


if __name__ == "__main__":
  app.run(main)
