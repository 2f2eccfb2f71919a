"""Online training: a bundled model (Wide&Deep, DCN) trained without end on a stream, on the Estimator path or
(--path=keras) the Keras path, in async or (--sync_mode=sync) sync mode.

  tfps-launch --num_ps=1 --num_workers=2 scripts/train_online.py -- --stream=kafka --kafka_bootstrap=broker:9092 \
      --kafka_topic=clicks --data=csv --feature_spec=clicks.spec.json --model=dcn --model_dir=/shared/online
  (brokers on another host: add --expose_ports to tfps-launch, whose tasks otherwise see only loopback)

Every message is applied exactly once: each checkpoint holds the offsets after the examples it holds, a restarted
chief reads on from them, and offsets are committed to --kafka_group only after the checkpoint that holds them.
SIGTERM ends training after the steps in flight with a checkpoint. --stream=folder reads slices appearing in
--stream_folder instead. With --stream_holdout_every=K about one message in K is held out, and
--stream_eval_every_steps/secs evaluate the newest checkpoint on the newest of them; the same script run as the
evaluator task (tfps-launch --evaluator) is the sidecar: it evaluates every checkpoint on the held-out window current
at it (both paths). --delta_export_secs=T (both paths) writes a delta of the changed rows every T seconds
to model_dir/deltas (docs/delta_export.md); with --serve_deltas=DIR the chief also runs `tfps-delta watch` keeping DIR
current, and the run's summary gives the freshness of the versions it served (from a message's write to the version
serving it). See docs/online.md.
"""

import contextlib
import dataclasses
import os
import subprocess
import sys
import time

from absl import flags

import tfps
from tfps import checks
from tfps.cli import model_flags
from tfps.cli import stream_flags

tfps.define_flags()
tfps.define_mode_flags()
stream_flags.define_stream_flags()  # before the model flags: with --stream no training files are needed
model_flags.define_model_flags()
_MODEL_DIR = flags.DEFINE_string("model_dir", "/tmp/tfps_online", "Checkpoints (with the stream's offsets), logs.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", None, "Stop at this global step (default: never; SIGTERM stops).",
                                  lower_bound=1)
_CHECKPOINT_STEPS = flags.DEFINE_integer("save_checkpoints_steps", 1000, "Steps between checkpoints.", lower_bound=1)
_LOG_STEPS = flags.DEFINE_integer("log_step_count_steps", 100, "Steps between progress lines.", lower_bound=1)
_STEPS_PER_EXECUTION = flags.DEFINE_integer("steps_per_execution", None, "Async: steps per scheduled function "
                                            "(default 20).", lower_bound=1)
_PATH = flags.DEFINE_enum("path", "estimator", ["estimator", "keras"], "The training path: a model_fn on the "
                          "Estimator path, or the compiled tf-keras model (tfps.keras.online.train_on_stream).")
_DELTA_EXPORT_SECS = flags.DEFINE_float(
    "delta_export_secs", None, "Seconds between delta exports of the changed rows to model_dir/deltas, each with the "
    "stream position of its examples (default: none; docs/delta_export.md). Both paths.", lower_bound=0)
_SERVE_DELTAS = flags.DEFINE_string(
    "serve_deltas", None, "With --delta_export_secs: the chief runs `tfps-delta watch model_dir/deltas --serving=DIR` "
    "while it trains, and the run's summary gives each served version's freshness (docs/delta_export.md).")


def main(argv):
  del argv
  mode = tfps.mode_from_flags()
  fv = flags.FLAGS
  if not fv.stream:
    raise tfps.UsageError("scripts/train_online.py trains on a stream: give --stream=kafka or --stream=folder")
  if _SERVE_DELTAS.value and _DELTA_EXPORT_SECS.value is None:
    raise tfps.UsageError(f"--serve_deltas={_SERVE_DELTAS.value} serves delta exports: give --delta_export_secs too")
  from tfps.training import online  # pylint: disable=g-import-not-at-top
  online.check_mode(mode)  # on every task: a mode a stream cannot train in ends the run, not only its chief
  if _PATH.value == "keras":
    tfps.run_task(lambda cluster: _train_keras(cluster, mode), evaluator_fn=_evaluate_keras,
                  cluster=tfps.config_from_flags(), **tfps.server_options_from_flags())
  else:
    tfps.run_task(lambda cluster: _train_estimator(cluster, mode), evaluator_fn=lambda c: _evaluate_estimator(c, mode),
                  cluster=tfps.config_from_flags(), **tfps.server_options_from_flags())


def _estimator(cluster, mode):
  """The bundled model's model_fn on the Estimator path (`cluster` None: the sidecar's local copy)."""
  from tfps.models import model_fns  # pylint: disable=g-import-not-at-top
  fv = flags.FLAGS
  config = tfps.RunConfig(save_checkpoints_steps=_CHECKPOINT_STEPS.value, log_step_count_steps=_LOG_STEPS.value,
                          steps_per_execution=_STEPS_PER_EXECUTION.value or 20,
                          delta_export_secs=_DELTA_EXPORT_SECS.value, tf_random_seed=fv.seed,
                          **dataclasses.asdict(mode))
  model_fn = model_fns.build_model_fn(fv.model, *_features(), optimizer=fv.optimizer, learning_rate=fv.learning_rate,
                                      **model_flags.model_options_from_flags(num_ps=cluster.num_ps if cluster else 1))
  return tfps.Estimator(model_fn, model_dir=_MODEL_DIR.value, config=config, cluster=cluster,
                        strategy_options=tfps.strategy_options_from_flags())


