"""Delta exports on the Estimator path (`RunConfig(delta_export_secs=...)`): a base plus its deltas answers as the
full export at the same step, on files and on a stream, where each delta names the stream positions of its examples."""

import errno
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import online_stream
import tfps
from tfps.cli import delta as delta_cli
from tfps.data.stream import batches as batches_lib
from tfps.data.stream import folder as folder_lib
from tfps.estimator import online
from tfps.training import delta_schedule
from tfps.training import deltas
from tfps.training import table_deltas
from tfps.training import tables
from tfps.training import touched_rows

from test_deltas import (DYNAMIC_IDS, PHASE_BATCHES, WIDE_DEEP_CATEGORICAL, chain, id_map, phase_ids, phased_fn,
                         wide_deep_fn)
from test_fit import NUM_IDS, VOCAB, examples  # a 50k x 8 table, sharded over both ps

SERVING = {"ids": tf.TensorSpec([None, NUM_IDS], tf.int64), "dense_in": tf.TensorSpec([None, 1], tf.float32)}


def model_fn(features, labels, mode):
  embedded = tf_keras.layers.Embedding(VOCAB, 8, name="table")(features["ids"])
  inputs = tf.concat([tf.reshape(embedded, [-1, NUM_IDS * 8]), features["dense_in"]], axis=1)
  logits = tf_keras.layers.Dense(1)(tf_keras.layers.Dense(8, activation="relu")(inputs))[:, 0]
  if mode == tfps.ModeKeys.PREDICT:
    return tfps.EstimatorSpec(mode, predictions={"probability": tf.sigmoid(logits)})
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
  return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.Adagrad(0.1))


def input_fn(input_context):
  features, labels = examples(2_000, seed=1 + input_context.input_pipeline_id)
  return tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(2_000).repeat().batch(32, drop_remainder=True)


def served_variables(path):
  return [variable.numpy() for variable in tf.saved_model.load(path).delta_variables]


def assert_same_model(applied, full, features, variables=5, output="probability"):
  """`applied` and `full` hold the same `variables` values (by default the table, two dense layers' kernels and
  biases) and answer `features` alike (their `output`), to 1e-6; returns the answers of `applied`."""
  got, want = served_variables(applied), served_variables(full)
  assert len(got) == len(want) == variables
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  serve = [tf.saved_model.load(path).signatures["serving_default"] for path in (applied, full)]
  answers = [fn(**{name: tf.constant(value) for name, value in features.items()})[output].numpy() for fn in serve]
  np.testing.assert_allclose(answers[0], answers[1], atol=1e-6, rtol=0)
  return answers[0]


def test_base_plus_deltas_answers_as_the_full_export(cluster, tmp_path):
  config = tfps.RunConfig(delta_export_secs=0, log_step_count_steps=5, save_checkpoints_steps=10,
                          steps_per_execution=5)
  estimator = tfps.Estimator(model_fn, model_dir=str(tmp_path / "run"), config=config, cluster=cluster)
  estimator.train(input_fn, max_steps=15)
  estimator.train(input_fn, steps=5)  # the same chain goes on: no second base
  base, delta_paths = chain(str(tmp_path / "run" / "deltas"))
  assert [os.path.basename(path) for path in [base] + delta_paths] == [
      "base-000000", "delta-000001", "delta-000002", "delta-000003", "delta-000004"]
  assert deltas.read_manifest(base)["step"] == 0 and deltas.read_manifest(base)["saved_model"] == "module"
  manifests = [deltas.read_manifest(path) for path in delta_paths]
  assert [m["step"] for m in manifests] == [5, 10, 15, 20]
  table = manifests[0]["variables"][0]
  assert table["shape"] == [VOCAB, 8] and table["shipped"] == "rows" and 0 < table["rows"] < VOCAB // 10
  assert [v["shipped"] for v in manifests[0]["variables"][1:]] == ["whole"] * 4
  full = estimator.export_saved_model(str(tmp_path / "full"), SERVING)
  applied = tfps.delta.apply(base, delta_paths, str(tmp_path / "served"))
  assert deltas.read_manifest(applied)["step"] == 20
  assert np.abs(served_variables(base)[0] - served_variables(full)[0]).max() > 1e-3  # training moved rows
  assert_same_model(applied, full, examples(100, seed=7)[0])


