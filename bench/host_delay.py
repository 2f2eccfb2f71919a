"""Examples/s against network delay: `tfps.fit` with 2 ps + 2 workers + a chief, each on a test host of its own.

  .venv/bin/python bench/host_delay.py                        # delays 0, 1, 2, 5, 10 ms (~8 min); root, iptables
  .venv/bin/python bench/host_delay.py --delays=0,10 --repeats=2
  .venv/bin/python bench/host_delay.py --train_flags=--pipelined_updates --out=bench/results/pipelined
  .venv/bin/python bench/host_delay.py --delays=0 --nodelayer_baseline --rate_mbit=200 --batch_size=4096 \
      --train_flags=--bf16_rows   # every host's link capped at 200 Mbit/s

Every host holds each packet it receives for the delay (`TestHosts.delay`: NFQUEUE and `tfps.testing.netdelay`,
since this kernel has no netem), so a round trip between two tasks grows by twice the delay. Each run is
`bench/train_bench.py --path=fit` started per host with tfps's cluster flags (Wide&Deep, `bench/workload.py`); the
chief measures examples/s over `--measure` windows of `--steps` steps after a warm-up window. One more point runs
every packet through the delayers held 1 us (`--delayer_baseline`): the injector's own cost. Also recorded per run:
the packets the busiest host's delayer held per second and the CPU share it used (is the injector a limit?). With
`--repeats` > 1 the delays run in a shuffled order each time and a delay's rate is the median. `--rate_mbit` caps
what every host sends (`TestHosts.limit_rate`); every run records the bytes all hosts sent per step. Writes
`--out/host_delay.json` and `--out/host_delay.png`.
"""

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

from absl import app
from absl import flags
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import report  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.testing import host_cluster  # pylint: disable=g-import-not-at-top,wrong-import-position

_DELAYS = flags.DEFINE_list("delays", ["0", "1", "2", "5", "10"], "Delays in ms (each host, each packet received).")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step.", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_size", 10_000, "Rows of each categorical feature's table.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 100, "Steps per measured window (and of the warm-up).", lower_bound=1)
_MEASURE = flags.DEFINE_integer("measure", 3, "Measured windows per run.", lower_bound=1)
_LOSS = flags.DEFINE_float("loss_percent", 0, "Packets dropped on every link, in percent.", lower_bound=0,
                           upper_bound=50)
_BASELINE = flags.DEFINE_boolean("delayer_baseline", True, "Also run with every packet through the delayers but "
                                 "held only 1 us: what the injector costs by itself.")
_RATE = flags.DEFINE_float("rate_mbit", 0, "Caps what every host sends at this many Mbit/s (tc tbf; 0: no cap).",
                          lower_bound=0)
_REPEATS = flags.DEFINE_integer("repeats", 1, "Runs per delay, each round in a shuffled order.", lower_bound=1)
_TRAIN_FLAGS = flags.DEFINE_list("train_flags", [], "More flags of every task's bench/train_bench.py, e.g. "
                                 "--train_flags=--pipelined_updates.")
_OUT = flags.DEFINE_string("out", os.path.join(runner.ROOT, "bench", "results"), "Folder for host_delay.json/.png.")

SCRIPT = os.path.join(runner.ROOT, "bench", "train_bench.py")
REPLICAS = (("ps", 2), ("worker", 2), ("chief", 1))
PASS_THROUGH_MS = 0.001  # the --delayer_baseline point
CHIEF = ("chief", 0)
TIMEOUT_SECS = 900


def _queue_counts(cluster) -> dict:
  """Per host: packets its NFQUEUE handed to the delayer so far, and packets the queue dropped (full queue or socket)
  (`id_sequence`, `queue_dropped` + `user_dropped` of /proc/net/netfilter/nfnetlink_queue)."""
  counts = {}
  for task in cluster.tasks:
    fields = cluster.hosts.run(cluster.host(task), ["cat", "/proc/net/netfilter/nfnetlink_queue"]).stdout.split()
    counts[cluster.host(task)] = (int(fields[7]), int(fields[5]) + int(fields[6])) if len(fields) > 7 else (0, 0)
  return counts


def _delayer_cpu_secs(cluster) -> dict:
  cpu = {}
  for name, pid in cluster.hosts.delayer_pids().items():
    try:
      times = psutil.Process(pid).cpu_times()
      cpu[name] = times.user + times.system
    except psutil.Error:
      cpu[name] = None
  return cpu


