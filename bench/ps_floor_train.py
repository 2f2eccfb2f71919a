"""The ps's floor: the benchmark workload trained by a loop written directly in TensorFlow, nothing else on the ps.

Run by `plain_pss_train.py --path=ps_floor` as its chief (no tfps code: the cluster, the strategy and the loop are
TensorFlow's own). Each step of a scheduled function (`--steps_per_execution` steps in a `tf.range` loop, as tf-keras
runs them) trains the workload's Wide&Deep (same inputs, shapes, loss and Adagrad) with only what any
ParameterServerStrategy training of it must do on the ps:

* the step's distinct ids (the 26 features' ids offset into the two stacked tables, made distinct on the worker)
  reach the ps, which gathers their rows of the deep (2.6M x 16) and the wide (2.6M x 1) table for the worker;
* the worker reads each dense variable (the model's 10), computes the model and its gradients (`tf.GradientTape`);
* the rows' gradients go back and each table's rows and Adagrad accumulators are updated there as a legacy Adagrad
  does (accumulators and rows gathered, updated, scattered back: tfps's way, cheaper than the kernel's);
* each dense gradient goes back and is applied there with `ResourceApplyAdagradV2`.

Nothing else runs on the ps: no loss metric, no step counter, no step records, no exactly-once gates, no locks. With
`packed_dense` (`--packed_dense`) the 10 dense variables are one variable (one read and one update per step). What
the ps spends per step here is what TensorFlow's runtime costs for this work on this machine.

With more than one ps the variables are laid out as tfps lays them out (`bench/ps_floor_layout.py`): each table's
rows split over the ps, each step's distinct ids routed to the piece holding them (on the worker), the rows gathered
and updated on that piece's ps; the large first deep kernel split too and the other dense variables whole, spread over
the ps. `packed_dense` is for 1 ps only.
"""

import os
import sys

from bench import epoch_timer
from bench import ps_floor_layout as layout
from bench import workload as workload_lib


