"""Online training: the chief reads a stream and hands each scheduled function its batches; runs without end.

Under ParameterServerStrategy a dataset function runs as a graph on the workers, where a Python generator hangs
(tensorflow#48957), and TensorFlow 2.21 has no Kafka op. So the chief reads the stream (`tfps.data.stream`), parses
it into batches, and schedules each function of the async runner with its batches as arguments
(`AsyncRunner.schedule_batches`). A function run again after a worker failure gets the same batches and goes on at
its first step not applied (the runner's exactly-once records), so after each join of the coordinator every batch
fed was applied exactly once, and the position after the last one is the position of the checkpoint saved there
(`tfps.training.stream_positions`). Offsets are committed to the source (the Kafka consumer group) only after that
checkpoint. A chief restarted restores the newest checkpoint and reads on from its position: the updates applied
after it (by steps whose functions ran after the checkpoint) are overwritten by the restore, so each message
counts once in the model however the chief, a worker or a ps was lost.

The loop saves every `checkpoint_every_steps` steps, after `checkpoint_every_secs`, whenever the stream pauses
with steps not saved yet, and when `evaluation_due(step)` says so (an evaluation of the held-out window follows the
checkpoint: `after_checkpoint`); a partial batch (`StreamBatches(idle_flush_secs=...)`) is scheduled alone. SIGTERM
(`stop_on_sigterm`) ends it after the steps in flight, with a checkpoint and a commit, and where a worker was lost
and is being restarted the chief waits for it to rejoin before it ends (`wait_for_lost_workers`). Sync and geo
runners take the chief's batches too. See docs/online.md.
"""

import collections
import contextlib
import signal
import threading
import time
from typing import Callable, Optional

from absl import logging

from tfps import _tf_private
from tfps import run_records
from tfps.errors import TfpsError, UnreachableTaskError, UsageError
from tfps.training import delta_schedule
from tfps.training import loop as loop_lib
from tfps.training import stream_positions

_WAIT_SECS = 0.5  # the longest a step waits for its batch before the loop looks for a stop, a save and a log
LOST_WORKER_WAIT_SECS = 600.0  # at the end, the longest the chief waits for a lost worker to rejoin


@contextlib.contextmanager
def stop_on_sigterm():
  """Yields a `threading.Event` set on SIGTERM (in the main thread; elsewhere, never set by a signal)."""
  stop = threading.Event()
  if threading.current_thread() is not threading.main_thread():
    yield stop
    return
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
  try:
    yield stop
  finally:
    signal.signal(signal.SIGTERM, previous)


