"""Checkpoints that carry a run over to another number of ps (or of shards): checked, then restored in full.

A checkpoint holds each sharded variable as slices of one full tensor (its key names the variable, not a shard), and
tf-keras saves the optimizer's slots of a sharded variable the same way, so the values restore into any number of ps
and shards. Two things make a resume go wrong silently, and `restore` closes both:

1. Values restored into variables that do not exist yet wait for them (deferred restoration). A non-legacy tf-keras
   optimizer makes its slots only at its first step, and the restored ones were then lost (measured: after a restore
   Adam had no `m` or `v`, so its first step made them afresh from zeros); a legacy optimizer given a sharded variable before its first step made one unsharded
   slot for it that its steps never used. `create_optimizer_variables` makes them all, per shard, before restoring.
2. A checkpoint that does not fit the model (another embedding size, a layer more or less, another optimizer) restores
   partly or not at all, and training went on from fresh values. `check_compatible` compares the checkpoint's objects,
   variable shapes and slots with the model's before anything is restored, and raises `CheckpointMismatchError`.

Dynamic tables (`tfps.layers.DynamicEmbedding`) are the exception: each row shard's id map holds the ids whose hash
falls in that shard, so their checkpoint restores only into as many shards; another count is refused with one line
naming both counts (`check_compatible`), before anything is restored.

Nothing else of tfps needs carrying: the exactly-once step records, sync gradient buffers and geo copies live only
for one run (a new run starts them afresh from the restored step counter), and variables created in place
(`tfps.training.initialization`) restore like any other.
"""

import logging
from typing import List, Tuple

import tensorflow as tf
import tf_keras

from tfps import _tf_private
from tfps.errors import CheckpointMismatchError
from tfps.training import tables

_SHOWN = 3  # differences named in the error (its count says how many more there are)


def create_optimizer_variables(optimizer, variables) -> None:
  """Creates every variable of `optimizer` (step counter, hyperparameters, a slot per shard of each of `variables`)
  now, as its first step would; call under the strategy scope, before restoring."""
  if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
    _tf_private.create_optimizer_slots(optimizer, variables)
  elif isinstance(optimizer, tf_keras.optimizers.Optimizer):
    optimizer.build(variables)
  _ = optimizer.iterations


def variables_so_far(model) -> list:
  """The model's trainable variables, or none if a sub-model has not made its own yet.

  A sub-model that the model's own call never reaches (a retrieval model's candidate tower) has no variables until
  the first step, and tf-keras raises when asked for them; the optimizer's variables are then left to that step.
  """
  try:
    return model.trainable_variables
  except ValueError:
    return []


def _is_variable(value) -> bool:
  return isinstance(value, tf.Variable) or _tf_private.is_sharded_variable(value)


def _children(value) -> dict:
  return dict(tf.train.TrackableView(value).children(value))


def _holds_variables(value) -> bool:
  return _is_variable(value) or any(_is_variable(v) for v in tf.train.TrackableView(value).descendants())


