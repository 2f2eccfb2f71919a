"""The value types of the Estimator-style API: `ModeKeys`, `EstimatorSpec`, `RunConfig`, `TrainSpec`, `EvalSpec`.

The names and fields mirror `tf.estimator`. Where TF1 concepts have no TF2 meaning the difference is explicit: a spec
carries an `optimizer` instead of a `train_op`, and `eval_metric_ops` holds tf-keras `Metric` objects (as TF 2.x
Estimators allowed) instead of `(value_op, update_op)` pairs. This module imports no TensorFlow.
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional

from tfps import checks
from tfps.training import modes
from tfps.errors import ArgumentTypeError, TfpsError, UsageError


class ModelFnError(TfpsError, ValueError):
  """A `model_fn` returned the wrong thing for a mode, or created variables it must not create."""


class ModeKeys:
  """The modes a `model_fn` is called in (the values of `tf.estimator.ModeKeys`)."""

  TRAIN = "train"
  EVAL = "eval"
  PREDICT = "infer"

  ALL = (TRAIN, EVAL, PREDICT)


# EstimatorSpec arguments of tf.estimator that have no meaning on the coordinator loop, with what to do instead.
_UNSUPPORTED_SPEC_ARGS = {
    "train_op": "a TF1 train_op has no meaning in TF2; return `optimizer=` (e.g. tf_keras.optimizers.legacy.Adagrad) "
                "and tfps applies the gradients of `loss`",
    "training_hooks": "session hooks do not exist in TF2; use RunConfig(log_step_count_steps=...) for step logs",
    "training_chief_hooks": "session hooks do not exist in TF2",
    "evaluation_hooks": "session hooks do not exist in TF2",
    "prediction_hooks": "session hooks do not exist in TF2",
    "scaffold": "there is no tf.compat.v1.train.Scaffold in TF2; tfps initializes and restores variables itself",
}


class EstimatorSpec:
  """What a `model_fn` returns: the ops of one mode.

  TRAIN needs `loss` and `optimizer`; EVAL needs `loss` and may give `eval_metric_ops`; PREDICT needs `predictions`.

  Args:
    mode: the `ModeKeys` value the model_fn was called with.
    predictions: a tensor or a dict of tensors (PREDICT; also exported by `export_saved_model`).
    loss: a scalar tensor (TRAIN and EVAL).
    optimizer: a tf-keras optimizer (TRAIN); its `apply_gradients` is applied to the gradients of `loss`. Only the
      optimizer of the first TRAIN call is used (model_fn is called again on every trace).
    eval_metric_ops: dict of name -> tf-keras `Metric` whose `update_state` the model_fn called (EVAL).
    export_outputs: accepted for compatibility and ignored; the export signature returns `predictions`.
    **unsupported: `tf.estimator` arguments with no TF2 meaning (`train_op`, hooks, `scaffold`); each raises a
      `TypeError` saying what to do instead.
  """

  def __init__(self, mode: str, predictions: Any = None, loss: Any = None, optimizer: Any = None,
               eval_metric_ops: Optional[Mapping[str, Any]] = None, export_outputs: Any = None, **unsupported):
    for name, value in unsupported.items():
      if name not in _UNSUPPORTED_SPEC_ARGS:
        raise ArgumentTypeError(f"EstimatorSpec got an unexpected argument {name!r}")
      if value is not None:
        raise ArgumentTypeError(f"EstimatorSpec({name}=...) is not supported: {_UNSUPPORTED_SPEC_ARGS[name]}")
    if mode not in ModeKeys.ALL:
      raise ModelFnError(f"EstimatorSpec `mode` ({mode!r}) must be one of ModeKeys.TRAIN, EVAL, PREDICT "
                         f"({', '.join(repr(m) for m in ModeKeys.ALL)})")
    self.mode = mode
    self.predictions = predictions
    self.loss = loss
    self.optimizer = optimizer
    self.eval_metric_ops = dict(eval_metric_ops or {})
    self.export_outputs = export_outputs

  def __repr__(self):
    return (f"EstimatorSpec(mode={self.mode!r}, loss={self.loss!r}, optimizer={type(self.optimizer).__name__}, "
            f"eval_metric_ops={sorted(self.eval_metric_ops)})")


def validate_spec(spec: Any, mode: str) -> EstimatorSpec:
  """Returns `spec` if it is a complete EstimatorSpec for `mode`, else raises `ModelFnError` saying what is wrong."""
  if not isinstance(spec, EstimatorSpec):
    raise ModelFnError(f"model_fn must return a tfps.EstimatorSpec in mode {mode!r}, got {type(spec).__name__}: "
                       f"{spec!r:.100}")
  if spec.mode != mode:
    raise ModelFnError(f"model_fn was called with mode {mode!r} but returned EstimatorSpec(mode={spec.mode!r})")
  if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
    if spec.loss is None:
      raise ModelFnError(f"model_fn returned no `loss` in mode {mode!r}; EstimatorSpec(mode, loss=...) is required "
                         "in TRAIN and EVAL")
    shape = getattr(spec.loss, "shape", None)
    if shape is None or shape.rank != 0:
      raise ModelFnError(f"model_fn returned a `loss` of shape {shape} in mode {mode!r}; it must be a scalar tensor "
                         "(reduce it, e.g. with tf.reduce_mean)")
  if mode == ModeKeys.TRAIN and not callable(getattr(spec.optimizer, "apply_gradients", None)):
    raise ModelFnError(f"model_fn returned `optimizer={spec.optimizer!r:.60}` in mode 'train'; TRAIN needs a tf-keras "
                       "optimizer, e.g. EstimatorSpec(mode, loss=loss, "
                       "optimizer=tf_keras.optimizers.legacy.Adagrad(0.05))")
  if mode == ModeKeys.PREDICT and spec.predictions is None:
    raise ModelFnError("model_fn returned no `predictions` in mode 'infer' (PREDICT); "
                       "EstimatorSpec(mode, predictions={...}) is required")
  for name, metric in spec.eval_metric_ops.items():
    if isinstance(metric, tuple):
      raise ModelFnError(f"eval_metric_ops[{name!r}] is a tuple (a tf.compat.v1.metrics (value, update_op) pair); "
                         "tfps takes tf-keras Metric objects: m = tf_keras.metrics.AUC(); m.update_state(labels, "
                         f"probs); eval_metric_ops={{{name!r}: m}}")
    if not all(callable(getattr(metric, attr, None)) for attr in ("update_state", "result", "get_config")):
      raise ModelFnError(f"eval_metric_ops[{name!r}] is a {type(metric).__name__}; it must be a tf-keras Metric "
                         "(e.g. tf_keras.metrics.AUC()) whose update_state the model_fn called")
  return spec


_MODE_FIELDS = tuple(field.name for field in dataclasses.fields(modes.TrainingMode))


@dataclasses.dataclass(frozen=True, init=False)
class RunConfig:
  """How training runs: checkpoints, logging, and the tfps loop settings.

  Attributes:
    model_dir: where checkpoints, `loss.log` and eval results go (`Estimator(model_dir=...)` wins when both are set).
    save_checkpoints_steps: save a checkpoint every this many steps (default: 1000).
    keep_checkpoint_max: checkpoints kept (older ones are deleted).
    log_step_count_steps: one step-log line (step | loss | steps/s | ex/s) every this many steps.
    steps_per_execution: training steps packed into one scheduled function (tfps; not in tf.estimator; default 20,
      chosen from the measured dispatch cost: `tfps.training.modes.DEFAULT_STEPS_PER_EXECUTION`); async only
      (a sync step is its own round; a geo round is `geo_steps` steps).
    eval_shards: shards an evaluation dataset is split into, each evaluated exactly once by one closure (tfps;
      default: 2 per worker).
    save_summary_steps: accepted for compatibility; summaries are written at each step-log line.
    tf_random_seed: passed to `tf_keras.utils.set_random_seed` before variables are created (TensorFlow's global
      seed, the seeds tf-keras initializers draw, Python's `random` and NumPy's), so that a run's initial values are
      the same from launch to launch (docs/repeatability.md).
    mode: the `tfps.TrainingMode` (tfps; default async; a script passes `tfps.mode_from_flags()`). Its fields
      (`sync_mode`, `geo_steps`, ...: see `tfps.TrainingMode`) may be given one by one instead, `RunConfig(
      sync_mode="geo")`, and read as attributes.
    delta_export_secs: seconds between delta exports of the changed rows to `model_dir/deltas` (tfps; None: none;
      a base export when training starts, then a delta at the first step-log line or checkpoint that long after the
      last export, and one at the end; docs/delta_export.md).
  """

  model_dir: Optional[str] = None
  save_checkpoints_steps: Optional[int] = None
  keep_checkpoint_max: int = 5
  log_step_count_steps: int = 100
  steps_per_execution: int = modes.DEFAULT_STEPS_PER_EXECUTION
  eval_shards: Optional[int] = None
  save_summary_steps: Optional[int] = None
  tf_random_seed: Optional[int] = None
  mode: modes.TrainingMode = modes.TrainingMode()
  delta_export_secs: Optional[float] = None

  def __init__(self, model_dir: Optional[str] = None, save_checkpoints_steps: Optional[int] = None,
               keep_checkpoint_max: int = 5, log_step_count_steps: int = 100,
               steps_per_execution: int = modes.DEFAULT_STEPS_PER_EXECUTION, eval_shards: Optional[int] = None,
               save_summary_steps: Optional[int] = None, tf_random_seed: Optional[int] = None,
               mode: Optional[modes.TrainingMode] = None, delta_export_secs: Optional[float] = None,
               **mode_fields):
    settings = dict(locals())
    del settings["self"], settings["mode_fields"], settings["mode"]
    for name, value in settings.items():
      object.__setattr__(self, name, value)
    object.__setattr__(self, "mode", _mode_of(mode, mode_fields))
    checks.positive_int("save_checkpoints_steps", self.save_checkpoints_steps, allow_none=True)
    checks.positive_int("keep_checkpoint_max", self.keep_checkpoint_max)
    checks.positive_int("log_step_count_steps", self.log_step_count_steps)
    checks.positive_int("steps_per_execution", self.steps_per_execution)
    checks.positive_int("eval_shards", self.eval_shards, allow_none=True)
    if self.tf_random_seed is not None:
      checks.non_negative_int("tf_random_seed", self.tf_random_seed)
    if self.delta_export_secs is not None:
      checks.non_negative_number("delta_export_secs", self.delta_export_secs, "number of seconds")
    if self.save_checkpoints_steps is None:
      object.__setattr__(self, "save_checkpoints_steps", 1000)

  @property
  def training_mode(self) -> modes.TrainingMode:
    """`mode` (its name before `mode` was a field)."""
    return self.mode

  def __getattr__(self, name):
    if name in _MODE_FIELDS:  # RunConfig(sync_mode="geo").sync_mode, as when they were fields of their own
      return getattr(self.mode, name)
    raise AttributeError(f"'RunConfig' object has no attribute {name!r}")

  def replace(self, **changes) -> "RunConfig":
    """A copy with `changes` applied (like `tf.estimator.RunConfig.replace`); a mode field changes `mode`."""
    mode_changes = {name: changes.pop(name) for name in list(changes) if name in _MODE_FIELDS}
    if mode_changes:
      changes["mode"] = dataclasses.replace(changes.get("mode", self.mode), **mode_changes)
    return dataclasses.replace(self, **changes)


def _mode_of(mode: Optional[modes.TrainingMode], mode_fields: dict) -> modes.TrainingMode:
  unknown = sorted(set(mode_fields) - set(_MODE_FIELDS))
  if unknown:
    raise ArgumentTypeError(f"RunConfig got an unexpected argument {unknown[0]!r}")
  if mode is not None and mode_fields:
    raise UsageError(f"RunConfig got `mode` and {', '.join(sorted(mode_fields))}: give the mode whole or its "
                     "fields, not both")
  if mode is not None and not isinstance(mode, modes.TrainingMode):
    raise ArgumentTypeError(f"RunConfig `mode` must be a tfps.TrainingMode, got {type(mode).__name__}")
  return mode if mode is not None else modes.TrainingMode(**mode_fields)


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """What to train on and for how long.

  Attributes:
    input_fn: returns a `tf.data.Dataset` of `(features, labels)`; may take `params`, `mode`, `config` and/or
      `input_context` by name. Each worker calls it for its own dataset; it should `.repeat()`.
    max_steps: train until the global step reaches this (None: until the input ends).
  """

  input_fn: Callable
  max_steps: Optional[int] = None

  def __post_init__(self):
    if not callable(self.input_fn):
      raise ArgumentTypeError(f"TrainSpec `input_fn` must be callable, got {type(self.input_fn).__name__}")
    checks.positive_int("max_steps", self.max_steps, allow_none=True)


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """What to evaluate on, how much, and how often.

  Attributes:
    input_fn: returns a finite `tf.data.Dataset` of `(features, labels)` when `steps` is None.
    steps: batches to evaluate (the first `steps` of the dataset); None: the whole dataset. Either way every batch is
      evaluated exactly once, even when a worker fails.
    name: evaluation name; results go to `model_dir/eval` or `model_dir/eval_<name>`.
    start_delay_secs: the sidecar evaluator waits this long before looking for checkpoints.
    throttle_secs: evaluate after a checkpoint only if at least this many seconds passed since the last evaluation.
    inline: whether the chief evaluates on the workers during training (None: yes, unless the cluster lists an
      evaluator task, which then evaluates as a sidecar).
  """

  input_fn: Callable
  steps: Optional[int] = 100
  name: Optional[str] = None
  start_delay_secs: float = 0
  throttle_secs: float = 600
  inline: Optional[bool] = None

  def __post_init__(self):
    if not callable(self.input_fn):
      raise ArgumentTypeError(f"EvalSpec `input_fn` must be callable, got {type(self.input_fn).__name__}")
    checks.positive_int("steps", self.steps, allow_none=True)
    for name in ("start_delay_secs", "throttle_secs"):
      checks.non_negative_number(name, getattr(self, name), "number of seconds")

  @property
  def eval_dir_name(self) -> str:
    """The folder under model_dir that holds this evaluation's results."""
    return eval_dir_name(self.name)


def eval_dir_name(name: Optional[str]) -> str:
  """The folder under model_dir that holds the results of the evaluation called `name` (tf.estimator's layout)."""
  return "eval" if not name else f"eval_{name}"
