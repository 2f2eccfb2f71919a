"""Where the CPU of a ps and a worker goes during training: Linux `perf` samples of each task, grouped by kind of work.

  .venv/bin/python bench/profile_tasks.py                          # tfps.fit, 1 ps + 1 worker, batch 256 (~2 min)
  .venv/bin/python bench/profile_tasks.py --path=estimator --thread_spinning

Starts `bench/train_bench.py` under `tfps-launch` (the workload of `bench/throughput.py`), waits `--warmup_secs` for
training to run steadily, records `--seconds` of CPU samples of the ps and the worker at the same time (`perf record
-e cpu-clock`, a software clock: no hardware counters needed), stops the run and prints, per task, the share of its
samples in each kind of work (`KINDS`: symbol patterns, first match wins). Writes `--out/profile.json` with the shares
and the 15 hottest symbols of each task. Needs `perf` (Debian: linux-perf) and root or `kernel.perf_event_paranoid`
<= 1. Imports no TensorFlow.
"""

import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import runner  # pylint: disable=g-import-not-at-top,wrong-import-position

_PATH = flags.DEFINE_enum("path", "fit", ["fit", "estimator"], "Training path.")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step.", lower_bound=1)
_SPIN = flags.DEFINE_boolean("thread_spinning", False, "Run the tasks with --thread_spinning (idle threads spin, "
                             "TensorFlow's default; --nothread_spinning, tfps's default: they sleep).")
_WARMUP = flags.DEFINE_float("warmup_secs", 60.0, "Seconds from the start before sampling.", lower_bound=0)
_SECONDS = flags.DEFINE_float("seconds", 20.0, "Seconds of samples.", lower_bound=1)
_FREQUENCY = flags.DEFINE_integer("frequency", 499, "Samples per second and CPU.", lower_bound=1)
_OUT = flags.DEFINE_string("out", "bench/results/profile", "Folder for profile.json.")

# (kind, pattern on the symbol); a sample in JIT-compiled code (oneDNN's kernels) counts as math.
KINDS = (
    ("optimizer: sparse Adagrad on table rows", r"SparseApplyAdagrad|scalar_sqrt_op|scalar_square_op"),
    ("math: matmul, activations (oneDNN JIT, Eigen)",
     r"dnnl|mkl|gemm|Contraction|BiasAdd|Relu|Sigmoid|Eigen::internal::TensorExecutor"),
    ("embedding gathers, unique ids, segment sums",
     r"HandleCopies|UniqueOp|UnsortedSegment|Gather|raw_hash_set<.*FlatHashMapPolicy<long"),
    ("thread pools: stealing, spinning, queues",
     r"GlobalSteal|PopBack|MaybeGetTask|WorkerLoop|RunQueue|Spinning|EigenEnvironment|ParallelFor|parallelFor|"
     r"handleRange|EventCount"),
    ("kernel: threads woken and put to sleep (futex, context switches)",
     r"finish_task_switch|_raw_spin_unlock_irqrestore|futex|schedule|try_to_wake_up|exit_to_user_mode|irqentry|"
     r"syscall|epoll"),
    ("kernel: network (TCP, socket copies)", r"_copy_(from|to)_iter|tcp_|sock_|skb|softirq|ip_|__get_user|csum"),
    ("gRPC, tensor (de)serialization, rendezvous",
     r"grpc|Grpc|TensorResponse|TensorProto|ParseTensor|protobuf|Rendezvous|RecvTensor|tsl::Consume"),
    ("memory: copies, allocation", r"memmove|memcpy|memset|malloc|_int_free|cfree|unlink_chunk|Allocator|mmap|"
     r"clear_page|page_fault"),
    ("TensorFlow executor, op dispatch",
     r"ExecutorState|Propagator|OpKernelContext|ThreadPoolDevice::Compute|LookupResource|ScheduleReady|OpKernel|"
     r"FunctionLibrary|set_output"),
)
_LINE = re.compile(r"\s+([\d.]+)%\s+(.+?)\s+\[[.k]\]\s+(.*)")


