"""A resume from a checkpoint, timed, done the way `tfps.fit` does it before its first step (bench/reshard.py and
bench/scale_train.py use it).

The chief builds the model under a strategy of its cluster (tables created in place on their ps:
`tfps.training.initialization`), makes the optimizer's variables, checks the checkpoint against the model and restores
it (`tfps.training.resharding`): the checkpoint may come from another number of ps.
"""

import time
from typing import Callable, Optional


def timed_resume(cluster, build_model: Callable, dataset, path: str, strategy_options=None,
                 table: Optional[str] = None):
  """Resumes `build_model()` from checkpoint `path` on `cluster`; returns `(model, facts)`.

  `dataset`: a batch source to build a model whose inputs are not declared. `facts`: `num_ps`, `create_secs`,
  `restore_secs`, `resume_secs`, the restored `step`, and with `table` (a layer's name) that table's `shards`.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfps.keras import evaluation, fitting  # pylint: disable=g-import-not-at-top
  from tfps.training import resharding, strategy as strategy_lib  # pylint: disable=g-import-not-at-top
  strategy, _ = strategy_lib.build_strategy(cluster, strategy_options)
  start = time.monotonic()
  model = fitting.build_model_in_scope(build_model, strategy)
  with strategy.scope():
    evaluation.ensure_built(model, dataset)
    resharding.create_optimizer_variables(model.optimizer, model.trainable_variables)
  built = time.monotonic()
  with strategy.scope():
    resharding.restore(path, tf.train.Checkpoint(model=model))
  restored = time.monotonic()
  facts = {"num_ps": cluster.num_ps, "create_secs": built - start, "restore_secs": restored - built,
           "resume_secs": restored - start, "step": int(model.optimizer.iterations.numpy())}
  if table:
    facts["shards"] = len(getattr(model.get_layer(table).embeddings, "variables", [None]))
  return model, facts
