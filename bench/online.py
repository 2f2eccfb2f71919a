"""Stream input against file input, side by side: the Estimator path's Wide&Deep on the same Criteo-schema rows read
from files on the workers (`tfps.data.delimited`) or from a Kafka topic by the chief (`tfps.estimator.online`:
parsed on the chief, each scheduled function given its batches).

  .venv/bin/python -m tfps.cli.launch --num_ps=1 --num_workers=1 bench/online.py -- \
      --out=bench/results/online/stream_vs_files.json

The chief holds librdkafka's mock cluster (one broker, in its own process: loopback inside the launcher's network
namespace) and alternates the two variants `--repeats` times, each in a fresh model_dir: `--warmup_steps` steps
(tracing), then `--steps` timed steps. Before each stream run it writes that run's rows (the same rows the files
hold, in file order) to a topic of its own (4 partitions; the mock broker keeps ~17,000 rows per partition, so a run
is at most ~60,000 rows). Per run: `wall`, the timed steps' examples over their wall time (with the run's start and
its final checkpoint), and `windows`, the median of the step log's examples/s over windows of `--log_steps` steps
(no checkpoint in them). Medians over the runs, and stream / files for each.

`--mode=quality`: a stream replay of the bundled MovieLens 100K against file training, on the same cluster:
u1.base rows in one shuffled order (`--quality_epochs` passes, each shuffled anew, `--max_rows` per pass), trained
once from a file on the workers and once from a folder stream of the same lines by the chief, same model (Wide&Deep
on user and movie ids), seed, batches and steps; then both evaluated on all of u1.test. The target: the stream's AUC
within 0.005 of the files'.

  .venv/bin/python -m tfps.cli.launch --num_ps=1 --num_workers=1 bench/online.py -- --mode=quality \
      --out=bench/results/online/stream_quality.json
"""

import json
import os
import statistics
import sys
import tempfile
import time

from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position

tfps.define_flags()
_OUT = flags.DEFINE_string("out", None, "Where to write the results (JSON).")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 200, "Timed steps per run.", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup_steps", 40, "Steps before the timed ones.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Runs of each variant, alternating.", lower_bound=1)
_SPE = flags.DEFINE_integer("steps_per_execution", 20, "Steps per scheduled function.", lower_bound=1)
_LOG_STEPS = flags.DEFINE_integer("log_steps", 20, "Steps per step-log window.", lower_bound=1)
_MODE = flags.DEFINE_enum("mode", "speed", ["speed", "quality"], "speed: examples/s of stream and file input; "
                          "quality: the AUC of a stream replay of MovieLens against file training.")
_DATA_DIR = flags.DEFINE_string("data_dir", os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "shared", "data", "ml-100k"), "--mode=quality: the MovieLens 100K folder.")
_EPOCHS = flags.DEFINE_integer("quality_epochs", 1, "--mode=quality: passes over u1.base.", lower_bound=1)
_MAX_ROWS = flags.DEFINE_integer("max_rows", 0, "--mode=quality: u1.base rows per pass (0: all 80,000).",
                                 lower_bound=0)
_SEED = flags.DEFINE_integer("seed", 0, "--mode=quality: the row order's and the variables' seed.")


def _rows(data_dir: str, needed: int):
  from tfps.data import synthetic  # pylint: disable=g-import-not-at-top
  spec = synthetic.SyntheticSpec(rows=needed, num_files=2, vocab_size=10_000)
  files = synthetic.ensure_generated(data_dir, spec).files
  lines = []
  for path in files:
    with open(path, "rb") as f:
      lines.extend(f.read().splitlines()[1:])  # without the header
  return files, lines


def _timed(train, model_dir: str, warmup: int, steps: int) -> dict:
  """`train(max_steps)` to `warmup`, then to `warmup + steps`: the examples/s of the latter, over its wall time and
  (median) over its step-log windows."""
  from tfps import run_records  # pylint: disable=g-import-not-at-top
  train(warmup)
  start = time.monotonic()
  train(warmup + steps)
  wall = steps * _BATCH.value / (time.monotonic() - start)
  records = run_records.read_jsonl(os.path.join(run_records.run_dir(model_dir), run_records.PROGRESS_FILE))
  windows = [r["examples_per_sec"] for r in records if r["step"] > warmup + _LOG_STEPS.value]  # the first waits
  return {"wall": wall, "windows": statistics.median(windows)}