def counting_model_fn(features, labels, mode):
  """online_stream's counting model (each application of a message adds 1 to its row), which also predicts."""
  del labels
  rows = tf_keras.layers.Embedding(online_stream.MAX_MESSAGES, 1, embeddings_initializer="zeros",
                                   name=online_stream.TABLE)(features["id"])
  if mode == tfps.ModeKeys.PREDICT:
    return tfps.EstimatorSpec(mode, predictions={"count": tf.reshape(rows, [-1])})
  return tfps.EstimatorSpec(mode, loss=-tf.reduce_sum(rows), optimizer=tf_keras.optimizers.legacy.SGD(1.0))


SLICE = 32  # lines per slice


def stream_features():
  """Ids 0-69 (64 of them in the stream) with the other feature the stream's base serves."""
  return {"id": tf.range(70, dtype=tf.int64), "dense": tf.ones([70, 1])}


def write_slices(folder, count):
  for index in range(count):
    name = os.path.join(folder, f"slice-{index:04d}.csv")
    with open(name, "w", encoding="utf-8") as f:
      f.write("".join(f"{i},{i % 2},1.5\n" for i in range(index * SLICE, (index + 1) * SLICE)))
    open(name + ".done", "w", encoding="utf-8").close()


def line_of(positions):
  """The stream position `{"folder": [slice, lines read]}` (`{}` at its start) as the number of lines read."""
  name, line = positions.get(folder_lib.KEY, [None, 0])
  return 0 if name is None else int(name[len("slice-"):-len(".csv")]) * SLICE + line


def folder_stream(root):
  """`(folder, make_batches)`: a folder stream of 64 messages (2 slices) in `root/stream`, in batches of 8."""
  stream = root / "stream"
  stream.mkdir()
  write_slices(str(stream), 2)

  def make(positions):
    source = folder_lib.FolderSource(str(stream), pattern="slice-*.csv", positions=positions, poll_secs=0.05)
    return batches_lib.StreamBatches(source, online_stream.SPEC, batch_size=8)

  return stream, make


@pytest.fixture(scope="module")
def stream_run(cluster, tmp_path_factory):
  """The counting model trained on a folder stream of 64 messages (2 slices), a delta after every 2 steps of 8."""
  root = tmp_path_factory.mktemp("stream_deltas")
  stream, make = folder_stream(root)
  config = tfps.RunConfig(delta_export_secs=0, steps_per_execution=2, log_step_count_steps=2,
                          save_checkpoints_steps=100)
  estimator = tfps.Estimator(counting_model_fn, model_dir=str(root / "run"), config=config, cluster=cluster,
                             strategy_options={"min_shard_bytes": 0})  # the table sharded over both ps
  assert online.train_on_stream(estimator, make, max_steps=8) == 8
  full = estimator.export_saved_model(str(root / "full"), {key: tf.TensorSpec.from_tensor(value)
                                                           for key, value in stream_features().items()})
  return str(root / "run" / "deltas"), full, f"folder {stream}"


def served_counts(path):
  return tf.saved_model.load(path).signatures["serving_default"](**stream_features())["count"].numpy()


def test_deltas_on_a_stream_name_the_positions_of_their_examples(stream_run, tmp_path):
  folder, full, name = stream_run
  base, delta_paths = chain(folder)
  assert deltas.read_manifest(base)["stream"] == {"name": name, "to": {}}  # the stream's start
  spans = []
  for path in delta_paths:
    manifest = deltas.read_manifest(path)
    assert manifest["stream"]["name"] == name and manifest["variables"][0]["shipped"] == "rows"
    spans.append((line_of(manifest["stream"]["from"]), line_of(manifest["stream"]["to"])))
    with np.load(os.path.join(path, deltas.TENSORS)) as tensors:  # the rows of exactly those examples, once each
      assert sorted(tensors["0/ids"].tolist()) == list(range(*spans[-1]))
      np.testing.assert_array_equal(tensors["0/rows"], np.ones((spans[-1][1] - spans[-1][0], 1)))
  assert spans == [(0, 16), (16, 32), (32, 48), (48, 64)]  # 2 steps of 8 examples each
  applied = tfps.delta.apply(base, delta_paths, str(tmp_path / "served"))
  last = deltas.read_manifest(delta_paths[-1])["stream"]
  assert deltas.read_manifest(applied)["stream"] == {"name": name, "to": last["to"]}  # what the served model holds
  for path in (applied, full):
    np.testing.assert_array_equal(served_counts(path), (np.arange(70) < 64).astype(np.float32))


