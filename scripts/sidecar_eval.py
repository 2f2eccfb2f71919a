"""Sidecar evaluator for a tfps model trained from a flagfile: follows the checkpoints of --model_dir.

It evaluates each new checkpoint on the flagfile's evaluation data in a plain process (no cluster), appends to
model_dir/eval/metrics.jsonl, writes TensorBoard scalars, keeps the best checkpoint in model_dir/best/, and exits after
the checkpoint the chief marks as final:
  python scripts/sidecar_eval.py --flagfile=configs/main.cfg --model_dir=/tmp/tfps_main --evaluate_every_checkpoint
(`tfps-launch --evaluator` runs the same evaluation as the training script's evaluator task.)
"""

from absl import flags
from absl import logging

import tfps
from tfps.cli import model_flags

model_flags.define_model_flags()
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "The training run's model_dir.", required=True)
_BEST_METRIC = flags.DEFINE_string("best_metric", None, "Metric that picks the best checkpoint (default: auc, else "
                                   "loss).")
_BEST_MODE = flags.DEFINE_enum("best_mode", "auto", ["auto", "min", "max"], "Whether smaller or larger is better "
                               "(auto: smaller for losses and errors).")
_EVERY = flags.DEFINE_boolean("evaluate_every_checkpoint", False, "Evaluate every checkpoint in order, not only the "
                              "newest.")
_POLL_SECS = flags.DEFINE_float("poll_secs", 2.0, "Seconds between looks at model_dir.", lower_bound=0.0)
_IDLE_TIMEOUT_SECS = flags.DEFINE_float("idle_timeout_secs", 3600.0, "Give up when no new checkpoint appears for this "
                                        "long.", lower_bound=0.0)


def main(argv):
  del argv
  data = model_flags.data_from_flags()

  def evaluate(cluster):
    del cluster  # None here: a standalone sidecar reads checkpoints and never connects to a cluster
    return tfps.run_sidecar_evaluator(
        lambda: model_flags.model_from_flags(data), data.eval_dataset_fn, _MODEL_DIR.value,
        best_metric=_BEST_METRIC.value, best_mode=_BEST_MODE.value, evaluate_every_checkpoint=_EVERY.value,
        poll_secs=_POLL_SECS.value, idle_timeout_secs=_IDLE_TIMEOUT_SECS.value)

  results = tfps.run_task(evaluator_fn=evaluate)
  logging.info("Evaluated %d checkpoint(s) of %s", len(results), _MODEL_DIR.value)


if __name__ == "__main__":
  tfps.run_main(main, arguments=False)
