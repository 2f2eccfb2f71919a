"""What the private network namespace costs `tfps-launch` at startup: isolated (the default) vs `--expose_ports`.

Each round runs both, one after the other in alternating order, on the same stand-in job (no TensorFlow, so the
launcher's own work is what is timed): 1 ps, 2 workers and a chief whose script prints one line and exits; the ps and
workers wait to be stopped. Per run: seconds from starting `tfps-launch` to the chief's first line (the cluster is up)
and to the launcher's exit (every task stopped). Prints medians and their ratio; writes `bench/results/isolation.json`.

  .venv/bin/python bench/isolation.py --rounds=10
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_ROUNDS = flags.DEFINE_integer("rounds", 10, "Rounds; each runs both variants once.", lower_bound=1)
_OUT = flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                               "isolation.json"), "Result JSON.")

TASK = """
import json, os, sys, time
if json.loads(os.environ["TF_CONFIG"])["task"]["type"] == "chief":
  print("chief up", flush=True)
  sys.exit(0)
time.sleep(600)
"""
VARIANTS = {"isolated": [], "expose_ports": ["--expose_ports"]}


def one_run(script: str, log_dir: str, extra) -> dict:
  command = [sys.executable, "-m", "tfps.cli.launch", "--num_ps=1", "--num_workers=2", "--stop_grace_secs=2",
             f"--log_dir={log_dir}", *extra, script]
  started = time.monotonic()
  process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  first_line = process.stdout.readline()
  up = time.monotonic() - started
  process.stdout.read()
  code = process.wait(timeout=120)
  if code != 0 or "chief up" not in first_line:
    raise RuntimeError(f"{' '.join(command)} exited with {code}; first line {first_line!r}")
  return {"cluster_up_secs": up, "total_secs": time.monotonic() - started}


def main(argv):
  del argv
  runs = {name: [] for name in VARIANTS}
  with tempfile.TemporaryDirectory() as workdir:
    script = os.path.join(workdir, "task.py")
    with open(script, "w", encoding="utf-8") as f:
      f.write(TASK)
    for round_index in range(_ROUNDS.value):
      order = list(VARIANTS) if round_index % 2 == 0 else list(reversed(VARIANTS))
      for name in order:
        runs[name].append(one_run(script, os.path.join(workdir, name), VARIANTS[name]))
  medians = {name: {key: statistics.median(run[key] for run in series) for key in series[0]}
             for name, series in runs.items()}
  ratios = {key: medians["isolated"][key] / medians["expose_ports"][key] for key in medians["isolated"]}
  result = {"rounds": _ROUNDS.value, "load_average": os.getloadavg(), "median": medians,
            "isolated_over_expose_ports": ratios, "runs": runs}
  os.makedirs(os.path.dirname(_OUT.value), exist_ok=True)
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  print(f"{'':14}{'cluster up (s)':>16}{'total (s)':>12}")
  for name, median in medians.items():
    print(f"{name:14}{median['cluster_up_secs']:16.3f}{median['total_secs']:12.3f}")
  print(f"{'ratio':14}{ratios['cluster_up_secs']:15.2f}x{ratios['total_secs']:11.2f}x  (isolated / --expose_ports, "
        f"medians of {_ROUNDS.value}; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
  app.run(main)
