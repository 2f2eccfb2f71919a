"""The main job: a recommender model (default Wide&Deep on generated Criteo-schema data) trained with tfps.fit.

One absl script for every role; locally, every role at once:
  tfps-launch --num_ps=1 --num_workers=2 --evaluator scripts/train.py -- --flagfile=configs/main.cfg
The chief evaluates the held-out file exactly once after every epoch; the evaluator follows the checkpoints, keeps
the best one by AUC, and writes model_dir/eval/metrics.jsonl.
"""

from absl import flags
from absl import logging

import tfps
from tfps import checks
from tfps.cli import model_flags
from tfps import run_records

tfps.define_flags()
tfps.define_mode_flags()
model_flags.define_model_flags()
_MODEL_DIR = flags.DEFINE_string("model_dir", "/tmp/tfps_main", "Checkpoints, TensorBoard logs, evaluations.")
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Epochs.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps_per_epoch", 150, "Steps per epoch.", lower_bound=1)
_EXPORT_DIR = flags.DEFINE_string("export_dir", None, "Where the chief writes a serving SavedModel at the end.")


def main(argv):
  del argv
  mode, strategy_options = tfps.mode_from_flags(), tfps.strategy_options_from_flags()  # bad settings fail on any task
  data = model_flags.data_from_flags()
  cluster_config = tfps.config_from_flags()
  num_ps = cluster_config.num_ps if cluster_config else 1  # --embedding=dynamic: its tables' shards

  def build_model():
    return model_flags.model_from_flags(data, num_ps=num_ps)

  def train(cluster):
    if _EXPORT_DIR.value:  # before training: a path that cannot be a folder is said now, not after the run
      checks.directory("--export_dir", _EXPORT_DIR.value)
    history = tfps.fit(build_model, data.train_dataset_fn, epochs=_EPOCHS.value, steps_per_epoch=_STEPS.value,
                       validation_dataset_fn=data.eval_dataset_fn, exact_evaluation=True, model_dir=_MODEL_DIR.value,
                       batch_size=data.batch_size, cluster=cluster,
                       sync_mode=mode, strategy_options=strategy_options)
    final = {name: values[-1] for name, values in history.history.items()}
    logging.info("Final: %s", " | ".join(f"{name} {float(value):.4f}" for name, value in sorted(final.items())))
    if _EXPORT_DIR.value:
      tfps.export_saved_model(build_model, _EXPORT_DIR.value, model=history.model,
                             dataset_fn=data.eval_dataset_fn)
      run_records.update_summary(_MODEL_DIR.value, export_dir=_EXPORT_DIR.value)

  def evaluate(cluster):
    del cluster  # the sidecar reads checkpoints; it never connects to the cluster
    tfps.run_sidecar_evaluator(build_model, data.eval_dataset_fn, _MODEL_DIR.value)

  tfps.run_task(train, evaluate, cluster=cluster_config, model_dir=_MODEL_DIR.value,
                **tfps.server_options_from_flags())


if __name__ == "__main__":
  tfps.run_main(main, arguments=False)
