"""`Estimator`: a `tf.estimator.Estimator`-style front end for a model_fn on ParameterServerStrategy."""

import os
from typing import Callable, Iterator, Mapping, Optional, Union

import tensorflow as tf

from tfps import checks
from tfps.cluster import config as cluster_lib
from tfps.cluster import options as options_lib
from tfps.cluster import roles
from tfps.errors import ArgumentTypeError, UsageError
from tfps.estimator import calls, evaluation, local, spec
from tfps.estimator.distributed import DistributedModel
from tfps.estimator.spec import RunConfig
from tfps.training import checkpoints as checkpoints_lib


class Estimator:
  """Trains, evaluates, predicts with and exports a `model_fn`, as `tf.estimator.Estimator` did.

  `train` runs on the cluster (flags/TF_CONFIG, or `cluster=`): the chief drives the coordinator loop, the variables
  live on the ps (large ones sharded). `evaluate`, `predict` and `export_saved_model` run in this process on unsharded
  copies restored from the newest checkpoint in `model_dir`; they need no cluster.

  Args:
    model_fn: `model_fn(features, labels, mode, params, config) -> EstimatorSpec`; it may omit the arguments it does
      not use (as with tf.estimator). It is called once per mode and trace; the variables its first call creates are
      given back to every later call.
    model_dir: where checkpoints, `loss.log` and evaluation results go (else `config.model_dir`).
    config: a `RunConfig`.
    params: passed to `model_fn` and `input_fn`s that take `params`.
    warm_start_from: a run's model_dir (its newest checkpoint) or a checkpoint path: a run with no checkpoint of its
      own starts with the model variables held there (all of them, on any number of ps; the optimizer's state and the
      global step start anew). A model_dir with checkpoints resumes from its own and ignores it.
    cluster: the cluster to train on (e.g. `tfps.testing.local_cluster()`, or in a script the cluster
      `tfps.run_task` gives); default: TF_CONFIG.
    strategy_options: a `tfps.StrategyOptions` (or a dict of its fields), checked here; a script passes
      `tfps.strategy_options_from_flags()`.
  """

  def __init__(self, model_fn: Callable, model_dir: Optional[str] = None, config: Optional[RunConfig] = None,
               params: Optional[Mapping] = None, warm_start_from=None, *,
               cluster: Optional[cluster_lib.ClusterConfig] = None,
               strategy_options: Union[None, options_lib.StrategyOptions, Mapping] = None):
    calls.check_model_fn(model_fn)
    config = config or RunConfig()
    if not isinstance(config, RunConfig):
      raise ArgumentTypeError(f"`config` must be a tfps.RunConfig, got {type(config).__name__}")
    if params is not None and not isinstance(params, Mapping):
      raise ArgumentTypeError(f"`params` must be a dict (passed to model_fn and input_fn), got {type(params).__name__}")
    self._warm_start_from = _warm_start_checkpoint(warm_start_from)
    model_dir = model_dir or config.model_dir
    if not model_dir:
      raise UsageError("`model_dir` is None and config.model_dir is None; give one of them")
    checks.directory("model_dir", os.fspath(model_dir))
    self._model_fn = model_fn
    self._config = config.replace(model_dir=os.fspath(model_dir))
    self._params = dict(params or {})
    self._cluster = cluster
    self._strategy_options = options_lib.as_strategy_options(strategy_options)
    self._distributed = None

  @property
  def model_dir(self) -> str:
    """Where checkpoints and results go."""
    return self._config.model_dir

  @property
  def config(self) -> RunConfig:
    """The RunConfig (its model_dir is this estimator's)."""
    return self._config

  @property
  def params(self) -> dict:
    """A copy of the params given to model_fn and input_fns."""
    return dict(self._params)

  @property
  def model_fn(self) -> Callable:
    """The user's model_fn."""
    return self._model_fn

  def distributed_model(self):
    """The model on the cluster (built on first use: connects to the ps and workers)."""
    if self._distributed is None:
      cluster = roles.resolve_cluster(self._cluster)
      self._distributed = DistributedModel(self._model_fn, self._params, self._config, cluster,
                                           self._strategy_options, self._warm_start_from)
    return self._distributed

  def local_model(self):
    """A fresh model on unsharded variables in this process (for evaluation, prediction and export)."""
    return local.LocalModel(self._model_fn, self._params, self._config)

  def train(self, input_fn: Callable, steps: Optional[int] = None, max_steps: Optional[int] = None) -> "Estimator":
    """Trains on the cluster until the global step reaches `max_steps` (or for `steps` more steps).

    A restarted chief resumes from the newest checkpoint in `model_dir/checkpoints`. When `max_steps` is reached, the
    chief writes `model_dir/checkpoints/FINAL`, which tells a sidecar evaluator that the last checkpoint is final.
    """
    if steps is not None and max_steps is not None:
      raise UsageError(f"give `steps` ({steps}) or `max_steps` ({max_steps}), not both")
    checks.positive_int("steps", steps, allow_none=True)
    checks.positive_int("max_steps", max_steps, allow_none=True)
    self.distributed_model().train(input_fn, max_steps=max_steps, steps=steps)
    return self

  def evaluate(self, input_fn: Callable, steps: Optional[int] = None, name: Optional[str] = None,
               checkpoint_path: Optional[str] = None) -> dict:
    """Evaluates the newest checkpoint (or `checkpoint_path`) in this process; every batch counts exactly once.

    Returns the metrics, `loss` (mean of the per-batch losses), `examples` and `global_step`; also appends them to
    `model_dir/eval[_<name>]/metrics.jsonl`.
    """
    path = local.latest_checkpoint(self.model_dir, checkpoint_path)
    results = self.local_model().evaluate(input_fn, steps, path)
    evaluation.write_results(self.model_dir, spec.eval_dir_name(name), results, results["global_step"], path)
    return results

  def predict(self, input_fn: Callable, checkpoint_path: Optional[str] = None,
              yield_single_examples: bool = True) -> Iterator:
    """Yields the predictions of the newest checkpoint (or `checkpoint_path`) for `input_fn`'s dataset."""
    path = local.latest_checkpoint(self.model_dir, checkpoint_path)
    yield from self.local_model().predict(input_fn, path, yield_single_examples)

  def export_saved_model(self, export_dir_base: str, serving_input_receiver_fn,
                         checkpoint_path: Optional[str] = None) -> str:
    """Exports the PREDICT graph with the newest checkpoint's values; returns the new SavedModel's folder.

    `serving_input_receiver_fn` is (or returns) a dict of feature name -> `tf.TensorSpec`; the `serving_default`
    signature takes those features by name and returns the `predictions` dict (a bare tensor as `output`). The
    SavedModel holds plain variables and loads with `tf.saved_model.load` in any process.
    """
    path = local.latest_checkpoint(self.model_dir, checkpoint_path)
    checks.directory("export_dir_base", os.fspath(export_dir_base))
    return self.local_model().export(os.fspath(export_dir_base), serving_input_receiver_fn, path)

  def latest_checkpoint(self) -> Optional[str]:
    """The newest checkpoint in `model_dir/checkpoints`, or None."""
    return local.latest_checkpoint(self.model_dir, required=False)


def _warm_start_checkpoint(source) -> Optional[str]:
  """The checkpoint `warm_start_from` names: a model_dir's newest, or a checkpoint path (tf.estimator's
  `WarmStartSettings` is not taken)."""
  if source is None:
    return None
  if not isinstance(source, (str, os.PathLike)):
    raise ArgumentTypeError(f"`warm_start_from` must be a model_dir or a checkpoint path, got {type(source).__name__}")
  source = os.fspath(source)
  if tf.io.gfile.exists(f"{source}.index"):
    return source
  saved = checkpoints_lib.list_checkpoints(source) if tf.io.gfile.isdir(source) else []
  if not saved:
    raise UsageError(f"`warm_start_from` ({source!r}) is neither a checkpoint nor a model_dir with checkpoints")
  return saved[-1]
