"""A run moved between numbers of ps (1 -> 2 -> 3 -> 1), on both training paths, with real processes.

Three ps and one worker serve for the whole module; each run is a chief process given a subset of the ps (as a run
moved to a smaller or larger ps tier is), resuming from the model_dir the previous run left. The data are the same
batches in the same order everywhere, so the first step of a resumed run must have the loss of the checkpoint it
resumed from on the first batch, which the sidecar evaluator / the Estimator's local evaluation computes here, in a
plain process, from checkpoints written on 1, 2 and 3 ps.
"""

import os
import pathlib
import signal
import subprocess
import sys

from fixtures import reshard_model
import numpy as np
import portpicker
import pytest
import tensorflow as tf

import tfps
from tfps.testing import host_forks
from tfps.training import checkpoints as checkpoints_lib

TASK = pathlib.Path(__file__).parent / "fixtures" / "reshard_task.py"
NUM_PS = 3
# (ps used, train until step, extra flags): 1 -> 2 -> 3 -> 1 ps, through sync, geo and async training; the last run
# keeps 3 shards on its single ps. Keras: legacy Adam (geo takes legacy optimizers only); Estimator: Adagrad.
# tf-keras's current Adam across shard counts: tests/test_resharding.py.
PLAN = [(1, 1, []), (2, 2, ["--sync_mode=sync"]), (3, 3, ["--sync_mode=geo", "--geo_steps=1"]),
        (1, 4, ["--num_shards=3"])]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
  """Three ps and one worker, killed (and waited for) at the end; every process of the module (these and the chiefs)
  forks from one import of TensorFlow (`start`)."""
  # The fixtures' folder too: the fork server imports the task's imports (reshard_model) before the task runs.
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
      [str(pathlib.Path(__file__).parents[1]), str(TASK.parent), os.environ.get("PYTHONPATH", "")]))
  ps = [f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(NUM_PS)]
  worker = f"127.0.0.1:{portpicker.pick_unused_port()}"
  logs = tmp_path_factory.mktemp("servers")
  forks = host_forks.HostForks()
  processes = []
  try:
    for job, index in [("ps", k) for k in range(NUM_PS)] + [("worker", 0)]:
      processes.append(_start(forks, [f"--job_name={job}", f"--task_index={index}", f"--ps_hosts={','.join(ps)}",
                                      f"--worker_hosts={worker}"], env, logs / f"{job}{index}.log"))
    yield {"ps": ps, "worker": worker, "env": env, "forks": forks}
  finally:
    for process in processes:  # SIGKILL: nothing of a server is kept
      os.kill(process.pid, signal.SIGKILL)
    for process in processes:
      process.wait()
    forks.close()


def _start(forks, args, env, out, err=None):
  """TASK with `args`, forked (else a fresh process), its stdout to file `out` and its stderr to `err` (or `out`)."""
  argv = [sys.executable, str(TASK), *args]
  with open(out, "wb") as stdout, open(err or os.devnull, "wb") as stderr:
    options = {"env": env, "stdout": stdout, "stderr": stderr if err else subprocess.STDOUT,
               "stdin": subprocess.DEVNULL}
    return forks.spawn(None, argv, options) or subprocess.Popen(argv, **options)


def _start_chief(servers, num_ps, *flags):
  """The chief with `flags`; its stdout and stderr go to files beside its --loss_file (`_finish` reads them)."""
  loss_file = next(flag for flag in flags if flag.startswith("--loss_file=")).split("=", 1)[1]
  outputs = pathlib.Path(f"{loss_file}.stdout"), pathlib.Path(f"{loss_file}.stderr")
  process = _start(servers["forks"], [
      "--job_name=chief", "--task_index=0", f"--ps_hosts={','.join(servers['ps'][:num_ps])}",
      f"--worker_hosts={servers['worker']}", f"--chief_hosts=127.0.0.1:{portpicker.pick_unused_port()}",
      "--min_shard_bytes=0", *flags], servers["env"], *outputs)
  process.outputs = outputs
  return process


def _finish(process) -> subprocess.CompletedProcess:
  try:
    process.wait(timeout=300)
  finally:
    if process.poll() is None:
      os.kill(process.pid, signal.SIGKILL)
      process.wait()
  stdout, stderr = (path.read_text(errors="replace") for path in process.outputs)
  return subprocess.CompletedProcess(process.pid, process.returncode, stdout, stderr)


def _chief(servers, num_ps, *flags) -> subprocess.CompletedProcess:
  return _finish(_start_chief(servers, num_ps, *flags))


