"""Under ParameterServerStrategy each worker reads its own share of the training data (tfps.data.pipeline).

Rows are tagged with their id in the first integer column, read back from `dense[:, 0]` (`log(1 + id)`); scheduled
functions return the worker's index with the ids of the batch it read.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfps
from tfps.data import criteo
from tfps.estimator.distributed import DistributedModel
from tfps.training import dataset_fns

ROWS = 24
ROUNDS = 30  # scheduling rounds before giving up on hearing from both workers


def _write_files(directory, num_files):
  """`num_files` Criteo TSV files holding rows 1..ROWS between them; returns `(paths, [ids of each file])`."""
  paths, ids_of_file = [], []
  for part, ids in enumerate(np.array_split(np.arange(1, ROWS + 1), num_files)):
    path = directory / f"part-{part}.tsv"
    path.write_text("".join(f"{row_id % 2}\t{row_id}" + "\t0" * 12 + "\tab" * 26 + "\n" for row_id in ids))
    paths.append(str(path))
    ids_of_file.append(set(int(row_id) for row_id in ids))
  return paths, ids_of_file


@pytest.fixture(scope="module")
def pss(cluster):
  return tfps.build_strategy(cluster)


def _ids_by_worker(pss, dataset_fn, min_rows_per_worker):
  """`{worker index: set of row ids}` read by scheduled functions from the per-worker iterator tfps.fit trains on,
  once both workers have read that many rows."""
  strategy, coordinator = pss
  return _ids_read(coordinator, dataset_fns.per_worker_iterator(strategy, coordinator, dataset_fn, "dataset_fn"),
                   min_rows_per_worker)


def _ids_read(coordinator, iterator, min_rows_per_worker):

  @tf.function
  def take(iterator):
    features, _ = next(iterator)
    return tf.distribute.coordinator.experimental_get_current_worker_index(), features["dense"][:, 0]

  seen, rows = {}, {}
  for _ in range(ROUNDS):
    results = [coordinator.schedule(take, args=(iterator,)) for _ in range(4)]
    coordinator.join()
    for result in results:
      index, dense = result.fetch()
      seen.setdefault(int(index), set()).update(int(row_id) for row_id in np.rint(np.expm1(dense)))
      rows[int(index)] = rows.get(int(index), 0) + len(dense)
    if len(rows) == 2 and min(rows.values()) >= min_rows_per_worker:
      break
  assert sorted(rows) == [0, 1], f"only worker(s) {sorted(rows)} ran a function in {ROUNDS} rounds"
  return seen


@pytest.mark.parametrize("num_files", [4, 1])
def test_workers_read_disjoint_shares_of_everything(pss, tmp_path, num_files):
  """4 files: each worker reads 2 whole files. 1 file: each reads every other line of it."""
  paths, ids_of_file = _write_files(tmp_path, num_files)
  dataset_fn = criteo.criteo_dataset_fn(paths, batch_size=5, num_buckets=10, shuffle_buffer=8, seed=1, scan=False)
  seen = _ids_by_worker(pss, dataset_fn, min_rows_per_worker=3 * ROWS)
  assert not seen[0] & seen[1]
  assert seen[0] | seen[1] == set(range(1, ROWS + 1))
  assert len(seen[0]) == len(seen[1]) == ROWS // 2
  if num_files > 1:
    for ids in ids_of_file:  # a file's rows all go to one worker
      assert ids <= seen[0] or ids <= seen[1]


def test_the_estimator_path_splits_too(cluster, tmp_path):
  paths, _ = _write_files(tmp_path, 4)
  dataset_fn = criteo.criteo_dataset_fn(paths, batch_size=5, num_buckets=10, shuffle_buffer=8, seed=1, scan=False)
  model = DistributedModel(lambda features, labels, mode: None, {}, tfps.RunConfig(model_dir=str(tmp_path)), cluster,
                           {})
  seen = _ids_read(model.coordinator, model._per_worker_iterator(lambda input_context: dataset_fn(input_context)),  # pylint: disable=protected-access
                   min_rows_per_worker=3 * ROWS)
  assert not seen[0] & seen[1]
  assert seen[0] | seen[1] == set(range(1, ROWS + 1))


def test_one_pass_readers_are_not_split(pss, tmp_path):
  """Evaluation reads (repeat=False) give every worker the whole set; exact evaluation shards it itself."""
  paths, _ = _write_files(tmp_path, 4)
  once = criteo.criteo_dataset_fn(paths, batch_size=4, num_buckets=10, repeat=False, shuffle_buffer=0, scan=False)
  seen = _ids_by_worker(pss, lambda input_context: once(input_context).repeat(), min_rows_per_worker=3 * ROWS)
  assert seen[0] == seen[1] == set(range(1, ROWS + 1))


def test_steps_take_each_batch_with_a_plain_get_next(pss):
  """With one replica per worker a step's batch comes from the worker's own iterator, not through the partial-batch
  conditionals of a distributed iterator; `fn` gets ParameterServerStrategy's input context (one pipeline a worker)."""
  strategy, coordinator = pss
  contexts = []

  def dataset_fn(input_context):
    contexts.append((input_context.num_input_pipelines, input_context.input_pipeline_id,
                     input_context.num_replicas_in_sync))
    return tf.data.Dataset.range(6).batch(3).repeat()
  iterator = dataset_fns.per_worker_iterator(strategy, coordinator, dataset_fn, "dataset_fn")

  @tf.function
  def take(iterator):
    return strategy.run(tf.reduce_sum, args=(next(iterator),))

  assert int(coordinator.schedule(take, args=(iterator,)).fetch()) == 0 + 1 + 2
  assert contexts == [(1, 0, 1)]  # traced once, run on every worker
  ops = {op.type for op in take.get_concrete_function(iterator).graph.get_operations()}
  assert "IteratorGetNext" in ops
  assert not ops & {"IteratorGetNextAsOptional", "If", "StatelessIf"}, ops
