"""What a run's start costs when its model has a dynamic table and a compiled metric: `tfps.fit` of 10 steps (1 epoch)
of tests/test_dynamic_embedding_modes.py's model on an in-process 2 ps + 2 worker cluster, per mode given, in one
process, printing the table layer's calls (traces, the build and any eager call) and the CPU seconds of the fit; a
mode `estimator_<mode>` runs that file's model_fn for 20 steps with `tfps.train_and_evaluate` instead, and counts the
model_fn's calls; `estimator_build` trains that model_fn for 2 steps and prints the CPU seconds of the start alone
(the trace that makes the variables, the restore check and the runner's build).

  .venv/bin/python bench/fit_traces.py async sync geo async   # the first fit of a process also warms it up
  .venv/bin/python bench/fit_traces.py estimator_async estimator_geo
  .venv/bin/python bench/fit_traces.py estimator_build estimator_build estimator_build
"""

import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.estimator import distributed  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.models import dynamic_embedding  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.testing import in_process  # pylint: disable=g-import-not-at-top,wrong-import-position
import test_dynamic_embedding_modes as workload  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(modes):
  cluster = in_process.local_cluster(num_workers=2, num_ps=2)
  calls = {"n": 0, "layer": True}  # "layer": count the table layer's calls (a fit), else the model_fn's
  call = dynamic_embedding.DynamicEmbedding.call

  def counted(self, *args, **kwargs):
    calls["n"] += calls["layer"]
    return call(self, *args, **kwargs)

  dynamic_embedding.DynamicEmbedding.call = counted
  for mode in modes:
    calls["n"], calls["layer"], start = 0, not mode.startswith("estimator_"), time.process_time()
    if mode == "estimator_build":
      _estimator_build(cluster)
      continue
    if not calls["layer"]:
      _estimator(mode.removeprefix("estimator_"), cluster, calls)
    else:
      sync_mode = tfps.TrainingMode(mode, geo_steps=5) if mode == "geo" else mode
      tfps.fit(workload.build_model, workload.dataset_fn, epochs=1, steps_per_epoch=10, sync_mode=sync_mode,
               cluster=cluster)
    print(f"MODE {mode} calls {calls['n']} cpu {time.process_time() - start:.2f}", flush=True)


def _estimator(sync_mode, cluster, calls):
  def model_fn(features, labels, mode, params):
    calls["n"] += 1
    return workload.model_fn(features, labels, mode, params)

  config = tfps.RunConfig(save_checkpoints_steps=1000, sync_mode=sync_mode,
                          **({"geo_steps": 5} if sync_mode == "geo" else {}))
  estimator = tfps.Estimator(model_fn, model_dir=tempfile.mkdtemp(), config=config, cluster=cluster)
  tfps.train_and_evaluate(estimator, tfps.TrainSpec(workload.train_input_fn, max_steps=20),
                          tfps.EvalSpec(workload.eval_input_fn, steps=None, throttle_secs=0))


def _estimator_build(cluster):
  build = distributed.DistributedModel._build
  spent = []

  def timed(self, iterator):
    start = time.process_time()
    build(self, iterator)
    spent.append(time.process_time() - start)

  distributed.DistributedModel._build = timed
  try:
    estimator = tfps.Estimator(workload.model_fn, model_dir=tempfile.mkdtemp(), cluster=cluster)
    estimator.train(workload.train_input_fn, max_steps=2)
  finally:
    distributed.DistributedModel._build = build
  print(f"MODE estimator_build cpu {spent[0]:.2f}", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:] or ["async"])