class _Comparison:
  """Walks the checkpoint's object graph and the live objects side by side, by the names the checkpoint uses."""

  def __init__(self, path: str):
    self.path = path
    self.graph = _tf_private.checkpoint_object_graph(path)
    self.shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    self.differences: List[str] = []
    self.matched = {}  # node id -> the live object it was compared with
    self._seen = set()

  def _saved_values(self, node_id: int) -> bool:
    node = self.graph.nodes[node_id]
    return not node.HasField("has_checkpoint_values") or node.has_checkpoint_values.value

  def compare(self, node_id: int, value, path: str, root: bool = False) -> None:
    if node_id in self._seen:
      return
    self._seen.add(node_id)
    self.matched[node_id] = value
    node = self.graph.nodes[node_id]
    self._check_table_shards(node, value, path)
    if _is_variable(value):
      for attribute in node.attributes:
        saved = self.shapes.get(attribute.checkpoint_key)
        if attribute.name == "VARIABLE_VALUE" and saved is not None and list(saved) != value.shape.as_list():
          self.differences.append(f"{path} has shape {list(saved)} in the checkpoint and {value.shape.as_list()} in "
                                  "the model")
    live = _children(value)
    for ref in node.children:
      if ref.local_name in live:
        self.compare(ref.node_id, live[ref.local_name], f"{path}/{ref.local_name}".lstrip("/"))
      elif not root and self._saved_values(ref.node_id):  # (a root may hold more than the model: training state)
        self.differences.append(f"{path}/{ref.local_name} is in the checkpoint but not in the model")
    saved_names = {ref.local_name for ref in node.children}
    for name, child in live.items():
      if name not in saved_names and _holds_variables(child):
        self.differences.append(f"{path}/{name} is in the model but not in the checkpoint".lstrip("/"))
    self._compare_slots(node, value, path)

  def _check_table_shards(self, node, value, path: str) -> None:
    """A layer keeping an id map per row shard (`DynamicEmbedding`) restores only into as many shards: its ids went
    to shards by hash of the id modulo their number, and its maps are not re-hashed into another layout."""
    live = getattr(value, "shards", None)
    if not (tables.is_table(value) and isinstance(live, (list, tuple))):
      return
    saved = [ref for ref in node.children if ref.local_name == "shards"]
    if not saved:
      return
    count = len(self.graph.nodes[saved[0].node_id].children)
    if count != len(live):
      raise CheckpointMismatchError(
          f"checkpoint {self.path} keeps the id maps of dynamic table {value.name!r} ({path}) in {count} shard(s) "
          f"and this run makes {len(live)} (one per ps unless --num_shards says otherwise): dynamic tables do not "
          f"move between ps counts; resume with the number of ps (and --num_shards) the checkpoint was saved with, "
          f"or train in a new model_dir. The checkpoint is untouched")

  def _compare_slots(self, node, value, path: str) -> None:
    """A legacy optimizer's slots are saved beside their variables: compare the names of the slots it keeps."""
    if not node.slot_variables or not isinstance(value, tf_keras.optimizers.legacy.Optimizer):
      return
    saved = sorted({slot.slot_name for slot in node.slot_variables})
    live = sorted(value.get_slot_names())
    if saved != live:
      self.differences.append(f"{path} keeps slots {saved} in the checkpoint and {live} in the model")


def check_compatible(path: str, root) -> _Comparison:
  """Raises `CheckpointMismatchError` unless checkpoint `path` fits `root` (a `tf.train.Checkpoint` of the model,
  with every variable created, optimizer slots included): the same objects holding variables, of the same shapes,
  and the same optimizer slots. The number of shards of a variable may differ."""
  comparison = _Comparison(path)
  comparison.compare(0, root, "", root=True)
  found = comparison.differences
  if found:
    more = f" (and {len(found) - _SHOWN} more)" if len(found) > _SHOWN else ""
    raise CheckpointMismatchError(f"checkpoint {path} does not fit this model: {'; '.join(found[:_SHOWN])}{more}. "
                                  "Resume with the model it was saved from, or train in a new model_dir")
  return comparison


def _value_key(node) -> str:
  return next((a.checkpoint_key for a in node.attributes if a.name == "VARIABLE_VALUE"), "")


def _pieces(comparison: _Comparison) -> List[Tuple[str, object]]:
  """`(checkpoint key, live variable)` of every sharded variable and every legacy optimizer slot: what `restore` reads
  piece by piece."""
  nodes, matched = comparison.graph.nodes, comparison.matched
  found = [(_value_key(nodes[i]), value) for i, value in matched.items()
           if _tf_private.is_sharded_variable(value) and _value_key(nodes[i])]
  for node_id, optimizer in matched.items():
    if not isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
      continue
    for slot in nodes[node_id].slot_variables:
      variable = matched.get(slot.original_variable_node_id)
      key = _value_key(nodes[slot.slot_variable_node_id])
      if variable is not None and key:
        found.append((key, optimizer.get_slot(variable, slot.slot_name)))
  return found