def run_once(delay_ms: float, work_dir: str) -> dict:
  """One training run with `delay_ms` on every host; the chief's measurements plus the delayers' load."""
  run_dir = os.path.join(work_dir, f"delay_{delay_ms:g}_{time.monotonic_ns()}")
  result_path = os.path.join(run_dir, "result.json")
  args = ["--path=fit", f"--batch_size={_BATCH.value}", f"--vocab_size={_VOCAB.value}", f"--steps={_STEPS.value}",
          f"--measure={_MEASURE.value}", f"--benchmark_json={result_path}", "--linger_secs=0",
          "--connect_timeout_secs=180", *_TRAIN_FLAGS.value]
  env = dict(os.environ, PYTHONPATH=runner.ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  with host_cluster.HostCluster(SCRIPT, args, os.path.join(run_dir, "logs"), replicas=REPLICAS, env=env) as cluster:
    cluster.delay(delay_ms)
    if _LOSS.value:
      cluster.drop(_LOSS.value / 100)
    if _RATE.value:
      for task in cluster.tasks:
        cluster.limit_rate(task, round(_RATE.value * 1000))
    start = time.monotonic()
    cluster.start_all()
    code = cluster.wait(CHIEF, TIMEOUT_SECS)
    wall = time.monotonic() - start
    if code != 0 or not os.path.exists(result_path):
      raise runner.BenchError(f"delay {delay_ms} ms: chief exit {code}; its log ends:\n{cluster.log(CHIEF)[-3000:]}")
    counts, cpu = _queue_counts(cluster), _delayer_cpu_secs(cluster)
    sent = sum(cluster.traffic(task)[1] for task in cluster.tasks)
  with open(result_path, encoding="utf-8") as f:
    result = json.load(f)
  packets = {name: queued for name, (queued, _) in counts.items()}
  busiest = max(packets, key=packets.get) if delay_ms else None
  return {"delay_ms": delay_ms, "examples_per_sec": result["examples_per_sec"],
          "window_examples_per_sec": result["window_examples_per_sec"], "step_secs": result["step_secs"],
          "wall_secs": round(wall, 1), "busiest_delayer": busiest,
          "busiest_delayer_packets_per_sec": round(packets[busiest] / wall) if busiest else 0,
          "busiest_delayer_cpu_share": round(cpu[busiest] / wall, 3) if busiest and cpu[busiest] is not None else 0,
          "queue_dropped_packets": sum(dropped for _, dropped in counts.values()),
          # every host's sent bytes over the whole run (start-up included) per step trained (warm-up included)
          "sent_bytes_per_step": round(sent / (_STEPS.value * (_MEASURE.value + 1)))}


def summarize(runs: list) -> list:
  rows = []
  for delay in sorted({run["delay_ms"] for run in runs}):
    mine = [run for run in runs if run["delay_ms"] == delay]
    rows.append({"delay_ms": delay, "examples_per_sec": statistics.median(r["examples_per_sec"] for r in mine),
                 "step_secs": statistics.median(r["step_secs"] for r in mine),
                 "busiest_delayer_packets_per_sec": max(r["busiest_delayer_packets_per_sec"] for r in mine),
                 "busiest_delayer_cpu_share": max(r["busiest_delayer_cpu_share"] for r in mine),
                 "queue_dropped_packets": sum(r["queue_dropped_packets"] for r in mine),
                 "sent_bytes_per_step": statistics.median(r["sent_bytes_per_step"] for r in mine)})
  base = next((row["examples_per_sec"] for row in rows if row["delay_ms"] == 0), None)
  for row in rows:
    row["vs_no_delay"] = round(row["examples_per_sec"] / base, 3) if base else None
  return rows


def main(argv):
  del argv
  try:
    delays = [float(d) for d in _DELAYS.value]
  except ValueError:
    raise app.UsageError(f"--delays ({','.join(_DELAYS.value)}) must be numbers of ms") from None
  if any(not 0 <= d <= 1000 for d in delays):
    raise app.UsageError(f"--delays ({','.join(_DELAYS.value)}) must each be in [0, 1000] ms")
  if _BASELINE.value:
    delays.insert(1, PASS_THROUGH_MS)  # next to the first point, so that both see the same load
  work_dir = tempfile.mkdtemp(prefix="tfps_host_delay_")
  runs = []
  summary = {"load_before": os.getloadavg(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "cluster": "2 ps + 2 workers + chief, one test host each", "batch_size": _BATCH.value,
             "vocab_size": _VOCAB.value, "steps": _STEPS.value, "measure": _MEASURE.value,
             "loss_percent": _LOSS.value, "rate_mbit": _RATE.value, "train_flags": _TRAIN_FLAGS.value}
  try:
    for _ in range(_REPEATS.value):
      for delay in random.sample(delays, len(delays)) if _REPEATS.value > 1 else delays:
        runs.append(run_once(delay, work_dir))
        print(json.dumps(runs[-1]), flush=True)
  finally:
    shutil.rmtree(work_dir, ignore_errors=True)
  summary.update(load_after=os.getloadavg(), runs=runs, rows=summarize(runs))
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "host_delay.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2)
  print(report.host_delay_table(summary))
  plot = report.plot_host_delay(summary, os.path.join(_OUT.value, "host_delay.png"))
  print(f"Wrote {os.path.join(_OUT.value, 'host_delay.json')}" + (f" and {plot}" if plot else ""))


if __name__ == "__main__":
  app.run(main)
