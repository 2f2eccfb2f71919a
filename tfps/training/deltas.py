"""Delta exports: what changed since the last export, versioned and atomic, and how a chain of them is checked.

A folder of exports holds one base (`base-000000`, a full SavedModel with a manifest) and the deltas after it
(`delta-000001`, ...), each numbered after the one before it. A delta holds, for each variable of the model in
`model.weights` order, either the rows that changed (their ids and values: a table's touched rows,
`tfps.training.touched_rows`) or the whole value (a variable updated densely), in `tensors.npz`, and `manifest.json`:
its version, the version it follows, the base it belongs to (version and id), the training step, the model's
fingerprint (its variables' shapes and dtypes) and each variable's name, shape and how it is shipped.

A delta is written in a hidden temporary folder (`.tmp-...`), its files synced to disk, then renamed to its name in
one step: a reader sees a whole delta or none. A folder without a manifest is never read. The names, manifests, chain
checks and atomic writes are `tfps.training.delta_files` (no TensorFlow).
"""

import hashlib
import json
import os
import uuid
from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf

from tfps import _tf_private
from tfps.training import strategy as strategy_lib
from tfps.training import table_deltas
from tfps.training.delta_files import (BASE_MANIFEST, FORMAT, MANIFEST, TENSORS, DeltaError,  # pylint: disable=unused-import
                                      check_chain, name_of, read_manifest, versions_in, write_atomically, write_json)

MODULE_EXPORT = "module"  # a base manifest's `saved_model` where the base is a tf.Module (the Estimator path's export)
MODULE_VARIABLES = "delta_variables"  # such a module's list of its variables, in the deltas' order


def whole_variables(model, weights) -> list:
  """`weights` (a model's `weights`, which list a sharded variable's shards one by one) with each sharded variable's
  shards replaced by the `ShardedVariable` itself: the variables of the same model built outside a strategy, in
  order."""
  sharded = {}
  for value in tf.train.TrackableView(model).descendants():
    if _tf_private.is_sharded_variable(value):
      sharded.update({id(shard): value for shard in value.variables})
  result, seen = [], set()
  for weight in weights:
    whole = sharded.get(id(weight), weight)
    if id(whole) not in seen:
      seen.add(id(whole))
      result.append(whole)
  return result


def fingerprint(weights) -> str:
  """The model's identity for deltas: a hash of its variables' shapes and dtypes, in order."""
  described = [[list(map(int, weight.shape)), weight.dtype.name] for weight in weights]
  return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


def describe(weights) -> List[dict]:
  return [{"name": weight.name, "shape": list(map(int, weight.shape)), "dtype": weight.dtype.name}
          for weight in weights]


