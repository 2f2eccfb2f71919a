"""Delta exports: a base plus its deltas equals a full export at the same step; bad chains are refused in one line."""

import errno
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfps
from tfps.cli import delta as delta_cli
from tfps.training import delta_files
from tfps.training import deltas
from tfps.training import touched_rows

from test_fit import NUM_IDS, VOCAB, build_model, examples  # a 50k x 8 table, sharded over both ps

EPOCHS, STEPS = 3, 20


def train_fn(input_context):
  features, labels = examples(4_000, seed=1 + input_context.input_pipeline_id)
  return tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(4_000).repeat().batch(32, drop_remainder=True)


@pytest.fixture(scope="module")
def trained(cluster, tmp_path_factory):
  """A run writing a delta at every epoch's end; and a full export at its last step."""
  root = tmp_path_factory.mktemp("deltas")
  model_dir = str(root / "run")
  history = tfps.fit(build_model, train_fn, epochs=EPOCHS, steps_per_epoch=STEPS, model_dir=model_dir,
                     cluster=cluster, delta_export_secs=0)
  full = tfps.export_saved_model(build_model, str(root / "full"), model=history.model)
  return os.path.join(model_dir, "deltas"), full, root


def chain(folder):
  names = sorted(os.listdir(folder))
  return os.path.join(folder, names[0]), [os.path.join(folder, name) for name in names[1:]]


def test_base_plus_deltas_answers_as_the_full_export(trained, tmp_path):
  folder, full, _ = trained
  base, delta_paths = chain(folder)
  assert [os.path.basename(path) for path in [base] + delta_paths] == [
      "base-000000", "delta-000001", "delta-000002", "delta-000003"]
  manifests = [deltas.read_manifest(path) for path in delta_paths]
  assert [m["step"] for m in manifests] == [STEPS, 2 * STEPS, 3 * STEPS]
  table = manifests[0]["variables"][0]
  assert table["shape"] == [VOCAB, 8] and table["shipped"] == "rows" and 0 < table["rows"] < VOCAB // 10
  assert all(m["shipped"] == "whole" for m in manifests[0]["variables"][1:])  # the dense layers
  assert delta_cli.main(["tfps-delta", "apply", base] + delta_paths + [f"--out={tmp_path}/served"]) == 0
  applied = str(tmp_path / "served")
  served, expected = (tf_keras.models.load_model(path, compile=False) for path in (applied, full))
  assert len(served.weights) == len(expected.weights) == len(manifests[0]["variables"])
  for got, want in zip(served.weights, expected.weights):
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6, rtol=0)
  base_model = tf_keras.models.load_model(base, compile=False)
  assert np.abs(base_model.weights[0].numpy() - expected.weights[0].numpy()).max() > 1e-3  # training moved rows
  features, _ = examples(200, seed=5)
  np.testing.assert_allclose(served.predict(features, verbose=0), expected.predict(features, verbose=0), atol=1e-6)
  # The result is itself a base at the last delta's version: the deltas after it apply to it in turn.
  assert deltas.read_manifest(applied)["version"] == 3
  again = tfps.delta.apply(str(tmp_path / "served"), [], str(tmp_path / "again"))
  assert deltas.read_manifest(again)["step"] == 3 * STEPS


def copy_delta(path, tmp_path, name, edit=None):
  target = tmp_path / name
  shutil.copytree(path, target)
  if edit is not None:
    manifest = json.loads((target / deltas.MANIFEST).read_text())
    edit(manifest)
    (target / deltas.MANIFEST).write_text(json.dumps(manifest))
  return str(target)


