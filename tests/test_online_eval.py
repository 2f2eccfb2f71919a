"""A stream run without end on the in-process cluster (a folder stream): a pause trains the partial batch with every
message still applied once; the held-out share is never trained on, its newest window is evaluated inline and by
the sidecar; the run records, the summary and tfps-report show the stream. One run for all of it: each run traces
the model again."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import online_stream
import tfps
from tfps import run_records
from tfps.cli import report
from tfps.cluster import summary as summary_lib
from tfps.data.stream import batches as batches_lib
from tfps.data.stream import folder as folder_lib
from tfps.data.stream import holdout
from tfps.data.stream.sources import Record
from tfps.estimator import online
from tfps.estimator import stream_evaluation
from tfps.keras import online as keras_online
from tfps.keras import stream_evaluation as keras_stream_evaluation
from tfps.training import stream_positions

BATCH = 8


def _model_fn(features, labels, mode):
  """tests/online_stream.py's counting model (row i: how often message i was applied), with an AUC in EVAL mode: a
  message never trained on has the logit 0 and the loss -0."""
  rows = tf_keras.layers.Embedding(online_stream.MAX_MESSAGES, 1, embeddings_initializer="zeros",
                                   name=online_stream.TABLE)(features["id"])
  metrics = {}
  if mode == tfps.ModeKeys.EVAL:
    metrics["auc"] = tf_keras.metrics.AUC(from_logits=True, name="auc")
    metrics["auc"].update_state(tf.reshape(labels, [-1, 1]), tf.reshape(rows, [-1, 1]))
  return tfps.EstimatorSpec(mode, loss=-tf.reduce_sum(rows), optimizer=tf_keras.optimizers.legacy.SGD(1.0),
                            eval_metric_ops=metrics)


def _write_slice(folder, name: str, ids) -> None:
  """A slice of one message per id, written under a hidden name and renamed (complete once renamed)."""
  hidden = folder / f".{name}"
  hidden.write_text("".join(f"{i},{i % 2},1.5\n" for i in ids))
  hidden.rename(folder / name)


def _batches(folder, **kwargs):
  def make(positions):
    source = folder_lib.FolderSource(str(folder), pattern="*.csv", complete="rename", positions=positions,
                                     poll_secs=0.05)
    return batches_lib.StreamBatches(source, online_stream.SPEC, batch_size=BATCH, **kwargs)
  return make


def _estimator(cluster, model_dir, model_fn=online_stream.model_fn):
  config = tfps.RunConfig(steps_per_execution=4, save_checkpoints_steps=100, log_step_count_steps=3)
  return tfps.Estimator(model_fn, model_dir=str(model_dir), config=config, cluster=cluster)


def _held_out_ids(first_id: int, count: int, every: int, name: str):
  picker = holdout.HeldOut(every, 1)
  return {first_id + line - 1 for line in range(1, count + 1)
          if picker.takes(Record(b"", folder_lib.KEY, [name, line], ""))}


def test_a_stream_with_a_pause_and_a_held_out_share_applies_each_message_once_and_evaluates_its_windows(cluster,
                                                                                                       tmp_path):
  """100 messages, a pause (the last of them trained in a partial batch after 0.3 s), then 60 more that end in a
  partial batch too; one in about 4 held out: each trained message applied once, none held out applied, the windows
  evaluated inline every 6 steps and by the sidecar at every checkpoint, the stream in the summary and the report."""
  stream_dir, model_dir = tmp_path / "stream", tmp_path / "model"
  stream_dir.mkdir()
  _write_slice(stream_dir, "slice-0.csv", range(100))
  held = _held_out_ids(0, 100, 4, "slice-0.csv") | _held_out_ids(100, 60, 4, "slice-1.csv")
  trained = (100 - len([i for i in held if i < 100]), 60 - len([i for i in held if i >= 100]))
  assert trained[0] % BATCH and trained[1] % BATCH  # both slices end in a partial batch
  first_steps, steps = -(-trained[0] // BATCH), -(-trained[0] // BATCH) - (-trained[1] // BATCH)

  def more(step):  # after the pause: the second slice
    if step >= first_steps and not (stream_dir / "slice-1.csv").exists():
      _write_slice(stream_dir, "slice-1.csv", range(100, 160))

  estimator = _estimator(cluster, model_dir, _model_fn)
  make = _batches(stream_dir, held_out=holdout.HeldOut(4, 1000), idle_flush_secs=0.3)
  assert online.train_on_stream(estimator, make, max_steps=steps, evaluate_every_steps=6,
                                after_checkpoint=more) == steps
  latest = estimator.latest_checkpoint()
  np.testing.assert_array_equal(online_stream.counts_in(latest)[:200],
                                [0 if i in held or i >= 160 else 1 for i in range(200)])
  assert stream_positions.read_positions(str(model_dir), latest) == {"folder": ["slice-1.csv", 60]}

  run = run_records.read_run(str(model_dir))
  windows = [r for r in run["progress"] if r["kind"] == run_records.WINDOW_KIND]
  assert windows[0]["step"] == 6 and all(b["step"] - a["step"] >= 6 for a, b in zip(windows, windows[1:]))
  last = windows[-1]
  assert last["window"]["messages"] == last["metrics"]["examples"] == last["window"]["held_out"] > 0
  assert last["metrics"]["loss"] == 0.0 and last["metrics"]["auc"] == pytest.approx(0.5)  # none was trained on
  assert last["window"]["positions"] == stream_positions.read_positions(
      str(model_dir), str(model_dir / "checkpoints" / f"ckpt-{last['step']}"))
  train = [r for r in run["progress"] if r["kind"] == "train"]
  assert all("lag_secs" in r["metrics"] and r["examples_per_sec"] > 0 for r in train)
  stream = run["summary"]["stream"]
  assert stream["messages_applied"] == 160 - len(held) and stream["held_out"] == len(held)
  assert stream["last_windows"][-1] == {"step": last["step"], **last["metrics"]}
  lines = summary_lib.summary_lines(str(model_dir), [], launch_secs=10)
  assert any(line.startswith(f"stream folder {stream_dir}: {160 - len(held)} messages applied in this run, "
                             f"{len(held)} held out") for line in lines), lines

  records = stream_evaluation.run_window_evaluator(estimator, holdout.window_input_fn(online_stream.SPEC, 64),
                                                   poll_secs=0.1, idle_timeout_secs=10)
  assert records and records[-1]["step"] == steps
  for record in records:  # each checkpoint on the window current at it
    window = stream_positions.read_record(str(model_dir), record["checkpoint_number"])["window"]
    assert record["metrics"]["examples"] == window["messages"] and record["metrics"]["loss"] == 0.0

  table = report.window_lines(str(model_dir))
  assert len(table) == len(windows) + 1 and table[0].split()[0] == "step"
  assert table[-1].split()[0] == str(last["step"]) and table[-1].split()[-1] == "0.5000"
  assert report.write_report(str(model_dir), str(tmp_path / "r.png"))


def _keras_model_with_auc() -> tf_keras.Model:
  """tests/online_stream.py's Keras counting model, with an AUC of its rows as logits (0.5 on messages never
  trained on)."""
  model = online_stream.CountingModel()
  model.compile(tf_keras.optimizers.legacy.SGD(1.0), metrics=[tf_keras.metrics.AUC(from_logits=True, name="auc")])
  return model


def test_the_keras_path_holds_out_a_share_and_evaluates_its_windows_inline_and_by_the_sidecar(cluster, tmp_path):
  """The Keras path (tfps.keras.online) on 100 messages, one in about 4 held out, the last ones in a partial batch:
  each trained message applied once, none held out; windows evaluated inline every 4 steps (run records, TensorBoard,
  the summary, tfps-report) and by the Keras sidecar at every checkpoint, each on the window current at it."""
  stream_dir, model_dir = tmp_path / "stream", tmp_path / "model"
  stream_dir.mkdir()
  _write_slice(stream_dir, "slice-0.csv", range(100))
  held = _held_out_ids(0, 100, 4, "slice-0.csv")
  steps = -(-(100 - len(held)) // BATCH)
  make = _batches(stream_dir, held_out=holdout.HeldOut(4, 1000), idle_flush_secs=0.3)
  assert keras_online.train_on_stream(_keras_model_with_auc, make, model_dir=str(model_dir), max_steps=steps,
                                      cluster=cluster, steps_per_execution=2, checkpoint_every_steps=100,
                                      log_every_steps=2, evaluate_every_steps=4, eval_batch_size=16) == steps
  latest = str(model_dir / "checkpoints" / f"ckpt-{steps}")
  np.testing.assert_array_equal(online_stream.counts_in(latest)[:120],
                                [0 if i in held or i >= 100 else 1 for i in range(120)])

  run = run_records.read_run(str(model_dir))
  windows = [r for r in run["progress"] if r["kind"] == run_records.WINDOW_KIND]
  assert windows[0]["step"] == 4 and all(b["step"] - a["step"] >= 4 for a, b in zip(windows, windows[1:]))
  last = windows[-1]
  assert last["window"]["messages"] == last["metrics"]["examples"] == last["window"]["held_out"] > 0
  assert last["metrics"]["loss"] == 0.0 and last["metrics"]["auc"] == pytest.approx(0.5)  # none was trained on
  assert tf.io.gfile.glob(str(model_dir / "eval_window" / "events.out.tfevents.*"))
  stream = run["summary"]["stream"]
  assert stream["held_out"] == len(held) and stream["last_windows"][-1] == {"step": last["step"], **last["metrics"]}
  assert report.window_lines(str(model_dir))[-1].split()[0] == str(last["step"])

  records = keras_stream_evaluation.run_window_evaluator(
      _keras_model_with_auc, holdout.window_input_fn(online_stream.SPEC, 16), str(model_dir), poll_secs=0.1,
      idle_timeout_secs=10)
  assert records and records[-1]["step"] == steps
  for record in records:  # each checkpoint on the window current at it
    window = stream_positions.read_record(str(model_dir), record["checkpoint_number"])["window"]
    assert record["metrics"]["examples"] == window["messages"] and record["metrics"]["loss"] == 0.0


def test_window_evaluation_without_a_held_out_share_is_one_line(tmp_path):
  (tmp_path / "stream").mkdir()
  with pytest.raises(tfps.UsageError, match="evaluating on the newest held-out window needs a held-out share"):
    online.train_on_stream(_estimator(None, tmp_path / "model"), _batches(tmp_path / "stream"), max_steps=1,
                           evaluate_every_secs=5)