def train(batch_size: int, vocab_size: int, steps: int, measure: int, steps_per_execution: int,
          packed_dense: bool = False) -> dict:
  """Trains the floor's step for `1 + measure` windows of `steps` steps; returns the rates of the measured windows."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfps.data import schema  # pylint: disable=g-import-not-at-top  (column names only)
  workload = workload_lib.Workload(batch_size=batch_size, vocab_size=vocab_size)
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  num_ps = resolver.cluster_spec().num_tasks("ps")
  if packed_dense and num_ps != 1:
    raise SystemExit(f"ps_floor_train: packed_dense is measured with 1 ps (got {num_ps})")
  strategy = tf.distribute.ParameterServerStrategy(
      resolver, variable_partitioner=layout.partitioner(num_ps) if num_ps > 1 else None)
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
  categorical = workload.categorical()
  offsets = np.cumsum([0] + list(categorical.values()))[:-1]
  rows = sum(categorical.values())
  shapes = workload.dense_shapes()
  sizes = [int(np.prod(shape)) for shape in shapes]
  variable_shapes = [[sum(sizes)]] if packed_dense else shapes
  uniform = lambda shape: tf.random.uniform(shape, -0.05, 0.05)
  made = layout.create(strategy, dict(enumerate(variable_shapes), deep=[rows, workload_lib.EMBEDDING_DIM],
                                      wide=[rows, 1]),
                       dict({index: (uniform, 0.1) for index in range(len(variable_shapes))},
                            deep=(uniform, 0.1), wide=(tf.zeros, 0.1)), num_ps)
  dense = [made[index] for index in range(len(variable_shapes))]  # each variable's [(piece, accumulator)]
  table_rows = {name: [int(piece.shape[0]) for piece, _ in made[name]] for name in ("deep", "wide")}
  rate = workload_lib.LEARNING_RATE

  def update_rows(table, accumulator, ids, gradient):
    # All on the ps: the arithmetic of tfps's row updates (`tfps._tf_private.adagrad_rows_at_once`), written out here
    # because the floor runs no tfps training code.
    with tf.device(table.device):
      accumulated = tf.gather(accumulator, ids) + gradient * gradient
      updated = tf.gather(table, ids) - rate * gradient / (tf.sqrt(accumulated) + 1e-7)
      return tf.group(accumulator.scatter_update(tf.IndexedSlices(accumulated, ids)),
                      table.scatter_update(tf.IndexedSlices(updated, ids)))

  def lookup(name, distinct):
    """`(ids, positions, rows)` per piece of table `name`: the distinct ids routed to the piece holding them (their
    places in `distinct`), its rows gathered there."""
    parts, places = layout.route(distinct, table_rows[name])
    return parts, places, [tf.gather(piece, part) for (piece, _), part in zip(made[name], parts)]

  def model(dense_features, deep_rows, wide_rows, positions, values):
    """The workload's Wide&Deep on the gathered rows: `(logits)`; `values` are the dense variables' values."""
    if packed_dense:
      values = [tf.reshape(part, shape) for part, shape in zip(tf.split(values[0], sizes), shapes)]
    wide_kernel, wide_bias, *deep_layers = values
    embedded = tf.reshape(tf.gather(deep_rows, positions), [batch_size, -1])
    hidden = tf.concat([embedded, dense_features], axis=1)
    for kernel, bias in zip(deep_layers[0:-2:2], deep_layers[1:-2:2]):
      hidden = tf.nn.relu(tf.matmul(hidden, kernel) + bias)
    deep_logit = tf.matmul(hidden, deep_layers[-2]) + deep_layers[-1]
    wide_logit = (tf.reduce_sum(tf.reshape(tf.gather(wide_rows, positions), [batch_size, -1]), axis=1, keepdims=True)
                  + tf.matmul(dense_features, wide_kernel) + wide_bias)
    return deep_logit + wide_logit

  def step(iterator):
    features, labels = next(iterator)
    ids = tf.stack([tf.cast(features[name], tf.int64) + int(offset)
                    for name, offset in zip(schema.CATEGORICAL_COLUMNS, offsets)], axis=1)
    distinct, positions = tf.unique(tf.reshape(ids, [-1]))
    (deep_ids, deep_places, deep_parts), (wide_ids, wide_places, wide_parts) = (lookup("deep", distinct),
                                                                                lookup("wide", distinct))
    pieces = [[tf.convert_to_tensor(piece) for piece, _ in variable] for variable in dense]
    with tf.GradientTape() as tape:
      tape.watch([deep_parts, wide_parts, pieces])
      deep_rows, wide_rows = whole(deep_places, deep_parts), whole(wide_places, wide_parts)
      values = [part[0] if len(part) == 1 else tf.concat(part, axis=0) for part in pieces]
      logits = model(features[schema.DENSE], deep_rows, wide_rows, positions, values)
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels[:, None], logits))
    gradients = [[tf.convert_to_tensor(gradient) for gradient in part]
                 for part in tape.gradient(loss, [deep_parts, wide_parts] + pieces)]
    updates = [update_rows(piece, accumulator, part_ids, gradient) for name, part_ids, part_gradients in
               (("deep", deep_ids, gradients[0]), ("wide", wide_ids, gradients[1]))
               for (piece, accumulator), part_ids, gradient in zip(made[name], part_ids, part_gradients)]
    for variable, part_gradients in zip(dense, gradients[2:]):
      for (piece, accumulator), gradient in zip(variable, part_gradients):
        with tf.device(piece.device):
          updates.append(tf.raw_ops.ResourceApplyAdagradV2(var=piece.handle, accum=accumulator.handle, lr=rate,
                                                           epsilon=1e-7, grad=gradient))
    with tf.control_dependencies(updates):
      return tf.identity(loss)

  def whole(places, parts):
    """A table's rows of the step's distinct ids, from its pieces' `parts` (one piece: its rows as they are)."""
    return parts[0] if len(parts) == 1 else tf.dynamic_stitch(places, parts)

  @tf.function
  def scheduled(iterator):
    loss = tf.constant(0.0)
    for _ in tf.range(steps_per_execution):
      loss = step(iterator)
    return loss

  iterator = iter(coordinator.create_per_worker_dataset(lambda: workload_lib.dataset(workload)))
  timer = epoch_timer.EpochTimer()
  functions = -(-steps // steps_per_execution)
  losses = []
  for epoch in range(1 + measure):
    timer.begin(epoch)
    last = [coordinator.schedule(scheduled, args=(iterator,)) for _ in range(functions)][-1]
    coordinator.join()
    timer.end(epoch)
    losses.append(float(last.fetch()))
  wall = sum(timer.seconds)
  return dict(epoch_timer.rates(timer.seconds, functions * steps_per_execution * batch_size,
                                functions * steps_per_execution),
              steps_per_execution=steps_per_execution, num_ps=num_ps,
              piece_ps=piece_ps(made), chief_cpu_share=sum(timer.cpu) / wall,
              measured_span=timer.span, packed_dense=packed_dense, losses=losses,
              tfps_modules=sorted(name for name in sys.modules if name.split(".")[0] == "tfps"))


def piece_ps(made: dict) -> dict:
  """`name -> [ps index of each piece]` of the floor's variables (`str` names: the dense variables' indices)."""
  return {str(name): [int(piece.device.split("task:")[1].split("/")[0]) for piece, _ in pieces]
          for name, pieces in made.items()}


if __name__ == "__main__":
  raise SystemExit(f"run {os.path.join(os.path.dirname(__file__), 'plain_pss_train.py')} --path=ps_floor")