def test_bad_chains_are_refused_in_one_line(trained, tmp_path):
  folder, _, _ = trained
  base, (first, second, third) = chain(folder)
  out = str(tmp_path / "out")
  with pytest.raises(deltas.DeltaError, match=r"^the delta chain has a gap: delta-000003 follows version 2, but the "
                     r"version before it here is 1; give every delta from 2 on$"):
    tfps.delta.apply(base, [first, third], out)
  with pytest.raises(deltas.DeltaError, match=r"the delta chain has a gap: delta-000002 follows version 1, but the "
                     r"version before it here is 0"):
    tfps.delta.apply(base, [second], out)
  other_run = copy_delta(first, tmp_path, "other_run", lambda m: m["base"].update(id="feedbeef0000"))
  with pytest.raises(deltas.DeltaError, match=r"^delta-000001 belongs to base-000000 \(id feedbeef0000\), not to "
                     r"base-000000 \(id [0-9a-f]{12}\)$"):
    tfps.delta.apply(base, [other_run], out)
  other_model = copy_delta(first, tmp_path, "other_model", lambda m: m.update(model="0123456789abcdef"))
  with pytest.raises(deltas.DeltaError, match=r"^delta-000001 is from another model \(fingerprint 0123456789abcdef, "
                     r"the base's [0-9a-f]{16}\); it cannot be applied to base-000000$"):
    tfps.delta.apply(base, [other_model], out)
  cut_short = copy_delta(first, tmp_path, "cut_short")
  os.remove(os.path.join(cut_short, deltas.MANIFEST))
  with pytest.raises(deltas.DeltaError, match=r"has no manifest.json: not a complete export"):
    tfps.delta.apply(base, [cut_short], out)
  temporary = copy_delta(first, tmp_path, ".tmp-delta-000001-0000abcd")
  with pytest.raises(deltas.DeltaError, match=r"is a delta still being written or cut short"):
    tfps.delta.apply(base, [temporary], out)
  assert not os.path.exists(out)


def publish(path, folder, name=None, edit=None):
  """Puts a copy of the export `path` into `folder` as a writer does: a temporary folder, renamed."""
  scratch = copy_delta(path, folder, f".tmp-{name or os.path.basename(path)}", edit)
  final = os.path.join(folder, name or os.path.basename(path))
  os.rename(scratch, final)
  return final


def assert_answers_as(served_path, full):
  served, expected = (tf_keras.models.load_model(path, compile=False) for path in (served_path, full))
  for got, want in zip(served.weights, expected.weights):
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6, rtol=0)
  features, _ = examples(100, seed=5)
  np.testing.assert_allclose(served.predict(features, verbose=0), expected.predict(features, verbose=0), atol=1e-6)


def test_watch_once_serves_the_newest_state_and_keeps_the_last_versions(trained, tmp_path, capsys):
  folder, full, _ = trained
  base, (first, second, third) = chain(folder)
  watched, serving = tmp_path / "deltas", str(tmp_path / "serving")
  watched.mkdir()
  publish(base, watched)
  publish(first, watched)
  command = ["tfps-delta", "watch", str(watched), f"--serving={serving}", "--keep=1", "--once"]
  assert delta_cli.main(command) == 0
  assert sorted(os.listdir(serving)) == ["1"] and deltas.read_manifest(os.path.join(serving, "1"))["step"] == STEPS
  publish(second, watched)
  publish(third, watched)
  assert delta_cli.main(command) == 0
  assert sorted(os.listdir(serving)) == ["3"]  # deltas 2 and 3 applied to version 1 in one go; 1 removed
  publish(third, watched, "delta-000005", lambda manifest: manifest.update(version=5, previous=4))
  assert delta_cli.main(command) == 2
  assert sorted(os.listdir(serving)) == ["3"]
  out, err = capsys.readouterr()
  assert out.splitlines() == [f"serving {serving}/1 (step {STEPS})", f"serving {serving}/3 (step {3 * STEPS})"]
  assert err == ("tfps-delta: the delta chain has a gap: delta-000005 follows version 4, but the version before it "
                 "here is 3; give every delta from 4 on; still serving the last good version\n")
  assert_answers_as(os.path.join(serving, "3"), full)


