"""Geo throughput of two checkouts side by side: `bench/train_bench.py --path=fit --sync_mode=geo --geo_steps=10`
(Wide&Deep, batch 256, 100,000-row tables) under tfps-launch (1 ps, 2 workers), the checkouts alternating, each with
its own venv. Prints one line per run: examples/s and CPU-microseconds per example over all tasks.

  python3 bench/results/geo_loop/side_by_side.py OLD_CHECKOUT NEW_CHECKOUT RUNS_EACH > OUT.txt
"""

import json
import subprocess
import sys

CODE = """
import json, sys
sys.path.insert(0, ".")
from bench import runner
r = runner.run(["--path=fit", "--batch_size=256", "--steps=400", "--measure=2", "--vocab_size=100000",
                "--sync_mode=geo", "--geo_steps=10"], num_ps=1, num_workers=2, log_dir=runner.log_dir("geo_tp"),
               timeout_secs=1200)
print("RESULT", json.dumps({"eps": r["examples_per_sec"], "cores": {k: v.get("cores") for k, v in r["tasks"].items()}}))
"""


def main(old: str, new: str, runs: int) -> None:
  for run in range(runs):
    for name, tree in ((("old", old), ("new", new)) if run % 2 == 0 else (("new", new), ("old", old))):
      out = subprocess.run([f"{tree}/.venv/bin/python", "-c", CODE], cwd=tree, capture_output=True, text=True,
                           check=True)
      result = json.loads([line for line in out.stdout.splitlines() if line.startswith("RESULT")][-1].split(" ", 1)[1])
      cores = sum(result["cores"].values())
      print(f"{name} {result['eps']:.0f} us-core/ex {cores / result['eps'] * 1e6:.1f}", flush=True)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
