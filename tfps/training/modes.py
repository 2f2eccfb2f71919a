"""Training modes: how the ps applies the workers' work. One setting serves `tfps.fit` and the Estimator path.

* `async` (the default, ParameterServerStrategy's own): every worker step applies its gradients at once.
* `sync`: a global step averages the gradients of `replicas_to_aggregate` worker batches (default: one per worker),
  all computed on the same parameter version, and applies them once (`tfps.training.sync`).
* `geo`: each worker trains `geo_steps` steps on a local copy of the dense parameters and of the embedding rows its
  batches touch, then adds its parameter difference to the ps (`tfps.training.geo`).
"""

import dataclasses
from typing import Optional, Union

from tfps import checks
from tfps.errors import UsageError

MODES = ("async", "sync", "geo")
DEFAULT_GEO_STEPS = 10
# Async steps per scheduled function unless the user sets one (the Estimator path's default; tfps.fit uses 20 too).
# Measured (bench/results/estimator/): a scheduled function costs about 2 ms to dispatch and begin (490 trivial
# functions/s, 0.6 ms inside `schedule`) against 15-30 ms per step at batch 256, so 20 steps keep the chief inside
# `schedule` at 0.3% of wall time (10: 1.5%); more gains under 0.3% and runs longer between the loop's joins.
DEFAULT_STEPS_PER_EXECUTION = 20
# Async steps traced one after another in each iteration of a scheduled function's loop (`unrolled_steps`). Each loop
# iteration costs about 5 transfers between every ps and the worker (the loop's condition and control signals: 5 of
# a step's 25 at 1 ps), and it ends only once every op of its steps has run. With "auto" the step function chooses
# when it is traced, from its batches' static size (`steps_per_iteration`): `AUTO_UNROLLED_STEPS` where that is at
# most `AUTO_UNROLL_MAX_BATCH`, else one step per iteration (and one where the batch size is not static). Measured at
# batch 256 (bench/results/unrolled_steps/NOTES.md, bench/results/defaults_auto/NOTES.md): 4 per iteration ran
# 1.05-1.15x as fast at 1 ps + 1 worker, with 0-11% less CPU per step; 0.95x and 0.86x one step's CPU per step at
# 2 ps + 2 and 4 ps + 2 workers. At batch 4096 and 2 ps + 2 workers it ran 0.81x as fast (workers at 1.6x the CPU per
# step). 1024, the geometric middle of 256 and 4096, is a guess. It costs at every start: the function traces 5 steps
# (4, and the loop of steps left over) where it traced 1, 1.6-2x as long (`bench/first_trace.py`: 2.6 s against
# 1.6 s for 20 steps of the benchmark workload, bench/results/unrolled_steps/first_trace_again.json), on the chief
# and again on each worker and ps, at every restart too; made the default for a day, it took the test suite, whose
# runs are short and restart often, from 11 min 45 s to 15 min (1,338 against 1,728 CPU-s). So one step per
# iteration, as tf-keras runs them, is the default; "auto" or a number is opt-in (`--unrolled_steps=auto`) for long
# runs with small batches.
AUTO_UNROLLED_STEPS = 4
AUTO_UNROLL_MAX_BATCH = 1024
DEFAULT_UNROLLED_STEPS = 1
# Async: the small dense variables of each ps read in one transfer per step (`packed_reads`) unless the user says
# otherwise. Measured side by side (bench/results/packed_default/NOTES.md), 3 alternating runs each, batch 256:
# 1 ps + 1 worker 1.05x the examples/s of reading each variable on its own with 5-6% less CPU per step, on both paths;
# 2 ps + 2 and 4 ps + 2 workers, and batch 4096, within the runs' spread (0.91-1.08x, each shape on either side of 1
# in its two series).
DEFAULT_PACKED_READS = True


