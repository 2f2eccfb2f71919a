"""One benchmark run of one training path; writes its measurements as JSON (`--benchmark_json`).

Every role of a cluster runs this script (under `tfps-launch`, or per role with tfps's cluster flags); the chief
measures. `--path`:

* `single`: tf-keras `Model.fit` in this process, no strategy, no cluster (run it directly, not under tfps-launch);
* `fit`: `tfps.fit`; also the time the chief spends inside `ClusterCoordinator.schedule` and its CPU time;
* `estimator`: `tfps.Estimator.train` with the same model as a model_fn (windows of one step-log line each);
* `tutorial`: the hand-written loop of TensorFlow's PSS tutorial: one step per `schedule`, its loss fetched every step;
* `trivial`: scheduled functions per second of a function that does nothing;
* `idle`: connects to the cluster and waits (a ps's baseline memory).

Examples/s are measured after a warm-up (the first epoch or `--steps` steps: tracing, variable creation) over
`--measure` further windows of `--steps` steps each; the JSON holds each window's rate and their median.
"""

import os
import statistics
import sys
import tempfile
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position

tfps.define_flags()
tfps.define_mode_flags()
_PATH = flags.DEFINE_enum("path", "fit", ["single", "fit", "estimator", "tutorial", "trivial", "idle"],
                          "What to measure.")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step (per worker).", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab_size", 100_000, "Rows of each categorical feature's table.", lower_bound=1)
_BIG_TABLE = flags.DEFINE_integer("big_table_rows", 0, "Rows of C1's table (0: --vocab_size).", lower_bound=0)
_STACK = flags.DEFINE_boolean("stack_tables", True, "One deep and one wide table for all 26 features (else one per "
                               "feature).")
_STEPS = flags.DEFINE_integer("steps", 200, "Steps per measured window (and of the warm-up).", lower_bound=1)
_MEASURE = flags.DEFINE_integer("measure", 3, "Measured windows after the warm-up.", lower_bound=1)
_SPE = flags.DEFINE_integer("steps_per_execution", None, "Steps per scheduled function (default: the path's own).",
                            lower_bound=1)
_JSON = flags.DEFINE_string("benchmark_json", None, "Where the chief writes its measurements.")
_LINGER = flags.DEFINE_float("linger_secs", 1.5, "Seconds the chief waits before exiting (so that a driver reads "
                             "the ps memory peaks while the cluster still runs).", lower_bound=0)


def _workload():
  from bench import workload  # pylint: disable=g-import-not-at-top
  return workload.Workload(batch_size=_BATCH.value, vocab_size=_VOCAB.value, big_table_rows=_BIG_TABLE.value,
                           stack_tables=_STACK.value)


def _rates(seconds, batches_per_step: int = 1):
  from bench import epoch_timer  # pylint: disable=g-import-not-at-top
  return epoch_timer.rates(seconds, _STEPS.value * _BATCH.value * batches_per_step, _STEPS.value)


def _epoch_timer():
  from bench import epoch_timer  # pylint: disable=g-import-not-at-top
  return epoch_timer.EpochTimer(_SCHEDULE_SECS)


_SCHEDULE_SECS = [0.0]


def _time_schedule_calls() -> None:
  """Counts the seconds the chief spends inside `ClusterCoordinator.schedule` (the Python side of the coordinator)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cls = tf.distribute.experimental.coordinator.ClusterCoordinator
  schedule = cls.schedule

  def timed(self, *args, **kwargs):
    start = time.perf_counter()
    try:
      return schedule(self, *args, **kwargs)
    finally:
      _SCHEDULE_SECS[0] += time.perf_counter() - start

  cls.schedule = timed


def run_single() -> dict:
  """tf-keras `Model.fit` with no strategy: the ceiling of one process on this machine."""
  from bench import workload as workload_lib  # pylint: disable=g-import-not-at-top
  workload = _workload()
  model = workload_lib.build_model(workload)
  model.compile(optimizer=model.optimizer, loss=model.loss, steps_per_execution=_SPE.value or 20)
  timer = _epoch_timer()
  model.fit(workload_lib.dataset(workload), epochs=1 + _MEASURE.value, steps_per_epoch=_STEPS.value,
            callbacks=[timer.callback], verbose=0)
  return dict(_rates(timer.seconds), steps_per_execution=_SPE.value or 20, measured_span=timer.span,
              cpu_secs_per_step=sum(timer.cpu) / (_STEPS.value * _MEASURE.value),
              process_cores=sum(timer.cpu) / sum(timer.seconds))


def run_fit(config) -> dict:
  """`tfps.fit`, timed per epoch; the chief's time in `schedule` and its CPU time per measured epoch."""
  from bench import workload as workload_lib  # pylint: disable=g-import-not-at-top
  from tfps.training import modes  # pylint: disable=g-import-not-at-top
  workload = _workload()
  _time_schedule_calls()
  timer = _epoch_timer()
  tfps.fit(lambda: workload_lib.build_model(workload), workload_lib.dataset_fn(workload), epochs=1 + _MEASURE.value,
           steps_per_epoch=_STEPS.value, callbacks=[timer.callback], steps_per_execution=_SPE.value,
           batch_size=workload.batch_size, cluster=config, sync_mode=tfps.mode_from_flags(),
           strategy_options=tfps.strategy_options_from_flags())
  wall = sum(timer.seconds)
  mode = tfps.mode_from_flags()
  batches_per_step = mode.replicas(config.num_workers) if mode.sync_mode == "sync" else 1  # a sync step averages
  return dict(_rates(timer.seconds, batches_per_step), sync_mode=mode.sync_mode,
              examples_per_step=batches_per_step * workload.batch_size,
              steps_per_execution=_SPE.value or modes.DEFAULT_STEPS_PER_EXECUTION,
              chief_schedule_share=sum(timer.schedule) / wall, chief_cpu_share=sum(timer.cpu) / wall,
              measured_span=timer.span)


