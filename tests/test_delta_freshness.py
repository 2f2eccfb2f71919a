"""Freshness of served versions, end to end: slices written to a folder stream while a run trains on it with deltas
and a `tfps-delta watch` process serves them; each version's freshness from the slices' write times to its swap."""

import errno
import os
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

import online_stream
import tfps
from tfps.cli import delta as delta_cli
from tfps.data.stream import batches as batches_lib
from tfps.data.stream import folder as folder_lib
from tfps.estimator import online
from tfps.training import delta_files
from tfps.training import delta_freshness
from tfps.training import delta_schedule
from tfps.training import deltas
from tfps.training import touched_rows

from test_deltas import publish, wait_for
from test_estimator_deltas import SLICE, counting_model_fn

SECS = 3.0  # the delta interval
SLICES, EVERY_SECS, BATCH = 6, 1.5, 8


def write_slice(folder, index):
  """Slice `index` of SLICE messages, then its marker (the slice's complete time)."""
  name = os.path.join(folder, f"slice-{index:04d}.csv")
  with open(name, "w", encoding="utf-8") as f:
    f.write("".join(f"{i},{i % 2},1.5\n" for i in range(index * SLICE, (index + 1) * SLICE)))
  open(name + folder_lib.DONE_SUFFIX, "w", encoding="utf-8").close()


def newest_served_step(serving):
  versions = delta_files.served_versions(serving)
  return delta_files.read_manifest(versions[max(versions)])["step"] if versions else -1


def produce(folder, serving, stop):
  """A first slice, which the first steps train (tracing the step function) and the watch serves; then a slice every
  EVERY_SECS, the slices whose freshness the target bounds."""
  write_slice(folder, 0)
  while newest_served_step(serving) < SLICE // BATCH and not stop.is_set():
    time.sleep(0.1)
  for index in range(1, SLICES + 1):
    if stop.is_set():
      return
    write_slice(folder, index)
    time.sleep(EVERY_SECS)


@pytest.fixture(scope="module")
def served(cluster, tmp_path_factory, module_subprocess_env):
  """`(root, watch's stdout, serving folder)` of a stream run with a delta every SECS and a watch process."""
  root = tmp_path_factory.mktemp("freshness")
  stream, serving, deltas_dir = root / "stream", str(root / "serving"), root / "run" / "deltas"
  stream.mkdir()
  deltas_dir.mkdir(parents=True)
  out_path = root / "watch.out"
  with open(out_path, "w") as out, open(root / "watch.err", "w") as err:
    watch = subprocess.Popen([sys.executable, "-m", "tfps.cli.delta", "watch", str(deltas_dir), f"--serving={serving}",
                              "--interval=0.2"], stdout=out, stderr=err, text=True, env=module_subprocess_env)
  stop = threading.Event()
  producer = threading.Thread(target=produce, args=(str(stream), serving, stop), daemon=True)
  try:
    config = tfps.RunConfig(delta_export_secs=SECS, steps_per_execution=2, log_step_count_steps=2,
                            save_checkpoints_steps=1000)
    estimator = tfps.Estimator(counting_model_fn, model_dir=str(root / "run"), config=config, cluster=cluster)

    def make(positions):
      source = folder_lib.FolderSource(str(stream), pattern="slice-*.csv", positions=positions, poll_secs=0.05)
      return batches_lib.StreamBatches(source, online_stream.SPEC, batch_size=BATCH)

    producer.start()
    steps = (SLICES + 1) * SLICE // BATCH
    assert online.train_on_stream(estimator, make, max_steps=steps) == steps
    last = max(delta_files.versions_in(str(deltas_dir)))
    wait_for(lambda: last in delta_files.served_versions(serving), watch)
  finally:
    stop.set()
    watch.terminate()
    watch.wait(timeout=60)
  assert watch.returncode == 0 and "Traceback" not in (root / "watch.err").read_text()
  return root, out_path.read_text(), serving