@pytest.mark.slow  # a process importing TensorFlow
def test_watch_follows_new_deltas_and_refuses_a_gap(trained, tmp_path, subprocess_env):
  """`tfps-delta watch` running: deltas written meanwhile are served, each version whole; a gap is told in one line
  and the last good version stays served."""
  folder, full, _ = trained
  base, (first, second, third) = chain(folder)
  watched, serving = tmp_path / "deltas", str(tmp_path / "serving")
  watched.mkdir()
  publish(base, watched)
  out_path, err_path = tmp_path / "watch.out", tmp_path / "watch.err"
  with open(out_path, "w") as out, open(err_path, "w") as err:
    watch = subprocess.Popen([sys.executable, "-m", "tfps.cli.delta", "watch", str(watched), f"--serving={serving}",
                              "--keep=2", "--interval=0.2"], stdout=out, stderr=err, text=True, env=subprocess_env)
  try:
    wait_for(lambda: 0 in delta_files.served_versions(serving), watch)
    publish(first, watched)
    wait_for(lambda: 1 in delta_files.served_versions(serving), watch)
    publish(second, watched)
    publish(third, watched)
    wait_for(lambda: 3 in delta_files.served_versions(serving), watch)
    publish(third, watched, "delta-000005", lambda manifest: manifest.update(version=5, previous=4))
    wait_for(lambda: "gap" in err_path.read_text(), watch)
    time.sleep(1)  # five more looks at the folder: told once
  finally:
    watch.terminate()
    watch.wait(timeout=60)
  out, err = out_path.read_text(), err_path.read_text()
  assert watch.returncode == 0 and "Traceback" not in err, err
  assert sorted(delta_files.served_versions(serving)) in ([1, 3], [2, 3])  # the newest 2
  assert f"serving {serving}/3 (step {3 * STEPS})" in out.splitlines()
  refusals = [line for line in err.splitlines() if line.startswith("tfps-delta:")]
  assert refusals == ["tfps-delta: the delta chain has a gap: delta-000005 follows version 4, but the version before "
                      "it here is 3; give every delta from 4 on; still serving the last good version"]  # told once
  assert_answers_as(os.path.join(serving, "3"), full)


def wait_for(condition, process, timeout=120):
  deadline = time.monotonic() + timeout
  while not condition():
    assert process.poll() is None and time.monotonic() < deadline, f"timed out, or the process ended ({process.poll()})"
    time.sleep(0.1)


def test_a_failed_write_keeps_the_last_delta_and_the_marks(tmp_path, monkeypatch):
  """A full disk while writing: no folder appears, the last delta stays valid, and the next delta carries the rows."""
  table, dense = tf.Variable(tf.zeros([100, 4])), tf.Variable(tf.zeros([3]))
  touched = touched_rows.TouchedRows(tf.distribute.get_strategy())
  writer = deltas.DeltaWriter(str(tmp_path), [table, dense], touched)
  touched.mark(table, tf.constant([0]))  # before the base: not in any delta
  writer.write_base(os.makedirs, step=0)

  def update(rows, value, step):
    table.scatter_update(tf.IndexedSlices(tf.fill([len(rows), 4], value), tf.constant(rows, tf.int64)))
    touched.mark(table, tf.constant(rows))
    dense.assign_add(tf.ones([3]))
    return writer.write_delta(step)

  first = update([3, 7], 1.0, step=1)

  def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(deltas.np, "savez", full_disk)
  with pytest.raises(OSError, match="No space left"):
    update([7, 9], 2.0, step=2)
  assert sorted(os.listdir(tmp_path)) == ["base-000000", "delta-000001"]  # nothing half written
  assert deltas.read_manifest(first)["version"] == 1
  monkeypatch.undo()
  second = update([11], 3.0, step=3)
  manifest = deltas.read_manifest(second)
  assert (manifest["version"], manifest["previous"], manifest["step"]) == (2, 1, 3)
  with np.load(os.path.join(second, deltas.TENSORS)) as tensors:
    assert tensors["0/ids"].tolist() == [7, 9, 11]  # the failed delta's rows, and the new one
    assert tensors["0/rows"][:, 0].tolist() == [2.0, 2.0, 3.0]
    assert tensors["1/value"].tolist() == [3.0, 3.0, 3.0]
  with np.load(os.path.join(first, deltas.TENSORS)) as tensors:
    assert tensors["0/ids"].tolist() == [3, 7]


