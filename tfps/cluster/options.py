"""`StrategyOptions`: how the chief uses its cluster (sharding, how long it waits for tasks) and how the ps and workers
serve (thread spinning). One frozen, checked object both training paths take (`tfps.fit(strategy_options=...)`,
`tfps.Estimator(strategy_options=...)`); a script builds it with `tfps.strategy_options_from_flags()`. No TensorFlow.
"""

import dataclasses
from typing import Mapping, Optional, Union

from tfps import checks
from tfps.cluster import config as cluster_lib
from tfps.cluster import watchdog
from tfps.errors import ArgumentTypeError, UsageError

DEFAULT_MIN_SHARD_BYTES = 256 << 10
DEFAULT_CONNECT_TIMEOUT_SECS = cluster_lib.DEFAULT_CONNECT_TIMEOUT_SECS


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
  """Checked settings of the strategy and the servers.

  Attributes:
    num_shards: shards of each large variable (default: the number of ps).
    min_shard_bytes: variables smaller than this are not sharded (0 shards every variable with >= 2 rows).
    connect_timeout_secs: seconds the chief waits for every ps and worker to answer.
    lost_task_timeout_secs: seconds a ps may stay silent mid-run before training stops with an error naming it.
    thread_spinning: a ps or worker's idle threads spin waiting for work (TensorFlow's default) instead of sleeping
      (tfps's); `tfps.run_task(..., thread_spinning=...)` takes it.
  """

  num_shards: Optional[int] = None
  min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES
  connect_timeout_secs: float = DEFAULT_CONNECT_TIMEOUT_SECS
  lost_task_timeout_secs: float = watchdog.DEFAULT_TIMEOUT_SECS
  thread_spinning: bool = cluster_lib.DEFAULT_THREAD_SPINNING

  def __post_init__(self):
    checks.positive_int("num_shards", self.num_shards, allow_none=True)
    checks.non_negative_int("min_shard_bytes", self.min_shard_bytes)
    for name in ("connect_timeout_secs", "lost_task_timeout_secs"):
      object.__setattr__(self, name, checks.non_negative_number(name, getattr(self, name), "number of seconds"))
    if not isinstance(self.thread_spinning, bool):
      raise UsageError(f"`thread_spinning` ({self.thread_spinning!r}) must be True or False")

  # A mapping too, for one release: `tfps.fit(**options)` and `build_strategy(config, **options)` as with the dict
  # `strategy_options_from_flags` returned before.
  def keys(self):
    return [field.name for field in dataclasses.fields(self)]

  def __getitem__(self, name: str):
    return getattr(self, name)


FIELDS = tuple(field.name for field in dataclasses.fields(StrategyOptions))


def as_strategy_options(options: Union[None, StrategyOptions, Mapping] = None, **settings) -> StrategyOptions:
  """A `StrategyOptions` from one, from a dict of its fields, or from None (the defaults), with `settings` (fields
  given one by one) applied; an unknown name is a `UsageError` naming the allowed ones."""
  if options is None:
    options = {}
  if not isinstance(options, (StrategyOptions, Mapping)):
    raise ArgumentTypeError(f"`strategy_options` must be a tfps.StrategyOptions, got {type(options).__name__}")
  unknown = sorted(set(options.keys()) - set(FIELDS)) + sorted(set(settings) - set(FIELDS))
  if unknown:
    raise UsageError(f"unknown strategy option {unknown[0]!r}; allowed: {', '.join(FIELDS)}")
  if isinstance(options, StrategyOptions):
    return dataclasses.replace(options, **settings) if settings else options
  return StrategyOptions(**{**options, **settings})