@dataclasses.dataclass(frozen=True)
class TrainingMode:
  """A validated training mode.

  Attributes:
    sync_mode: "async", "sync" or "geo".
    geo_steps: local steps between two pushes of a worker's difference (geo only; default 10).
    replicas_to_aggregate: worker batches averaged into one sync step (sync only; default: the number of workers).
    packed_reads: async: read the small dense variables of each ps in one transfer per step (`tfps.training.packing`;
      the default with async, `DEFAULT_PACKED_READS`: fewer transfers, measured faster at 1 ps + 1 worker and no slower
      elsewhere, bench/results/packed_default/NOTES.md); False reads each one on its own, as ParameterServerStrategy
      does.
    lockfree_row_updates: async: a legacy Adagrad applies a batch's table rows all at once (gather, the kernel's
      arithmetic on every row, scatter: `tfps._tf_private.adagrad_rows_at_once`; the same values as TensorFlow's sparse
      kernel bit for bit, and measured faster: bench/results/row_updates/NOTES.md) either way. False (the default) holds
      a lock of each table shard's own from the gathers to the scatters, as the kernel holds the variable's, so every
      row update is applied; True takes none, as TF1's optimizers ran by default: two workers updating the same row at
      the same moment may each overwrite the other's update of it.
    pipelined_updates: async: each ps applies a step's updates while the worker computes the next step, whose gradients
      are then taken on parameters without the previous step's updates (one step of delay, as one more worker would
      add); measured faster at 1 ps + 1 worker (bench/results/pipelined/NOTES.md); later, on a loaded machine, by less
      than one series swings, and further from one process's quality (bench/results/overlap/NOTES.md); so opt-in. Not for models with table layers (`tfps.layers.DynamicEmbedding`). False (the default) applies each
      step's updates before the next step reads.
    bf16_rows: async: table rows and their gradients cross the network as bfloat16 (`tfps.training.wire`): the
      rows of every lookup of a tf-keras `Embedding` layer or a stacked table, and every sparse gradient of a float32
      variable; half their bytes, rounded to 8 significant bits (tables, optimizer slots and updates stay float32).
      False (the default): they cross as float32.
    unrolled_steps: async: steps traced one after another in each iteration of a scheduled function's loop. None
      (not set): 1, the default (`DEFAULT_UNROLLED_STEPS`: one step per iteration, as tf-keras runs them). "auto":
      chosen when the step function is traced, 4 where its batches' static size is at most 1024, else 1 (also where
      the batch size is not static). A number given is used as given. More: fewer loop transfers and waits per step
      (measured faster with small batches, slower with large batches on several workers:
      bench/results/unrolled_steps/NOTES.md), and a trace about `unrolled_steps + 1` times one step's (the steps left
      over run one per iteration), at every start and restart of a task. Each step still reads the parameters after
      the previous step's updates (with `pipelined_updates`, after the updates of the step before that, as without
      unrolling).
    records_lock: async: each ps decides on a step's updates, applies them and records them holding a lock of its own
      (`tfps.training.ps_records.PsRecords`; True, the default), so that a step whose function runs again while its
      first run still applies it on a ps (its worker died after sending that ps all it needed) is applied there once.
      False takes no such lock, for speed: the steps of different workers no longer take turns on a ps from decision
      to record (measured with the lock and the ps's wait for the learning rate, which stays: a few percent fewer
      examples/s at 2 ps + 2 workers, at most a few at 1 + 1; switched off alone, side by side, nothing measurable on 2
      cores: docs/failures.md, bench/results/records_lock/NOTES.md);
      such a step can then be applied twice on that ps, and with `lockfree_row_updates` as well two workers updating
      one table row at once may each overwrite the other's update of it. Sync and geo always take it (not measured
      there: a sync step's updates run one step at a time, a geo push once per `geo_steps` steps).
  """

  sync_mode: str = "async"
  geo_steps: Optional[int] = None
  replicas_to_aggregate: Optional[int] = None
  packed_reads: Optional[bool] = None
  lockfree_row_updates: bool = False
  pipelined_updates: bool = False
  unrolled_steps: Union[int, str, None] = None
  bf16_rows: bool = False
  records_lock: bool = True

  def __post_init__(self):
    checks.one_of("sync_mode", self.sync_mode, MODES)
    checks.positive_int("geo_steps", self.geo_steps, allow_none=True)
    checks.positive_int("replicas_to_aggregate", self.replicas_to_aggregate, allow_none=True)
    if not (self.unrolled_steps in (None, "auto") or checks.is_int(self.unrolled_steps) and self.unrolled_steps >= 1):
      raise UsageError(f"`unrolled_steps` ({self.unrolled_steps!r}) must be a positive integer, \"auto\" or None")
    if self.geo_steps is not None and self.sync_mode != "geo":
      raise UsageError(f"`geo_steps` ({self.geo_steps}) applies only to sync_mode=geo, not {self.sync_mode}")
    if self.replicas_to_aggregate is not None and self.sync_mode != "sync":
      raise UsageError(f"`replicas_to_aggregate` ({self.replicas_to_aggregate}) applies only to sync_mode=sync, "
                       f"not {self.sync_mode}")
    if self.packed_reads is None:  # on by default where it applies
      object.__setattr__(self, "packed_reads", DEFAULT_PACKED_READS and self.sync_mode == "async")
    for name in ("packed_reads", "lockfree_row_updates", "pipelined_updates", "bf16_rows"):  # async-only switches
      if not isinstance(getattr(self, name), bool):
        raise UsageError(f"`{name}` ({getattr(self, name)!r}) must be True or False")
      if getattr(self, name) and self.sync_mode != "async":
        raise UsageError(f"`{name}` (True) applies only to sync_mode=async, not {self.sync_mode}")
    if not isinstance(self.records_lock, bool):
      raise UsageError(f"`records_lock` ({self.records_lock!r}) must be True or False")
    if not self.records_lock and self.sync_mode != "async":
      raise UsageError(f"`records_lock` (False) applies only to sync_mode=async, not {self.sync_mode}")
    if self.unrolled_steps is not None and self.sync_mode != "async":
      raise UsageError(f"`unrolled_steps` ({self.unrolled_steps}) applies only to sync_mode=async, not "
                       f"sync_mode={self.sync_mode}")
    if self.sync_mode == "geo" and self.geo_steps is None:
      object.__setattr__(self, "geo_steps", DEFAULT_GEO_STEPS)
    if self.sync_mode == "async" and self.unrolled_steps is None:
      object.__setattr__(self, "unrolled_steps", DEFAULT_UNROLLED_STEPS)

  def steps_per_iteration(self, steps_per_execution: int, batch_size: Optional[int] = None) -> int:
    """Async: the steps each iteration of a scheduled function's loop runs (`unrolled_steps`, at most the function's
    `steps_per_execution`); "auto" chooses from `batch_size`, its batches' static size (None: not static)."""
    return min(self.unrolled(batch_size), steps_per_execution)

  def unrolled(self, batch_size: Optional[int]) -> int:
    """Async: `unrolled_steps`, or with "auto" what it chooses for batches of static size `batch_size` (None: not
    static): `AUTO_UNROLLED_STEPS` up to `AUTO_UNROLL_MAX_BATCH`, else 1."""
    if self.unrolled_steps != "auto":
      return self.unrolled_steps
    small = batch_size is not None and batch_size <= AUTO_UNROLL_MAX_BATCH
    return AUTO_UNROLLED_STEPS if small else 1

  def _unrolled_described(self, batch_size) -> str:
    """"4 steps per loop iteration" (set), "4 steps per loop iteration (auto: batch 256)", "1 step per loop iteration
    (auto: batch size not static)"."""
    if self.unrolled_steps == "auto":
      steps = self.unrolled(batch_size)
      auto = " (auto: " + ("batch size not static" if batch_size is None else f"batch {batch_size}") + ")"
    else:
      steps, auto = self.unrolled_steps, ""
    return f"{steps} step{'s' if steps > 1 else ''} per loop iteration{auto}"

  def replicas(self, num_workers: int) -> int:
    """Worker batches per sync step on a cluster of `num_workers` workers."""
    replicas = self.replicas_to_aggregate or num_workers
    if replicas > num_workers:
      raise UsageError(f"`replicas_to_aggregate` ({replicas}) is more than the {num_workers} workers of the cluster: "
                       "each worker gives at most one batch per sync step")
    return replicas

  def describe(self, num_workers: int, batch_size: Union[int, str, None] = "unknown") -> str:
    """"async", "async, updates pipelined", "sync, 2 worker batches per step", "geo, 10 local steps per push"; async
    names the switches set otherwise than by default too ("async, 4 steps per loop iteration, rows as bfloat16",
    "async, dense variables read one by one"), and with "auto" steps per loop iteration what it chooses for a
    worker's batches of static size `batch_size` (None: not static; "unknown", the default: nothing said)."""
    if self.sync_mode == "geo":
      return f"geo, {self.geo_steps} local steps per push"
    if self.sync_mode == "sync":
      return f"sync, {self.replicas(num_workers)} worker batches per step"
    said = self.unrolled_steps != DEFAULT_UNROLLED_STEPS and not (self.unrolled_steps == "auto" and
                                                                   batch_size == "unknown")
    unrolled = self._unrolled_described(batch_size) if said else None
    switches = [
        (self.pipelined_updates, "updates pipelined"),
        (unrolled is not None, unrolled),
        (self.packed_reads != DEFAULT_PACKED_READS,
         "dense reads packed per ps" if self.packed_reads else "dense variables read one by one"),
        (self.lockfree_row_updates, "row updates without a lock"),
        (self.bf16_rows, "rows as bfloat16"),
        (not self.records_lock, "no records lock"),
    ]
    return ", ".join(["async"] + [name for on, name in switches if on])


def as_mode(mode) -> TrainingMode:
  """A TrainingMode from a TrainingMode, a mode name, or None (async); flags are read by `tfps.cli` only."""
  if isinstance(mode, TrainingMode):
    return mode
  if mode is None:
    return TrainingMode()
  if isinstance(mode, str):
    return TrainingMode(mode)
  raise TypeError(f"`sync_mode` ({mode!r}) must be one of {', '.join(MODES)} or a tfps.TrainingMode")
