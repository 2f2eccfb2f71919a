"""The plain-PSS peer: tf-keras `Model.fit` under ParameterServerStrategy as TensorFlow's tutorial writes it, no tfps.

Nothing of tfps's cluster or training code runs here: the cluster comes from `TF_CONFIG`
(`TFConfigClusterResolver`), the variables are split by the tutorial's
`MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=number of ps)` (variables under 256 KiB stay whole;
`--partitioner=fixed`: `FixedShardsPartitioner(number of ps)`, every variable split, the peer measured before), the
input is a `DatasetCreator`, the model is built and compiled (legacy Adagrad, `steps_per_execution=20`) under
`strategy.scope()`, and every process runs with `GRPC_FAIL_FAST=use_caller`. Only the workload (the Wide&Deep model
and its in-memory batches of `bench/workload.py`) is shared with the tfps variants, so both train the same thing.

Started without `TF_CONFIG`, this script is its own launcher: it picks free ports on 127.0.0.1, starts `--num_ps` ps
and `--num_workers` worker processes of itself (each a `tf.distribute.Server` with its `TF_CONFIG`), waits until they
listen, starts the chief, and stops the servers when the chief is done. As `tfps-launch` does by default, it imports
TensorFlow once and forks each task from itself (`--fork_tasks`; a forked task's `/proc/<pid>/environ` has no
TF_CONFIG, so it names each task's pid in `<--task_log_dir>/tasks.json`, as `tfps-launch` does); `--nofork_tasks`
starts a fresh Python per task. The chief writes the same JSON as
`train_bench.py` (`--benchmark_json`): examples/s over `--measure` windows of `--steps` steps after a warm-up window.
With `--path=ps_floor` the chief trains the same workload with a loop written directly in TensorFlow instead, nothing
on the ps but the work any such training must do there (`bench/ps_floor_train.py`): the ps's floor.

  .venv/bin/python bench/plain_pss_train.py --num_ps=1 --num_workers=1 --batch_size=256 --steps=200 --task_log_dir=/tmp/plain_pss
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf-keras: Keras 3 has no ParameterServerStrategy
os.environ["GRPC_FAIL_FAST"] = "use_caller"  # the tutorial's setting: a dead task is reported, not waited for
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

_NUM_PS = flags.DEFINE_integer("num_ps", 1, "ps processes (launcher).", lower_bound=1)
_NUM_WORKERS = flags.DEFINE_integer("num_workers", 1, "Worker processes (launcher).", lower_bound=1)
_LOG_DIR = flags.DEFINE_string("task_log_dir", None, "Folder of every task's log (launcher; default: inherit stdout).")
_PATH = flags.DEFINE_enum("path", "keras_pss", ["keras_pss", "ps_floor"], "keras_pss: tf-keras Model.fit (the peer); "
                          "ps_floor: a loop written directly in TensorFlow, nothing on the ps but the work it must do "
                          "(`bench/ps_floor_train.py`).")
_PARTITIONER = flags.DEFINE_enum(
    "partitioner", "min_size", ["min_size", "fixed"], "keras_pss: min_size is the tutorial's "
    "MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=number of ps); fixed is FixedShardsPartitioner(number "
    "of ps), which splits every variable, small dense kernels and biases too.")
_PACKED_DENSE = flags.DEFINE_boolean("packed_dense", False, "ps_floor: the dense variables in one variable.")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step (per worker).", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_size", 100_000, "Rows of each categorical feature's table.", lower_bound=1)
_STACK = flags.DEFINE_boolean("stack_tables", True, "One deep and one wide table for all features.")
_STEPS = flags.DEFINE_integer("steps", 200, "Steps per measured window (and of the warm-up).", lower_bound=1)
_MEASURE = flags.DEFINE_integer("measure", 3, "Measured windows after the warm-up.", lower_bound=1)
_SPE = flags.DEFINE_integer("steps_per_execution", 20, "Steps per scheduled function.", lower_bound=1)
_JSON = flags.DEFINE_string("benchmark_json", None, "Where the chief writes its measurements.")
_LINGER = flags.DEFINE_float("linger_secs", 1.5, "Seconds the chief waits before exiting (the driver reads the "
                             "servers' memory peaks meanwhile).", lower_bound=0)
_FORK = flags.DEFINE_boolean("fork_tasks", True, "Launcher: fork each task from this process after one import of "
                             "TensorFlow, as tfps-launch's default --fork_tasks does; else a fresh Python per task.")
_START_SECS = flags.DEFINE_float("start_timeout_secs", 60.0, "Seconds the servers may take to listen (launcher).",
                                 lower_bound=1)


def _wait_listening(address: str, deadline: float) -> None:
  host, port = address.rsplit(":", 1)
  while True:
    try:
      with socket.create_connection((host, int(port)), timeout=1.0):
        return
    except OSError:
      if time.monotonic() > deadline:
        raise SystemExit(f"plain_pss_train: {address} did not listen within {_START_SECS.value:g}s (see the task "
                         "logs in --task_log_dir)") from None
      time.sleep(0.1)


class _ForkedTask:
  """A task forked from the launcher (after its one import of TensorFlow), with the bits of `subprocess.Popen` that
  `launch` uses: the child runs `main` with `tf_config` in its environment and its output in `log`."""

  def __init__(self, tf_config: str, log):
    sys.stdout.flush()
    sys.stderr.flush()
    self.pid = os.fork()
    if self.pid:
      return
    status = 1
    try:
      os.environ["TF_CONFIG"] = tf_config
      if log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
      main([])
      status = 0
    except SystemExit as e:  # as Python ends on it: a status, or a message on stderr and status 1
      if e.code is None or isinstance(e.code, int):
        status = e.code or 0
      else:
        print(e.code, file=sys.stderr)
    except Exception:  # pylint: disable=broad-except  (a task's failure is its exit status, as in a fresh Python)
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(status)  # pylint: disable=protected-access

  def terminate(self) -> None:
    os.kill(self.pid, signal.SIGTERM)

  def wait(self) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def launch() -> int:
  """Starts the cluster as processes of this script with their TF_CONFIG; returns the chief's exit code."""
  import portpicker  # pylint: disable=g-import-not-at-top
  cluster = {"chief": [f"127.0.0.1:{portpicker.pick_unused_port()}"],
             "ps": [f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(_NUM_PS.value)],
             "worker": [f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(_NUM_WORKERS.value)]}
  if _LOG_DIR.value:
    os.makedirs(_LOG_DIR.value, exist_ok=True)

  if _FORK.value:
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import  (once, for every forked task)
    import tf_keras  # pylint: disable=g-import-not-at-top,unused-import
  pids = {}

  def start(job: str, index: int):
    tf_config = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
    log = open(os.path.join(_LOG_DIR.value, f"{job}-{index}.log"), "w", encoding="utf-8") if _LOG_DIR.value else None
    try:
      if _FORK.value:
        process = _ForkedTask(tf_config, log)
      else:
        process = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:],
                                   env=dict(os.environ, TF_CONFIG=tf_config), stdout=log,
                                   stderr=subprocess.STDOUT if log else None, stdin=subprocess.DEVNULL)
    finally:
      if log:
        log.close()
    pids[f"{job}:{index}"] = process.pid
    if _LOG_DIR.value:  # as tfps-launch names its tasks (bench/runner.py finds them by it)
      with open(os.path.join(_LOG_DIR.value, "tasks.json"), "w", encoding="utf-8") as tasks:
        json.dump(pids, tasks)
    return process

  servers = [start(job, index) for job in ("ps", "worker") for index in range(len(cluster[job]))]
  try:
    deadline = time.monotonic() + _START_SECS.value
    for address in cluster["ps"] + cluster["worker"]:
      _wait_listening(address, deadline)
    return start("chief", 0).wait()
  finally:
    for server in servers:
      server.terminate()
    for server in servers:
      server.wait()


