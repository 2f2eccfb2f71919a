"""Delta exports on the Keras path: `tfps.fit(..., delta_export_secs=T)` writes a base SavedModel when training
starts and, every T seconds (checked before each scheduled execution of steps, within an epoch too, at each epoch's
end, and at the end of training), a delta of what changed since (`tfps.training.deltas`); so does
`tfps.keras.online.train_on_stream(..., delta_export_secs=T)` between its chunks, each manifest with the stream span
it ships and its examples' write times (`stream_schedule`). `apply` turns a base and its deltas into a SavedModel for
serving (a Keras base, or the Estimator path's, `tfps.estimator.deltas`).
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
  return [DeltaExport(build_model, dataset_fn, _deltas_folder(model_dir, delta_export_secs), delta_export_secs)]


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
    self.schedule = schedule_for(self.model, self.build_model, self.dataset_fn, self.directory, self.secs)
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


def schedule_for(model: tf_keras.Model, build_model: Callable, dataset_fn: Callable, directory: str,
                 secs: float) -> delta_schedule.DeltaSchedule:
  """The delta schedule of `model` (trained in its strategy's scope) into `directory` every `secs` seconds, at its
  optimizer's step; made before its first step is traced (that step's updates mark the rows they change from then
  on). A table layer without `delta_shards` raises a one-line `UsageError`."""
  layers = tables.tables_of(model)
  delta_schedule.refuse_tables(secs, layers, "tfps.export_saved_model")
  touched = touched_rows.track(model.distribute_strategy)
  writer = deltas.DeltaWriter(directory, deltas.whole_variables(model, model.weights), touched, tables=layers)
  return delta_schedule.DeltaSchedule(writer, secs, lambda: int(model.optimizer.iterations.numpy()), lambda folder: (
      export.export_saved_model(build_model, folder, model=model, dataset_fn=dataset_fn)))


def stream_schedule(build_model: Callable, model: tf_keras.Model, sample, model_dir: str,
                    secs: Optional[float]) -> Optional[delta_schedule.DeltaSchedule]:
  """The delta schedule `tfps.keras.online.train_on_stream` gives its stream loop for `delta_export_secs` (None where
  it is None): the loop writes the base at its first step and a delta of the examples trained since every `secs`
  seconds between chunks, each manifest with its stream span and write times (`tfps.training.delta_schedule`).
  `sample` is a dataset of one batch, to build a model whose inputs are not declared for the base export."""
  if secs is None:
    return None
  return schedule_for(model, build_model, lambda input_context: sample, _deltas_folder(model_dir, secs), secs)


def _deltas_folder(model_dir: Optional[str], secs: float) -> str:
  """`model_dir/deltas`, after a one-line `UsageError` for a bad `secs` or no `model_dir`."""
  checks.non_negative_number("delta_export_secs", secs, "number of seconds")
  if not model_dir:
    raise UsageError(f"`delta_export_secs` ({secs}) needs a `model_dir` to write the deltas into "
                     f"(model_dir/{delta_schedule.DELTAS_SUBDIR})")
  return os.path.join(model_dir, delta_schedule.DELTAS_SUBDIR)


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
