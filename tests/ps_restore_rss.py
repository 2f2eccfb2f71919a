"""Saves a 160 MB table and its Adagrad accumulator from 2 ps of real processes (each ps started by tfps's own server),
overwrites them, restores the checkpoint on the same ps (`tfps.training.resharding`) and writes to the JSON file given
each ps's RSS before the table existed, after the restore and at its peak (bytes), and whether the rows read back
equal the saved ones (tests/test_resharding.py)."""

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import portpicker
from ps_peak_rss import memory  # (this script's folder is on the path)

SERVE = ("import sys; from tfps.cluster import config, server; server.run_server(config.from_hosts(ps_hosts=sys.argv[1], "
         "worker_hosts=sys.argv[2], task_type=sys.argv[3], task_index=int(sys.argv[4])))")
ROWS, DIM = 2_500_000, 16  # 160 MB of float32: 80 MB of table and 80 MB of accumulator per ps


def _fill(tf, parts, scale):
  """Every shard (`parts`) of a variable set on its own ps to `scale * (1 + its index)`, a fresh tensor per shard."""
  for index, part in enumerate(parts):
    with tf.device(part.device):
      part.assign(tf.fill(part.shape, scale * (1 + index)), read_value=False)


def _rows_equal_saved(tf, parts, scale) -> bool:
  """Whether the first and last row of every shard (`parts`) read back `scale * (1 + its index)`, gathered on its ps
  (a shard given rows of the other shard's slice reads another value)."""
  equal = True
  for index, part in enumerate(parts):
    with tf.device(part.device):
      values = part.sparse_read([0, int(part.shape[0]) - 1]).numpy()
    equal = equal and np.array_equal(values, np.full(values.shape, scale * (1 + index), np.float32))
  return equal


def main(out):
  ps = [f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(2)]
  worker = f"127.0.0.1:{portpicker.pick_unused_port()}"
  servers = [subprocess.Popen([sys.executable, "-c", SERVE, ",".join(ps), worker, job, str(index)])
             for job, index in (("ps", 0), ("ps", 1), ("worker", 0))]
  try:
    import tfps  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tf_keras  # pylint: disable=g-import-not-at-top
    from tfps.training import resharding  # pylint: disable=g-import-not-at-top
    strategy, _ = tfps.build_strategy(tfps.cluster.config.from_hosts(ps_hosts=ps, worker_hosts=[worker]))
    with strategy.scope():
      probes = [tf.Variable(1.0), tf.Variable(1.0)]  # (round robin: one on each ps)
    [float(probe.read_value()) for probe in probes]  # both ps are up and have run an op
    time.sleep(1)
    before = [memory(server.pid, "VmRSS") for server in servers[:2]]
    with strategy.scope():
      layer = tf_keras.layers.Embedding(ROWS, DIM)
      layer.build((None,))
      optimizer = tf_keras.optimizers.legacy.Adagrad(0.1)
      resharding.create_optimizer_variables(optimizer, layer.embeddings.variables)  # as from model.trainable_variables
    table = layer.embeddings.variables
    accumulator = [optimizer.get_slot(part, "accumulator") for part in table]
    _fill(tf, table, 1.0)
    _fill(tf, accumulator, 0.5)
    path = tf.train.Checkpoint(layer=layer, optimizer=optimizer).write(os.path.join(os.path.dirname(out), "ckpt"))
    _fill(tf, table, -1.0)  # values the restore must replace
    _fill(tf, accumulator, -1.0)
    with strategy.scope():
      resharding.restore(path, tf.train.Checkpoint(layer=layer, optimizer=optimizer))
    equal = _rows_equal_saved(tf, table, 1.0) and _rows_equal_saved(tf, accumulator, 0.5)
    time.sleep(1)
    result = {"share_bytes": ROWS * DIM * 4, "shards": len(table), "rows_equal": bool(equal),
              "before_bytes": before, "after_bytes": [memory(server.pid, "VmRSS") for server in servers[:2]],
              "peak_bytes": [memory(server.pid, "VmHWM") for server in servers[:2]]}
    pathlib.Path(out).write_text(json.dumps(result), encoding="utf-8")
  finally:
    for server in servers:  # SIGKILL: nothing of a server is kept
      server.kill()
      server.wait()


if __name__ == "__main__":
  main(sys.argv[1])