def kind_of(dso: str, symbol: str) -> str:
  """The kind of work of one sampled symbol (`KINDS`), "other" where no pattern matches."""
  for kind, pattern in KINDS:
    if re.search(pattern, symbol):
      return kind
  return KINDS[1][0] if dso.startswith("[JIT]") else "other"


def shares(perf_data: str) -> dict:
  """`{"kinds": {kind: percent}, "hottest": [(percent, symbol)], "samples": n}` of one `perf record` file."""
  report = subprocess.run(["perf", "report", "-i", perf_data, "--no-children", "--sort", "dso,sym", "--stdio",
                           "-g", "none"], capture_output=True, text=True, check=True).stdout
  kinds, hottest = collections.Counter(), []
  for line in report.splitlines():
    match = _LINE.match(line)
    if match:
      percent, dso, symbol = float(match.group(1)), match.group(2), match.group(3)
      kinds[kind_of(dso, symbol)] += percent
      hottest.append((percent, symbol[:160]))
  samples = re.search(r"# Samples: (\S+)", report)
  return {"kinds": {kind: round(percent, 1) for kind, percent in kinds.most_common()}, "hottest": hottest[:15],
          "samples": samples.group(1) if samples else None}


def _tasks(launcher: subprocess.Popen, log_dir: str) -> dict:
  try:
    children = psutil.Process(launcher.pid).children(recursive=True)
  except psutil.Error:
    return {}
  return {name: child.pid for child in children if (name := runner.task_name(child, log_dir))}


def main(argv):
  del argv
  log_dir = runner.log_dir(f"profile_{_PATH.value}_b{_BATCH.value}")
  os.makedirs(log_dir, exist_ok=True)
  steps = max(20, round(2_000_000 / _BATCH.value / 20) * 20)  # windows long enough to outlast the samples
  command = [runner.LAUNCHER, "--num_ps=1", "--num_workers=1", f"--log_dir={log_dir}", runner.SCRIPT, "--",
             f"--path={_PATH.value}", f"--batch_size={_BATCH.value}", f"--steps={steps}", "--measure=2",
             f"--thread_spinning={_SPIN.value}", f"--benchmark_json={os.path.join(log_dir, 'result.json')}"]
  launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
  folder = tempfile.mkdtemp(prefix="tfps_profile_")
  try:
    time.sleep(_WARMUP.value)
    tasks = _tasks(launcher, log_dir)
    wanted = {name: pid for name, pid in tasks.items() if name in ("ps:0", "worker:0")}
    if len(wanted) != 2 or launcher.poll() is not None:
      raise runner.BenchError(f"the run has no ps and worker to sample after {_WARMUP.value:.0f}s (tasks: {tasks}); "
                              f"logs in {log_dir}")
    records = {name: subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(_FREQUENCY.value), "-g", "-p", str(pid), "-o",
         os.path.join(folder, f"{name}.data"), "--", "sleep", str(_SECONDS.value)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for name, pid in wanted.items()}
    for name, record in records.items():
      if record.wait() != 0:
        raise runner.BenchError(f"perf record of {name} failed: {record.stderr.read().decode()[-500:]}")
  finally:
    runner.stop(launcher)
  result = {"command": " ".join(sys.argv), "load": os.getloadavg(),
            "tasks": {name: shares(os.path.join(folder, f"{name}.data")) for name in ("ps:0", "worker:0")}}
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "profile.json"), "w", encoding="utf-8") as out:
    json.dump(result, out, indent=2)
  print(f"| kind of work | {' | '.join(result['tasks'])} |\n| --- | --- | --- |")
  kinds = [kind for kind, _ in KINDS] + ["other"]
  for kind in sorted(kinds, key=lambda k: -result["tasks"]["ps:0"]["kinds"].get(k, 0)):
    print(f"| {kind} | " + " | ".join(f"{task['kinds'].get(kind, 0):.1f}%" for task in result["tasks"].values()) +
          " |")
  print(f"Wrote {os.path.join(_OUT.value, 'profile.json')}")


if __name__ == "__main__":
  app.run(main)