def test_command_line_applies_an_estimator_chain(stream_run, tmp_path, capsys):
  base, delta_paths = chain(stream_run[0])
  assert delta_cli.main(["tfps-delta", "apply", base, *delta_paths[:2], f"--out={tmp_path}/served"]) == 0
  assert capsys.readouterr().out == f"{tmp_path}/served\n"
  assert deltas.read_manifest(f"{tmp_path}/served")["step"] == 4
  np.testing.assert_array_equal(served_counts(f"{tmp_path}/served"), (np.arange(70) < 32).astype(np.float32))


def test_a_failed_delta_on_a_stream_leaves_its_examples_to_the_next(tmp_path, monkeypatch):
  """A full disk while writing a delta: the next delta ships its rows and starts its stream span where the last
  written delta ended."""
  table = tf.Variable(tf.zeros([10, 2]))
  touched = touched_rows.TouchedRows(tf.distribute.get_strategy())
  writer = deltas.DeltaWriter(str(tmp_path), [table], touched)
  step = [0]
  schedule = delta_schedule.DeltaSchedule(writer, 0, lambda: step[0], os.makedirs)
  schedule.begin(stream=("s", {"p": 0}))

  def train(rows, position):
    touched.mark(table, tf.constant(rows))
    step[0] += 1
    return schedule.maybe_write(("s", {"p": position}))

  assert train([1], 4)

  def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(deltas.np, "savez", full_disk)
  assert train([2], 6) is None
  monkeypatch.undo()
  manifest = deltas.read_manifest(train([3], 9))
  assert (manifest["version"], manifest["stream"]) == (2, {"name": "s", "from": {"p": 4}, "to": {"p": 9}})
  with np.load(os.path.join(str(tmp_path), "delta-000002", deltas.TENSORS)) as tensors:
    assert tensors["0/ids"].tolist() == [2, 3]
  assert schedule.maybe_write(("s", {"p": 9})) is None  # nothing trained since


def test_run_config_refuses_a_negative_interval():
  with pytest.raises(tfps.UsageError, match=r"^`delta_export_secs` \(-1\) must be a non-negative number of seconds$"):
    tfps.RunConfig(delta_export_secs=-1)


def assert_refused(cluster, model_dir, a_model_fn, an_input_fn, secs, message):
  """Training `a_model_fn` with `delta_export_secs=secs` raises a one-line `UsageError` matching `message`, before a
  step: no export, no checkpoint."""
  estimator = tfps.Estimator(a_model_fn, model_dir=str(model_dir), cluster=cluster,
                             config=tfps.RunConfig(delta_export_secs=secs))
  with pytest.raises(tfps.UsageError, match=message):
    estimator.train(an_input_fn, max_steps=1)
  assert deltas.versions_in(str(model_dir / "deltas")) == {} and estimator.latest_checkpoint() is None


def test_features_that_are_not_a_dict_are_refused_in_one_line(cluster, tmp_path):
  def bare_model_fn(features, labels, mode):
    logits = tf_keras.layers.Dense(1)(features)[:, 0]
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.SGD(0.1))

  def bare_input_fn():
    return tf.data.Dataset.from_tensors((tf.zeros([4, 3]), tf.zeros([4]))).repeat()

  assert_refused(cluster, tmp_path, bare_model_fn, bare_input_fn, 5,
                 r"^`delta_export_secs` \(5\) serves the training input's features, which must be a dict of name -> "
                 r"dense tensor; the input gives a TensorSpec$")


class _MapWithoutDeltas(tf.Module):
  """A table state that cannot say what its deltas hold (no `delta_shards`): rows and a map of its own."""

  def __init__(self):
    super().__init__(name="odd_table")
    self.embeddings = tf.Variable(tf.zeros([64, 2]), name="rows")

  def bind_optimizer(self, optimizer):
    del optimizer

  def table_metrics(self):
    return {}


def test_a_table_without_delta_shards_is_refused_in_one_line_before_a_step(cluster, tmp_path):
  def odd_model_fn(features, labels, mode):
    table = tables.build_state(_MapWithoutDeltas)  # kept as a model_fn's tables are
    rows = tf.gather(table.embeddings, features["ids"] % 64)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=tf.reduce_sum(rows, [1, 2])))
    return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.SGD(0.1))

  assert_refused(cluster, tmp_path, odd_model_fn, input_fn, 0,
                 r"^`delta_export_secs` \(0\) cannot export table layers without `delta_shards` \(odd_table\): their "
                 r"id maps are not in the deltas; export whole SavedModels \(Estimator.export_saved_model\) for them$")