def _parse_rate(make_source, spec, batches_lib, steps: int) -> float:
  """Records/s the chief reads and parses alone (no training): `steps` batches of a topic written before."""
  stream = batches_lib.StreamBatches(make_source(), spec, batch_size=_BATCH.value)
  stream.next_batch(30)  # the first read connects and traces the parse
  start = time.monotonic()
  for _ in range(steps - 1):
    stream.next_batch(30)
  return (steps - 1) * _BATCH.value / (time.monotonic() - start)


def _produce(bootstrap: str, topic: str, lines) -> None:
  from confluent_kafka import Producer  # pylint: disable=g-import-not-at-top
  producer = Producer({"bootstrap.servers": bootstrap, "log_level": 2, "linger.ms": 50})
  for index, line in enumerate(lines):
    producer.produce(topic, value=line, partition=index % 4)
    if index % 10_000 == 0:
      producer.poll(0)
  producer.flush(120)


def run_chief(cluster):
  from confluent_kafka import Producer  # pylint: disable=g-import-not-at-top
  from tfps.data import criteo, delimited  # pylint: disable=g-import-not-at-top
  from tfps.data.stream import batches, kafka  # pylint: disable=g-import-not-at-top
  from tfps.estimator import online  # pylint: disable=g-import-not-at-top
  from tfps.models import model_fns  # pylint: disable=g-import-not-at-top

  per_run = (_WARMUP.value + _STEPS.value) * _BATCH.value
  work = tempfile.mkdtemp(prefix="tfps_online_bench_")
  files, lines = _rows(os.path.join(work, "data"), per_run)
  spec = criteo.criteo_spec(criteo.guess_format(files), 10_000)
  holder = Producer({"test.mock.num.brokers": 1, "log_level": 2})
  bootstrap = ",".join(f"{b.host}:{b.port}" for b in holder.list_topics(timeout=10).brokers.values())
  categorical, dense = criteo.feature_spec(10_000)
  model_fn = model_fns.build_model_fn("wide_deep", categorical, dense, stack_tables=True)
  config = tfps.RunConfig(steps_per_execution=_SPE.value, save_checkpoints_steps=10_000,
                          log_step_count_steps=_LOG_STEPS.value)
  train_fn = delimited.delimited_dataset_fn(files, spec, batch_size=_BATCH.value, shuffle_buffer=0, scan=False)
  results = {"files": [], "stream": []}
  for repeat in range(_REPEATS.value):
    for variant in ("files", "stream") if repeat % 2 == 0 else ("stream", "files"):
      model_dir = os.path.join(work, f"{variant}-{repeat}")
      estimator = tfps.Estimator(model_fn, model_dir=model_dir, config=config, cluster=cluster)
      if variant == "files":
        train = lambda steps: estimator.train(train_fn, max_steps=steps)  # pylint: disable=cell-var-from-loop
      else:
        topic = f"criteo-{repeat}"
        _produce(bootstrap, topic, lines[:per_run])

        def make(positions, topic=topic):
          source = kafka.KafkaSource(bootstrap, topic, group_id="bench", start="earliest", positions=positions)
          return batches.StreamBatches(source, spec, batch_size=_BATCH.value)

        train = lambda steps: online.train_on_stream(  # pylint: disable=cell-var-from-loop
            estimator, make, max_steps=steps)
      rates = _timed(train, model_dir, _WARMUP.value, _STEPS.value)
      results[variant].append(rates)
      print(f"{variant} run {repeat}: {rates['wall']:,.0f} examples/s over the wall time, {rates['windows']:,.0f} "
            "in the step-log windows", flush=True)
  summary_parse = _parse_rate(make_source=lambda: kafka.KafkaSource(bootstrap, "criteo-0", group_id="parse",
                                                                      start="earliest"),
                              spec=spec, batches_lib=batches, steps=_WARMUP.value + _STEPS.value - 1)
  median = {variant: {kind: statistics.median(run[kind] for run in runs) for kind in ("wall", "windows")}
            for variant, runs in results.items()}
  summary = {"batch_size": _BATCH.value, "steps": _STEPS.value, "warmup_steps": _WARMUP.value,
             "steps_per_execution": _SPE.value, "log_steps": _LOG_STEPS.value,
             "cluster": f"{cluster.num_ps} ps + {cluster.num_workers} worker", "examples_per_sec": results,
             "median": median,
             "chief_reads_and_parses_records_per_sec": summary_parse,
             "stream_over_files": {kind: median["stream"][kind] / median["files"][kind]
                                   for kind in ("wall", "windows")}}
  print(json.dumps(summary, indent=1), flush=True)
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=1)


