"""Runs one `train_bench.py` measurement (alone, or as a cluster under `tfps-launch`) and watches its processes.

While a cluster runs, every task process (named in the log folder's tasks.json, or by its TF_CONFIG) is sampled every `sample_secs`: CPU time, peak RSS
(`VmHWM` of /proc/<pid>/status, through psutil), RSS (`VmRSS`), and the bytes its TCP sockets sent and received
(`ss -tinp`: the kernel's per-connection `bytes_sent`/`bytes_received`; gRPC keeps its connections open, so nothing is
lost between samples). The result is the chief's JSON plus, per task, `peak_rss_bytes`, `rss_bytes` (at its last
sample that has one), and over the chief's measured span `cores` (CPU seconds per second; between the first and last
samples inside the span, or, where fewer than two fall inside a short span, interpolated between the samples around
its ends) and `network_bytes` (between the first and last samples inside the span), and `span_network_bytes` (over
the whole span, interpolated between the samples around its ends). One process run alone reports its own
`process_cores` over its windows, which is taken as its `cores`: its short windows can fall between two samples.
Imports no TensorFlow.
"""

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

import psutil

from tfps.cluster import tasks as tasks_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "train_bench.py")
PLAIN_SCRIPT = os.path.join(ROOT, "bench", "plain_pss_train.py")  # starts its own cluster, no tfps
LAUNCHER = os.path.join(os.path.dirname(sys.executable), "tfps-launch")
LOGS_ENV = "TFPS_BENCH_LOGS"  # where set, the folder of this bench's logs


def log_root() -> str:
  """The folder of this bench's logs: `$TFPS_BENCH_LOGS` where set, else one of its own (`_own_log_root`), so that
  two benches running at once (or a bench and a test) never write into each other's logs."""
  return os.environ.get(LOGS_ENV) or _own_log_root()


@functools.lru_cache(maxsize=None)
def _own_log_root() -> str:
  """A new folder `<tmp>/tfps_bench_logs_<script>_<random>`, made at the first call of the process; printed then."""
  script = os.path.splitext(os.path.basename(sys.argv[0]))[0] or "bench"
  root = tempfile.mkdtemp(prefix=f"tfps_bench_logs_{script}_")
  print(f"task logs: {root}", flush=True)
  return root


def log_dir(name: str) -> str:
  """The folder of one measurement's logs: `<log_root()>/<name>`."""
  return os.path.join(log_root(), name)


class BenchError(RuntimeError):
  """A benchmark run failed; the message holds the end of its log."""


def keep_folder(folder: str, keep_dir: Optional[str], name: str) -> Optional[str]:
  """Copies `folder` (a run's logs and outputs, about to be removed) to `keep_dir`/`name` where `keep_dir` is given;
  returns the copy's path, else None."""
  if not keep_dir:
    return None
  kept = os.path.join(keep_dir, name)
  shutil.copytree(folder, kept)
  return kept


def task_name(process: psutil.Process, log_dir: Optional[str] = None) -> Optional[str]:
  """`process`'s task ("ps:0"): named in `log_dir`'s tasks.json (tfps-launch's fork server's tasks show its
  environment), else by its TF_CONFIG; None if it is no task."""
  named = [label for label in tasks_lib.task_pids(log_dir) if tasks_lib.find_task(log_dir, label, [process])] \
      if log_dir else []
  if named:
    return named[0]
  try:
    tf_config = process.environ().get("TF_CONFIG")
  except (psutil.Error, OSError):
    return None
  if not tf_config:
    return None
  task = json.loads(tf_config).get("task", {})
  return f"{task.get('type')}:{task.get('index', 0)}"


def _memory(process: psutil.Process) -> Dict[str, int]:
  """`{"VmHWM": peak RSS, "VmRSS": RSS now}` of `process`, bytes (0 where /proc lacks a field)."""
  found = {"VmHWM": 0, "VmRSS": 0}
  with open(f"/proc/{process.pid}/status", encoding="ascii") as status:
    for line in status:
      field = line.split(":", 1)[0]
      if field in found:
        found[field] = int(line.split()[1]) * 1024
  return found


_SS_PID = re.compile(r"pid=(\d+),")
_SS_BYTES = re.compile(r"\bbytes_(?:sent|received):(\d+)")


def _socket_bytes(netns_pid: Optional[int] = None) -> Dict[int, int]:
  """`{pid: bytes sent + received over its TCP sockets}` from `ss -tinp` (0 where ss is missing), in the network
  namespace of process `netns_pid` (tfps-launch's tasks run in a private one) or else in ours."""
  enter = [] if netns_pid is None else ["nsenter", f"--net=/proc/{netns_pid}/ns/net"]
  try:
    lines = subprocess.run([*enter, "ss", "-tinpH"], capture_output=True, text=True, timeout=10, check=False).stdout
  except (OSError, subprocess.TimeoutExpired):
    return {}
  totals: Dict[int, int] = {}
  owners: List[int] = []
  for line in lines.splitlines():
    if not line.startswith((" ", "\t")):  # a connection line; its counters follow on the next line
      owners = [int(pid) for pid in _SS_PID.findall(line)]
      continue
    count = sum(int(value) for value in _SS_BYTES.findall(line))
    for pid in owners[:1]:
      totals[pid] = totals.get(pid, 0) + count
  return totals


def _sample(root: psutil.Process, tasks: Dict[str, psutil.Process], log_dir: str) -> Dict[str, tuple]:
  """`{task: (time, cpu_secs, peak_rss, network_bytes)}` of every live task process under `root`."""
  try:
    children = root.children(recursive=True)
  except psutil.Error:
    children = []
  for child in children:
    if child.pid not in {p.pid for p in tasks.values()}:
      name = task_name(child, log_dir)
      if name:
        tasks[name] = child
  result = {}
  network = _socket_bytes(next(iter(tasks.values())).pid if tasks else None)  # the tasks share one namespace
  for name, process in tasks.items():
    try:
      times = process.cpu_times()
      memory = _memory(process)
      result[name] = (time.time(), times.user + times.system, memory["VmHWM"], network.get(process.pid, 0),
                      memory["VmRSS"])
    except (psutil.Error, OSError):
      continue
  return result