def test_rows_are_marked_only_where_deltas_are_exported(cluster, tmp_path):
  """The touched-row records (a scatter on the ps in each step's sparse updates) exist only with delta_export_secs."""
  plain = tfps.fit(build_model, train_fn, epochs=1, steps_per_epoch=1, cluster=cluster)
  assert touched_rows._active.get(plain.model.distribute_strategy.extended) is None  # pylint: disable=protected-access
  exported = tfps.fit(build_model, train_fn, epochs=1, steps_per_epoch=1, cluster=cluster,
                      model_dir=str(tmp_path / "run"), delta_export_secs=1e9)
  records = touched_rows._active[exported.model.distribute_strategy.extended]  # pylint: disable=protected-access
  shards = exported.model.get_layer("table").embeddings.variables  # sharded over both ps
  assert len(shards) == 2 and all(records.record_of(shard) is not None for shard in shards)
  rows = deltas.read_manifest(str(tmp_path / "run" / "deltas" / "delta-000001"))["variables"][0]["rows"]
  assert 0 < rows < VOCAB // 10  # the rows the step marked, shipped at the end of training


def test_fit_refuses_delta_export_without_model_dir(cluster):
  with pytest.raises(tfps.UsageError, match=r"^`delta_export_secs` \(5\) needs a `model_dir`"):
    tfps.fit(build_model, train_fn, epochs=1, steps_per_epoch=1, cluster=cluster, delta_export_secs=5)
  with pytest.raises(tfps.UsageError, match=r"^`delta_export_secs` \(-1\) must be a non-negative number of seconds"):
    tfps.fit(build_model, train_fn, epochs=1, steps_per_epoch=1, cluster=cluster, delta_export_secs=-1)


@pytest.mark.slow  # a run of its own
@pytest.mark.parametrize("mode", ["sync", "geo"])
def test_sync_and_geo_deltas_equal_the_full_export(cluster, tmp_path, mode):
  model_dir = str(tmp_path / "run")
  history = tfps.fit(build_model, train_fn, epochs=2, steps_per_epoch=5, model_dir=model_dir, cluster=cluster,
                     sync_mode=tfps.TrainingMode(mode, geo_steps=5) if mode == "geo" else mode, delta_export_secs=0)
  full = tfps.export_saved_model(build_model, str(tmp_path / "full"), model=history.model)
  base, delta_paths = chain(os.path.join(model_dir, "deltas"))
  assert [deltas.read_manifest(path)["step"] for path in delta_paths] == [5, 10]
  served = tf_keras.models.load_model(tfps.delta.apply(base, delta_paths, str(tmp_path / "served")), compile=False)
  for got, want in zip(served.weights, tf_keras.models.load_model(full, compile=False).weights):
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6, rtol=0)


class _TableWithoutDeltas(tf_keras.layers.Layer):
  """A table layer (`tables.is_table`) that cannot say what its deltas hold (no `delta_shards`)."""

  def call(self, inputs):
    return inputs

  def bind_optimizer(self, optimizer):
    del optimizer

  def table_metrics(self):
    return {}


def test_fit_refuses_delta_export_of_table_layers_without_delta_shards(cluster, tmp_path):
  def build_odd():
    ids = tf_keras.Input((NUM_IDS,), dtype="int64", name="ids")
    dense = tf_keras.Input((1,), name="dense_in")
    output = tf_keras.layers.Dense(1, activation="sigmoid")(_TableWithoutDeltas(name="odd")(dense))
    model = tf_keras.Model({"ids": ids, "dense_in": dense}, output)
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "binary_crossentropy")
    return model

  with pytest.raises(tfps.UsageError, match=r"^`delta_export_secs` \(0\) cannot export table layers without "
                     r"`delta_shards` \(odd\)"):
    tfps.fit(build_odd, train_fn, epochs=1, steps_per_epoch=2, model_dir=str(tmp_path / "run"), cluster=cluster,
             delta_export_secs=0)
  assert not os.path.exists(tmp_path / "run" / "deltas")