def _replay_lines(work: str):
  """The training lines of the quality mode (u1.base, shuffled per pass) in `work/replay.tsv`; returns its path and
  the number of lines."""
  import random  # pylint: disable=g-import-not-at-top
  with open(os.path.join(_DATA_DIR.value, "u1.base"), "rb") as f:
    base = f.read().splitlines()
  rng, lines = random.Random(_SEED.value), []
  for _ in range(_EPOCHS.value):
    rng.shuffle(base)
    lines += base[:_MAX_ROWS.value or len(base)]
  path = os.path.join(work, "replay.tsv")
  with open(path, "wb") as f:
    f.write(b"".join(line + b"\n" for line in lines))
  return path, len(lines)


def run_quality(cluster):
  """Stream replay against file training on MovieLens 100K: the test AUC of each and their difference."""
  from tfps.data import delimited, movielens  # pylint: disable=g-import-not-at-top
  from tfps.data.stream import batches, folder  # pylint: disable=g-import-not-at-top
  from tfps.estimator import online  # pylint: disable=g-import-not-at-top
  from tfps.models import model_fns  # pylint: disable=g-import-not-at-top

  work = tempfile.mkdtemp(prefix="tfps_online_quality_")
  path, rows = _replay_lines(work)
  steps = rows // _BATCH.value
  spec = movielens.ratings_spec()
  categorical, dense = spec.model_features()
  model_fn = model_fns.build_model_fn("wide_deep", categorical, dense, learning_rate=0.2)
  config = tfps.RunConfig(steps_per_execution=_SPE.value, save_checkpoints_steps=100_000,
                          log_step_count_steps=_LOG_STEPS.value, tf_random_seed=_SEED.value)
  test_fn = delimited.delimited_dataset_fn(os.path.join(_DATA_DIR.value, "u1.test"), spec, batch_size=1024,
                                           repeat=False, scan=False, shuffle_buffer=0, drop_remainder=False)
  stream_dir = os.path.join(work, "slices")
  os.makedirs(stream_dir)
  os.link(path, os.path.join(stream_dir, "slice-0.tsv"))  # complete at once: --stream_complete=rename

  def make(positions):
    return batches.StreamBatches(folder.FolderSource(stream_dir, complete="rename", positions=positions), spec,
                                 batch_size=_BATCH.value)

  results = {}
  for variant in ("files", "stream"):
    estimator = tfps.Estimator(model_fn, model_dir=os.path.join(work, variant), config=config, cluster=cluster)
    start = time.monotonic()
    if variant == "files":
      estimator.train(delimited.delimited_dataset_fn(path, spec, batch_size=_BATCH.value, shuffle_buffer=0,
                                                     scan=False), max_steps=steps)
    else:
      online.train_on_stream(estimator, make, max_steps=steps)
    results[variant] = {"auc": float(estimator.evaluate(test_fn)["auc"]), "train_secs": time.monotonic() - start}
    print(f"{variant}: test AUC {results[variant]['auc']:.4f}", flush=True)
  difference = results["stream"]["auc"] - results["files"]["auc"]
  return {"mode": "quality", "data": "MovieLens 100K: u1.base (shuffled, seed %d) -> u1.test" % _SEED.value,
          "model": "wide_deep (user_id, movie_id), adagrad 0.2", "passes": _EPOCHS.value, "rows": rows,
          "batch_size": _BATCH.value, "steps": steps, "cluster": f"{cluster.num_ps} ps + {cluster.num_workers} worker",
          "files": results["files"], "stream": results["stream"], "stream_minus_files_auc": difference,
          "target": "within 0.005", "met": abs(difference) <= 0.005}


def main(argv):
  del argv
  if _MODE.value == "speed":
    tfps.run_task(run_chief, cluster=tfps.config_from_flags())
    return
  summary = tfps.run_task(run_quality, cluster=tfps.config_from_flags())
  if summary is not None:
    print(json.dumps(summary, indent=1), flush=True)
    if _OUT.value:
      with open(_OUT.value, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
  tfps.run_main(main)
