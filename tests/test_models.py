"""tfps.models under ParameterServerStrategy (in-process cluster, tables sharded over 2 ps) and without a strategy."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tfps
from tfps import models
from tfps.data import criteo
from tfps.data import movielens
from tfps.data import synthetic
from test_data import ml100k  # pylint: disable=unused-import  (the fixture)

VOCAB = 1000
# The coordinator-loop tests use C1-C6, the categorical features that carry the synthetic data's planted signal, of
# Criteo's 26 (the models read the features they name): tracing a step costs time per sharded table.
SIGNAL_FEATURES = criteo.CATEGORICAL_COLUMNS[:synthetic.SIGNAL_CATEGORICAL]


@pytest.fixture(scope="module")
def strategy(cluster):
  strategy, _ = tfps.build_strategy(cluster, min_shard_bytes=0)
  return strategy


@pytest.fixture(scope="module")
def synthetic_files(tmp_path_factory):
  spec = synthetic.SyntheticSpec(rows=20_000, num_files=4, seed=3, vocab_size=VOCAB)
  return list(synthetic.generate_criteo(str(tmp_path_factory.mktemp("synthetic")), spec).files)


def _assert_sharded(table, num_ps=2):
  assert type(table).__name__ == "ShardedVariable", f"{table.name} is a {type(table).__name__}"
  devices = {variable.device for variable in table.variables}
  assert len(table.variables) == num_ps and len({d.split("/device")[0] for d in devices}) == num_ps, devices


def _fit(strategy, build, dataset_fn, held_out, epochs=2, steps_per_epoch=5):
  """Builds under the strategy and fits; returns the model, history, the input contexts seen, and the loss of the
  `held_out` batch (computed on the chief) before and after training."""
  contexts = []

  def recording_fn(input_context):
    contexts.append((input_context.num_input_pipelines, input_context.input_pipeline_id))
    return dataset_fn(input_context)

  with strategy.scope():
    model = build()
    before = float(model.step_loss(*held_out, training=False))  # the first call creates the (sharded) variables
  history = model.fit(tf_keras.utils.experimental.DatasetCreator(recording_fn), epochs=epochs,
                      steps_per_epoch=steps_per_epoch, verbose=0)
  after = float(model.step_loss(*held_out, training=False))
  assert np.all(np.isfinite(history.history["loss"])) and np.isfinite(after)
  assert after < before, (before, after, history.history)
  return model, history.history, contexts


def _criteo_batch(files, size):
  return next(iter(criteo.criteo_dataset_fn(files, batch_size=size, num_buckets=VOCAB, repeat=False,
                                            shuffle_buffer=0, scan=False)(None)))


@pytest.mark.parametrize("name", ["wide_deep", "dcn"])
def test_ranking_model_trains_with_sharded_tables(strategy, synthetic_files, name):
  categorical, dense = criteo.feature_spec(VOCAB)
  dataset_fn = criteo.criteo_dataset_fn(synthetic_files[:-1], batch_size=256, num_buckets=VOCAB)
  model, history, contexts = _fit(strategy, lambda: models.compile_model(
      models.build_model(name, categorical, dense, embedding_dim=8, deep_layers=(32,))), dataset_fn,
                                  _criteo_batch(synthetic_files[-1:], 2000), epochs=2, steps_per_epoch=20)
  assert 0.0 <= history["auc"][-1] <= 1.0
  tables = models.embedding_tables(model)
  assert len(tables) == (52 if name == "wide_deep" else 26)  # Wide&Deep: a wide and a deep table per feature
  for table in tables.values():
    _assert_sharded(table)
  # ParameterServerStrategy traces the dataset function once for all workers, as pipeline 0 of 1
  # (see tfps.data.pipeline): PSS workers do not split files by input context.
  assert contexts == [(1, 0)]


def test_wide_deep_trains_on_the_criteo_sample(strategy, shared_data):
  categorical, dense = criteo.feature_spec(VOCAB)
  sample = str(shared_data / "criteo" / "criteo_sample.csv")
  dataset_fn = criteo.criteo_dataset_fn(sample, batch_size=64, num_buckets=VOCAB, shuffle_buffer=200)
  # At 0.02, as the coordinator-loop tests: at 0.05 the held-out loss ended above its start in 1 of 3 runs alone
  # (0.62 -> 1.18; plain tf-keras fit on 2 async workers, no tfps training code).
  _fit(strategy, lambda: models.compile_model(
      models.build_wide_deep(categorical, dense, embedding_dim=4, deep_layers=(16,)), learning_rate=0.02), dataset_fn,
       _criteo_batch(sample, 200), epochs=2, steps_per_epoch=10)  # about 6 passes over the 200 rows


def _one_movielens_batch(ml100k, tables):
  """256 ratings of u1.base and a dataset function repeating them: 20 steps of the in-batch softmax barely move the
  loss on fresh batches (about 0.1%, below the noise of asynchronous training), but fit one batch clearly (~18%)."""
  batch = next(iter(movielens.movielens_dataset_fn(ml100k, "u1.base", batch_size=256, repeat=False,
                                                   shuffle_buffer=0, tables=tables)(None)))
  return batch, lambda input_context: tf.data.Dataset.from_tensors(batch).repeat()


def test_retrieval_trains_sharded_and_evaluates_top_k(strategy, ml100k):
  tables = movielens.load_tables(ml100k)
  categorical, dense = tables.feature_spec()
  batch, dataset_fn = _one_movielens_batch(ml100k, tables)
  test = movielens.movielens_dataset_fn(ml100k, "u1.test", batch_size=500, repeat=False, shuffle_buffer=0,
                                        tables=tables)(None)
  model, _, _ = _fit(strategy, lambda: models.compile_model(
      models.build_retrieval(categorical, dense, embedding_dim=8, layer_sizes=(16,)), learning_rate=0.1),
                     dataset_fn, batch, epochs=2, steps_per_epoch=10)
  embeddings = models.embedding_tables(model)
  assert sorted(embeddings) == sorted(f"embedding_{name}" for name in categorical)
  for table in embeddings.values():
    _assert_sharded(table)
  with strategy.scope(), pytest.raises(RuntimeError, match="outside strategy.scope"):
    models.evaluate_top_k(model, test, movielens.candidates_dataset(tables))
  results = models.evaluate_top_k(model, test, movielens.candidates_dataset(tables), ks=(1, 10, 100), steps=4)
  assert results["examples"] == 2000
  assert 0.0 <= results["top_1"] <= results["top_10"] <= results["top_100"] <= 1.0


def _estimator_style_losses(strategy, model_builder, dataset_fn, steps, held_out, learning_rate):
  """Trains with `model.step_loss` on the coordinator loop (no Keras fit), as the Estimator-style path does;
  returns the model, the step losses, and the held-out loss before and after."""
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  # A fixed initialization: unseeded, Wide&Deep's held-out loss started anywhere from 0.59 to 2.5, and from 0.59
  # (already near the base rate's 0.57) 20 steps ended at 0.596 once. Seeded, it starts at 0.73 and ends near 0.58.
  tf_keras.utils.set_random_seed(0)
  with strategy.scope():
    model = model_builder()
    before = float(model.step_loss(*held_out, training=False))
    optimizer = tf_keras.optimizers.legacy.Adagrad(learning_rate)
  per_worker = coordinator.create_per_worker_dataset(lambda: strategy.distribute_datasets_from_function(dataset_fn))

  @tf.function
  def train_step(iterator):
    def replica_fn(batch):
      features, labels = batch
      with tf.GradientTape() as tape:
        loss = model.step_loss(features, labels, training=True)
      optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
      return loss
    return strategy.run(replica_fn, args=(next(iterator),))

  iterator = iter(per_worker)
  losses = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(steps)]
  coordinator.join()
  return model, [float(loss.fetch()) for loss in losses], (before, float(model.step_loss(*held_out, training=False)))


@pytest.mark.parametrize("name", ["wide_deep", "dcn", "retrieval"])
def test_step_loss_trains_on_the_coordinator_loop(strategy, synthetic_files, name, request):
  if name == "retrieval":  # synthetic columns are independent: nothing relates a query to a candidate there
    ml100k = request.getfixturevalue("ml100k")
    tables = movielens.load_tables(ml100k)
    categorical, dense = tables.feature_spec()
    held_out, dataset_fn = _one_movielens_batch(ml100k, tables)
    options, learning_rate = {"layer_sizes": (16,)}, 0.1
  else:
    categorical, dense = criteo.feature_spec(VOCAB)
    categorical = {feature: categorical[feature] for feature in SIGNAL_FEATURES}
    dataset_fn = criteo.criteo_dataset_fn(synthetic_files[:-1], batch_size=128, num_buckets=VOCAB, scan=False)
    held_out = _criteo_batch(synthetic_files[-1:], 1000)
    # 0.02: at 0.05 DCN's cross layers diverged once in 20 async steps (held-out loss 0.69 -> 1.0), and so did
    # Wide&Deep once (0.75 -> 1.50, 2026-11-25; this test's own loop, no tfps training code).
    options, learning_rate = {"deep_layers": (16,)}, 0.02
  model, losses, (before, after) = _estimator_style_losses(
      strategy, lambda: models.build_model(name, categorical, dense, embedding_dim=4, **options), dataset_fn, 20,
      held_out, learning_rate)
  assert np.all(np.isfinite(losses)) and after < before, (before, after, losses)
  for table in models.embedding_tables(model).values():
    _assert_sharded(table)


def test_planted_signal_is_learnable(tmp_path):
  """Single process, no strategy: Wide&Deep on 100k synthetic rows reaches AUC > 0.70 on 20k held-out rows.

  Chance is 0.5; the planted model itself scores about 0.91 on these rows. Measured: about 0.74 after one pass.
  """
  spec = synthetic.SyntheticSpec(rows=120_000, num_files=6, seed=0, vocab_size=5000)
  data = synthetic.generate_criteo(str(tmp_path), spec)
  assert data.planted_auc > 0.85
  categorical, dense = criteo.feature_spec(5000)
  train = criteo.criteo_dataset_fn(list(data.files[:-1]), batch_size=512, num_buckets=5000, seed=0, scan=False)
  held_out = criteo.criteo_dataset_fn(data.files[-1], batch_size=4000, num_buckets=5000, repeat=False,
                                      shuffle_buffer=0, scan=False)
  tf_keras.utils.set_random_seed(0)
  model = models.compile_model(models.build_wide_deep(categorical, dense, embedding_dim=8, deep_layers=(64, 32)))
  model.fit(train(None), epochs=1, steps_per_epoch=200, verbose=0)
  results = model.evaluate(held_out(None), verbose=0, return_dict=True)
  assert results["auc"] > 0.70, results


def test_builder_errors():
  with pytest.raises(ValueError, match=r"model 'mf' is not one of wide_deep, dcn, retrieval"):
    models.build_model("mf", {"a": 3}, {})
  with pytest.raises(ValueError, match=r"`categorical` feature 'a' has size 0; sizes must be positive integers"):
    models.build_wide_deep({"a": 0}, {})
  with pytest.raises(ValueError, match=r"`candidate_features` names 'item', not a feature"):
    models.build_retrieval({"user": 3}, {}, candidate_features=("item",), candidate_id="item")
  with pytest.raises(ValueError, match=r"`optimizer` \('lamb'\) must be one of adagrad, adam, sgd"):
    models.compile_model(models.build_wide_deep({"a": 3}, {}), optimizer="lamb")


def test_lookups_gather_rows_from_each_shard_never_the_whole_table(strategy):
  """A sharded table's lookup traces to one `ResourceGather` per shard (run where the shard lives) and no read of a
  whole shard; its gradient is sparse (`IndexedSlices`)."""
  with strategy.scope():
    model = models.build_wide_deep({"item": 1000}, {}, embedding_dim=4, deep_layers=(4,))
    model({"item": tf.constant([1, 2], tf.int64)})
  layer = model.deep_inputs.tables["item"]
  _assert_sharded(layer.embeddings)

  @tf.function
  def gradient(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer(ids))
    return tape.gradient(loss, layer.trainable_variables)

  graph = gradient.get_concrete_function(tf.TensorSpec([None], tf.int64)).graph
  op_types = [op.type for op in graph.get_operations()]
  assert op_types.count("ResourceGather") == 2 and "ReadVariableOp" not in op_types, sorted(set(op_types))
  gradients = gradient(tf.constant([3, 999], tf.int64))
  assert all(isinstance(g, tf.IndexedSlices) for g in gradients)