def test_command_line_usage_errors_are_one_line(capsys):
  assert delta_cli.main(["tfps-delta", "apply", "base-000000", "delta-000001"]) == 2
  assert capsys.readouterr().err == ("tfps-delta: give --out=DIR once; usage: tfps-delta apply BASE [DELTA ...] "
                                     "--out=DIR\n")
  assert delta_cli.main(["tfps-delta", "serve", "deltas"]) == 2
  assert capsys.readouterr().err.startswith("tfps-delta: unknown command 'serve' (known: apply, watch)")
  assert delta_cli.main(["tfps-delta", "--help"]) == 0
  assert "usage: tfps-delta apply BASE" in capsys.readouterr().out
  assert delta_cli.main(["tfps-delta"]) == 2  # no command: told on stderr, not a success
  no_command = capsys.readouterr()
  assert (no_command.out, no_command.err.splitlines()[:2]) == ("", ["tfps-delta: give a command (apply, watch)",
                                                                    delta_cli.USAGE["apply"]])


def test_docs_figures_come_from_the_bench_results():
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(repo, "bench", "results", "delta_export.json"), encoding="utf-8") as f:
    results = json.load(f)
  with open(os.path.join(repo, "docs", "delta_export.md"), encoding="utf-8") as f:
    text = " ".join(f.read().split())  # the prose's line breaks aside
  assert [size["rows"] for size in results["sizes"]] == [10**6, 10**7]
  for size in results["sizes"]:
    rows = f"{size['rows']:,}"
    assert (f"| {rows} | base-000000 (full SavedModel) | all | {size['base_bytes']:,} | 1x | "
            f"{size['base_write_secs']} | |") in text
    for delta in size["deltas"]:
      assert (f"| {rows} | {delta['name']} | {delta['rows']:,} ({delta['rows_share']:.2%}) | {delta['bytes']:,} | "
              f"{delta['ratio_to_full']}x | {delta['write_secs']} | {delta['apply_secs']}, "
              f"{delta['rows_applied_secs']} |") in text
      assert delta["ratio_to_full"] <= 0.05 and delta["rows_share"] <= size["changed_at_most"]
  # The training cost's table: tests/test_figures.py.


WIDE_DEEP_CATEGORICAL = {"a": 20_000, "b": 30_000, "c": 50}  # and a dense feature of width 2


def wide_deep_fn(input_context):
  """Batches for Wide&Deep on `WIDE_DEEP_CATEGORICAL` (also the Estimator path's input_fn)."""
  rng = np.random.default_rng(input_context.input_pipeline_id)
  features = {name: rng.integers(0, size, 2_000) for name, size in WIDE_DEEP_CATEGORICAL.items()}
  features["dense"] = rng.random((2_000, 2)).astype(np.float32)
  labels = (features["c"] % 2).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(64)


@pytest.mark.slow  # a run of its own
def test_stacked_wide_deep_deltas_equal_the_full_export(cluster, tmp_path):
  """Wide&Deep with its tables stacked (a wide and a deep table, sharded): the rows changed reach serving."""
  from tfps import models  # pylint: disable=g-import-not-at-top
  categorical, dense, dataset_fn = WIDE_DEEP_CATEGORICAL, {"dense": 2}, wide_deep_fn

  def build_wide_deep():
    return models.compile_model(models.build_model("wide_deep", categorical, dense, embedding_dim=4,
                                                   deep_layers=(8,), stack_tables=True), learning_rate=0.5)

  model_dir = str(tmp_path / "run")
  history = tfps.fit(build_wide_deep, dataset_fn, epochs=2, steps_per_epoch=5, model_dir=model_dir, cluster=cluster,
                     min_shard_bytes=0, delta_export_secs=0)
  full = tfps.export_saved_model(build_wide_deep, str(tmp_path / "full"), model=history.model,
                                 dataset_fn=dataset_fn)
  base, delta_paths = chain(os.path.join(model_dir, "deltas"))
  shipped = [(v["shape"], v["shipped"]) for v in deltas.read_manifest(delta_paths[0])["variables"]]
  assert ([50_050, 4], "rows") in shipped and ([50_050, 1], "rows") in shipped
  served = tf_keras.models.load_model(tfps.delta.apply(base, delta_paths, str(tmp_path / "served")), compile=False)
  expected = tf_keras.models.load_model(full, compile=False)
  assert len(served.weights) == len(expected.weights) == len(shipped)
  for got, want in zip(served.weights, expected.weights):
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6, rtol=0)
  features = {name: np.arange(10) % size for name, size in categorical.items()}
  features["dense"] = np.ones((10, 2), np.float32)
  np.testing.assert_allclose(served.predict(features, verbose=0), expected.predict(features, verbose=0), atol=1e-6)


