"""Creates a 400 MB table and its Adagrad accumulator through tfps on one ps of real processes and writes that ps's
RSS before, after and at its peak (bytes) to the JSON file given (tests/test_initialization.py)."""

import json
import subprocess
import sys
import time

import portpicker

SERVE = ("import sys, tensorflow as tf; tf.distribute.Server(tf.train.ClusterSpec({'ps': [sys.argv[1]], 'worker': "
         "[sys.argv[2]]}), job_name=sys.argv[3], task_index=0).join()")
ROWS, DIM = 6_250_000, 16  # 400 MB of float32


def memory(pid, field):
  with open(f"/proc/{pid}/status", encoding="ascii") as status:
    return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def main(out):
  ps, worker = (f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(2))
  servers = [subprocess.Popen([sys.executable, "-c", SERVE, ps, worker, job]) for job in ("ps", "worker")]
  try:
    import tfps  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import tf_keras  # pylint: disable=g-import-not-at-top
    strategy, coordinator = tfps.build_strategy(tfps.cluster.config.from_hosts(ps_hosts=[ps], worker_hosts=[worker]))
    with strategy.scope():
      probe = tf.Variable(1.0)
    float(probe.read_value())  # the ps is up and has run an op
    time.sleep(1)
    before = memory(servers[0].pid, "VmRSS")
    with strategy.scope():
      layer = tf_keras.layers.Embedding(ROWS, DIM)
      layer.build((None,))
      table = layer.embeddings  # one ps: one shard
      optimizer = tf_keras.optimizers.legacy.Adagrad(0.1)

    @tf.function
    def step():  # the accumulator is created while this is traced, as in training
      strategy.run(lambda: optimizer.apply_gradients([(tf.IndexedSlices(tf.ones([1, DIM]), tf.constant([3])), table)]))
    with strategy.scope():  # as in tf-keras's fit, which traces its train function under the scope
      coordinator.schedule(step)
      coordinator.join()
    # Every op above has run on the ps. (A sparse read: a dense read of a variable that sparse ops have used copies it.)
    float(optimizer.get_slot(table, "accumulator").sparse_read([3])[0, 0])
    time.sleep(1)
    result = {"table_bytes": ROWS * DIM * 4, "before_bytes": before, "after_bytes": memory(servers[0].pid, "VmRSS"),
              "peak_bytes": memory(servers[0].pid, "VmHWM")}
    with open(out, "w", encoding="utf-8") as f:
      json.dump(result, f)
    print(result)
  finally:
    for server in servers:
      server.kill()


if __name__ == "__main__":
  main(sys.argv[1])
