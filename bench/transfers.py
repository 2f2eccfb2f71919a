"""Cross-process transfers per step of a training path, counted in the partitioned graphs TensorFlow runs.

  .venv/bin/python bench/transfers.py --path=estimator       # or --path=fit; --batch_size=256

Trains a few scheduled functions of the benchmark workload (`bench/workload.py`) on an in-process 1 ps + 1 worker
cluster with `TF_DUMP_GRAPH_PREFIX` set (in a child process: the variable must be set before TensorFlow loads), then
counts in the ps partition of the training function (the one with the most ops) the `_Send` and `_Recv` ops, each
one tensor moved between the ps and the worker, served by one gRPC `RecvTensor` call. Inside the step loop
(`while/` frames) they happen every step; the rest once per scheduled function.
"""

import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

_PATH = flags.DEFINE_enum("path", "estimator", ["fit", "estimator"], "The training path to count.")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step.", lower_bound=1)
_SPE = flags.DEFINE_integer("steps_per_execution", None, "Steps per scheduled function (default: the path's own).",
                            lower_bound=1)
_CHILD_DIR = flags.DEFINE_string("child_dump_dir", None, "(internal) train and dump into this folder.")
_JSON = flags.DEFINE_string("json_out", None, "Also write the counts here.")

_NODE = re.compile(r'^node \{\n  name: "([^"]*)"\n  op: "([^"]*)"', re.M)


def _train(dump_dir: str) -> None:
  """In the child: a few scheduled functions of `--path` on an in-process cluster, graphs dumped into `dump_dir`."""
  del dump_dir  # read by TensorFlow from the environment
  import tfps  # pylint: disable=g-import-not-at-top
  from bench import workload as workload_lib  # pylint: disable=g-import-not-at-top
  from tfps.testing import in_process  # pylint: disable=g-import-not-at-top
  workload = workload_lib.Workload(batch_size=_BATCH.value, vocab_size=10_000)
  cluster = in_process.local_cluster(num_workers=1, num_ps=1)
  if _PATH.value == "fit":
    tfps.fit(lambda: workload_lib.build_model(workload), workload_lib.dataset_fn(workload), epochs=1,
             steps_per_epoch=40, steps_per_execution=_SPE.value, cluster=cluster, batch_size=_BATCH.value)
    return
  with tempfile.TemporaryDirectory(prefix="tfps_transfers_") as model_dir:
    options = {} if _SPE.value is None else {"steps_per_execution": _SPE.value}
    estimator = tfps.Estimator(workload_lib.build_model_fn(workload), model_dir=model_dir, cluster=cluster,
                               config=tfps.RunConfig(save_checkpoints_steps=1000, **options))
    estimator.train(lambda: workload_lib.dataset(workload), max_steps=40)


def count(dump_dir: str) -> dict:
  """`{file, ops, per_step: {send, recv}, per_function: {send, recv}, per_step_names}` of the biggest ps partition."""
  files = glob.glob(os.path.join(dump_dir, "*partition__job_ps*after_partition_passes*.pbtxt"))
  files += glob.glob(os.path.join(dump_dir, "*partition__job:ps*after_partition_passes*.pbtxt"))
  if not files:
    raise RuntimeError(f"no ps partition was dumped into {dump_dir}: {sorted(os.listdir(dump_dir))[:20]}")
  best = None
  for path in set(files):
    with open(path, encoding="utf-8") as graph:
      nodes = _NODE.findall(graph.read())
    if best is None or len(nodes) > len(best[1]):
      best = (path, nodes)
  path, nodes = best
  counts = {"per_step": collections.Counter(), "per_function": collections.Counter()}
  names = []
  for name, op in nodes:
    if op not in ("_Send", "_Recv", "_HostSend", "_HostRecv"):
      continue
    where = "per_step" if "while/" in name or "/body/" in name else "per_function"
    counts[where]["send" if "Send" in op else "recv"] += 1
    if where == "per_step":
      names.append(f"{op} {name}")
  return {"file": os.path.basename(path), "ops": len(nodes), "per_step": dict(counts["per_step"]),
          "per_function": dict(counts["per_function"]), "per_step_names": sorted(names)}


def main(argv):
  del argv
  if _CHILD_DIR.value:
    _train(_CHILD_DIR.value)
    return
  with tempfile.TemporaryDirectory(prefix="tfps_dump_") as dump_dir:
    env = dict(os.environ, TF_DUMP_GRAPH_PREFIX=dump_dir, TF_DUMP_GRAPH_NAME_FILTER="*", TF_DUMP_GRAPH_GROUPS="main",
               TF_CPP_MIN_LOG_LEVEL="2")
    args = [sys.executable, os.path.abspath(__file__), f"--path={_PATH.value}", f"--batch_size={_BATCH.value}",
            f"--child_dump_dir={dump_dir}"] + ([f"--steps_per_execution={_SPE.value}"] if _SPE.value else [])
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)
    result = dict(count(dump_dir), path=_PATH.value, batch_size=_BATCH.value)
  for name in result.pop("per_step_names") if not _JSON.value else result["per_step_names"]:
    print(name)
  print(json.dumps({k: v for k, v in result.items() if k != "per_step_names"}, indent=1))
  if _JSON.value:
    with open(_JSON.value, "w", encoding="utf-8") as out:
      json.dump(result, out, indent=2)


if __name__ == "__main__":
  app.run(main)