@pytest.mark.slow  # a watch process importing TensorFlow beside a stream run of ~10 s
def test_each_served_version_has_its_freshness_within_the_bound(served):
  """Every version that applied deltas has a freshness record from the slices' complete times (the markers') to its
  swap, told by the watch; past the first slice (the first steps trace the step function) within the target: twice
  the delta interval plus the time from the delta on disk to the version served."""
  root, out, serving = served
  records = delta_freshness.read(serving)
  complete = [os.path.getmtime(os.path.join(str(root / "stream"), f"slice-{index:04d}.csv.done"))
              for index in range(SLICES + 1)]
  assert sorted(r["version"] for r in records) == [r["version"] for r in records]
  assert [v for r in records for v in r["deltas"]] == sorted(
      v for v in delta_files.versions_in(str(root / "run" / "deltas")) if v)
  for record in records:
    written = record["written"]
    assert written["oldest"] in complete and written["newest"] in complete, (record, complete)
    assert record["freshness_secs"] == pytest.approx(record["swapped_at"] - written["oldest"], abs=2e-3)
    assert 0 < record["newest_freshness_secs"] <= record["freshness_secs"]
    assert (f"serving {serving}/{record['version']} (step {record['step']}; freshness "
            f"{record['newest_freshness_secs']:.2f}-{record['freshness_secs']:.2f} s)") in out.splitlines()
  timed = [r for r in records if r["written"]["oldest"] > complete[0]]
  assert len(timed) >= 2 and {r["written"]["newest"] for r in timed} >= {complete[-1]}, records
  for record in timed:
    export = record["swapped_at"] - record["exported_at"]  # the delta's apply, and the watch's look for it
    assert 0 <= export and record["freshness_secs"] <= 2 * SECS + export, record  # the target
  assert out.splitlines()[-1] == delta_freshness.summary_line(records)
  assert out.splitlines()[-1].startswith(f"freshness of {len(records)} served version(s), from an example's write")
  later = records[-1]["swapped_at"]  # a run's summary counts the versions swapped in since it started
  assert delta_freshness.read(serving, since=later) == records[-1:]


@pytest.mark.slow  # the run above
def test_a_delta_without_write_times_is_told_in_one_line(served, tmp_path, capsys):
  """A delta written by an older tfps (a stream span without write times): served, its freshness not measured."""
  root, _, _ = served
  exports = delta_files.versions_in(str(root / "run" / "deltas"))
  watched, serving = tmp_path / "deltas", str(tmp_path / "serving")
  watched.mkdir()
  publish(exports[0], watched)
  publish(exports[1], watched, edit=lambda manifest: manifest["stream"].pop("written"))
  assert delta_cli.main(["tfps-delta", "watch", str(watched), f"--serving={serving}", "--once"]) == 0
  assert capsys.readouterr().out.splitlines()[-1] == (
      f"serving {serving}/1 (step {delta_files.read_manifest(exports[1])['step']}; freshness not measured: "
      "delta-000001 holds no write times of its stream's examples (written by an older tfps, which did not record "
      "them))")
  assert [(r["version"], r["missing"]) for r in delta_freshness.read(serving)] == [(1, ["delta-000001"])]


def test_a_failed_delta_leaves_its_write_times_to_the_next(tmp_path, monkeypatch):
  """A full disk while writing a delta: the next delta's `written` spans the examples of both, as its `from` does."""
  table = tf.Variable(tf.zeros([10, 2]))
  touched = touched_rows.TouchedRows(tf.distribute.get_strategy())
  schedule = delta_schedule.DeltaSchedule(deltas.DeltaWriter(str(tmp_path), [table], touched), 0, lambda: step[0],
                                          os.makedirs)
  step, span = [0], delta_schedule.WriteSpan()
  schedule.begin(("s", {"p": 0}, span))

  def train(row, position, written):
    touched.mark(table, tf.constant([row]))
    span.add(written)
    step[0] += 1
    return schedule.maybe_write(("s", {"p": position}, span))

  assert deltas.read_manifest(train(1, 4, (10.0, 12.0)))["stream"]["written"] == {"oldest": 10.0, "newest": 12.0}
  monkeypatch.setattr(deltas.np, "savez", lambda *args, **kwargs: (_ for _ in ()).throw(
      OSError(errno.ENOSPC, "No space left on device")))
  assert train(2, 6, (13.0, 14.0)) is None
  monkeypatch.undo()
  manifest = deltas.read_manifest(train(3, 9, (15.5, 16.0)))
  assert manifest["stream"] == {"name": "s", "from": {"p": 4}, "to": {"p": 9},
                                "written": {"oldest": 13.0, "newest": 16.0}}
  assert manifest["step"] == 3 and span.describe() == {}  # cleared once written
