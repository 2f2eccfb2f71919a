"""The tfps models on the Estimator-style path (`tfps.estimator.Estimator`) over the in-process cluster."""

import numpy as np
import pytest

from tfps import estimator
from tfps.data import criteo
from tfps.data import synthetic
from tfps.models import model_fns

VOCAB = 1000
# The models use C1-C6, the categorical features that carry the synthetic data's planted signal, of Criteo's 26 (they
# read the features they name): tracing the train step costs time per sharded table, and 52 were most of this file's.
SIGNAL_FEATURES = criteo.CATEGORICAL_COLUMNS[:synthetic.SIGNAL_CATEGORICAL]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  spec = synthetic.SyntheticSpec(rows=12_000, num_files=3, seed=5, vocab_size=VOCAB)
  files = list(synthetic.generate_criteo(str(tmp_path_factory.mktemp("synthetic")), spec).files)
  train = criteo.criteo_dataset_fn(files[:-1], batch_size=256, num_buckets=VOCAB, scan=False)
  held_out = criteo.criteo_dataset_fn(files[-1], batch_size=1000, num_buckets=VOCAB, repeat=False, shuffle_buffer=0,
                                      drop_remainder=False, scan=False)
  return train, held_out


def _estimator(cluster, tmp_path, name, **options):
  categorical, dense = criteo.feature_spec(VOCAB)
  categorical = {feature: categorical[feature] for feature in SIGNAL_FEATURES}
  model_fn = model_fns.build_model_fn(name, categorical, dense, embedding_dim=4, **options)
  return estimator.Estimator(model_fn, model_dir=str(tmp_path), cluster=cluster,
                             strategy_options={"min_shard_bytes": 0})


def test_wide_deep_model_fn_trains_evaluates_predicts(cluster, data, tmp_path):
  train, held_out = data
  model = _estimator(cluster, tmp_path, "wide_deep", deep_layers=(16,))
  model.train(lambda input_context: train(input_context), steps=10)
  results = model.evaluate(lambda input_context: held_out(input_context))
  assert results["global_step"] == 10 and results["examples"] == 4000
  assert np.isfinite(results["loss"]) and 0.0 <= results["auc"] <= 1.0
  prediction = next(iter(model.predict(lambda: held_out(None).take(1))))
  assert prediction["logits"].shape == (1,) and 0.0 < prediction["probabilities"][0] < 1.0


def test_retrieval_model_fn_trains_evaluates_predicts(cluster, data, tmp_path):
  train, held_out = data
  model = _estimator(cluster, tmp_path, "retrieval", candidate_features=("C1", "C2"), candidate_id="C1",
                     layer_sizes=(8,))
  model.train(lambda input_context: train(input_context), steps=10)
  results = model.evaluate(lambda input_context: held_out(input_context))
  assert results["global_step"] == 10 and np.isfinite(results["loss"])
  assert next(iter(model.predict(lambda: held_out(None).take(1))))["query_embedding"].shape == (8,)


def test_model_fn_errors():
  with pytest.raises(ValueError, match=r"`optimizer` \('lamb'\) must be one of adagrad, adam, sgd"):
    model_fns.build_model_fn("dcn", {"a": 3}, {}, optimizer="lamb")
  with pytest.raises(ValueError, match=r"`num_cross_layers` \(0\) must be a positive integer"):
    model_fns.build_model_fn("dcn", {"a": 3}, {}, num_cross_layers=0)
