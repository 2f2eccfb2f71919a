"""Online training: a bundled model (Wide&Deep, DCN) trained without end on a stream, on the Estimator path.

  tfps-launch --num_ps=1 --num_workers=2 scripts/train_online.py -- --stream=kafka --kafka_bootstrap=broker:9092 \
      --kafka_topic=clicks --data=csv --feature_spec=clicks.spec.json --model=dcn --model_dir=/shared/online
  (brokers on another host: add --expose_ports to tfps-launch, whose tasks otherwise see only loopback)

Every message is applied exactly once: each checkpoint holds the offsets after the examples it holds, a restarted
chief reads on from them, and offsets are committed to --kafka_group only after the checkpoint that holds them.
SIGTERM ends training after the steps in flight with a checkpoint. --stream=folder reads slices appearing in
--stream_folder instead. With --stream_holdout_every=K about one message in K is held out, and
--stream_eval_every_steps/secs evaluate the newest checkpoint on the newest of them; the same script run as the
evaluator task (tfps-launch --evaluator) is the sidecar: it evaluates every checkpoint on the held-out window current
at it. --delta_export_secs=T writes a delta of the changed rows every T seconds to model_dir/deltas
(docs/delta_export.md). See docs/online.md.
"""

import dataclasses

from absl import flags

import tfps
from tfps.cli import flags as tfps_flags
from tfps.cli import model_flags

tfps.define_flags()
tfps.define_mode_flags()
tfps_flags.define_stream_flags()  # before the model flags: with --stream no training files are needed
model_flags.define_model_flags()
_MODEL_DIR = flags.DEFINE_string("model_dir", "/tmp/tfps_online", "Checkpoints (with the stream's offsets), logs.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", None, "Stop at this global step (default: never; SIGTERM stops).",
                                  lower_bound=1)
_CHECKPOINT_STEPS = flags.DEFINE_integer("save_checkpoints_steps", 1000, "Steps between checkpoints.", lower_bound=1)
_LOG_STEPS = flags.DEFINE_integer("log_step_count_steps", 100, "Steps between progress lines.", lower_bound=1)
_STEPS_PER_EXECUTION = flags.DEFINE_integer("steps_per_execution", 20, "Steps per scheduled function.",
                                            lower_bound=1)
_DELTA_EXPORT_SECS = flags.DEFINE_float(
    "delta_export_secs", None, "Seconds between delta exports of the changed rows to model_dir/deltas, each with the "
    "stream position of its examples (default: none; docs/delta_export.md).", lower_bound=0)


def main(argv):
  del argv
  mode = tfps.mode_from_flags()
  fv = flags.FLAGS
  if not fv.stream:
    raise tfps.UsageError("scripts/train_online.py trains on a stream: give --stream=kafka or --stream=folder")
  config = tfps.RunConfig(save_checkpoints_steps=_CHECKPOINT_STEPS.value, log_step_count_steps=_LOG_STEPS.value,
                          steps_per_execution=_STEPS_PER_EXECUTION.value, delta_export_secs=_DELTA_EXPORT_SECS.value,
                          **dataclasses.asdict(mode))
  cluster_config = tfps.config_from_flags()

  def estimator_on(cluster):
    from tfps.data import spec as spec_lib  # pylint: disable=g-import-not-at-top
    from tfps.models import model_fns  # pylint: disable=g-import-not-at-top
    categorical, dense = spec_lib.load_spec(fv.feature_spec).model_features()
    model_fn = model_fns.build_model_fn(fv.model, categorical, dense, optimizer=fv.optimizer,
                                        learning_rate=fv.learning_rate,
                                        **model_flags.model_options_from_flags(num_ps=cluster.num_ps if cluster else 1))
    return tfps.Estimator(model_fn, model_dir=_MODEL_DIR.value, config=config, cluster=cluster,
                          strategy_options=tfps.strategy_options_from_flags())

  def train(cluster):
    from tfps.estimator import online  # pylint: disable=g-import-not-at-top
    online.train_on_stream(estimator_on(cluster), tfps_flags.stream_batches_from_flags(), max_steps=_MAX_STEPS.value,
                           checkpoint_every_secs=fv.checkpoint_every_secs,
                           evaluate_every_steps=fv.stream_eval_every_steps,
                           evaluate_every_secs=fv.stream_eval_every_secs, eval_batch_size=fv.batch_size)

  def evaluate(cluster):  # the sidecar: every checkpoint on the held-out window current at it
    from tfps.data import spec as spec_lib  # pylint: disable=g-import-not-at-top
    from tfps.data.stream import holdout  # pylint: disable=g-import-not-at-top
    from tfps.estimator import stream_evaluation  # pylint: disable=g-import-not-at-top
    return stream_evaluation.run_window_evaluator(
        estimator_on(cluster), holdout.window_input_fn(spec_lib.load_spec(fv.feature_spec), fv.batch_size))

  tfps.run_task(train, evaluator_fn=evaluate, cluster=cluster_config, **tfps.server_options_from_flags())


if __name__ == "__main__":
  tfps.run_main(main)