def stop(process: subprocess.Popen, grace_secs: float = 10.0) -> None:
  """SIGTERM to the launcher's process group (it stops its tasks), then SIGKILL after `grace_secs`."""
  if process.poll() is not None:
    return
  os.killpg(process.pid, signal.SIGTERM)
  try:
    process.wait(grace_secs)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _tail(path: str, lines: int = 15) -> str:
  with open(path, encoding="utf-8", errors="replace") as log:
    return "".join(log.readlines()[-lines:])


def run(args: Sequence[str], *, num_ps: int = 0, num_workers: int = 0, log_dir: str,
        timeout_secs: float = 600.0, sample_secs: float = 0.25, plain: bool = False, script: str = SCRIPT,
        env: Optional[Dict[str, str]] = None) -> dict:
  """Runs `train_bench.py ARGS` (or another benchmark `script` that takes `--benchmark_json`): alone when `num_ps` is
  0, else under `tfps-launch` with that cluster; with `plain`, `plain_pss_train.py ARGS` instead, which starts that
  cluster itself (no tfps code). `env`: variables set for every process of the run, beside this one's environment.

  Returns the chief's JSON, with `tasks: {task: {"peak_rss_bytes", "cores"}}` (one process: the task `single:0`).

  Raises:
    BenchError: the run failed or took longer than `timeout_secs`.
  """
  os.makedirs(log_dir, exist_ok=True)
  fd, json_path = tempfile.mkstemp(suffix=".json", prefix="tfps_bench_")
  os.close(fd)
  command: List[str] = [sys.executable, script]
  if plain:
    command = [sys.executable, PLAIN_SCRIPT, f"--num_ps={num_ps}", f"--num_workers={num_workers}",
               f"--task_log_dir={log_dir}"]
  elif num_ps:
    command = [LAUNCHER, f"--num_ps={num_ps}", f"--num_workers={num_workers}", f"--log_dir={log_dir}", script, "--"]
  command += list(args) + [f"--benchmark_json={json_path}"]
  log_path = os.path.join(log_dir, "run.log")
  samples: Dict[str, List[tuple]] = {}
  tasks: Dict[str, psutil.Process] = {}
  with open(log_path, "w", encoding="utf-8") as log:
    log.write(" ".join(command) + "\n")
    log.flush()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True, cwd=ROOT,
                               env=dict(os.environ, **(env or {})))
  deadline = time.monotonic() + timeout_secs
  try:
    root = psutil.Process(process.pid)
    if not plain and not num_ps:  # one process, without TF_CONFIG: sampled as the task `single:0`
      tasks["single:0"] = root
    while process.poll() is None:
      if time.monotonic() > deadline:
        raise BenchError(f"{' '.join(command)} took more than {timeout_secs:g}s; log {log_path}:\n{_tail(log_path)}")
      for name, sample in _sample(root, tasks, log_dir).items():
        samples.setdefault(name, []).append(sample)
      time.sleep(sample_secs)
  finally:
    stop(process)
  try:
    if process.returncode != 0:
      raise BenchError(f"{' '.join(command)} exited with {process.returncode}; log {log_path}:\n{_tail(log_path)}")
    with open(json_path, encoding="utf-8") as result_file:
      result = json.load(result_file)
  finally:
    os.remove(json_path)
  if samples:
    result["tasks"] = {name: _task_summary(series, result.get("measured_span")) for name, series in samples.items()}
  if "process_cores" in result and "single:0" in result.get("tasks", {}):
    # One process counts its own CPU over its measured windows: exact, where a short window may fall between samples.
    result["tasks"]["single:0"]["cores"] = result["process_cores"]
  return result


def _task_summary(series: List[tuple], span: Optional[Sequence[float]]) -> dict:
  # RSS at the last sample that has one (a task that has just exited has none)
  summary = {"peak_rss_bytes": max(sample[2] for sample in series),
             "rss_bytes": next((sample[4] for sample in reversed(series) if sample[4]), 0)}
  if span and span[0] and span[1]:
    inside = [sample for sample in series if span[0] <= sample[0] <= span[1]]
    if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
      first, last = inside[0], inside[-1]
      summary["cores"] = (last[1] - first[1]) / (last[0] - first[0])
      summary["network_bytes"] = last[3] - first[3]
      summary["network_secs"] = last[0] - first[0]
    else:  # a span shorter than the sampling period (a loaded sampler can fall behind): its CPU at its ends
      span_cpu = [_at(series, moment, 1) for moment in span]
      if None not in span_cpu and span[1] > span[0]:
        summary["cores"] = (span_cpu[1] - span_cpu[0]) / (span[1] - span[0])
    span_bytes = [_at(series, moment, 3) for moment in span]
    if None not in span_bytes:
      summary["span_network_bytes"] = span_bytes[1] - span_bytes[0]
  return summary


def _at(series: List[tuple], moment: float, field: int) -> Optional[float]:
  """Sample `field` at time `moment`, interpolated between the samples around it (None: none on one side)."""
  before = [sample for sample in series if sample[0] <= moment]
  after = [sample for sample in series if sample[0] >= moment]
  if not before or not after:
    return None
  low, high = before[-1], after[0]
  if high[0] == low[0]:
    return float(low[field])
  return low[field] + (high[field] - low[field]) * (moment - low[0]) / (high[0] - low[0])
