"""CPU of one legacy-Adagrad update of a batch's table rows, in one process: TensorFlow's sparse kernel against the
rows all at once under the table's lock and without it (`--lockfree_row_updates`), and under the lock without the
optimizer's summing of duplicate ids (`unsummed`: async training's default for a stacked table, whose ids are
distinct; `tfps.training.distinct_rows`).

  .venv/bin/python bench/row_updates.py              # ~1 min; --rows, --batch_rows, --applies, --repeats

Each variant applies the same gradient (`--batch_rows` distinct rows of a `--rows` x 16 table) `--applies` times in a
tf.function, after two warm-up calls; the variants alternate `--repeats` times. Prints CPU ms per update (process time,
all threads) per variant and repeat, and each variant's median against the kernel's. Also checks that every variant
leaves the same weights and accumulators as the kernel, bit for bit. The legacy optimizer's own summing of duplicate
ids (`Unique` and `UnsortedSegmentSum`) runs in every variant but `unsummed`.
"""

import contextlib
import os
import statistics
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position
import tf_keras  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `tfps`

from tfps import _tf_private  # pylint: disable=g-import-not-at-top,wrong-import-position

_ROWS = flags.DEFINE_integer("rows", 2_600_000, "Rows of the table (the stacked deep table of bench/workload.py).",
                             lower_bound=1)
_BATCH_ROWS = flags.DEFINE_integer("batch_rows", 6_000, "Distinct rows each update touches (a batch of 256 on the "
                                   "workload touches about 6,000).", lower_bound=1)
_APPLIES = flags.DEFINE_integer("applies", 200, "Updates timed per variant and repeat.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Alternating repetitions.", lower_bound=1)

VARIANTS = ("kernel", "locked", "lockfree", "unsummed")


def _updater(variant: str):
  """`(apply, optimizer, table)`: a traced update of a fresh zero table by `variant`."""
  optimizer, table = tf_keras.optimizers.legacy.Adagrad(0.1), tf.Variable(tf.zeros([_ROWS.value, 16]))
  ids = np.random.RandomState(0).choice(_ROWS.value, _BATCH_ROWS.value, replace=False)
  values = tf.random.stateless_normal([_BATCH_ROWS.value, 16], [1, 2])
  gradient = tf.IndexedSlices(values, tf.constant(ids, tf.int64), tf.constant([_ROWS.value, 16], tf.int64))

  @tf.function
  def apply():
    rows = (contextlib.nullcontext() if variant == "kernel" else
            _tf_private.adagrad_rows_at_once(optimizer, locked=variant != "lockfree"))
    # The ids are distinct by construction; a stacked table's are recognised by their marks instead.
    unsummed = (_tf_private.sparse_updates_unsummed(optimizer, lambda ids: True) if variant == "unsummed" else
                contextlib.nullcontext())
    with rows, unsummed:
      optimizer.apply_gradients([(gradient, table)])

  return apply, optimizer, table


def main(argv):
  del argv
  cpu = {variant: [] for variant in VARIANTS}
  states = {}
  for _ in range(_REPEATS.value):
    for variant in VARIANTS:
      apply, optimizer, table = _updater(variant)
      apply()
      apply()
      start = time.process_time()
      for _ in range(_APPLIES.value):
        apply()
      cpu[variant].append((time.process_time() - start) / _APPLIES.value * 1e3)
      states[variant] = (table.numpy(), optimizer.get_slot(table, "accumulator").numpy())
  kernel = statistics.median(cpu["kernel"])
  print(f"{_BATCH_ROWS.value:,} distinct rows of a {_ROWS.value:,} x 16 table, {_APPLIES.value} updates per run")
  print("| variant | CPU ms per update (runs) | x kernel | same values as the kernel |")
  print("| --- | --- | --- | --- |")
  for variant in VARIANTS:
    same = all((a == b).all() for a, b in zip(states[variant], states["kernel"]))
    runs = ", ".join(f"{ms:.2f}" for ms in cpu[variant])
    print(f"| {variant} | {statistics.median(cpu[variant]):.2f} ({runs}) | "
          f"{statistics.median(cpu[variant]) / kernel:.2f} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
  app.run(main)