@tf.function(reduce_retracing=True)
def _read_into(part, path, keys, specs, device: str):
  """Restores one piece into variable `part`, read on `device` (its own ps); inside one function the restored tensor is
  the assign's alone, and it is gone when the call ends. Returns once it is assigned.

  `device` is a Python argument, not read from `part`: a trace serves every variable of its dtype (shapes are
  generalized: one trace per device and dtype instead of one per shape, which made TensorFlow warn of retracing at
  every resume of a model with many variables), and a device taken from `part` while tracing sent every shard's rows
  over from the first shard's ps (measured: the other ps peaked at 2.0x its share instead of 1.5x).
  """
  with tf.device(device):
    assigned = part.assign(tf.raw_ops.RestoreV2(prefix=path, tensor_names=keys, shape_and_slices=specs,
                                                dtypes=[part.dtype])[0], read_value=False)
    with tf.control_dependencies([assigned]):
      return tf.constant(True)


def _slice_spec(full: List[int], offset: int, rows: int) -> str:
  """The checkpoint slice of rows `[offset, offset + rows)` of a variable of shape `full`, every other dimension whole,
  written as TensorFlow writes the slices of a sharded variable it saves (`0,16`, not `-`): the reader copies a saved
  slice straight into the restored tensor only when the slice asked for is the same, spelled the same; otherwise it
  reads the saved slice whole into a tensor of its own first (measured: 2.0x the share instead of 1.5x)."""
  return " ".join(str(d) for d in full) + f" {offset},{rows}" + "".join(f":0,{d}" for d in full[1:])


def _restore_piecewise(path: str, key: str, variable) -> None:
  """Reads the saved value `key` into `variable` one shard at a time, each its own restore op on the shard's ps that
  requests only the shard's rows, assigned before the next is read: a ps holds one shard's rows more at most (and,
  when the saved slices differ from the live shards, the saved slice TensorFlow's reader reads whole for them)."""
  sharded = _tf_private.is_sharded_variable(variable)
  full = variable.shape.as_list()
  offset = 0
  for part in (variable.variables if sharded else [variable]):
    rows = int(part.shape[0]) if sharded else 0
    spec = _slice_spec(full, offset, rows) if sharded else ""
    _read_into(part, tf.constant(path), tf.constant([key]), tf.constant([spec]), part.device).numpy()
    offset += rows


def restore(path: str, root):
  """Checks (`check_compatible`) and restores checkpoint `path` into `root`, a `tf.train.Checkpoint` whose variables
  all exist (`create_optimizer_variables` for the optimizer), whatever number of ps and shards either side has.

  Raises:
    CheckpointMismatchError: the checkpoint does not fit (nothing is restored then).
  """
  pieces = _pieces(check_compatible(path, root))
  # Sharded variables and legacy slots are read piece by piece (`_restore_piecewise`), the rest as TensorFlow does.
  # The comparison has matched every object holding variables; TensorFlow's own `assert_existing_objects_matched`
  # cannot be used instead: a legacy optimizer hands out a new ShardedVariable of slot shards on each `get_slot`, and
  # the one the restore bound is never the one the assertion sees.
  options = tf.train.CheckpointOptions(experimental_skip_slot_variables=True)
  with _tf_private.restored_elsewhere([v for _, v in pieces if _tf_private.is_sharded_variable(v)]):
    status = root.read(path, options=options).expect_partial()
  quiet = _NoRetracingWarning()  # one trace per dtype, device and (until generalized) shape: expected, not a mistake
  tf.get_logger().addFilter(quiet)
  try:
    for key, variable in pieces:
      _restore_piecewise(path, key, variable)
  finally:
    tf.get_logger().removeFilter(quiet)
  return status


class _NoRetracingWarning(logging.Filter):
  """Drops TensorFlow's warning that a function was traced again."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "triggered tf.function retracing" not in record.getMessage()