def _run_plan(servers, tmp_path, path, *flags):
  """Runs PLAN in one model_dir; returns it and the loss of each run's first step."""
  model_dir, firsts = tmp_path / "run", []
  for run, (num_ps, steps, extra) in enumerate(PLAN):
    loss_file = tmp_path / f"losses{run}"
    done = _chief(servers, num_ps, f"--path={path}", f"--model_dir={model_dir}", f"--steps={steps}",
                  f"--loss_file={loss_file}", *flags, *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = loss_file.read_text().split()
    # One step left to run, run once. A geo round first runs the model_fn forward (TRAIN mode, embeddings answering
    # zeros) to find the rows it touches: the Estimator path's model_fn logs that loss too, before the step's.
    discovery = path == "estimator" and "--sync_mode=geo" in extra
    assert len(logged) == 1 + discovery, (run, logged)
    firsts.append(float(logged[-1]))
  return model_dir, firsts


def _assert_resumed_where_saved(firsts, saved_losses):
  """The first step of each resumed run (k >= 1) saw the weights of the checkpoint the run before left (`ckpt-k`,
  whose loss is `saved_losses[k - 1]`)."""
  for run in range(1, len(PLAN)):
    assert abs(firsts[run] - saved_losses[run - 1]) < 1e-6, (run, firsts, saved_losses)


def test_keras_run_moves_between_ps_counts(servers, tmp_path):
  model_dir, firsts = _run_plan(servers, tmp_path, "keras", "--optimizer=adam")
  marker = checkpoints_lib.read_final_marker(str(model_dir))
  assert marker["step"] == 4  # every step applied and counted once over the four runs

  # A chief refused the checkpoint of a model of another shape, meanwhile: it reads the model_dir and writes nothing.
  refused = _start_chief(servers, 2, "--path=keras", f"--model_dir={model_dir}", "--steps=5", "--embedding_dim=5",
                         f"--loss_file={tmp_path / 'refused'}", "--optimizer=adam")

  def build():
    return reshard_model.build_model("adam")

  try:
    evaluations = tfps.run_sidecar_evaluator(build, reshard_model.first_batch, str(model_dir),
                                             evaluate_every_checkpoint=True, idle_timeout_secs=30)
    assert [entry["step"] for entry in evaluations] == [1, 2, 3, 4]  # saved on 1, 2, 3 and 1 ps
    _assert_resumed_where_saved(firsts, [float(entry["metrics"]["loss"]) for entry in evaluations])

    exported = tfps.export_saved_model(build, str(tmp_path / "export"), model_dir=str(model_dir),
                                       dataset_fn=reshard_model.first_batch)
    restored = build()
    features = next(iter(reshard_model.first_batch()))[0]
    restored(features)
    tf.train.Checkpoint(model=restored).read(marker["last_checkpoint"]).expect_partial()
    served = tf.saved_model.load(exported).signatures["serving_default"](**features)
    np.testing.assert_allclose(list(served.values())[0].numpy(), restored(features).numpy(), atol=1e-6)
  finally:
    refused = _finish(refused)
  assert refused.returncode == 2
  last_line = refused.stderr.strip().splitlines()[-1]
  assert "ckpt-4 does not fit this model" in last_line and "[800, 4] in the checkpoint and [800, 5]" in last_line
  assert "Traceback" not in refused.stderr
  assert not (tmp_path / "refused").exists()  # no step ran


def test_estimator_run_moves_between_ps_counts(servers, tmp_path):
  model_dir, firsts = _run_plan(servers, tmp_path, "estimator", "--optimizer=adagrad")
  estimator = tfps.Estimator(reshard_model.build_model_fn("adagrad"), model_dir=str(model_dir))
  checkpoints = checkpoints_lib.list_checkpoints(str(model_dir))
  assert [checkpoints_lib.checkpoint_number(path) for path in checkpoints] == [1, 2, 3, 4]
  saved_losses = [estimator.evaluate(reshard_model.dataset, steps=1, checkpoint_path=path)["loss"]
                  for path in checkpoints]
  _assert_resumed_where_saved(firsts, saved_losses)
  exported = estimator.export_saved_model(
      str(tmp_path / "export"), {name: tf.TensorSpec([None], tf.int64) for name in reshard_model.CATEGORICAL}
      | {"dense": tf.TensorSpec([None, 2], tf.float32)})
  features = next(iter(reshard_model.first_batch()))[0]
  served = tf.saved_model.load(exported).signatures["serving_default"](**features)
  expected = next(estimator.predict(lambda: tf.data.Dataset.from_tensors(features), yield_single_examples=False))
  np.testing.assert_allclose(served["probabilities"].numpy(), expected["probabilities"], atol=1e-6)