@pytest.mark.slow  # a run of its own
def test_a_resumed_run_writes_a_new_base_and_numbers_on(trained, cluster, tmp_path):
  """Training resumed for one more epoch: a new base at the resumed step, the next delta after it; the old chain's
  deltas do not apply to the new base."""
  folder, _, _ = trained
  model_dir = str(tmp_path / "run")
  shutil.copytree(os.path.dirname(folder), model_dir)
  history = tfps.fit(build_model, train_fn, epochs=EPOCHS + 1, steps_per_epoch=STEPS, model_dir=model_dir,
                     cluster=cluster, delta_export_secs=0)
  full = tfps.export_saved_model(build_model, str(tmp_path / "full"), model=history.model)
  exports = os.path.join(model_dir, "deltas")
  assert sorted(os.listdir(exports))[-2:] == ["delta-000003", "delta-000005"] and "base-000004" in os.listdir(exports)
  new_base = deltas.read_manifest(os.path.join(exports, "base-000004"))
  assert (new_base["step"], deltas.read_manifest(os.path.join(exports, "delta-000005"))["previous"]) == (60, 4)
  served = tfps.delta.apply(os.path.join(exports, "base-000004"), [os.path.join(exports, "delta-000005")],
                            str(tmp_path / "served"))
  for got, want in zip(*(tf_keras.models.load_model(path, compile=False).weights for path in (served, full))):
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6, rtol=0)
  with pytest.raises(deltas.DeltaError, match=r"^delta-000003 belongs to base-000000 \(id [0-9a-f]{12}\), "
                     r"not to base-000004 \(id [0-9a-f]{12}\)$"):
    tfps.delta.apply(os.path.join(exports, "base-000004"), [os.path.join(exports, "delta-000003")],
                     str(tmp_path / "mixed"))


DYNAMIC_IDS, PHASE_BATCHES = 4, 3


def build_dynamic():
  """A dynamic table and a hashed one (a sharded `Embedding` of the hashed ids) side by side."""
  ids = tf_keras.Input((DYNAMIC_IDS,), dtype="int64", name="ids")
  table = tfps.layers.DynamicEmbedding(256, 4, steps_to_live=4, num_shards=2, name="dynamic")
  hashed = tf_keras.layers.Embedding(1_000, 4, name="hashed")(tf_keras.layers.Hashing(1_000)(ids))
  model = tf_keras.Model({"ids": ids}, tf_keras.layers.Dense(1, activation="sigmoid")(
      tf_keras.layers.Flatten()(tf_keras.layers.Concatenate()([table(ids), hashed]))))
  model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "binary_crossentropy")
  return model


def phase_ids(phase, rng, rows):
  """Raw ids of a phase: 40 of its own, so an id of an earlier phase goes unseen (and is evicted) in a later one."""
  return rng.integers(0, 40, size=(rows, DYNAMIC_IDS)) * 7_919 + phase * 10**9 + 11


def phased_fn(input_context):
  rng = np.random.default_rng(input_context.input_pipeline_id)
  ids = np.concatenate([phase_ids(phase, rng, PHASE_BATCHES * 16) for phase in range(4)])
  labels = (ids % 3 == 0).mean(axis=1).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).batch(16).repeat()


def id_map(row_shard):
  """`{raw id: row}` of a served row shard's map."""
  keys, rows = tf.raw_ops.LookupTableExportV2(table_handle=row_shard.map.resource_handle, Tkeys=tf.int64,
                                              Tvalues=tf.int64)
  return dict(zip(keys.numpy().tolist(), rows.numpy().tolist()))


