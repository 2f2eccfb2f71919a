"""Estimator path example: a tf.estimator-style model_fn trained on a parameter-server cluster, every role one script.

Locally, all roles at once (the evaluator as a sidecar, so the chief does not evaluate inline):
  tfps-launch --num_ps=1 --num_workers=2 --evaluator scripts/train_estimator.py -- --model_dir=/tmp/run \
      --noinline_eval
Per role, on each host (TF_CONFIG works too):
  python scripts/train_estimator.py --job_name=ps --task_index=0 --ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 \
      --model_dir=/shared/run
  python scripts/train_estimator.py --job_name=chief --ps_hosts=... --worker_hosts=... --model_dir=/shared/run
  python scripts/train_estimator.py --job_name=evaluator --ps_hosts=... --worker_hosts=... --model_dir=/shared/run
The model and data: `tfps.estimator.synthetic` (an embedding + MLP click model on generated data).
"""


from absl import flags

import tensorflow as tf

import tfps
from tfps.estimator import synthetic
from tfps.testing import applied_steps

tfps.define_flags()
tfps.define_mode_flags()
_MODEL_DIR = flags.DEFINE_string("model_dir", "/tmp/tfps_estimator", "Checkpoints, loss.log, evaluation results.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", 2000, "Train until the global step reaches this.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 64, "Batch size per worker.", lower_bound=1)
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.1, "Adagrad learning rate.", lower_bound=0)
_CHECKPOINT_STEPS = flags.DEFINE_integer("save_checkpoints_steps", 500, "Steps between checkpoints.", lower_bound=1)
_LOG_STEPS = flags.DEFINE_integer("log_step_count_steps", 100, "Steps between step-log lines.", lower_bound=1)
_STEPS_PER_EXECUTION = flags.DEFINE_integer("steps_per_execution", 20, "Steps packed into one scheduled function.",
                                            lower_bound=1)
_EVAL_EXAMPLES = flags.DEFINE_integer("eval_examples", 2000, "Examples in the (finite) evaluation set.",
                                      lower_bound=1)
_EVAL_STEPS = flags.DEFINE_integer("eval_steps", None, "Batches to evaluate (default: the whole evaluation set).",
                                   lower_bound=1)
_THROTTLE_SECS = flags.DEFINE_float("throttle_secs", 0, "Minimum seconds between evaluations.", lower_bound=0)
_INLINE_EVAL = flags.DEFINE_boolean("inline_eval", True, "The chief evaluates on the workers after checkpoints; "
                                    "turn off when a sidecar evaluator runs.")
_SEED = flags.DEFINE_integer("seed", None, "Seed of the model's initial values (RunConfig's tf_random_seed): the same "
                             "at every launch (docs/repeatability.md); unset: other ones at each launch.", lower_bound=0)
_COUNT = flags.DEFINE_boolean("count_applied_steps", False, "Count on every ps the steps applied there (a counter per "
                              "ps, in the checkpoints: tfps.testing.applied_steps), to check a run under failures.")


def build_estimator(cluster=None) -> tfps.Estimator:
  params = {"batch_size": _BATCH.value, "learning_rate": _LEARNING_RATE.value, "eval_examples": _EVAL_EXAMPLES.value}
  mode = tfps.mode_from_flags()
  config = tfps.RunConfig(save_checkpoints_steps=_CHECKPOINT_STEPS.value, log_step_count_steps=_LOG_STEPS.value,
                          steps_per_execution=_STEPS_PER_EXECUTION.value, mode=mode,
                          tf_random_seed=_SEED.value)
  return tfps.Estimator(counted_model_fn if _COUNT.value else synthetic.model_fn, model_dir=_MODEL_DIR.value,
                        params=params, config=config, cluster=cluster,
                        strategy_options=tfps.strategy_options_from_flags())


def counted_model_fn(features, labels, mode, params):
  """`synthetic.model_fn`, its TRAIN loss plus the term of a step counter on each ps (value 0, gradient 1)."""
  spec = synthetic.model_fn(features, labels, mode, params)
  if mode != tfps.ModeKeys.TRAIN:
    return spec  # the counters are the last variables made, so evaluation's are those before them
  counters = applied_steps.StepCounters(tfps.config_from_flags().num_ps, name="counters")
  counters(spec.loss)
  return tfps.EstimatorSpec(mode, loss=spec.loss + tf.add_n(counters.losses), optimizer=spec.optimizer)


def eval_spec() -> tfps.EvalSpec:
  return tfps.EvalSpec(synthetic.eval_input_fn, steps=_EVAL_STEPS.value, throttle_secs=_THROTTLE_SECS.value,
                       inline=_INLINE_EVAL.value)


def run_chief(cluster):
  train_spec = tfps.TrainSpec(synthetic.train_input_fn, max_steps=_MAX_STEPS.value)
  return tfps.train_and_evaluate(build_estimator(cluster), train_spec, eval_spec())


def run_evaluator(cluster):
  del cluster  # the sidecar evaluator reads checkpoints; it never connects to the cluster
  return tfps.estimator.run_evaluator(build_estimator(), eval_spec())


def main(argv):
  del argv
  build_estimator()  # bad settings (mode, RunConfig) fail on any task, before the role is dispatched
  tfps.run_task(run_chief, run_evaluator, cluster=tfps.config_from_flags(), model_dir=_MODEL_DIR.value,
                **tfps.server_options_from_flags())


if __name__ == "__main__":
  tfps.run_main(main, arguments=False)
