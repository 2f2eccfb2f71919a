"""Delta exports on the Estimator path: `RunConfig(delta_export_secs=T)` (docs/delta_export.md).

The base is the Estimator path's serving export (what `Estimator.export_saved_model` writes: the PREDICT graph of the
model_fn in a tf.Module SavedModel whose `serving_default` signature takes the features by name) of the values on the
ps when training starts. Its signature takes the training input's features, the batch dimension left free. The deltas
are `tfps.training.deltas`'s, on `tfps.training.delta_schedule`'s schedule: at the first step-log line or checkpoint
at least T seconds after the last export, and at the end of training; on a stream with the stream position of the
examples each one holds (`tfps.estimator.online`). A model_fn's dynamic tables (the states its `DynamicEmbedding`
layers share) ship their id maps' changes and evicted ids as well (`tfps.training.table_deltas`); the base copies
their maps from the ps.
"""

import os
from typing import Dict, Optional

import tensorflow as tf

from tfps.errors import UsageError
from tfps.estimator import calls
from tfps.estimator import local
from tfps.estimator.spec import ModeKeys
from tfps.training import delta_schedule
from tfps.training import deltas
from tfps.training import table_deltas
from tfps.training import touched_rows


def schedule_for(model, element_spec) -> Optional[delta_schedule.DeltaSchedule]:
  """The delta schedule of `model` (a `DistributedModel` whose variables exist and whose steps are not traced yet:
  the steps traced from now on mark the rows they change), or None without `delta_export_secs`.

  `element_spec` is a training batch's (the base serves its features). A model that cannot give deltas (a table
  whose state cannot say what its deltas hold, features that are not a dict of dense tensors) raises a one-line
  `UsageError`, before any step. Dynamic tables (the states a model_fn's `DynamicEmbedding` layers share) ship their
  id maps' changes too (`tfps.training.table_deltas`).
  """
  secs = model.config.delta_export_secs
  if secs is None:
    return None
  tables = list(model.model.variables.tables)
  delta_schedule.refuse_tables(secs, tables, "Estimator.export_saved_model")
  specs = serving_specs(secs, element_spec)
  trained = model.model.variables.model_variables()
  writer = deltas.DeltaWriter(os.path.join(model.config.model_dir, delta_schedule.DELTAS_SUBDIR), trained,
                              touched_rows.track(model.strategy), tables=tables)
  return delta_schedule.DeltaSchedule(writer, secs, lambda: int(model.global_step.numpy()),
                                      lambda folder: export_values(model.model, specs, folder),
                                      {"saved_model": deltas.MODULE_EXPORT})


def serving_specs(secs, element_spec) -> Dict[str, tf.TensorSpec]:
  """The base's signature: the features of `element_spec` (a training batch's), any batch size."""
  features, _ = calls.split_element(element_spec, ModeKeys.TRAIN)
  bad = (f"a {type(features).__name__}" if not isinstance(features, dict) else
         next((f"feature {name!r} as a {type(spec).__name__}" for name, spec in sorted(features.items())
               if not isinstance(spec, tf.TensorSpec)), None))
  if bad is not None:
    raise UsageError(f"`delta_export_secs` ({secs}) serves the training input's features, which must be a dict of "
                     f"name -> dense tensor; the input gives {bad}")
  return {name: tf.TensorSpec(tf.TensorShape([None]).concatenate(spec.shape[1:]), spec.dtype, name)
          for name, spec in features.items()}


def export_values(model, specs: Dict[str, tf.TensorSpec], folder: str) -> None:
  """Writes to `folder` the serving export (`local.LocalModel.save_serving`) of the values `model` (a
  `ModelFnModel` on the cluster) holds now: its variables, and its dynamic tables' id maps."""
  served = local.LocalModel(model.model_fn, model.params, model.config)
  trained = model.variables.model_variables()

  def load():
    variables = served.model.variables.model_variables()
    if deltas.fingerprint(variables) != deltas.fingerprint(trained):
      raise UsageError(f"delta exports need model_fn to create the same variables in PREDICT mode as in TRAIN mode; "
                       f"PREDICT made {len(variables)} ({_shapes(variables)}), TRAIN {len(trained)} "
                       f"({_shapes(trained)})")
    for target, source in zip(variables, trained):
      target.assign(source.numpy())
    for target, source in zip(served.model.variables.tables, model.variables.tables):
      table_deltas.copy_maps(source, target)

  served.save_serving(folder, specs, load)


def _shapes(variables) -> str:
  return ", ".join(str(list(map(int, variable.shape))) for variable in variables)
