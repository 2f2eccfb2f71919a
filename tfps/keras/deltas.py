"""Delta exports on the Keras path: `tfps.fit(..., delta_export_secs=T)` writes a base SavedModel when training
starts and, every T seconds (checked before each scheduled execution of steps, within an epoch too, at each epoch's
end, and at the end of training), a delta of what changed since (`tfps.training.deltas`); `apply` turns a base and
its deltas into a SavedModel for serving (a Keras base, or the Estimator path's, `tfps.estimator.deltas`).
"""

import os
from typing import Callable, Optional, Sequence

import tf_keras

from tfps import checks
from tfps.errors import UsageError
from tfps.keras import export
from tfps.training import delta_files
from tfps.training import delta_schedule
from tfps.training import deltas
from tfps.training import table_deltas
from tfps.training import tables
from tfps.training import touched_rows


def delta_callbacks(build_model: Callable, dataset_fn: Callable, model_dir: Optional[str],
                    delta_export_secs: Optional[float]) -> list:
  """The `DeltaExport` callback `tfps.fit` adds for `delta_export_secs` (none where it is None); `dataset_fn` gives
  a batch to build a model whose inputs are not declared, for the base export."""
  if delta_export_secs is None:
    return []
  checks.non_negative_number("delta_export_secs", delta_export_secs, "number of seconds")
  if not model_dir:
    raise UsageError(f"`delta_export_secs` ({delta_export_secs}) needs a `model_dir` to write the deltas into "
                     f"(model_dir/{delta_schedule.DELTAS_SUBDIR})")
  return [DeltaExport(build_model, dataset_fn, os.path.join(model_dir, delta_schedule.DELTAS_SUBDIR),
                      delta_export_secs)]


class DeltaExport(tf_keras.callbacks.Callback):
  """Writes a base export at the start of training, then a delta at the first point with no step in flight at least
  `secs` seconds after the last one, and one at the end of training if anything was trained since
  (`tfps.training.delta_schedule`).

  Those points are each epoch's end and, within an epoch, the pauses `tfps.keras.steps.drive_fit` makes before an
  execution of steps where `due()`: there the executions scheduled so far are waited for and `run()` writes the delta.
  """

  def __init__(self, build_model: Callable, dataset_fn: Callable, directory: str, secs: float):
    super().__init__()
    self.build_model, self.dataset_fn, self.directory, self.secs = build_model, dataset_fn, directory, secs
    self.schedule: Optional[delta_schedule.DeltaSchedule] = None

  def on_train_begin(self, logs=None):
    layers = tables.tables_of(self.model)
    delta_schedule.refuse_tables(self.secs, layers, "tfps.export_saved_model")
    # Before the first step is traced: its updates mark the rows they change from then on.
    touched = touched_rows.track(self.model.distribute_strategy)
    writer = deltas.DeltaWriter(self.directory, deltas.whole_variables(self.model, self.model.weights), touched,
                                tables=layers)
    self.schedule = delta_schedule.DeltaSchedule(writer, self.secs, self._current_step, lambda folder: (
        export.export_saved_model(self.build_model, folder, model=self.model, dataset_fn=self.dataset_fn)))
    self.schedule.begin()

  def due(self) -> bool:
    """Whether a delta is due (`secs` passed since the last export): `drive_fit` then pauses the steps to `run`."""
    return self.schedule is not None and self.schedule.due()

  def run(self) -> None:
    """Within an epoch, with no step in flight (the step counter settled): the delta that is due."""
    self.schedule.maybe_write()

  def on_epoch_end(self, epoch, logs=None):
    self.schedule.maybe_write()

  def on_train_end(self, logs=None):
    self.schedule.finish()

  def _current_step(self) -> int:
    return int(self.model.optimizer.iterations.numpy())


def apply(base: str, delta_paths: Sequence[str], out: str) -> str:
  """Writes to `out` a SavedModel that answers as a full export at the last delta's step would: the base export
  `base` with the deltas `delta_paths` (in order, with no gap) applied. Returns `out`.

  `out` holds a base manifest too, so the deltas after the last one given apply to it in turn. Bad input (a gap in
  the chain, a delta of another base or model, a folder that is not a complete delta, an existing `out`) raises a
  one-line `tfps.training.deltas.DeltaError` and writes nothing.
  """
  base_manifest, manifests = delta_files.check_apply(base, delta_paths, out)
  weights, shards_of, save = _load(base, base_manifest)
  if deltas.fingerprint(weights) != base_manifest["model"]:
    raise deltas.DeltaError(f"the SavedModel in {base!r} does not match its manifest (another model's variables)")
  for path in delta_paths:
    deltas.apply_delta(weights, path)
    table_deltas.apply_delta(shards_of, path)  # dynamic tables' id maps
  last = manifests[-1] if manifests else base_manifest
  manifest = dict(base_manifest, version=last["version"], step=last["step"])
  if "stream" in last:  # the stream position after the last example the result holds
    manifest["stream"] = {"name": last["stream"]["name"], "to": last["stream"]["to"]}

  def fill(folder):
    save(folder)
    deltas.write_json(os.path.join(folder, deltas.BASE_MANIFEST), manifest)

  delta_files.write_atomically(*os.path.split(os.path.abspath(out)), fill)  # a reader sees all of it or none
  return out


def _load(base: str, manifest: dict):
  """`(variables in the deltas' order, shards_of(number, name), save(folder))` of the base SavedModel at `base`: a
  Keras model, or the Estimator path's module (its manifest's `saved_model`); `shards_of` gives the row shards of
  its dynamic table `number`, named `name` (`tfps.training.table_deltas.apply_delta`)."""
  if manifest.get("saved_model") == deltas.MODULE_EXPORT:
    return deltas.load_module_export(base)
  model = tf_keras.models.load_model(base, compile=False)
  return (model.weights, lambda number, name: model.get_layer(name).shards,
          lambda folder: model.save(folder, include_optimizer=False))
