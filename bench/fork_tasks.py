"""What the fork server saves `tfps-launch`: `--fork_tasks` (the default) vs `--nofork_tasks`, on a real training job.

Each round runs both, one after the other in alternating order: 1 ps, 2 workers and the chief of
`scripts/train_keras.py` (one short epoch), with `--expose_ports` (so that the pids in `tasks.json` are this
namespace's). Per run: seconds from starting `tfps-launch` to the chief's "Training on" line (its first step comes
next), the tasks' memory at that moment (RSS and PSS from /proc/PID/smaps_rollup, summed over the tasks and, with
--fork_tasks, the server), and the CPU seconds (user + system) of the whole launch. Writes
`bench/results/fork_tasks.json` with the load average beside each run.

  .venv/bin/python bench/fork_tasks.py --rounds=2
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import psutil

from tfps.cluster import tasks as tasks_lib

_ROUNDS = flags.DEFINE_integer("rounds", 2, "Rounds; each runs both variants once.", lower_bound=1)
_OUT = flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                               "fork_tasks.json"), "Result JSON.")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("--fork_tasks", "--nofork_tasks")


def _memory_kib(pid: int) -> dict:
  fields = {}
  with open(f"/proc/{pid}/smaps_rollup") as rollup:
    for line in rollup:
      name, _, rest = line.partition(":")
      if name in ("Rss", "Pss"):
        fields[name.lower()] = int(rest.split()[0])
  return fields


def _run(variant: str, work: str) -> dict:
  log_dir = os.path.join(work, "logs")
  command = [sys.executable, "-m", "tfps.cli.launch", variant, "--expose_ports", "--num_ps=1", "--num_workers=2",
             f"--log_dir={log_dir}", "scripts/train_keras.py", "--", f"--model_dir={work}/run", "--epochs=1",
             "--steps_per_epoch=20", "--vocab_size=2000", "--batch_size=32"]
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  load = os.getloadavg()[0]
  started = time.monotonic()
  launcher = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  chief_log = os.path.join(log_dir, "chief-0.log")
  while not (os.path.exists(chief_log) and "Training on " in open(chief_log, errors="replace").read()):
    if launcher.poll() is not None:
      raise RuntimeError(f"{variant}: the launch ended (status {launcher.returncode}) before training started")
    time.sleep(0.05)
  to_training = time.monotonic() - started
  pids = set(tasks_lib.task_pids(log_dir).values())  # with the server (a forked task shows its command line too)
  pids |= {p.pid for p in psutil.Process(launcher.pid).children() if "forkserver" in " ".join(p.cmdline())}
  memory = [_memory_kib(pid) for pid in pids]
  if launcher.wait(timeout=600) != 0:
    raise RuntimeError(f"{variant}: the launch failed (status {launcher.returncode})")
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return {"variant": variant, "secs_to_training": round(to_training, 2), "cpu_secs": round(cpu, 2),
          "processes": len(pids), "rss_mib": round(sum(m["rss"] for m in memory) / 1024, 1),
          "pss_mib": round(sum(m["pss"] for m in memory) / 1024, 1), "load_before": round(load, 1)}


def main(argv) -> None:
  del argv
  runs = []
  for round_ in range(_ROUNDS.value):
    for variant in (VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]):
      with tempfile.TemporaryDirectory() as work:
        runs.append(_run(variant, work))
        print(json.dumps(runs[-1]), flush=True)
  summary = {}
  for key in ("secs_to_training", "cpu_secs", "rss_mib", "pss_mib"):
    medians = {v: statistics.median(r[key] for r in runs if r["variant"] == v) for v in VARIANTS}
    summary[key] = {**medians, "fork/nofork": round(medians["--fork_tasks"] / medians["--nofork_tasks"], 3)}
  with open(_OUT.value, "w") as out:
    json.dump({"runs": runs, "medians": summary}, out, indent=1)
  print(json.dumps(summary, indent=1))


if __name__ == "__main__":
  app.run(main)