def test_a_model_fn_whose_predict_mode_makes_other_variables_is_refused_in_one_line(cluster, tmp_path):
  def train_only_model_fn(features, labels, mode):
    spec = model_fn(features, labels, mode)
    if mode != tfps.ModeKeys.TRAIN:
      return spec
    scale = tf.compat.v1.get_variable("scale", [1], initializer=tf.compat.v1.ones_initializer())
    return tfps.EstimatorSpec(mode, loss=spec.loss * scale[0], optimizer=spec.optimizer)

  assert_refused(cluster, tmp_path, train_only_model_fn, input_fn, 0,
                 r"^delta exports need model_fn to create the same variables in PREDICT mode as in TRAIN mode; PREDICT "
                 r"made 5 \(\[50000, 8\], \[49, 8\], \[8\], \[8, 1\], \[1\]\), TRAIN 6 \(.*, \[1\]\)$")


@pytest.mark.slow  # a run of its own
def test_stacked_wide_deep_deltas_equal_the_full_export(cluster, tmp_path):
  """The bundled Wide&Deep model_fn with its tables stacked (a wide and a deep table, sharded over both ps): the
  stacked tables' changed rows reach serving."""
  from tfps.models import model_fns  # pylint: disable=g-import-not-at-top
  a_model_fn = model_fns.build_model_fn("wide_deep", WIDE_DEEP_CATEGORICAL, {"dense": 2}, embedding_dim=4,
                                        deep_layers=(8,), stack_tables=True, learning_rate=0.5)
  config = tfps.RunConfig(delta_export_secs=0, log_step_count_steps=5, save_checkpoints_steps=100,
                          steps_per_execution=5)
  estimator = tfps.Estimator(a_model_fn, model_dir=str(tmp_path / "run"), config=config, cluster=cluster,
                             strategy_options={"min_shard_bytes": 0})
  estimator.train(wide_deep_fn, max_steps=10)
  base, delta_paths = chain(str(tmp_path / "run" / "deltas"))
  assert len(delta_paths) == 2
  shipped = [(v["shape"], v["shipped"]) for v in deltas.read_manifest(delta_paths[0])["variables"]]
  assert ([50_050, 4], "rows") in shipped and ([50_050, 1], "rows") in shipped
  features = {name: np.arange(10) % size for name, size in WIDE_DEEP_CATEGORICAL.items()}
  features["dense"] = np.ones((10, 2), np.float32)
  full = estimator.export_saved_model(str(tmp_path / "full"), {name: tf.TensorSpec.from_tensor(tf.constant(value))
                                                               for name, value in features.items()})
  applied = tfps.delta.apply(base, delta_paths, str(tmp_path / "served"))
  assert_same_model(applied, full, features, len(shipped), "probabilities")


def dynamic_model_fn(features, labels, mode):
  """test_deltas's dynamic model as a model_fn: a table evicting ids unseen for 4 of its shard's calls."""
  table = tfps.layers.DynamicEmbedding(256, 4, steps_to_live=4, num_shards=2, name="dynamic")
  vectors = table(features["ids"], training=mode == tfps.ModeKeys.TRAIN)
  logits = tf_keras.layers.Dense(1)(tf.reshape(vectors, [-1, DYNAMIC_IDS * 4]))[:, 0]
  if mode == tfps.ModeKeys.PREDICT:
    return tfps.EstimatorSpec(mode, predictions={"probability": tf.sigmoid(logits)})
  loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
  return tfps.EstimatorSpec(mode, loss=loss, optimizer=tf_keras.optimizers.legacy.Adagrad(0.1))


def dynamic_estimator(cluster, model_dir):
  config = tfps.RunConfig(delta_export_secs=0, log_step_count_steps=PHASE_BATCHES, save_checkpoints_steps=100,
                          steps_per_execution=PHASE_BATCHES)
  return tfps.Estimator(dynamic_model_fn, model_dir=model_dir, config=config, cluster=cluster,
                        strategy_options={"min_shard_bytes": 0})  # the table's 2 row shards, one on each ps


def served_maps(path):
  """`[{raw id: row}, ...]` and the row keys of each row shard of the served table at `path`."""
  table, = tf.saved_model.load(path).model_variables.tables
  return [(id_map(shard), shard.row_keys.numpy().tolist()) for shard in table.shards]