class StreamLoop(loop_lib.TrainLoop):
  """Trains on `batches` (a `tfps.data.stream.batches.StreamBatches`) until `stop` is set or `max_steps` is reached.

  Takes `TrainLoop`'s arguments but `iterator`; `config.checkpoint_every_steps` and `checkpoint_every_secs` set the
  checkpoints. The runner must take batches as arguments (`schedule_batches`: async, one batch a step; sync,
  `batches_per_step` a step, one per worker slot; geo, a round's).
  """

  def __init__(self, *, batches, checkpoint_every_secs: Optional[float] = None,
               evaluation_due: Optional[Callable[[int], bool]] = None, **kwargs):
    super().__init__(iterator=None, **kwargs)
    if not hasattr(self._runner, "schedule_batches"):
      raise UsageError(f"training on a stream needs a runner that takes the chief's batches (the runner is "
                       f"{type(self._runner).__name__})")
    if self._runner.batches_per_step > 1 and batches.idle_flush_secs is not None:
      raise UsageError(f"partial batches after a pause (idle_flush_secs={batches.idle_flush_secs}) need a mode that "
                       f"trains one batch a step (async or geo): a sync step trains one batch per worker slot")
    self._batches = batches
    self._fed_positions = batches.positions()  # the position after the last batch scheduled
    self._written = delta_schedule.WriteSpan()  # when the examples scheduled since the last delta export were written
    self._ready = collections.deque()  # batches read ahead while the last chunk's functions ran, not scheduled yet
    self._ready_stacked = ([], None)  # a function's worth of them, and their stacked element
    self._every_secs = checkpoint_every_secs
    self._stop: Callable[[], bool] = lambda: False
    self._evaluation_due = evaluation_due or (lambda step: False)
    given = self._metrics
    self._metrics = lambda: {**(given() if given is not None else {}), **self.stream_metrics()}

  def run(self, max_steps: Optional[int] = None, after_checkpoint=None, stop: Optional[threading.Event] = None) -> int:
    """Trains until `stop` is set (None: never) or the global step reaches `max_steps`; returns the final step."""
    self._stop = stop.is_set if stop is not None else (lambda: False)
    step = self.step
    self._begin_deltas()
    self._records = run_records.RunRecorder(self._model_dir, start_step=step)
    self._examples, self._loss, self._last_metrics = 0, None, {}
    saved, saved_time, clock = step, time.monotonic(), (time.monotonic(), step)
    while not self._stop() and (max_steps is None or step < max_steps):
      boundary = (step // self._config.log_every_steps + 1) * self._config.log_every_steps
      fed, loss_sum, examples, paused = self._run_chunk_fed(min(boundary, max_steps or boundary) - step)
      step = self.step
      if fed:
        loss_sum = self.chunk_ended(fed, loss_sum)
        clock = self._log(step, loss_sum, examples, clock, max_steps)
      due = (step >= saved + self._config.checkpoint_every_steps or step == max_steps or
             (self._every_secs is not None and time.monotonic() - saved_time >= self._every_secs) or paused or
             self._evaluation_due(step))
      if due and step != saved:
        self._save_with_positions(step, after_checkpoint)
        saved, saved_time, clock = step, time.monotonic(), (time.monotonic(), step)
      if self._wrote_delta_due():
        clock = (time.monotonic(), step)  # writing a delta is not training time
    if self._stop():
      logging.info("Stopping at step %d: the steps in flight ended; saving and committing the stream position", step)
    if step != saved:
      self._save_with_positions(step, after_checkpoint)
    self._finish_deltas()
    self._writer.flush()
    self._records.finish(step, {} if self._loss is None else {"loss": self._loss, **self._last_metrics},
                         examples=self._examples, tensorboard=self._model_dir)
    run_records.add_to_summary(self._model_dir, "stream", self._stream_summary())
    return step

  def _run_chunk_fed(self, num_steps: int):
    """Schedules up to `num_steps` steps on the stream's next batches, joins and settles: `(steps fed, loss sum,
    examples, paused)`, `paused` where the stream gave no batch for a while."""
    runner, start = self._runner, self.step
    runner.begin()
    results, fed, paused, per_step = [], 0, False, runner.batches_per_step
    while fed < num_steps and not self._stop():
      batches, paused = self._next_batches(min(runner.steps_per_execution, num_steps - fed) * per_step)
      steps = len(batches) // per_step
      self._ready.extendleft(reversed(batches[steps * per_step:]))  # a step's batches go in together
      if steps:
        batches = batches[:steps * per_step]
        results += _schedule(runner, batches, per_step, self._stacked)
        self._fed_positions = batches[-1].positions
        for batch in batches:
          self._written.add(batch.written)
        fed += steps
      if paused or not steps:
        break
    self._read_ahead(runner.steps_per_execution * per_step)
    runner.coordinator.join()
    applied = runner.settle() - start  # async: from its records; sync: each step checked as it ended
    if applied != fed:  # the coordinator re-runs a lost worker's functions, so after a join each one has ended
      raise RuntimeError(f"{fed} steps were fed from the stream and {applied} recorded as applied")
    loss_sum, examples = 0.0, 0
    for result in results:
      loss, count = result.fetch()
      loss_sum, examples = loss_sum + float(loss), examples + int(count)
    return fed, loss_sum, examples, paused

  def chunk_ended(self, steps: int, loss_sum: float) -> float:
    """Called after each chunk of `steps` steps (joined) with their summed loss; returns the loss sum its progress line
    shows (a subclass may read it elsewhere: the Keras path's loss metric)."""
    del steps
    return loss_sum

  def _next_batches(self, count: int):
    """`(batches, paused)`: up to `count` batches, those read ahead first; `paused` where the stream gave none for a
    while."""
    batches = []
    while len(batches) < count and not self._stop():
      batch = self._ready.popleft() if self._ready else self._batches.next_batch(_WAIT_SECS)
      if batch is None:
        return batches, True
      batches.append(batch)
      if batch.size < self._batches.batch_size:  # a partial batch, after a pause: the chunk ends with it
        return batches, True
    return batches, False

  def _read_ahead(self, count: int) -> None:
    """While the functions just scheduled run: reads up to `count` batches the stream has now, for the next chunk
    (their records are not in a checkpoint's position before they are scheduled and applied)."""
    while len(self._ready) < count and not self._stop():
      batch = self._batches.next_batch(0.0)
      if batch is None:
        return
      self._ready.append(batch)
    full = self._batches.batch_size
    if len(self._ready) == count and all(batch.size == full for batch in self._ready):  # parsed now, not after
      chunk = list(self._ready)  # the join (the workers would wait); a partial batch goes in a function of its own
      self._ready_stacked = (chunk, self._batches.stacked(chunk, count))

  def _stacked(self, batches, size: int):
    """The stacked element of `batches` (`StreamBatches.stacked`): the one `_read_ahead` made where it is theirs."""
    chunk, stacked = self._ready_stacked
    self._ready_stacked = ([], None)
    if len(chunk) == len(batches) == size and all(a is b for a, b in zip(chunk, batches)):
      return stacked
    return self._batches.stacked(batches, size)

  def _save_with_positions(self, step: int, after_checkpoint) -> None:
    """The checkpoint of `step` with the position after every batch scheduled (all applied: the loop joined), then
    the commit of that position to the source."""
    positions = self._fed_positions
    stream_positions.write_positions(self._model_dir, step, positions, self._batches.source.name,
                                     window=self._write_window(step))
    self._save(step, after_checkpoint)
    self._batches.source.commit(positions)
    stream_positions.prune_positions(self._model_dir, self._manager.checkpoints)

  def _write_window(self, step: int) -> Optional[dict]:
    """Writes the held-out window current at checkpoint `step` beside it; returns what it is (None: no held-out
    share)."""
    held_out = self._batches.held_out
    if held_out is None:
      return None
    spec = self._batches.spec
    stream_positions.write_window(self._model_dir, step, held_out.window(),
                                  header=spec.delimiter.join(spec.columns) if spec.header else None)
    return held_out.describe()

  def _stream_summary(self) -> dict:
    """The stream's part of the run summary: messages applied in this run, held out and malformed, the final lag,
    and the last window evaluations (`run_records.WINDOW_KIND` records)."""
    windows = [r for r in run_records.read_jsonl(run_records.progress_path(self._model_dir))
               if r.get("kind") == run_records.WINDOW_KIND]
    held_out = self._batches.held_out
    return {"stream": self._batches.source.name, "messages_applied": self._examples,
            "held_out": held_out.count if held_out is not None else None, **self.stream_metrics(),
            "last_windows": [{"step": r["step"], **r["metrics"]} for r in windows[-5:]]}

  def stream_position(self):
    """`(stream name, position after the last batch scheduled, the write times of the examples scheduled since the
    last delta export)`: all of them applied between chunks."""
    return self._batches.source.name, self._fed_positions, self._written

  @property
  def coordinator(self):
    """The cluster coordinator the loop's runner schedules on."""
    return self._runner.coordinator

  def close(self) -> None:
    """Closes the stream's source (its connection, or files)."""
    self._batches.source.close()

  def finish(self) -> None:
    """Training ended (stopped, or at its last step): the FINAL marker names the newest checkpoint, so a sidecar
    following the run ends after it, and ps and workers given the model_dir end (`CheckpointWriter.finish`)."""
    self._manager.finish()

  def stream_metrics(self) -> dict:
    """Lag and malformed records, for the progress lines: `lag_messages` (where the source counts them),
    `lag_secs`, `malformed_records`."""
    messages, seconds = self._batches.lag(self._fed_positions)
    metrics = {"lag_secs": round(float(seconds), 3), "malformed_records": self._batches.malformed}
    if messages is not None:
      metrics["lag_messages"] = messages
    return metrics


def _schedule(runner, batches, per_step: int, stacked) -> list:
  """Schedules `batches` (fed in order, `per_step` to a step), the steps whose batches are of one size in one function
  (a partial batch's step alone), each given `stacked(its batches, steps_per_execution * per_step)`; returns the
  functions' results."""
  results, start = [], 0
  while start < len(batches):
    end = start + per_step
    while end < len(batches) and batches[end].size == batches[start].size:
      end += per_step
    results.append(runner.schedule_batches(stacked(batches[start:end], runner.steps_per_execution * per_step),
                                           (end - start) // per_step))
    start = end
  return results


def open_batches(make_batches: Callable, model_dir: str):
  """`make_batches(positions)` from the newest checkpoint's position in `model_dir`, checked to be of the stream
  that checkpoint read (`stream_positions.check_same_stream`; the source is closed where it is not). A source that
  refuses the position says which stream it is of."""
  checkpoint, record = stream_positions.newest_record(model_dir)
  try:
    batches = make_batches(None if record is None else record["positions"])
  except UnreachableTaskError:
    raise
  except TfpsError as e:
    if record is None:
      raise
    raise type(e)(f"{e} ({checkpoint} holds the position of {record['stream']!r})") from None
  if record is not None:
    try:
      stream_positions.check_same_stream(checkpoint, record, batches.source.name)
    except UsageError:
      batches.source.close()
      raise
  return batches


def check_mode(mode) -> None:
  """A one-line `UsageError`, before anything connects, where a stream cannot train in `mode`: with pipelined updates
  (their steps take their batches from the workers' own input only; docs/online.md)."""
  if mode.pipelined_updates:
    raise UsageError("training on a stream needs pipelined_updates=False (given True): pipelined steps take their "
                     "batches from the workers' own input, not from the chief")


def run_until_stopped(stream_loop: StreamLoop, max_steps: Optional[int], after_checkpoint=None,
                      stop: Optional[threading.Event] = None) -> int:
  """`stream_loop.run` until `stop` is set (None: until SIGTERM) or `max_steps`; closes the stream's source after,
  waits for a lost worker to rejoin (a restarted one must not find FINAL and end), then writes FINAL. Returns the
  final step."""
  try:
    if stop is not None:
      step = stream_loop.run(max_steps, after_checkpoint, stop=stop)
    else:
      with stop_on_sigterm() as sigterm:
        step = stream_loop.run(max_steps, after_checkpoint, stop=sigterm)
  finally:
    stream_loop.close()
  wait_for_lost_workers(stream_loop.coordinator)
  stream_loop.finish()
  return step


def wait_for_lost_workers(coordinator, timeout_secs: float = LOST_WORKER_WAIT_SECS) -> None:
  """Where `coordinator` waits for a lost worker to rejoin (one stopped while it was being restarted), waits up to
  `timeout_secs` for that: a coordinator collected before hangs the chief (`_tf_private.worker_recovery_pending`)."""
  deadline = time.monotonic() + timeout_secs
  if _tf_private.worker_recovery_pending(coordinator):
    logging.info("Waiting up to %.0f s for a lost worker to rejoin before the chief ends", timeout_secs)
  while _tf_private.worker_recovery_pending(coordinator) and time.monotonic() < deadline:
    time.sleep(0.2)
