"""Stream input against file input, side by side: the Estimator path's Wide&Deep on the same Criteo-schema rows read
from files on the workers (`tfps.data.delimited`) or from a Kafka topic by the chief (`tfps.estimator.online`:
parsed on the chief, each scheduled function given its batches).

  .venv/bin/python -m tfps.cli.launch --num_ps=1 --num_workers=1 bench/online.py -- \
      --out=bench/results/online/stream_vs_files.json

The chief holds librdkafka's mock cluster (one broker, in its own process: loopback inside the launcher's network
namespace), writes the rows once to a topic (the same rows the files hold, in file order; 4 partitions; the mock
broker keeps ~17,000 rows per partition, so a run is at most ~60,000 rows) and alternates the two variants
`--repeats` times, each in a fresh model_dir: `--warmup_steps` steps (tracing), then `--steps` timed steps; each
stream run reads the topic from its start. Per run: `wall`, the timed steps' examples over their wall time (with the
run's start and its final checkpoint), `windows`, the median of the step log's examples/s over windows of
`--log_steps` steps (no checkpoint in them), the CPU milliseconds per 1,000 examples of the chief (with the broker),
the ps and the workers over the timed steps, and the load average after it. Medians over the runs, and stream /
files for each; then the chief's reading and parsing alone (records/s over the wall time and over its CPU time).

`--mode=quality`: a stream replay of the bundled MovieLens 100K against file training, on the same cluster:
u1.base rows in one shuffled order (`--quality_epochs` passes, each shuffled anew, `--max_rows` per pass), trained
once from a file on the workers and once from a folder stream of the same lines by the chief, same model (Wide&Deep
on user and movie ids), seed, batches and steps; then both evaluated on all of u1.test. Once per seed of `--seeds`,
the variants' order alternating. The target: the median of the stream's AUCs within 0.005 of the files'. The mode
flags apply (`--sync_mode=sync`: a step trains a batch per worker, so a pass has 1 / workers as many steps); with
`tf_random_seed` each seed's runs repeat at 1 worker and in sync mode (docs/repeatability.md).

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
tfps.define_mode_flags()
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
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "--mode=quality: a run of each variant per seed (the row order's "
                           "and the variables' seed), the variants' order alternating from seed to seed.")


def _rows(data_dir: str, needed: int):
  from tfps.data import synthetic  # pylint: disable=g-import-not-at-top
  spec = synthetic.SyntheticSpec(rows=needed, num_files=2, vocab_size=10_000)
  files = synthetic.ensure_generated(data_dir, spec).files
  lines = []
  for path in files:
    with open(path, "rb") as f:
      lines.extend(f.read().splitlines()[1:])  # without the header
  return files, lines


def _task_processes(cluster) -> dict:
  """`{task: psutil.Process}` of the run's tasks (the chief's siblings under the launcher, by their TF_CONFIG)."""
  import psutil  # pylint: disable=g-import-not-at-top
  from bench import runner  # pylint: disable=g-import-not-at-top
  process = psutil.Process()
  for _ in range(4):
    process = process.parent()
    if process is None:
      break
    tasks = {runner.task_name(p): p for p in process.children(recursive=True)}
    tasks.pop(None, None)
    if len(tasks) >= 1 + cluster.num_ps + cluster.num_workers:
      return tasks
  return {"chief:0": psutil.Process()}


def _cpu_secs(tasks: dict) -> dict:
  """CPU seconds (user + system) of each kind of task so far: `{chief, ps, worker}` (ps and workers summed)."""
  kinds = {}
  for name, process in tasks.items():
    times = process.cpu_times()
    kind = name.split(":")[0]
    kinds[kind] = kinds.get(kind, 0.0) + times.user + times.system
  return kinds


def _timed(train, model_dir: str, warmup: int, steps: int, tasks: dict) -> dict:
  """`train(max_steps)` to `warmup`, then to `warmup + steps`: the examples/s of the latter, over its wall time and
  (median) over its step-log windows, and the CPU milliseconds per 1,000 examples of each kind of task (the chief's
  with the broker it holds) over the wall time."""
  from tfps import run_records  # pylint: disable=g-import-not-at-top
  train(warmup)
  start, cpu = time.monotonic(), _cpu_secs(tasks)
  train(warmup + steps)
  wall = steps * _BATCH.value / (time.monotonic() - start)
  thousands = steps * _BATCH.value / 1000
  cpu = {kind: (secs - cpu[kind]) * 1000 / thousands for kind, secs in _cpu_secs(tasks).items()}
  records = run_records.read_jsonl(os.path.join(run_records.run_dir(model_dir), run_records.PROGRESS_FILE))
  windows = [r["examples_per_sec"] for r in records if r["step"] > warmup + _LOG_STEPS.value]  # the first waits
  return {"wall": wall, "windows": statistics.median(windows),
          "cpu_ms_per_1000_examples": {**cpu, "all": sum(cpu.values())}}


def _parse_rate(make_source, spec, batches_lib, steps: int) -> dict:
  """Records/s the chief reads and parses alone (no training), as the training loop does (`steps_per_execution`
  batches parsed at once): about `steps` batches of a topic written before; over the wall time and over the chief's
  CPU time (with the broker it holds)."""
  stream = batches_lib.StreamBatches(make_source(), spec, batch_size=_BATCH.value)
  chunk = lambda: stream.stacked([stream.next_batch(30) for _ in range(_SPE.value)], _SPE.value)
  chunk()  # the first read connects and traces the parse
  start, cpu, chunks = time.monotonic(), time.process_time(), (steps - _SPE.value) // _SPE.value
  for _ in range(chunks):
    chunk()
  records = chunks * _SPE.value * _BATCH.value
  stream.source.close()
  return {"wall": records / (time.monotonic() - start), "cpu": records / (time.process_time() - cpu)}


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
  _produce(bootstrap, "criteo", lines[:per_run])  # once: every stream run reads the same rows from the start

  def make(positions):
    source = kafka.KafkaSource(bootstrap, "criteo", group_id="bench", start="earliest", positions=positions)
    return batches.StreamBatches(source, spec, batch_size=_BATCH.value)

  results, tasks = {"files": [], "stream": []}, _task_processes(cluster)
  print(f"measuring the CPU of {sorted(tasks)}", flush=True)
  for repeat in range(_REPEATS.value):
    for variant in ("files", "stream") if repeat % 2 == 0 else ("stream", "files"):
      model_dir = os.path.join(work, f"{variant}-{repeat}")
      estimator = tfps.Estimator(model_fn, model_dir=model_dir, config=config, cluster=cluster)
      if variant == "files":
        train = lambda steps: estimator.train(train_fn, max_steps=steps)  # pylint: disable=cell-var-from-loop
      else:
        train = lambda steps: online.train_on_stream(  # pylint: disable=cell-var-from-loop
            estimator, make, max_steps=steps)
      rates = {**_timed(train, model_dir, _WARMUP.value, _STEPS.value, tasks), "load_average": os.getloadavg()[0]}
      results[variant].append(rates)
      print(f"{variant} run {repeat}: {rates['wall']:,.0f} examples/s over the wall time, {rates['windows']:,.0f} "
            f"in the step-log windows, CPU ms per 1,000 examples {rates['cpu_ms_per_1000_examples']}, load "
            f"{rates['load_average']:.1f}", flush=True)
  summary_parse = _parse_rate(make_source=lambda: kafka.KafkaSource(bootstrap, "criteo", group_id="parse",
                                                                      start="earliest"),
                              spec=spec, batches_lib=batches, steps=_WARMUP.value + _STEPS.value - 1)
  summary = _speed_summary(cluster, results, summary_parse)
  print(json.dumps(summary, indent=1), flush=True)
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=1)


def _speed_summary(cluster, results: dict, parse_rate: dict) -> dict:
  """The speed mode's results: each run's, their medians, stream / files, and the load averages beside the runs."""
  median = {variant: {**{kind: statistics.median(run[kind] for run in runs) for kind in ("wall", "windows")},
                      "cpu_ms_per_1000_examples": {kind: statistics.median(r["cpu_ms_per_1000_examples"][kind]
                                                                           for r in runs)
                                                   for kind in runs[0]["cpu_ms_per_1000_examples"]}}
            for variant, runs in results.items()}
  cpu = {variant: median[variant]["cpu_ms_per_1000_examples"] for variant in median}
  return {"batch_size": _BATCH.value, "steps": _STEPS.value, "warmup_steps": _WARMUP.value,
          "steps_per_execution": _SPE.value, "log_steps": _LOG_STEPS.value,
          "cluster": f"{cluster.num_ps} ps + {cluster.num_workers} worker", "examples_per_sec": results,
          "median": median, "chief_reads_and_parses_records_per_sec": parse_rate,
          "stream_over_files": {kind: median["stream"][kind] / median["files"][kind] for kind in ("wall", "windows")},
          "stream_cpu_over_files": {kind: cpu["stream"][kind] / cpu["files"][kind] for kind in cpu["files"]},
          "load_average": [run["load_average"] for runs in results.values() for run in runs]}


def _replay_lines(work: str, seed: int):
  """The training lines of the quality mode (u1.base, shuffled per pass with `seed`) in `work/replay-SEED.tsv`;
  returns its path and the number of lines."""
  import random  # pylint: disable=g-import-not-at-top
  with open(os.path.join(_DATA_DIR.value, "u1.base"), "rb") as f:
    base = f.read().splitlines()
  rng, lines = random.Random(seed), []
  for _ in range(_EPOCHS.value):
    rng.shuffle(base)
    lines += base[:_MAX_ROWS.value or len(base)]
  path = os.path.join(work, f"replay-{seed}.tsv")
  with open(path, "wb") as f:
    f.write(b"".join(line + b"\n" for line in lines))
  return path, len(lines)


def _quality_run(cluster, work: str, seed: int, variants) -> dict:
  """One seed's runs of `variants` (files, stream) in that order: `{variant: {auc, train_secs}}` and the rows."""
  from tfps.data import delimited, movielens  # pylint: disable=g-import-not-at-top
  from tfps.data.stream import batches, folder  # pylint: disable=g-import-not-at-top
  from tfps.estimator import online  # pylint: disable=g-import-not-at-top
  from tfps.models import model_fns  # pylint: disable=g-import-not-at-top

  path, rows = _replay_lines(work, seed)
  mode = tfps.mode_from_flags()  # a sync step takes a batch per worker: the same rows in fewer steps
  steps = rows // (_BATCH.value * (cluster.num_workers if mode.sync_mode == "sync" else 1))
  spec = movielens.ratings_spec()
  categorical, dense = spec.model_features()
  model_fn = model_fns.build_model_fn("wide_deep", categorical, dense, learning_rate=0.2)
  config = tfps.RunConfig(steps_per_execution=_SPE.value, save_checkpoints_steps=100_000,
                          log_step_count_steps=_LOG_STEPS.value, tf_random_seed=seed, mode=mode)
  test_fn = delimited.delimited_dataset_fn(os.path.join(_DATA_DIR.value, "u1.test"), spec, batch_size=1024,
                                           repeat=False, scan=False, shuffle_buffer=0, drop_remainder=False)
  stream_dir = tempfile.mkdtemp(dir=work, prefix=f"slices-{seed}-")  # a seed may run more than once
  os.link(path, os.path.join(stream_dir, "slice-0.tsv"))  # complete at once: --stream_complete=rename

  def make(positions):
    return batches.StreamBatches(folder.FolderSource(stream_dir, complete="rename", positions=positions), spec,
                                 batch_size=_BATCH.value)

  results = {"rows": rows, "steps": steps}
  for variant in variants:
    estimator = tfps.Estimator(model_fn, model_dir=tempfile.mkdtemp(dir=work, prefix=f"{variant}-{seed}-"),
                               config=config, cluster=cluster)
    start = time.monotonic()
    if variant == "files":
      estimator.train(delimited.delimited_dataset_fn(path, spec, batch_size=_BATCH.value, shuffle_buffer=0,
                                                     scan=False), max_steps=steps)
    else:
      online.train_on_stream(estimator, make, max_steps=steps)
    results[variant] = {"auc": float(estimator.evaluate(test_fn)["auc"]), "train_secs": time.monotonic() - start,
                        "losses": _losses(estimator.model_dir)}
    print(f"seed {seed}, {variant}: test AUC {results[variant]['auc']:.4f}", flush=True)
  return results


