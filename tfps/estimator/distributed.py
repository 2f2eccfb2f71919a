"""A model_fn model with its variables on the ps of a cluster: training on the coordinator loop, inline evaluation."""

from typing import Callable, Dict, Optional

from absl import logging
import tensorflow as tf
import tf_keras

from tfps import run_records
from tfps.training import checkpoints as checkpoints_lib
from tfps.training import dataset_fns
from tfps.cluster import config as cluster_lib
from tfps.cluster import options as options_lib
from tfps.training import chief as chief_lib
from tfps.training import delta_schedule
from tfps.training import loop
from tfps.training import steps as steps_lib
from tfps.training import tables
from tfps.estimator import calls
from tfps.estimator import deltas as estimator_deltas
from tfps.estimator.evaluation import ShardedEvaluation
from tfps.estimator import variables as variables_lib
from tfps.estimator.model import ModelFnModel
from tfps.estimator.spec import ModeKeys, RunConfig


class DistributedModel:
  """Builds the strategy once (`tfps.training.chief`); creates the variables (sharded over the ps) on the first `train`,
  restoring the newest checkpoint of `model_dir` into them, so a chief restarted from scratch, or on another number of
  ps, resumes at the checkpointed step (`tfps.training.resharding`)."""

  def __init__(self, model_fn: Callable, params: dict, config: RunConfig, cluster: cluster_lib.ClusterConfig,
               strategy_options: options_lib.StrategyOptions, warm_start_from: Optional[str] = None):
    self._config = config
    self._warm_start_from = warm_start_from  # a checkpoint whose model variables a run without checkpoints starts at
    self.cluster = cluster
    self._num_workers = cluster.num_workers
    self.chief = chief_lib.connect(cluster, config.mode, strategy_options)
    self.strategy, self.coordinator = self.chief.strategy, self.chief.coordinator
    with self.strategy.scope():
      self.global_step = loop.build_global_step()
    self.model = ModelFnModel(model_fn, params, config, self.global_step)
    self._checkpoints: Optional[checkpoints_lib.CheckpointWriter] = None
    self._evaluations: Dict[tuple, ShardedEvaluation] = {}
    self._batch_size: Optional[int] = None  # a worker's batches' static size, known at the first `_build`
    self.runner: Optional[steps_lib.Runner] = None
    self.deltas: Optional[delta_schedule.DeltaSchedule] = None  # with `RunConfig.delta_export_secs`

  @property
  def config(self) -> RunConfig:
    """The RunConfig."""
    return self._config

  def _per_worker_iterator(self, input_fn: Callable):
    def dataset_fn(input_context):
      return calls.call_input_fn(input_fn, ModeKeys.TRAIN, self.model.params, self._config, input_context)

    # First on the chief: a mistake in input_fn (or what it returns) raises as it is, not inside the trace of the
    # workers' dataset function, where autograph wraps it.
    calls.split_element(dataset_fn(tf.distribute.InputContext()).element_spec, ModeKeys.TRAIN)
    return dataset_fns.per_worker_iterator(self.strategy, self.coordinator, dataset_fn, "input_fn")

  def _build(self, iterator) -> None:
    """Creates every variable (the model_fn's and its optimizer's) by tracing a training step that runs no step on a
    worker, then restores the newest checkpoint into them and builds the mode's runner."""
    if self._config.tf_random_seed is not None:  # tf-keras too: its initializers do not follow TensorFlow's seed
      tf_keras.utils.set_random_seed(int(self._config.tf_random_seed))

    element = []  # a training batch's spec (traced once per replica)

    def first_step(batch):
      element.append(tf.nest.map_structure(tf.type_spec_from_value, batch))
      with tf.variable_creator_scope(variables_lib.made_eagerly):
        return self.model.train_step(batch)

    @tf.function(autograph=False)
    def no_step(iterator):
      def body(index):
        loss, _ = self.strategy.run(first_step, args=(next(iterator),))
        with tf.control_dependencies([loss]):
          return index + 1
      return tf.while_loop(lambda index: index < 0, body, [tf.constant(0)])

    def create():
      self.coordinator.schedule(no_step, args=(iterator,))
      self.coordinator.join()
      return self.model.optimizer, self.model.variables.tables

    self.chief.create_variables(create)
    self._batch_size = dataset_fns.static_batch_size(element[0])  # the runner's choice of steps per loop iteration
    self.deltas = estimator_deltas.schedule_for(self, element[0])  # before a step is traced: its rows are marked
    self._checkpoints = checkpoints_lib.CheckpointWriter(self._config.model_dir, self.global_step,
                                                         self._config.keep_checkpoint_max,
                                                         **self.model.checkpoint_objects())
    restored = self.chief.resume(self._config.model_dir, self._checkpoints.checkpoint)
    if restored:  # checked against the model first; any number of ps and shards on either side
      logging.info("Restored %s; resuming at step %d", restored, int(self.global_step.numpy()))
    elif self._warm_start_from:  # the model's variables alone: the optimizer's state and the step start anew
      self.chief.restore(self._warm_start_from, tf.train.Checkpoint(model=self.model.variables))
      logging.info("Warm-started the model's variables from %s; training starts at step 0", self._warm_start_from)
    self.runner = self.chief.build_runner(self.model.step(self.global_step), self._config.steps_per_execution)

  def prepare(self, input_fn: Callable) -> checkpoints_lib.CheckpointWriter:
    """What the first `train` does before its steps: creates the variables on a batch of `input_fn`, restores the
    newest checkpoint and builds the runner (for a caller that feeds the steps itself: `tfps.estimator.online`);
    returns the checkpoint writer."""
    if self._checkpoints is None:
      self._build(self._per_worker_iterator(input_fn))
    return self._checkpoints

  def train(self, input_fn: Callable, max_steps: Optional[int] = None, steps: Optional[int] = None,
            after_checkpoint: Optional[Callable[[int], None]] = None) -> int:
    """Trains on `input_fn` until the global step reaches `max_steps` (or for `steps` more); returns the final step.

    `after_checkpoint(step)` runs after each checkpoint (inline evaluation); reaching `max_steps` (or the end of the
    input) writes the final marker (`tfps.training.checkpoints`), a sidecar evaluator's cue that training ended.
    """
    iterator = self._per_worker_iterator(input_fn)
    if self._checkpoints is None:
      self._build(iterator)
    self._checkpoints.begin()
    step = int(self.global_step.numpy())
    if steps is not None:
      max_steps = step + steps
    if max_steps is not None and step >= max_steps:
      logging.info("Global step %d already reached max_steps %d; nothing to train", step, max_steps)
      run_records.tell_launcher(self._config.model_dir)  # its summary is the run's that reached them
      return step
    logging.info("Training from step %d to %s (%s)", step,
                 max_steps if max_steps is not None else "the end of the input",
                 self._config.mode.describe(self._num_workers, self._batch_size))
    loop_config = loop.LoopConfig(log_every_steps=self._config.log_step_count_steps,
                                  checkpoint_every_steps=self._config.save_checkpoints_steps)
    train_loop = loop.TrainLoop(runner=self.runner, iterator=iterator, checkpoint_manager=self._checkpoints,
                                config=loop_config, model_dir=self._config.model_dir,
                                metrics=lambda: tables.table_metrics(self.model.variables.tables),
                                deltas=self.deltas)
    final_step = train_loop.run(max_steps, after_checkpoint)
    if max_steps is None or final_step >= max_steps:
      self._checkpoints.finish()
    return final_step

  def evaluate(self, input_fn: Callable, steps: Optional[int], num_shards: Optional[int] = None) -> Dict[str, object]:
    """Evaluates the current variables on the workers, every batch exactly once; needs a `train` call first.

    `num_shards` defaults to `RunConfig.eval_shards`, else 2 per worker.
    """
    if self._checkpoints is None:
      raise RuntimeError("inline evaluation needs the variables a first train() call creates")
    num_shards = num_shards or self._config.eval_shards or 2 * self._num_workers
    key = (input_fn, steps, num_shards)
    if key not in self._evaluations:
      self._evaluations[key] = ShardedEvaluation(self.model, input_fn, steps, num_shards)
    results = self._evaluations[key].run_on_cluster(self.coordinator)
    return dict(results, global_step=int(self.global_step.numpy()))