def serve(task: dict) -> None:
  """A ps or worker: a `tf.distribute.Server` of the cluster in TF_CONFIG, until stopped."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  config = None
  if _PATH.value == "ps_floor":  # idle threads sleep, as in tfps's tasks: the floor is the ps's work, not spinning
    config = tf.compat.v1.ConfigProto()
    config.experimental.disable_thread_spinning = True
  server = tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"], task_index=task["index"],
                                protocol=resolver.rpc_layer or "grpc", config=config, start=True)
  server.join()


def train() -> dict:
  """The chief: Model.fit under ParameterServerStrategy, timed per epoch."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  from bench import epoch_timer  # pylint: disable=g-import-not-at-top
  from bench import workload as workload_lib  # pylint: disable=g-import-not-at-top
  workload = workload_lib.Workload(batch_size=_BATCH.value, vocab_size=_VOCAB.value, stack_tables=_STACK.value)
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  num_ps = resolver.cluster_spec().num_tasks("ps")
  partitioners = tf.distribute.experimental.partitioners
  if _PARTITIONER.value == "fixed":
    partitioner = partitioners.FixedShardsPartitioner(num_ps)
  else:  # TensorFlow's parameter-server tutorial: small variables are not split
    partitioner = partitioners.MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=num_ps)
  strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
  with strategy.scope():
    model = workload_lib.build_model(workload)  # Wide&Deep, compiled with legacy Adagrad and no metrics
    model.compile(optimizer=model.optimizer, loss=model.loss, steps_per_execution=_SPE.value)
  timer = epoch_timer.EpochTimer()
  model.fit(tf_keras.utils.experimental.DatasetCreator(workload_lib.dataset_fn(workload)),
            epochs=1 + _MEASURE.value, steps_per_epoch=_STEPS.value, callbacks=[timer.callback], verbose=0)
  wall = sum(timer.seconds)
  return dict(epoch_timer.rates(timer.seconds, _STEPS.value * _BATCH.value, _STEPS.value),
              steps_per_execution=_SPE.value, num_ps=num_ps, chief_cpu_share=sum(timer.cpu) / wall,
              partitioner=_PARTITIONER.value,
              variable_pieces=sum(len(getattr(v, "variables", [v])) for v in model.variables),
              measured_span=timer.span,
              # what of tfps this process loaded: the workload's model and schema only, never its training code
              tfps_modules=sorted(name for name in sys.modules if name.split(".")[0] == "tfps"))


def main(argv):
  del argv
  tf_config = os.environ.get("TF_CONFIG")
  if not tf_config:
    sys.exit(launch())
  task = json.loads(tf_config)["task"]
  if task["type"] != "chief":
    serve(task)
    return
  if _PATH.value == "ps_floor":
    from bench import ps_floor_train  # pylint: disable=g-import-not-at-top
    result = ps_floor_train.train(_BATCH.value, _VOCAB.value, _STEPS.value, _MEASURE.value, _SPE.value,
                                  packed_dense=_PACKED_DENSE.value)
  else:
    result = train()
  result = dict(result, path=_PATH.value, batch_size=_BATCH.value, vocab_size=_VOCAB.value,
                stack_tables=_STACK.value, steps=_STEPS.value)
  from bench import chief_result  # pylint: disable=g-import-not-at-top
  chief_result.write_and_exit(result, _JSON.value, _LINGER.value)


if __name__ == "__main__":
  app.run(main)
