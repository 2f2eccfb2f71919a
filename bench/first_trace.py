"""What unrolled steps cost at the start of a run: `tfps.fit` of one scheduled function (20 steps of the benchmark
workload, `bench/workload.py`) on an in-process 1 ps + 1 worker cluster, timed from the call to its return, for each
`--unrolled_steps` value, alternating in one process (a new model and runner each time: each fit traces its own
function).

  .venv/bin/python bench/first_trace.py                           # 1 and 4 steps per loop iteration, 2 rounds
  .venv/bin/python bench/first_trace.py --unrolled_steps=1,2,4,8 --rounds=3
  .venv/bin/python bench/first_trace.py --pipelined_updates     # the same with updates pipelined
"""

import json
import os
import statistics
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

_UNROLLED = flags.DEFINE_list("unrolled_steps", ["1", "4"], "Steps per loop iteration to time.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Times each value is timed, alternating.", lower_bound=1)
_PIPELINED = flags.DEFINE_boolean("pipelined_updates", False, "Every run with --pipelined_updates.")
_JSON = flags.DEFINE_string("json_out", None, "Also write the timings here.")


def main(argv):
  del argv
  import tfps  # pylint: disable=g-import-not-at-top
  from bench import workload as workload_lib  # pylint: disable=g-import-not-at-top
  from tfps.testing import in_process  # pylint: disable=g-import-not-at-top
  values = [int(value) for value in _UNROLLED.value]
  cluster = in_process.local_cluster(num_workers=1, num_ps=1)
  workload = workload_lib.Workload(batch_size=256)
  seconds = {value: [] for value in values}
  for _ in range(_ROUNDS.value):
    for value in values:
      mode = tfps.TrainingMode(unrolled_steps=value, pipelined_updates=_PIPELINED.value)
      start = time.monotonic()
      tfps.fit(lambda: workload_lib.build_model(workload), workload_lib.dataset_fn(workload), epochs=1,
               steps_per_epoch=20, cluster=cluster, sync_mode=mode)
      seconds[value].append(time.monotonic() - start)
  print("| steps per loop iteration | tfps.fit of 20 steps, s (median; runs) |\n| --- | --- |")
  for value in values:
    runs = ", ".join(f"{secs:.1f}" for secs in seconds[value])
    print(f"| {value} | {statistics.median(seconds[value]):.1f} ({runs}) |")
  if _JSON.value:
    with open(_JSON.value, "w", encoding="utf-8") as out:
      json.dump({"seconds": seconds, "command": " ".join(sys.argv)}, out, indent=2)


if __name__ == "__main__":
  app.run(main)