def _losses(model_dir: str) -> list:
  """`[step, loss]` of a run's progress lines: where the two variants' curves part."""
  from tfps import run_records  # pylint: disable=g-import-not-at-top
  records = run_records.read_jsonl(os.path.join(run_records.run_dir(model_dir), run_records.PROGRESS_FILE))
  return [[r["step"], round(r["metrics"]["loss"], 5)] for r in records if "loss" in r.get("metrics", {})]


def run_quality(cluster):
  """Stream replay against file training on MovieLens 100K, once per seed: the test AUC of each, their medians and
  the difference of the medians."""
  work = tempfile.mkdtemp(prefix="tfps_online_quality_")
  runs = []
  for index, seed in enumerate(int(s) for s in _SEEDS.value):
    variants = ("files", "stream") if index % 2 == 0 else ("stream", "files")
    runs.append({"seed": seed, "order": list(variants), "load_average": os.getloadavg()[0],
                 **_quality_run(cluster, work, seed, variants)})
  median = {variant: statistics.median(run[variant]["auc"] for run in runs) for variant in ("files", "stream")}
  difference = median["stream"] - median["files"]
  return {"mode": "quality", "data": "MovieLens 100K: u1.base (shuffled per seed) -> u1.test",
          "model": "wide_deep (user_id, movie_id), adagrad 0.2", "passes": _EPOCHS.value, "rows": runs[0]["rows"],
          "batch_size": _BATCH.value, "steps": runs[0]["steps"],
          "cluster": f"{cluster.num_ps} ps + {cluster.num_workers} worker",
          "sync_mode": tfps.mode_from_flags().sync_mode, "runs": runs,
          "median_auc": median, "stream_minus_files_auc": difference,
          "median_of_differences": statistics.median(run["stream"]["auc"] - run["files"]["auc"] for run in runs),
          "target": "within 0.005 (medians)", "met": abs(difference) <= 0.005}


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
