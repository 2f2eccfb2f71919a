"""The small dense variables of each ps are read in one transfer per step (`tfps.training.packing`); that they train
to the same weights as one process is `test_exactly_once.test_gradients_packed_per_ps_reach_their_own_variables`."""

import pytest
from test_exactly_once import async_runner
import tfps
from tfps.training import packing
import tensorflow as tf
import tf_keras


# One step per loop iteration: the function has one loop, whose body is one step (at batch 8 the default unrolls 4).
ONE_STEP_PER_ITERATION = tfps.TrainingMode(unrolled_steps=1)


def _loop_body(concrete):
  """The FunctionDef of the scheduled function's step loop body."""
  library = {function.signature.name: function for function in concrete.graph.as_graph_def().library.function}
  (loop,) = [op for op in concrete.graph.get_operations() if op.type in ("While", "StatelessWhile")]
  return library[loop.get_attr("body").name]


def _data_consumers(body, name):
  return [node for node in body.node_def if any(source.split(":")[0] == name for source in node.input)]


def _built(cluster, packed_reads):
  """A model of 3 dense layers over 2 ps, and its runner's step loop body."""
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(4, activation="tanh"),
                                 tf_keras.layers.Dense(2, activation="tanh"), tf_keras.layers.Dense(1)],
                                name="dense_model")
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "mse")
    runner = async_runner(model, coordinator, mode=tfps.TrainingMode(packed_reads=packed_reads, unrolled_steps=1))
  iterator = iter(tf.data.Dataset.from_tensors((tf.ones((8, 3)), tf.ones((8, 1)))).repeat())
  body = _loop_body(runner.function.get_concrete_function(iterator, tf.constant(5, tf.int64), tf.constant(0, tf.int64)))
  reads = [node for node in body.node_def if node.op == "ReadVariableOp" and node.name.startswith("while/dense_model/")]
  assert len(reads) == len(model.trainable_variables)  # each variable read once per step
  return model, body, reads


def test_the_dense_variables_of_each_ps_cross_to_the_worker_in_one_tensor_per_step(cluster):
  model, body, reads = _built(cluster, packed_reads=True)
  devices = {variable.device for variable in model.trainable_variables}
  assert len(devices) == 2, devices
  for read in reads:  # ... and used where it is, on its ps: none crosses alone
    assert {consumer.device for consumer in _data_consumers(body, read.name)} <= devices, read.name
  packs = [node for node in body.node_def if node.op == "ConcatV2" and node.device in devices]
  assert sorted(pack.device for pack in packs) == sorted(devices)  # one packed read per ps
  for pack in packs:
    assert {consumer.device for consumer in _data_consumers(body, pack.name)} == {"/device:CPU:0"}  # to the worker


def test_without_packed_reads_each_dense_variable_crosses_on_its_own(cluster):
  _, body, reads = _built(cluster, packed_reads=False)
  for read in reads:  # read on its ps, used on the worker
    assert "/device:CPU:0" in {consumer.device for consumer in _data_consumers(body, read.name)}, read.name


