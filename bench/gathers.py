"""CPU of one gather of a batch's table rows, in one process: what a ps pays per pass over a batch's rows.

  .venv/bin/python bench/gathers.py                     # ~20 s; --intra_op_threads=1, --rows, --batch_rows
  GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python bench/gathers.py   # the table on transparent huge pages

A ps gathers a batch's distinct rows of a table for the lookup, and gathers and scatters them and their Adagrad
accumulators for the update: about five passes over the same rows per table and step. This times `tf.gather` of
`--batch_rows` ids from a `--rows` x 16 float32 variable inside a tf.function, 10 gathers per call on 10 fixed sets
of random ids (`cold`: rows spread over the whole table, as a batch's distinct rows are) and on 10 sets within the
first 6,000 rows (`hot`: rows in the CPU's caches), and a call that only reduces the ids (`overhead`: the call and
reductions without a gather). Prints CPU (process time, all threads) and wall ms per gather of each.
"""

import os
import time

from absl import app
from absl import flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_ROWS = flags.DEFINE_integer("rows", 2_600_000, "Rows of the table (the stacked deep table of bench/workload.py).",
                             lower_bound=1)
_BATCH_ROWS = flags.DEFINE_integer("batch_rows", 6_000, "Rows per gather (a batch of 256's distinct rows).",
                                   lower_bound=1)
_INTRA = flags.DEFINE_integer("intra_op_threads", 0, "TensorFlow's intra-op threads (0: its default, one per core).",
                              lower_bound=0)
_CALLS = flags.DEFINE_integer("calls", 200, "Timed calls per kind (10 gathers each).", lower_bound=1)


def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (after the flags: the thread count comes first)
  if _INTRA.value:
    tf.config.threading.set_intra_op_parallelism_threads(_INTRA.value)
  table = tf.Variable(tf.random.uniform([_ROWS.value, 16]))
  cold = [tf.random.uniform([_BATCH_ROWS.value], 0, _ROWS.value, dtype=tf.int64) for _ in range(10)]
  hot = [tf.random.uniform([_BATCH_ROWS.value], 0, min(6_000, _ROWS.value), dtype=tf.int64) for _ in range(10)]
  kinds = {
      "cold": tf.function(lambda: [tf.reduce_sum(tf.gather(table, ids)) for ids in cold]),
      "hot": tf.function(lambda: [tf.reduce_sum(tf.gather(table, ids)) for ids in hot]),
      "overhead": tf.function(lambda: [tf.reduce_sum(tf.cast(ids, tf.float32)) for ids in cold]),
  }
  print(f"{_BATCH_ROWS.value:,} rows per gather from a {_ROWS.value:,} x 16 table, intra-op threads "
        f"{_INTRA.value or 'default'}, GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")
  print("| kind | CPU ms per gather | wall ms per gather |\n| --- | --- | --- |")
  for name, call in kinds.items():
    for _ in range(3):
      call()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(_CALLS.value):
      call()
    gathers = 10 * _CALLS.value
    print(f"| {name} | {(time.process_time() - cpu) / gathers * 1e3:.3f} | "
          f"{(time.perf_counter() - wall) / gathers * 1e3:.3f} |")


if __name__ == "__main__":
  app.run(main)
