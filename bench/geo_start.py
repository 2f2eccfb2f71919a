"""What a geo run costs before it trains, against `geo_steps`: the chief traces one function per round length
(`tfps/training/geo.py`), whose discovery is written out batch by batch and whose training steps are written out up
to `2 * geo.UNROLLED_STEPS - 1` steps, then run in a loop (bench/results/geo_loop/NOTES.md).

For each of `--geo_steps`, a fresh process (its own in-process cluster of 2 ps and 2 workers) fits the benchmark
workload (`bench/workload.py`: Wide&Deep, batch 256) for 2 rounds and reports the fit's CPU and wall seconds; the
slope between the smallest and the largest size is the CPU per step of the round (training the extra steps, a few
milliseconds each, included). Writes `--out` (JSON) and prints one line per size.

  .venv/bin/python bench/geo_start.py --geo_steps=5,10,20,40,80 --out=bench/results/geo_start.json
"""

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

_GEO_STEPS = flags.DEFINE_list("geo_steps", ["5", "20"], "Round lengths to measure, each in a process of its own.")
_VOCAB = flags.DEFINE_integer("vocab_size", 10_000, "Rows of each feature's table.")
_OUT = flags.DEFINE_string("out", None, "Where to write the results (JSON); nothing written without it.")
_ONE = flags.DEFINE_integer("one", None, "Internal: measure this one round length in this process and print it.")


def _measure_one(geo_steps: int, vocab_size: int) -> dict:
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import tfps  # pylint: disable=g-import-not-at-top
  from bench import workload as workload_lib  # pylint: disable=g-import-not-at-top
  workload = workload_lib.Workload(batch_size=256, vocab_size=vocab_size)
  cluster = tfps.testing.local_cluster(num_workers=2, num_ps=2)
  cpu, wall = time.process_time(), time.perf_counter()
  tfps.fit(lambda: workload_lib.build_model(workload), workload_lib.dataset_fn(workload), epochs=1,
           steps_per_epoch=2 * geo_steps, sync_mode=tfps.TrainingMode("geo", geo_steps=geo_steps), cluster=cluster)
  return {"geo_steps": geo_steps, "fit_cpu_secs": round(time.process_time() - cpu, 2),
          "fit_wall_secs": round(time.perf_counter() - wall, 2)}


def main(argv):
  del argv
  if _ONE.value is not None:
    print(json.dumps(_measure_one(_ONE.value, _VOCAB.value)), flush=True)
    os._exit(0)  # in-process servers cannot be stopped
  given = _GEO_STEPS.value
  if not given or not all(size.isdigit() and int(size) > 0 for size in given) or len(set(map(int, given))) < len(given):
    raise app.UsageError(f"--geo_steps ({','.join(given)}) must be distinct positive integers")
  sizes = sorted(int(size) for size in given)
  load_before = os.getloadavg()
  runs = []
  for size in sizes:
    result = subprocess.run([sys.executable, __file__, f"--one={size}", f"--vocab_size={_VOCAB.value}"],
                            capture_output=True, text=True, check=True)
    runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    print(f"geo_steps={size}: fit {runs[-1]['fit_cpu_secs']:.1f} CPU-s, {runs[-1]['fit_wall_secs']:.1f} s wall",
          flush=True)
  report = {"runs": runs, "vocab_size": _VOCAB.value, "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()]}
  if len(runs) > 1:
    report["cpu_secs_per_round_step"] = round((runs[-1]["fit_cpu_secs"] - runs[0]["fit_cpu_secs"]) /
                                              (runs[-1]["geo_steps"] - runs[0]["geo_steps"]), 2)
    print(f"{report['cpu_secs_per_round_step']:.2f} CPU-s per step of the round")
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as f:
      json.dump(report, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  app.run(main)
