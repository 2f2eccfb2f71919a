"""File listing, per-worker sharding, and the shuffle/repeat/batch tail shared by every tfps reader.

Sharding and epochs (the documented behaviour of every tfps reader):

* A reader splits its data into `n` disjoint shares and reads share `i`: whole files (`files[i::n]`) where there are
  at least `n` files, else every `n`-th line of each file (`Dataset.shard`; correct, but every share opens every file).
* `n` and `i`, in order of precedence: `shard_index`/`num_shards` where given; else the input context where it has
  several pipelines (`num_input_pipelines`, `input_pipeline_id`); else, for a repeating (training) reader whose
  dataset function is traced for the workers of a ParameterServerStrategy built by tfps, under its scope (as
  both training paths do), the number of workers and the worker's index. Otherwise nothing is split.
* Under PSS TensorFlow passes every worker the same context, pipeline 0 of 1 (the dataset function is traced once for
  all workers), so the worker's index comes from `tf.distribute.coordinator.experimental_get_current_worker_index()`:
  a tensor fed when the traced function runs on each worker. A worker that fails reads its share again when it
  returns; until then its share goes unread. Both training paths (`tfps.fit`, the Estimator path) trace their
  per-worker datasets under the strategy's scope.
* A one-pass reader (`repeat=False`, evaluation) is not split by worker: exactly-once evaluation (`tfps.keras.evaluation`)
  shards the whole set itself and may run any of its shards on any worker.
* `repeat=True` (the default, as PSS training needs) repeats the share forever, reshuffling each pass. An "epoch" is
  the training loop's `steps_per_epoch`: each worker cycles through its own share at its own pace (the shuffle
  buffer mixes consecutive passes), so there is no exactly-once visitation per epoch.
  `repeat=False` reads each line once, and `drop_remainder=False` then keeps the last partial batch.
* `seed` seeds file order and the shuffle buffer; None draws a different order in each process. Split by worker, a
  fixed seed is fine (the workers shuffle different shares); unsplit, every worker would produce the same sequence.
"""

import glob
import os
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

from absl import logging
import tensorflow as tf

from tfps import checks
from tfps.training import strategy as strategy_lib
from tfps.errors import UsageError

FilePattern = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]


def list_files(file_pattern: FilePattern) -> List[str]:
  """The sorted files matching `file_pattern` (a path, a glob, or a sequence of them).

  Raises:
    UsageError: nothing matches.
  """
  patterns = [file_pattern] if isinstance(file_pattern, (str, os.PathLike)) else list(file_pattern)
  files = sorted({path for pattern in patterns for path in glob.glob(os.fspath(pattern)) if os.path.isfile(path)})
  if not files:
    raise UsageError(f"`file_pattern` ({file_pattern!r}) matches no file; give a path or glob of existing files")
  return files


class Shard(NamedTuple):
  """Share `index` of `num_shards`: whole files where `by_file`, else every `num_shards`-th line of each file.

  `index` is an int, or a scalar int64 tensor (the ParameterServerStrategy worker index, fed on each worker).
  """

  num_shards: int
  index: Union[int, tf.Tensor]
  by_file: bool


def shard_plan(num_files: int, input_context: Optional[tf.distribute.InputContext] = None,
               shard_index: Optional[int] = None, num_shards: Optional[int] = None, *, repeat: bool = True
               ) -> Optional[Shard]:
  """The share of `num_files` files this pipeline reads, or None for all of it (see the module doc for the rules).

  Call it inside the dataset function: whether it runs for the workers of a ParameterServerStrategy is decided there.

  Args:
    num_files: files of the data set.
    input_context: the strategy's (`tfps.training.dataset_fns.per_worker_iterator`, `DatasetCreator`,
      `distribute_datasets_from_function`), or None.
    shard_index: overrides the context and the worker (requires `num_shards`).
    num_shards: overrides the context and the worker (requires `shard_index`).
    repeat: whether the reader repeats (training); only a repeating reader is split by PSS worker.
  """
  if (shard_index is None) != (num_shards is None):
    raise UsageError(f"give both `shard_index` ({shard_index!r}) and `num_shards` ({num_shards!r}) or neither")
  if num_shards is None:
    if input_context is not None and input_context.num_input_pipelines > 1:
      num_shards, shard_index = input_context.num_input_pipelines, input_context.input_pipeline_id
    else:
      worker = pss_worker() if repeat else None
      if worker is None:
        return None
      shard = Shard(worker[0], worker[1], by_file=num_files >= worker[0])  # the index is a tensor: nothing to check
      logging.info("Each of the %d workers reads its own share of the training data (%s)", shard.num_shards,
                   "whole files" if shard.by_file else f"one line in {shard.num_shards} of each file")
      return shard
  checks.positive_int("num_shards", num_shards)
  checks.int_in_range("shard_index", shard_index, 0, num_shards - 1)
  if num_shards == 1:
    return None
  return Shard(num_shards, shard_index, by_file=num_files >= num_shards)


def pss_worker() -> Optional[Tuple[int, tf.Tensor]]:
  """`(number of workers, this worker's index)` while a dataset function is traced for the workers of a
  ParameterServerStrategy built by tfps (under its scope) with 2 or more workers; else None.

  The index is a scalar int64 tensor that TensorFlow feeds on each worker when the traced function runs there.
  """
  if not tf.inside_function() or not tf.distribute.has_strategy():
    return None
  try:
    cluster = strategy_lib.cluster_of(tf.distribute.get_strategy())
  except ValueError:  # not a strategy tfps built: its workers cannot be counted without TensorFlow privates
    return None
  if cluster.num_workers < 2:
    return None
  return cluster.num_workers, tf.distribute.coordinator.experimental_get_current_worker_index()


def read_lines(files: Sequence[str], *, skip_header: bool, repeat: bool, shuffle: bool, seed: Optional[int],
               shard: Optional[Shard] = None) -> tf.data.Dataset:
  """Lines of `shard` of `files` (header lines dropped where `skip_header`), interleaved over up to 4 files."""
  dataset = tf.data.Dataset.from_tensor_slices(list(files))
  num_files = len(files)
  if shard is not None and shard.by_file:
    dataset = dataset.shard(shard.num_shards, shard.index)
    num_files = -(-num_files // shard.num_shards)  # at most this many in a share
  if shuffle and num_files > 1:
    dataset = dataset.shuffle(num_files, seed=seed, reshuffle_each_iteration=True)
  if repeat:
    dataset = dataset.repeat()
  skip = 1 if skip_header else 0

  def file_lines(path):
    lines = tf.data.TextLineDataset(path).skip(skip)
    if shard is not None and not shard.by_file:
      lines = lines.shard(shard.num_shards, shard.index)
    return lines

  return dataset.interleave(file_lines, cycle_length=min(4, num_files), num_parallel_calls=tf.data.AUTOTUNE,
                            deterministic=not shuffle or seed is not None)


def shuffle_and_batch(dataset: tf.data.Dataset, *, batch_size: int, shuffle_buffer: int, seed: Optional[int],
                      drop_remainder: bool) -> tf.data.Dataset:
  """Shuffles (where `shuffle_buffer` > 1) and batches `dataset`."""
  checks.positive_int("batch_size", batch_size)
  checks.non_negative_int("shuffle_buffer", shuffle_buffer)
  if shuffle_buffer > 1:
    dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
  return dataset.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=True)


DatasetFn = Callable[[Optional[tf.distribute.InputContext]], tf.data.Dataset]
