"""Two-tower retrieval (`tfrs.tasks.Retrieval`) and its top-K evaluation against the full candidate set.

Training uses the in-batch softmax loss of `tfrs.tasks.Retrieval` (SUM reduction, as TFRS defines it) with no
metrics: top-K metrics over all candidates cannot run under ParameterServerStrategy as TFRS builds them (a
`BruteForce` index created under `strategy.scope()` has its candidate table sharded and fails: "ShardedVariable:
indices must be 1D Tensor for sparse operations"; exact PSS evaluation refuses models that update metrics in their
own step). `evaluate_top_k` therefore runs where the towers can be called directly (the chief after or between
`fit` calls, a sidecar, or a single process): it embeds every candidate, builds a `BruteForce` index *outside* any
strategy scope and feeds `tfrs.metrics.FactorizedTopK`. The towers' variables stay on the ps; only the rows a batch
needs are gathered.

With `dynamic` (`--embedding=dynamic`) both towers' tables are `DynamicEmbedding`s keyed by the raw user and movie
ids; the serving export (the query tower) then answers raw user ids, unknown ones reading zeros in their tables.
The model's first call builds the candidate tower too (on the same batch, its output unused): its tables then
exist before the first step, so the training paths bind the optimizer to them and restore them like any other.
"""

import functools
from typing import Dict, Mapping, Optional, Sequence

from absl import logging
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

from tfps.models.layers import DynamicTables, FeatureEmbeddings, mlp


def build_tower(categorical: Mapping[str, int], dense: Mapping[str, int], embedding_dim: int,
                layer_sizes: Sequence[int], name: str, dynamic: Optional[DynamicTables] = None) -> tf_keras.Sequential:
  """Feature embeddings, then an MLP whose last layer (no activation) is the tower's output."""
  if not layer_sizes:
    raise ValueError(f"`layer_sizes` ({list(layer_sizes)!r}) must name at least the output width")
  return tf_keras.Sequential([FeatureEmbeddings(categorical, dense, embedding_dim, name=f"{name}_features",
                                                dynamic=dynamic),
                              mlp(layer_sizes, name=f"{name}_mlp", final_activation=None)], name=name)


class TwoTowerRetrieval(tfrs.models.Model):
  """Query tower and candidate tower trained with `tfrs.tasks.Retrieval`; `call` returns query embeddings.

  Args:
    query: `(categorical vocabulary sizes, dense widths)` of the query tower's features.
    candidate: the same for the candidate tower.
    candidate_id: the candidate feature that identifies a candidate (for top-K metrics).
    embedding_dim: width of every embedding table.
    layer_sizes: each tower's MLP; the last is the width of the tower outputs.
    dynamic: `DynamicEmbedding` tables keyed by raw ids in both towers (None: tables of the vocabulary sizes).
  """

  def __init__(self, query, candidate, *, candidate_id: str = "movie_id", embedding_dim: int = 32,
               layer_sizes: Sequence[int] = (64, 32), dynamic: Optional[DynamicTables] = None,
               name: str = "retrieval"):
    super().__init__(name=name)
    if candidate_id not in candidate[0]:
      raise ValueError(f"`candidate_id` ({candidate_id!r}) must be a categorical candidate feature: "
                       f"{', '.join(candidate[0]) or '(none)'}")
    self.candidate_id = candidate_id
    self.query_tower = build_tower(*query, embedding_dim, layer_sizes, name="query_tower", dynamic=dynamic)
    self.candidate_tower = build_tower(*candidate, embedding_dim, layer_sizes, name="candidate_tower",
                                       dynamic=dynamic)
    self.task = tfrs.tasks.Retrieval()

  def call(self, features: Mapping[str, tf.Tensor], training: bool = False) -> tf.Tensor:
    query = self.query_tower(features, training=training)
    if not self.candidate_tower.built:  # the first call (building the model) makes the candidate tower's tables,
      self.candidate_tower(features, training=False)  # after the query tower's, as `compute_loss` makes them
    return query

  def compute_loss(self, inputs, training: bool = False) -> tf.Tensor:
    """The in-batch softmax loss of a `(features, label)` batch (the label is ignored)."""
    features = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
    query = self.query_tower(features, training=training)
    candidate = self.candidate_tower(features, training=training)
    return _retrieval_call()(self.task, query, candidate, compute_metrics=False)


  def step_loss(self, features: Mapping[str, tf.Tensor], labels: Optional[tf.Tensor] = None,
                training: bool = True) -> tf.Tensor:
    """`compute_loss` plus regularisation losses: the tfps model contract for the Estimator-style path."""
    loss = self.compute_loss((features, labels), training=training)
    return loss + tf.add_n(self.losses) if self.losses else loss


@functools.lru_cache(maxsize=None)
def _retrieval_call():
  """`tfrs.tasks.Retrieval.call` converted by AutoGraph: it takes `len(tf.shape(x))`, which works only converted, and
  a loop traced with `autograph=False` (the Estimator-style path's) would otherwise call it unconverted."""
  return tf.autograph.to_graph(tfrs.tasks.Retrieval.call)


def evaluate_top_k(model: TwoTowerRetrieval, dataset: tf.data.Dataset, candidates: tf.data.Dataset,
                   ks: Sequence[int] = (1, 5, 10, 50, 100), steps: Optional[int] = None) -> Dict[str, float]:
  """Top-K accuracy of `model` on `dataset` against every candidate in `candidates`; call outside `strategy.scope()`.

  Args:
    model: a trained `TwoTowerRetrieval` (its variables may live on parameter servers).
    dataset: finite `(features, label)` batches of true (query, candidate) pairs.
    candidates: finite batches of candidate features, each candidate once.
    ks: cut-offs.
    steps: batches of `dataset` to use (all where None).

  Returns:
    `{"top_1": ..., "top_5": ..., "examples": n}`: the fraction of pairs whose true candidate ranks within K.
  """
  if tf.distribute.has_strategy():
    raise RuntimeError("evaluate_top_k must run outside strategy.scope(): its BruteForce index would be sharded")
  ids, embeddings = [], []
  for batch in candidates:
    ids.append(batch[model.candidate_id])
    embeddings.append(model.candidate_tower(batch))
  index = tfrs.layers.factorized_top_k.BruteForce(k=max(ks))
  index.index(tf.concat(embeddings, axis=0), tf.concat(ids, axis=0))
  metric = tfrs.metrics.FactorizedTopK(candidates=index, ks=list(ks))
  examples = 0
  for features, _ in dataset.take(-1 if steps is None else steps):
    metric.update_state(model.query_tower(features), model.candidate_tower(features),
                        true_candidate_ids=features[model.candidate_id])
    examples += int(tf.shape(features[model.candidate_id])[0])
  results = {f"top_{k}": float(value) for k, value in zip(ks, metric.result())}
  results["examples"] = examples
  logging.info("retrieval over %d candidates, %d examples: %s", int(tf.add_n([tf.size(i) for i in ids])), examples,
               ", ".join(f"{k} {v:.4f}" for k, v in results.items() if k != "examples"))
  return results
