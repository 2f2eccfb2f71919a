"""Per-epoch timing of a Keras `fit` and the rates derived from it; imports no tfps (the plain-PSS peer uses it too)."""

import os
import statistics
import time
from typing import List, Optional, Sequence


def cpu_secs() -> float:
  """CPU seconds (user + system) of this process so far."""
  times = os.times()
  return times.user + times.system


def rates(seconds: Sequence[float], examples_per_window: int, steps: int) -> dict:
  """Examples/s of each measured window, their median, and the median seconds per step."""
  window_rates = [examples_per_window / s for s in seconds]
  return {"examples_per_sec": statistics.median(window_rates), "window_examples_per_sec": window_rates,
          "step_secs": statistics.median(seconds) / steps}


class EpochTimer:
  """Times every epoch of a Keras `fit` after the first (the warm-up); under PSS an epoch ends after the join.

  `schedule_secs`: a one-element list another piece of code adds seconds to (the chief's time inside `schedule`);
  its growth per measured epoch is kept in `schedule`.
  """

  def __init__(self, schedule_secs: Optional[List[float]] = None):
    import tf_keras  # pylint: disable=g-import-not-at-top

    class Callback(tf_keras.callbacks.Callback):

      def __init__(self, owner):
        super().__init__()
        self.owner = owner

      def on_epoch_begin(self, epoch, logs=None):
        self.owner.begin(epoch)

      def on_epoch_end(self, epoch, logs=None):
        self.owner.end(epoch)

    self.callback = Callback(self)
    self._schedule_secs = schedule_secs if schedule_secs is not None else [0.0]
    self.seconds = []
    self.cpu = []
    self.schedule = []
    self.span = [None, None]  # wall-clock (time.time) of the measured epochs' start and end
    self._start = None

  def begin(self, epoch):
    if epoch == 1:
      self.span[0] = time.time()
    self._start = (time.perf_counter(), cpu_secs(), self._schedule_secs[0])

  def end(self, epoch):
    wall, cpu, schedule = self._start
    if epoch > 0:
      self.seconds.append(time.perf_counter() - wall)
      self.cpu.append(cpu_secs() - cpu)
      self.schedule.append(self._schedule_secs[0] - schedule)
      self.span[1] = time.time()
