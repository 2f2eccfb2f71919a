"""The ps's floor's variables laid out over the ps as tfps lays out the benchmark workload's (no tfps code).

tfps (`tfps.training.strategy.ShardLargeVariables`, `min_shard_bytes` 256 KiB by default) splits each variable of at
least 256 KiB along its first axis into one piece per ps (the first pieces a row longer where the rows do not divide:
`FixedShardsPartitioner`'s split), keeps smaller ones whole, and ParameterServerStrategy puts each piece or whole
variable on the next ps in the order they are created. tfps's Wide&Deep creates the wide table, the wide kernel and
bias, one more variable, then the deep table and the deep layers' kernels and biases; at 2 ps that is 15 pieces: both
tables and the first deep kernel (429 x 256) in 2, the other 9 dense variables whole, alternating between the ps (read
from the model built under tfps's strategy at 2 ps). Each piece's Adagrad accumulator lives beside it. The floor
creates its variables in that order (with a scalar of its own for the one more), so the strategy's round-robin places
them where tfps's are; at 1 ps everything is on the one ps, as before.
"""

from typing import List, Sequence, Tuple

import numpy as np

MIN_SHARD_BYTES = 256 << 10  # tfps's default min_shard_bytes (tfps.cluster.options.DEFAULT_MIN_SHARD_BYTES)
FILLER = None  # in `creation_order`: the one more variable tfps's model creates before the deep table


def piece_rows(shape: Sequence[int], num_ps: int) -> List[int]:
  """The rows of each piece tfps makes of a float32 variable of `shape` at `num_ps` ps (one piece: kept whole)."""
  rows = int(shape[0]) if len(shape) else 1
  pieces = 1
  if len(shape) and rows >= 2 and int(np.prod(shape)) * 4 >= MIN_SHARD_BYTES:
    pieces = min(num_ps, rows)
  base, extra = divmod(rows, pieces)
  return [base + (index < extra) for index in range(pieces)]


def creation_order(num_dense: int, num_ps: int) -> list:
  """tfps's order of creation: "wide", "deep" (the stacked tables), dense variable indices, `FILLER` (not at 1 ps)."""
  dense = list(range(num_dense))
  return ["wide"] + dense[:2] + ([FILLER] if num_ps > 1 else []) + ["deep"] + dense[2:]


def placement(shapes: dict, num_ps: int) -> dict:
  """`name -> [(rows, ps index)]` of each piece, for `shapes` (`"wide"`, `"deep"` and the dense indices ->
  shape), as the round-robin places them in `creation_order`."""
  count, placed = 0, {}
  for name in creation_order(len(shapes) - 2, num_ps):
    rows = [1] if name is FILLER else piece_rows(shapes[name], num_ps)
    if name is not FILLER:
      placed[name] = [(piece, (count + index) % num_ps) for index, piece in enumerate(rows)]
    count += len(rows)
  return placed


def create(strategy, shapes: dict, initial: dict, num_ps: int) -> dict:
  """`name -> [(piece, accumulator)]`: each variable's pieces created under `strategy` (a ParameterServerStrategy
  whose partitioner splits as `piece_rows` does), in `creation_order`, from `initial` (`name -> (initializer of a
  shape, the accumulator's initial value)`), each accumulator beside its piece."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  made = {}
  with strategy.scope():
    for name in creation_order(len(shapes) - 2, num_ps):
      if name is FILLER:
        tf.Variable(0.0, trainable=False, name="filler")  # takes tfps's model's one more variable's ps
        continue
      fill, accumulated = initial[name]
      def value(shape=tuple(shapes[name]), fill=fill, partition_shape=None, partition_offset=None):
        del partition_offset  # each piece made in place at its own shape, as tfps makes its tables
        return fill(list(partition_shape or shape))
      variable = tf.Variable(value, shape=shapes[name], dtype=tf.float32)
      pieces = list(getattr(variable, "variables", [variable]))  # a ShardedVariable's pieces, in row order
      accumulators = []
      for piece in pieces:
        with strategy.extended.colocate_vars_with(piece):
          accumulators.append(tf.Variable(tf.fill(piece.shape, accumulated)))
      made[name] = list(zip(pieces, accumulators))
  return made


def partitioner(num_ps: int):
  """The strategy's `variable_partitioner`: `piece_rows`'s split (tfps's), for the floor's float32 variables."""
  return lambda shape, dtype, axis=0: [len(piece_rows(list(shape), num_ps))] + [1] * (len(shape) - 1)


def route(ids, pieces: Sequence[int]) -> Tuple[list, list]:
  """`(local ids, positions)` per piece of distinct `ids` (1-D int64) in a table split in `pieces` rows: each id's row
  in the piece holding it, and where in `ids` it was (for `tf.dynamic_stitch`); one piece: `ids` as they are."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if len(pieces) == 1:
    return [ids], None
  ends = np.cumsum(pieces)
  shard_of = tf.searchsorted(tf.constant(ends, ids.dtype), ids, side="right", out_type=tf.int32)
  local = ids - tf.gather(tf.constant(ends - np.asarray(pieces), ids.dtype), shard_of)
  return (tf.dynamic_partition(local, shard_of, len(pieces)),
          tf.dynamic_partition(tf.range(tf.size(ids)), shard_of, len(pieces)))
