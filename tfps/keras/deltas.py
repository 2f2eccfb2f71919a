"""Delta exports on the Keras path: `tfps.fit(..., delta_export_secs=T)` writes a base SavedModel when training
starts and, every T seconds (checked at each epoch's end, and at the end of training), a delta of what changed since
(`tfps.training.deltas`); `apply` turns a base and its deltas into a SavedModel for serving.
"""

import os
import time
from typing import Callable, Optional, Sequence

from absl import logging
import tf_keras

from tfps import checks
from tfps.errors import UsageError
from tfps.keras import export
from tfps.training import delta_files
from tfps.training import deltas
from tfps.training import table_deltas
from tfps.training import tables
from tfps.training import touched_rows

DELTAS_SUBDIR = "deltas"


def delta_callbacks(build_model: Callable, dataset_fn: Callable, model_dir: Optional[str],
                    delta_export_secs: Optional[float]) -> list:
  """The `DeltaExport` callback `tfps.fit` adds for `delta_export_secs` (none where it is None); `dataset_fn` gives
  a batch to build a model whose inputs are not declared, for the base export."""
  if delta_export_secs is None:
    return []
  checks.non_negative_number("delta_export_secs", delta_export_secs, "number of seconds")
  if not model_dir:
    raise UsageError(f"`delta_export_secs` ({delta_export_secs}) needs a `model_dir` to write the deltas into "
                     f"(model_dir/{DELTAS_SUBDIR})")
  return [DeltaExport(build_model, dataset_fn, os.path.join(model_dir, DELTAS_SUBDIR), delta_export_secs)]


class DeltaExport(tf_keras.callbacks.Callback):
  """Writes a base export at the start of training, then a delta at the first epoch end at least `secs` seconds
  after the last one, and one at the end of training if anything was trained since. A delta that cannot be written
  (a full disk) is logged and its rows stay marked: the next delta carries them, and the previous one stays valid."""

  def __init__(self, build_model: Callable, dataset_fn: Callable, directory: str, secs: float):
    super().__init__()
    self.build_model, self.dataset_fn, self.directory, self.secs = build_model, dataset_fn, directory, secs
    self.writer: Optional[deltas.DeltaWriter] = None
    self._last, self._step = 0.0, -1

  def on_train_begin(self, logs=None):
    layers = tables.tables_of(self.model)
    refused = [layer.name for layer in layers if not callable(getattr(layer, "delta_shards", None))]
    if refused:
      raise UsageError(f"`delta_export_secs` ({self.secs}) cannot export table layers without `delta_shards` ("
                       + ", ".join(refused) + "): their id maps would not be in the deltas; export whole SavedModels "
                       "(tfps.export_saved_model) for them")
    # Before the first step is traced: its updates mark the rows they change from then on.
    touched = touched_rows.track(self.model.distribute_strategy)
    self.writer = deltas.DeltaWriter(self.directory, deltas.whole_variables(self.model, self.model.weights), touched,
                                     tables=layers)
    self._step = self._current_step()
    path = self.writer.write_base(lambda folder: export.export_saved_model(
        self.build_model, folder, model=self.model, dataset_fn=self.dataset_fn), self._step)
    logging.info("Wrote the base export %s at step %d", path, self._step)
    self._last = time.monotonic()

  def on_epoch_end(self, epoch, logs=None):
    if time.monotonic() - self._last >= self.secs:
      self._write()

  def on_train_end(self, logs=None):
    if self._current_step() != self._step:
      self._write()

  def _write(self):
    step = self._current_step()
    try:
      path = self.writer.write_delta(step)
    except OSError as e:
      logging.warning("Could not write a delta at step %d (%s); the last delta stays valid and the next one carries "
                      "its rows", step, e)
      return
    self._last, self._step = time.monotonic(), step
    logging.info("Wrote delta %s at step %d", path, step)

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
  model = tf_keras.models.load_model(base, compile=False)
  if deltas.fingerprint(model.weights) != base_manifest["model"]:
    raise deltas.DeltaError(f"the SavedModel in {base!r} does not match its manifest (another model's variables)")
  for path in delta_paths:
    deltas.apply_delta(model.weights, path)
    table_deltas.apply_delta(model, path)  # dynamic tables' id maps
  last = manifests[-1] if manifests else base_manifest
  manifest = dict(base_manifest, version=last["version"], step=last["step"])

  def fill(folder):
    model.save(folder, include_optimizer=False)
    deltas.write_json(os.path.join(folder, deltas.BASE_MANIFEST), manifest)

  delta_files.write_atomically(*os.path.split(os.path.abspath(out)), fill)  # a reader sees all of it or none
  return out