def test_a_variable_too_large_to_pack_or_not_trainable_is_read_as_before():
  assert packing.packable(tf.Variable(tf.zeros([packing.MAX_PACKED_BYTES // 4])))
  assert not packing.packable(tf.Variable(tf.zeros([packing.MAX_PACKED_BYTES // 4 + 1])))
  assert not packing.packable(tf.Variable(tf.zeros([3]), trainable=False))
  assert not packing.packable(tf.Variable(tf.zeros([3], tf.int64)))


class _ReadsAfterItsWrite(tf_keras.Sequential):
  """A step that reads its weights, writes one (the last bias, + 1) and reads them again: `shift` gets the mean change
  of the output between the two reads."""

  def train_step(self, data):
    features, _ = data
    before = self(features)
    self.layers[-1].bias.assign_add(tf.ones_like(self.layers[-1].bias))
    after = self(features)
    self.shift.assign(tf.reduce_mean(after - before))
    return {"loss": tf.reduce_mean(after)}


@pytest.mark.parametrize("packed_reads", [True, False])
def test_a_read_after_a_write_in_the_step_sees_the_write(cluster, packed_reads):
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = _ReadsAfterItsWrite([tf_keras.Input((3,)), tf_keras.layers.Dense(4, activation="tanh"),
                                 tf_keras.layers.Dense(2, activation="tanh"), tf_keras.layers.Dense(1)])
    model.shift = tf.Variable(0.0, trainable=False)
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "mse")
    runner = async_runner(model, coordinator, mode=tfps.TrainingMode(packed_reads=packed_reads))
  bias = model.layers[-1].bias
  assert sum(other.device == bias.device for other in model.trainable_variables) > 1  # packed with others

  def dataset_fn():
    return tf.data.Dataset.from_tensors((tf.ones((8, 3)), tf.ones((8, 1)))).repeat()
  iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
  coordinator.schedule(runner.function, args=(iterator, tf.constant(3, tf.int64), runner.progress.next_sequence()))
  coordinator.join()
  assert float(bias.numpy()[0]) == pytest.approx(3.0)  # 3 steps, each + 1
  assert float(model.shift.numpy()) == pytest.approx(1.0)  # the second read saw the step's write


class _Table(tf_keras.layers.Layer):
  """A small table (100 x 4, small enough to pack), looked up by gathers from the variable, or (`whole`) from its
  whole value, as a sharded table's lookup may read its shards."""

  def __init__(self, whole=False, **kwargs):
    super().__init__(**kwargs)
    self.whole = whole

  def build(self, input_shape):
    self.table = self.add_weight(name="table", shape=[100, 4])

  def call(self, ids):
    return tf.reduce_sum(tf.gather(tf.convert_to_tensor(self.table) if self.whole else self.table, ids), axis=1)


class _DenseFirst(tf_keras.Model):
  """Reads a dense layer's weights before it looks up its table (as a second tower may): the table's ps has made its
  packed read by then."""

  def __init__(self, table):
    super().__init__(name="dense_first")
    self.first, self.lookup, self.last = tf_keras.layers.Dense(4), table, tf_keras.layers.Dense(1)

  def call(self, inputs):
    return self.last(tf.concat([self.first(inputs["x"]), tf.reshape(self.lookup(inputs["ids"]), [8, -1])], axis=1))


_FEATURES = {"x": tf.ones((8, 3)), "ids": tf.constant([[1, 2, 3]] * 8, tf.int64)}


def _traced(cluster, build):
  """The step loop body of `build()`'s runner (packed reads, the default), and the dense Adagrad updates in its
  function library (the loop's, its branches')."""
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = build()
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "mse")
    runner = async_runner(model, coordinator, mode=ONE_STEP_PER_ITERATION)
  return _runner_traced(runner, lambda: model.trainable_variables)  # a subclassed model is built by the trace


def _runner_traced(runner, trainable_variables):
  """`_traced` of `runner`, whose model's variables `trainable_variables()` gives."""
  iterator = iter(tf.data.Dataset.from_tensors((_FEATURES, tf.ones((8, 1)))).repeat())
  concrete = runner.function.get_concrete_function(iterator, tf.constant(5, tf.int64), tf.constant(0, tf.int64))
  (table,) = [v for v in trainable_variables() if "table" in v.name]
  assert sum(other.device == table.device for other in trainable_variables()) > 1  # a pack on its ps
  library = concrete.graph.as_graph_def().library.function
  return _loop_body(concrete), [node for function in library for node in function.node_def
                                if node.op == "ResourceApplyAdagradV2"]


def _tables_read_whole(body):
  """The variables (the loop's arguments) the model gathers from that are also read whole."""
  gathered = {node.input[0] for node in body.node_def
              if node.op == "ResourceGather" and not node.name.startswith("while/Adagrad/")}  # not the slots' rows
  assert gathered
  return gathered & {node.input[0] for node in body.node_def if node.op == "ReadVariableOp"}


def _table_model(table):
  ids, x = tf_keras.Input((3,), dtype="int64", name="ids"), tf_keras.Input((3,), name="x")
  hidden = tf_keras.layers.Dense(4)(tf_keras.layers.Concatenate()([tf_keras.layers.Flatten()(table(ids)), x]))
  return tf_keras.Model({"ids": ids, "x": x}, tf_keras.layers.Dense(1)(hidden))


def test_a_table_gathered_before_the_dense_reads_stays_out_of_the_pack_and_sparse(cluster):
  body, dense_applies = _traced(cluster, lambda: _table_model(_Table(name="lookup")))
  assert not _tables_read_whole(body)
  assert len(dense_applies) == 4  # the 2 kernels and 2 biases; the table's rows are updated sparsely


def test_a_keras_embedding_looked_up_after_the_pack_stays_out_of_it(cluster):
  body, dense_applies = _traced(cluster, lambda: _DenseFirst(tf_keras.layers.Embedding(100, 4, name="table")))
  assert not _tables_read_whole(body)
  assert len(dense_applies) == 4


def test_any_table_looked_up_after_the_pack_stays_out_of_it(cluster):
  """Not a tf-keras Embedding, looked up after its ps's packed read is made: found by the step's scratch trace."""
  body, dense_applies = _traced(cluster, lambda: _DenseFirst(_Table(name="lookup")))
  assert not _tables_read_whole(body)
  assert len(dense_applies) == 4


def _dense_first_model_fn(features, labels, mode):
  hidden = tf_keras.layers.Dense(4)(features["x"])
  looked_up = tf_keras.layers.Flatten()(tf_keras.layers.Embedding(100, 4, name="table")(features["ids"]))
  predictions = tf_keras.layers.Dense(1)(tf.concat([hidden, looked_up], axis=1))
  return tfps.EstimatorSpec(mode, loss=tf.reduce_mean(tf.square(predictions - labels)),
                            optimizer=tf_keras.optimizers.legacy.Adagrad(0.1))


def test_a_table_a_model_fn_looks_up_after_the_pack_stays_out_of_it(cluster, tmp_path):
  estimator = tfps.Estimator(_dense_first_model_fn, model_dir=str(tmp_path), cluster=cluster,
                             config=tfps.RunConfig(mode=ONE_STEP_PER_ITERATION))
  estimator.train(lambda: tf.data.Dataset.from_tensors((_FEATURES, tf.ones((8, 1)))).repeat(), max_steps=1)
  model = estimator.distributed_model()
  body, dense_applies = _runner_traced(model.runner, model.model.variables.trainable_variables_flat)
  assert not _tables_read_whole(body)
  assert len(dense_applies) == 4


def test_a_table_read_whole_from_the_pack_keeps_its_sparse_gradient(cluster):
  """A lookup from the table's whole value, taken from the pack (made before it): the tapes see the table's part as
  its read, not the concatenation of the pack, which would have given the whole table a dense gradient."""
  _, dense_applies = _traced(cluster, lambda: _DenseFirst(_Table(whole=True, name="lookup")))
  assert len(dense_applies) == 4  # no dense update of the table: its rows are updated sparsely