def served_dynamic(base, delta_paths, full, tmp_path):
  """`base` with `delta_paths` applied and the `full` export of `build_dynamic`, loaded, after checking that they hold
  the same weights (to 1e-6) and each dynamic row shard the same id map (more than 10 ids) and row keys."""
  served = tf_keras.models.load_model(tfps.delta.apply(base, delta_paths, str(tmp_path / "served")), compile=False)
  expected = tf_keras.models.load_model(full, compile=False)
  assert len(served.weights) == len(expected.weights) == 4  # the dynamic rows, the hashed table, the dense layer
  for got, want in zip(served.weights, expected.weights):
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6, rtol=0)
  for got, want in zip(*(model.get_layer("dynamic").shards for model in (served, expected))):
    assert id_map(got) == id_map(want) and len(id_map(got)) > 10  # each raw id's row; no evicted id
    np.testing.assert_array_equal(got.row_keys.numpy(), want.row_keys.numpy())
  return served, expected


def test_dynamic_table_deltas_delete_evicted_ids_and_equal_the_full_export(cluster, tmp_path):
  """A dynamic table evicting ids between deltas, beside a hashed table, with deltas written while an epoch's steps
  run (an epoch of 3 executions, longer than the interval) and at its end: base + deltas answers as the full export
  at the last step, and an id a delta deletes answers as an id never seen."""
  model_dir = str(tmp_path / "run")
  history = tfps.fit(build_dynamic, phased_fn, epochs=2, steps_per_epoch=3 * PHASE_BATCHES, model_dir=model_dir,
                     cluster=cluster, min_shard_bytes=0, delta_export_secs=0, steps_per_execution=PHASE_BATCHES)
  full = tfps.export_saved_model(build_dynamic, str(tmp_path / "full"), model=history.model)
  base, delta_paths = chain(os.path.join(model_dir, "deltas"))
  # Before each execution after an epoch's first (two within each epoch), and at each epoch's end.
  assert [deltas.read_manifest(path)["step"] for path in delta_paths] == [
      PHASE_BATCHES * number for number in range(1, 7)]
  hashed = [variable["shipped"] for variable in deltas.read_manifest(delta_paths[1])["variables"]
            if variable["shape"] == [1_000, 4]]
  assert hashed == ["rows"]
  deleted = []
  for path in delta_paths:
    with np.load(os.path.join(path, deltas.TENSORS)) as tensors:
      deleted += [int(key) for shard in (0, 1) for key in tensors[f"table0/{shard}/deleted"]]
  layer = history.model.get_layer("dynamic")
  gone = [key for key in set(deleted) if layer.rows_of(tf.constant([key], tf.int64)).numpy()[0] == -1]
  assert gone, deleted  # evicted between deltas, and not given a row again since
  served, expected = served_dynamic(base, delta_paths, full, tmp_path)
  live = phase_ids(2, np.random.default_rng(9), 8)  # the last phases' ids, seen lately
  # An id never seen in the hashed table's bucket of the evicted one: both read the same hashed row.
  candidates = np.arange(1, 5_000)  # below every phase's ids but 11
  buckets = tf_keras.layers.Hashing(1_000)(candidates).numpy()
  bucket = tf_keras.layers.Hashing(1_000)(np.array([gone[0]])).numpy()[0]
  unseen = np.full((1, DYNAMIC_IDS), candidates[(buckets == bucket) & (candidates != 11)][0], np.int64)
  features = {"ids": np.concatenate([live, phase_ids(3, np.random.default_rng(9), 8),
                                     np.full((1, DYNAMIC_IDS), gone[0], np.int64), unseen])}
  answers = served.predict(features, verbose=0)
  np.testing.assert_allclose(answers, expected.predict(features, verbose=0), atol=1e-6, rtol=0)
  assert answers[-2] == answers[-1]  # the evicted id answers as the unseen one
  assert len(set(np.round(answers[:-2, 0], 6))) > 4  # live ids answer from their rows