def _time_log_lines() -> list:
  """Records `(time.time(), time.perf_counter(), CPU seconds, seconds inside schedule)` at every step-log line of the
  coordinator loop (after each chunk's join, as a tf-keras epoch ends after its join): the Estimator path's windows,
  timed as fit's epochs."""
  from bench import epoch_timer  # pylint: disable=g-import-not-at-top
  from tfps.training import loop  # pylint: disable=g-import-not-at-top
  marks = []
  log = loop.TrainLoop._log  # pylint: disable=protected-access

  def timed(self, *args, **kwargs):
    marks.append((time.time(), time.perf_counter(), epoch_timer.cpu_secs(), _SCHEDULE_SECS[0]))
    return log(self, *args, **kwargs)

  loop.TrainLoop._log = timed  # pylint: disable=protected-access
  return marks


def run_estimator(config) -> dict:
  """`tfps.Estimator.train`, one step-log line per window (each after the join of its chunk); windows after the
  first (the warm-up) are measured, as fit's epochs."""
  from bench import workload as workload_lib  # pylint: disable=g-import-not-at-top
  workload = _workload()
  spe = _SPE.value or tfps.RunConfig().steps_per_execution
  total = (1 + _MEASURE.value) * _STEPS.value
  marks = _time_log_lines()
  _time_schedule_calls()
  with tempfile.TemporaryDirectory(prefix="tfps_bench_estimator_") as model_dir:
    mode = tfps.mode_from_flags()
    run_config = tfps.RunConfig(save_checkpoints_steps=10 * total, log_step_count_steps=_STEPS.value,
                                steps_per_execution=spe, mode=mode)
    estimator = tfps.Estimator(workload_lib.build_model_fn(workload), model_dir=model_dir, config=run_config,
                               cluster=config, strategy_options=tfps.strategy_options_from_flags())

    def input_fn(input_context):
      del input_context
      return workload_lib.dataset(workload)

    estimator.train(input_fn, max_steps=total)
  if len(marks) != 1 + _MEASURE.value:
    raise RuntimeError(f"expected {1 + _MEASURE.value} step-log lines (one per window), got {len(marks)}")
  seconds = [later[1] - earlier[1] for earlier, later in zip(marks, marks[1:])]
  wall = marks[-1][1] - marks[0][1]
  return dict(_rates(seconds), steps_per_execution=spe, measured_span=[marks[0][0], marks[-1][0]],
              chief_schedule_share=(marks[-1][3] - marks[0][3]) / wall,
              chief_cpu_share=(marks[-1][2] - marks[0][2]) / wall)


def run_tutorial(config) -> dict:
  """TensorFlow's PSS tutorial loop: `schedule` one step, `fetch` its loss, repeat."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  from bench import workload as workload_lib  # pylint: disable=g-import-not-at-top
  workload = _workload()
  strategy, coordinator = tfps.build_strategy(config)
  with strategy.scope():
    model = workload_lib.build_model(workload)
  optimizer, loss_fn = model.optimizer, tf_keras.losses.BinaryCrossentropy(
      from_logits=True, reduction=tf_keras.losses.Reduction.NONE)

  @tf.function
  def step_fn(iterator):
    def replica_fn(batch):
      features, labels = batch
      with tf.GradientTape() as tape:
        logits = model(features, training=True)
        loss = tf.nn.compute_average_loss(loss_fn(tf.reshape(labels, [-1, 1]), logits))
      gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))
      return loss

    losses = strategy.run(replica_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

  def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(workload_lib.dataset_fn(workload))

  iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))
  seconds = []
  for window in range(1 + _MEASURE.value):
    start = time.perf_counter()
    for _ in range(_STEPS.value):
      coordinator.schedule(step_fn, args=(iterator,)).fetch()
    if window:
      seconds.append(time.perf_counter() - start)
  return dict(_rates(seconds), steps_per_execution=1)


def run_trivial(config, calls: int = 2000) -> dict:
  """Scheduled functions per second of `tf.constant(1)`: `calls` scheduled back to back, then one join."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  _, coordinator = tfps.build_strategy(config)

  @tf.function
  def trivial():
    return tf.constant(1)

  coordinator.schedule(trivial).fetch()
  rates, schedule_secs = [], []
  for _ in range(_MEASURE.value):
    start = time.perf_counter()
    for _ in range(calls):
      coordinator.schedule(trivial)
    scheduled = time.perf_counter()
    coordinator.join()
    rates.append(calls / (time.perf_counter() - start))
    schedule_secs.append((scheduled - start) / calls)
  return {"functions_per_sec": statistics.median(rates), "window_functions_per_sec": rates,
          "schedule_call_secs": statistics.median(schedule_secs)}


def run_idle(config) -> dict:
  tfps.build_strategy(config)
  time.sleep(2.0)
  return {}


def main(argv):
  del argv
  if _PATH.value == "single":
    result = run_single()
  else:
    paths = {"fit": run_fit, "estimator": run_estimator, "tutorial": run_tutorial, "trivial": run_trivial,
             "idle": run_idle}
    result = tfps.run_task(paths[_PATH.value], cluster=tfps.config_from_flags(), **tfps.server_options_from_flags())
  result = dict(result, path=_PATH.value, batch_size=_BATCH.value, vocab_size=_VOCAB.value,
                big_table_rows=_BIG_TABLE.value, stack_tables=_STACK.value, steps=_STEPS.value)
  from bench import chief_result  # pylint: disable=g-import-not-at-top
  chief_result.write_and_exit(result, _JSON.value, _LINGER.value)


if __name__ == "__main__":
  app.run(main)