def _train_estimator(cluster, mode):
  """The chief's training on the Estimator path, with the inline evaluations of the newest held-out window."""
  from tfps.estimator import online  # pylint: disable=g-import-not-at-top
  fv = flags.FLAGS
  estimator = _estimator(cluster, mode)
  with _served(_SERVE_DELTAS.value):
    online.train_on_stream(estimator, stream_flags.stream_batches_from_flags(), max_steps=_MAX_STEPS.value,
                           checkpoint_every_secs=fv.checkpoint_every_secs,
                           evaluate_every_steps=fv.stream_eval_every_steps,
                           evaluate_every_secs=fv.stream_eval_every_secs, eval_batch_size=fv.batch_size)


@contextlib.contextmanager
def _served(serving_dir):
  """With `serving_dir`: `tfps-delta watch` on model_dir/deltas while training runs (its lines in the chief's output);
  after it, up to 60 s for the watch to serve the last export, then the served versions' freshness in the summary."""
  if not serving_dir:
    yield
    return
  from tfps import run_records  # pylint: disable=g-import-not-at-top
  from tfps.training import delta_files, delta_freshness  # pylint: disable=g-import-not-at-top
  checks.directory("serve_deltas", serving_dir)  # before training: a file there would leave nothing served
  folder = os.path.join(_MODEL_DIR.value, "deltas")
  os.makedirs(folder, exist_ok=True)
  started = time.time()  # the summary's freshness is this run's: the serving folder keeps earlier runs' versions
  watch = subprocess.Popen([sys.executable, "-m", "tfps.cli.delta", "watch", folder, f"--serving={serving_dir}",
                            "--interval=0.5"])
  try:
    yield
    deadline = time.monotonic() + 60
    while (watch.poll() is None and time.monotonic() < deadline and
           max(delta_files.versions_in(folder), default=-1) not in delta_files.served_versions(serving_dir)):
      time.sleep(0.2)
  finally:
    watch.terminate()
    watch.wait(timeout=60)
  line = delta_freshness.summary_line(delta_freshness.read(serving_dir, since=started))
  run_records.add_to_summary(_MODEL_DIR.value, "freshness", {"serving": serving_dir, "line": line})


def _evaluate_estimator(cluster, mode):
  """The sidecar: every checkpoint evaluated on the held-out window current at it."""
  from tfps.data import spec as spec_lib  # pylint: disable=g-import-not-at-top
  from tfps.data.stream import holdout  # pylint: disable=g-import-not-at-top
  from tfps.estimator import stream_evaluation  # pylint: disable=g-import-not-at-top
  fv = flags.FLAGS
  return stream_evaluation.run_window_evaluator(
      _estimator(cluster, mode), holdout.window_input_fn(spec_lib.load_spec(fv.feature_spec), fv.batch_size))


def _keras_model(cluster):
  """`build_model` of the bundled model on the Keras path, compiled as `tfps.fit` trains it (`cluster` None: the
  sidecar's unsharded copy)."""
  from tfps import models  # pylint: disable=g-import-not-at-top
  fv = flags.FLAGS
  options = model_flags.model_options_from_flags(num_ps=cluster.num_ps if cluster else 1)

  def build_model():
    model_flags.seed_from_flags()
    model = models.build_model(fv.model, *_features(), **options)
    return models.compile_model(model, optimizer=fv.optimizer, learning_rate=fv.learning_rate)

  return build_model


def _train_keras(cluster, mode):
  """The chief's training on the Keras path, with the inline evaluations of the newest held-out window."""
  from tfps.keras import online  # pylint: disable=g-import-not-at-top
  fv = flags.FLAGS
  with _served(_SERVE_DELTAS.value):
    online.train_on_stream(_keras_model(cluster), stream_flags.stream_batches_from_flags(), model_dir=_MODEL_DIR.value,
                           max_steps=_MAX_STEPS.value, sync_mode=mode, cluster=cluster,
                           strategy_options=tfps.strategy_options_from_flags(),
                           steps_per_execution=_STEPS_PER_EXECUTION.value,
                           checkpoint_every_steps=_CHECKPOINT_STEPS.value, log_every_steps=_LOG_STEPS.value,
                           checkpoint_every_secs=fv.checkpoint_every_secs,
                           evaluate_every_steps=fv.stream_eval_every_steps,
                           evaluate_every_secs=fv.stream_eval_every_secs, eval_batch_size=fv.batch_size,
                           delta_export_secs=_DELTA_EXPORT_SECS.value)


def _evaluate_keras(cluster):
  """The sidecar on the Keras path: every checkpoint evaluated on the held-out window current at it."""
  del cluster  # the sidecar reads checkpoints; it never connects to the cluster
  from tfps.data import spec as spec_lib  # pylint: disable=g-import-not-at-top
  from tfps.data.stream import holdout  # pylint: disable=g-import-not-at-top
  from tfps.keras import stream_evaluation  # pylint: disable=g-import-not-at-top
  fv = flags.FLAGS
  return stream_evaluation.run_window_evaluator(
      _keras_model(None), holdout.window_input_fn(spec_lib.load_spec(fv.feature_spec), fv.batch_size),
      _MODEL_DIR.value)


def _features():
  """`(categorical, dense)`: the model's features, from --feature_spec."""
  from tfps.data import spec as spec_lib  # pylint: disable=g-import-not-at-top
  return spec_lib.load_spec(flags.FLAGS.feature_spec).model_features()


if __name__ == "__main__":
  tfps.run_main(main, arguments=False)