def deleted_ids(delta_paths):
  found = []
  for path in delta_paths:
    with np.load(os.path.join(path, deltas.TENSORS)) as tensors:
      found += [int(key) for shard in (0, 1) for key in tensors[f"table0/{shard}/deleted"]]
  return found


@pytest.mark.slow  # two runs (a chief restarted in the same model_dir)
def test_dynamic_table_deltas_delete_evicted_ids_and_equal_the_full_export(cluster, tmp_path):
  """A model_fn's dynamic table evicting ids between deltas: base + deltas (through `tfps-delta apply`, then
  applied to its result in turn) answers as `Estimator.export_saved_model` at the last step, and an id a delta
  deletes answers as an id never seen. A chief restarted in the same model_dir writes a new base holding the maps
  on the ps: equal to the first chain applied up to that step."""
  model_dir = str(tmp_path / "run")
  dynamic_estimator(cluster, model_dir).train(phased_fn, max_steps=4 * PHASE_BATCHES)
  first = chain(os.path.join(model_dir, "deltas"))
  assert [os.path.basename(path) for path in first[1]] == [f"delta-00000{n}" for n in range(1, 5)]
  estimator = dynamic_estimator(cluster, model_dir)  # a restarted chief: resumes at the checkpoint of step 12
  estimator.train(phased_fn, max_steps=8 * PHASE_BATCHES)
  exports = os.path.join(model_dir, "deltas")
  base = os.path.join(exports, "base-000005")
  delta_paths = [os.path.join(exports, f"delta-00000{n}") for n in range(6, 10)]
  assert deltas.read_manifest(base)["step"] == 4 * PHASE_BATCHES
  assert [deltas.read_manifest(path)["step"] for path in delta_paths] == [15, 18, 21, 24]
  features = {"ids": np.concatenate([phase_ids(phase, np.random.default_rng(9), 8) for phase in range(4)] +
                                    [np.full((1, DYNAMIC_IDS), 5, np.int64)])}
  # The new base, whose maps come from the ps, is the first chain applied up to its step.
  resumed = tfps.delta.apply(*first, str(tmp_path / "first"))
  assert served_maps(resumed) == served_maps(base) and len(served_maps(base)[0][0]) > 10
  assert_same_model(resumed, base, features, variables=3)  # the dense kernel and bias, the rows
  assert delta_cli.main(["tfps-delta", "apply", base, delta_paths[0], f"--out={tmp_path}/served-6"]) == 0
  applied = tfps.delta.apply(f"{tmp_path}/served-6", delta_paths[1:], str(tmp_path / "served"))
  full = estimator.export_saved_model(str(tmp_path / "full"), {"ids": tf.TensorSpec([None, DYNAMIC_IDS], tf.int64)})
  assert served_maps(applied) == served_maps(full)  # each raw id's row; no evicted id
  deleted = deleted_ids(first[1] + delta_paths)
  live = {key for shard, _ in served_maps(full) for key in shard}
  gone = sorted(set(deleted) - live)
  assert gone, deleted  # evicted between deltas, and not given a row again since
  features["ids"][-2] = gone[0]
  answers = assert_same_model(applied, full, features, variables=3)
  assert abs(answers[-2] - answers[-1]) < 1e-6  # the evicted id answers as the unseen one (rows apart: 1 ulp)
  assert len(set(np.round(answers[:-2], 4))) > 4  # live ids answer from their rows


def test_a_base_copies_each_maps_and_refuses_another_number_of_row_shards():
  """The base's copy of a dynamic table (built outside the strategy) gets each row shard's map and row keys; a copy
  with another number of row shards is refused in one line."""
  def built(num_shards):
    layer = tfps.layers.DynamicEmbedding(64, 2, num_shards=num_shards, name="dynamic")
    layer(tf.constant([1], tf.int64))
    return layer

  trained, copy = built(2), built(2)
  trained(tf.constant([3, 10**12, 7, 3], tf.int64), training=True)
  table_deltas.copy_maps(trained, copy)
  assert [id_map(shard) for shard in copy.shards] == [id_map(shard) for shard in trained.shards]
  assert sum(len(id_map(shard)) for shard in copy.shards) == 3
  for got, want in zip(copy.shards, trained.shards):
    np.testing.assert_array_equal(got.row_keys.numpy(), want.row_keys.numpy())
  with pytest.raises(tfps.UsageError, match=r"^dynamic: the serving copy has 1 row shard\(s\), training 2; give the "
                     r"layer `num_shards=2` so a copy built outside the strategy has as many$"):
    table_deltas.copy_maps(trained, built(1))