class DeltaWriter:
  """Writes a base, then the deltas after it, of a model's `weights` into `directory`.

  Args:
    directory: the folder of exports.
    weights: the model's variables (`model.weights`, sharded or not), in order.
    touched: the `touched_rows.TouchedRows` recording the tables' changed rows.
    tables: the model's dynamic tables (layers with `delta_shards()`): their id maps' changes go in the deltas too
      (`tfps.training.table_deltas`); their bookkeeping variables are left out of `weights` (serving reads none).
  """

  def __init__(self, directory: str, weights, touched, tables=()):
    self.directory = directory
    self.tables = table_deltas.TableDeltas(tables, touched)
    self.weights = [weight for weight in weights if not self.tables.owns(weight)]  # the variables serving reads
    self.touched = touched
    touched.watch([shard for weight in self.weights for shard in strategy_lib.shards_of(weight)])
    self.model = fingerprint(self.weights)
    self.base: Optional[dict] = None
    self.version = 0

  def write_base(self, export: Callable[[str], None], step: int, extra: Optional[dict] = None) -> str:
    """A full export (`export(folder)` writes the SavedModel) at `step`, the base of the deltas written next;
    `extra` adds to its manifest (`saved_model`, `stream`)."""
    existing = versions_in(self.directory)
    version = max(existing, default=-1) + 1
    base = {"version": version, "id": uuid.uuid4().hex[:12]}
    manifest = {"format": FORMAT, "kind": "base", "version": version, "base": base, "step": step,
                "model": self.model, "variables": describe(self.weights), **(extra or {})}
    for weight in self.weights:  # what changes from here on goes into the deltas
      for shard in strategy_lib.shards_of(weight):
        rows, _ = self.touched.changed(shard)
        if rows is not None:
          self.touched.clear(shard, rows)
    self.tables.clear()

    def fill(folder):
      export(folder)
      write_json(os.path.join(folder, BASE_MANIFEST), manifest)

    path = write_atomically(self.directory, name_of("base", version), fill)
    self.base, self.version = base, version
    return path

  def write_delta(self, step: int, extra: Optional[dict] = None) -> str:
    """A delta of what changed since the last export (base or delta), at `step`; marks cleared only once written.
    `extra` adds to its manifest (`stream`: the stream position of the examples it holds)."""
    if self.base is None:
      raise RuntimeError("write_base comes before the first delta")
    tensors, described, shipped = {}, describe(self.weights), []
    for index, weight in enumerate(self.weights):
      rows = self._changed_rows(weight, shipped)
      if rows is None:
        tensors[f"{index}/value"] = np.asarray(weight.numpy())
        described[index]["shipped"] = "whole"
      else:
        tensors[f"{index}/ids"], tensors[f"{index}/rows"] = rows
        described[index]["shipped"] = "rows"
        described[index]["rows"] = int(len(rows[0]))
    evicted = self.tables.add(tensors, self.weights)
    version = self.version + 1
    manifest = {"format": FORMAT, "kind": "delta", "version": version, "previous": self.version, "base": self.base,
                "step": step, "model": self.model, "variables": described, "tables": self.tables.describe(),
                **(extra or {})}

    def fill(folder):
      os.makedirs(folder)
      with open(os.path.join(folder, TENSORS), "wb") as f:
        np.savez(f, **tensors)
      write_json(os.path.join(folder, MANIFEST), manifest)  # last: a folder without it is never read

    path = write_atomically(self.directory, name_of("delta", version), fill)
    self.version = version
    for shard, rows in shipped:
      self.touched.clear(shard, rows)
    self.tables.clear(evicted)
    return path

  def _changed_rows(self, weight, shipped: list):
    """`(ids, rows)` of `weight` changed since the last export, ids over the whole variable; None where a shard has
    no touched-row record (the variable is shipped whole). Appends `(shard, shard rows)` to `shipped`."""
    ids, rows, offset, found = [], [], 0, []
    for shard in strategy_lib.shards_of(weight):
      local, values = self.touched.changed(shard)
      if local is None:
        return None
      found.append((shard, local))
      ids.append(local + offset)
      rows.append(values)
      offset += int(shard.shape[0])
    shipped.extend(found)
    return np.concatenate(ids), np.concatenate(rows)


def apply_delta(weights, path: str) -> dict:
  """Applies the delta at `path` to `weights` (unsharded variables of the same model, in order); returns its
  manifest."""
  manifest = read_manifest(path)
  with np.load(os.path.join(path, TENSORS)) as tensors:
    for index, (weight, described) in enumerate(zip(weights, manifest["variables"])):
      if described["shipped"] == "whole":
        weight.assign(tensors[f"{index}/value"])
      elif len(tensors[f"{index}/ids"]):
        weight.scatter_update(tf.IndexedSlices(tf.constant(tensors[f"{index}/rows"]),
                                               tf.constant(tensors[f"{index}/ids"], tf.int64)))
  return manifest


def load_module_export(path: str):
  """`(variables, shards_of, save)` of the tf.Module SavedModel at `path` (the Estimator path's serving export): its
  variables in the deltas' order (`MODULE_VARIABLES`); `shards_of(number, name)`, the row shards of its dynamic
  table `number` (the model_fn's tables in creation order, as the deltas list them); and `save(folder)`, which writes
  it again with its signatures."""
  loaded = tf.saved_model.load(path)
  variables = getattr(loaded, MODULE_VARIABLES, None)
  if variables is None:
    raise DeltaError(f"the SavedModel in {path!r} lists no `{MODULE_VARIABLES}`: not an export deltas apply to")

  def shards_of(number: int, name: str):
    tables = list(loaded.model_variables.tables)
    if number >= len(tables):
      raise DeltaError(f"the SavedModel in {path!r} has {len(tables)} dynamic table(s); a delta has table {name!r} "
                       f"as number {number + 1}")
    return list(tables[number].shards)

  def save(folder: str) -> None:
    tf.saved_model.save(loaded, folder, signatures=dict(loaded.signatures))

  return list(variables), shards_of, save
