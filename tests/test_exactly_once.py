"""A scheduled training function run again (as after a worker failure) applies only the steps it had not applied, a step
is recorded only once it has been applied, and the step counter ends at the steps recorded."""

import threading
import time

import held_gradients
import pytest
import tfps
from tfps.keras import steps as keras_steps
from tfps.training import exactly_once
from tfps.training import loop
from tfps.training import ps_records
from tfps.training import runners
from tfps.training import steps as steps_lib
import tensorflow as tf
import tf_keras


def async_runner(model, coordinator, steps_per_execution=5, mode=None):
  """The async runner of `model`'s step (as tfps.fit builds it); the tests schedule its function themselves."""
  runner = runners.build_runner(mode or tfps.TrainingMode("async"), keras_steps.keras_step(model),
                                strategy=model.distribute_strategy, coordinator=coordinator, num_workers=2,
                                steps_per_execution=steps_per_execution)
  return runner


def test_a_rerun_function_skips_the_steps_it_applied(cluster):
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
    model.compile(tf_keras.optimizers.legacy.SGD(0.01), "mse")
    runner = async_runner(model, coordinator)
    train_function, progress = runner.function, runner.progress

  def dataset_fn():
    return tf.data.Dataset.from_tensors((tf.ones((4, 2)), tf.ones((4, 1)))).repeat()
  iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

  def run(seq, steps=5):
    coordinator.schedule(train_function, args=(iterator, tf.constant(steps, tf.int64), tf.constant(seq, tf.int64)))
    coordinator.join()
    return int(model.optimizer.iterations.numpy())

  assert run(seq=0) == 5
  assert int(progress.variable[0].numpy()) == 5  # seq 0 applied its 5 steps
  progress.variable.scatter_update(tf.IndexedSlices(tf.constant([3 * 5 + 2], tf.int64), tf.constant([3])))
  assert run(seq=3) == 5 + 3  # a re-run of seq 3 that had applied 2 steps applies the other 3
  assert int(progress.variable[3].numpy()) == 3 * 5 + 5
  assert run(seq=3) == 5 + 3  # run once more after it completed (died before returning): nothing to apply
  assert run(seq=4, steps=2) == 5 + 3 + 2  # a shorter last chunk of an epoch
  assert run(seq=exactly_once.SLOTS) == 5 + 3 + 2 + 5  # slot 0 reused by a later function: no reset needed


def test_the_progress_vector_stays_whole_when_every_variable_is_sharded(cluster):
  """`min_shard_bytes=0` shards every variable with two or more rows; the progress vector must stay one variable (a
  sharded one cannot be indexed by a tensor in the scheduled function)."""
  strategy, coordinator = tfps.build_strategy(cluster, min_shard_bytes=0)
  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(4), tf_keras.layers.Dense(1)])
    model.compile(tf_keras.optimizers.legacy.SGD(0.01), "mse")
    runner = async_runner(model, coordinator)
    train_function, progress = runner.function, runner.progress
  assert type(model.layers[0].kernel).__name__ == "ShardedVariable"
  assert type(progress.variable).__name__ != "ShardedVariable"
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((tf.ones((4, 2)), tf.ones((4, 1)))).repeat()))
  coordinator.schedule(train_function, args=(iterator, tf.constant(5, tf.int64), tf.constant(0, tf.int64)))
  coordinator.join()
  assert int(model.optimizer.iterations.numpy()) == 5
  assert int(progress.variable[0].numpy()) == 5


def _gated_model(strategy, entered: threading.Event, release: threading.Event):
  """A model whose first layer's gradients wait (in the worker) until `release` is set."""
  def wait(gradient):
    entered.set()
    release.wait(120)
    return gradient

  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(4),
                                 tf_keras.layers.Lambda(held_gradients.gate(wait)),
                                 tf_keras.layers.Dense(1)])
    model.compile(tf_keras.optimizers.Adagrad(0.01), "mse")
  return model


def test_no_update_of_a_step_lands_and_it_is_not_recorded_before_all_its_gradients_are_on_the_ps(cluster):
  """A worker that dies before sending a step's last gradient must leave none of that step applied or recorded: tf-keras
  would otherwise increment the step counter and update the variables whose gradients came first, and a record made
  then would let a re-run skip a step whose other gradients never arrived."""
  strategy, coordinator = tfps.build_strategy(cluster)
  entered, release = threading.Event(), threading.Event()
  model = _gated_model(strategy, entered, release)
  with strategy.scope():
    runner = async_runner(model, coordinator)
    train_function, progress = runner.function, runner.progress
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((tf.ones((4, 2)), tf.ones((4, 1)))).repeat()))
  before = [variable.numpy() for variable in model.variables]
  try:
    coordinator.schedule(train_function, args=(iterator, tf.constant(1, tf.int64), progress.next_sequence()))
    assert entered.wait(60)  # the first layer's gradients are held; the last layer's are computed
    deadline = time.monotonic() + 2  # ample for the ps to apply what has arrived (milliseconds)
    while time.monotonic() < deadline:
      assert all((variable.numpy() == value).all() for variable, value in zip(model.variables, before))
      assert int(model.optimizer.iterations.numpy()) == 0
      assert int(progress.variable[0].numpy()) == 0
      time.sleep(0.1)
  finally:
    release.set()
  coordinator.join()
  assert int(progress.variable[0].numpy()) == 1
  assert int(model.optimizer.iterations.numpy()) == 1
  assert all((variable.numpy() != value).any() for variable, value in zip(model.variables, before))
  assert "apply_gradients" not in vars(model.optimizer)  # the hold-back was only there while the step was traced


@pytest.mark.parametrize("make_optimizer", [tf_keras.optimizers.legacy.Adagrad, tf_keras.optimizers.Adagrad],
                         ids=["legacy", "current"])
def test_a_ps_waits_for_its_own_gradients_only_where_the_optimizer_writes_through_the_strategy(cluster,
                                                                                                make_optimizer):
  """Two layers without biases, one kernel on each ps; the first layer's gradient is held on the worker. A legacy
  optimizer's ps that has its gradient applies it meanwhile (the step's record waits for both; its counter for the
  updates of its own ps only, as the Estimator path's step count: both are settled from the records); a current
  optimizer, which increments its counter directly, has every ps wait for every gradient."""
  strategy, coordinator = tfps.build_strategy(cluster)
  entered, release = threading.Event(), threading.Event()
  legacy = make_optimizer is tf_keras.optimizers.legacy.Adagrad

  def wait(gradient):
    entered.set()
    release.wait(120)
    return gradient

  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(4, use_bias=False),
                                 tf_keras.layers.Lambda(held_gradients.gate(wait)),
                                 tf_keras.layers.Dense(1, use_bias=False)])
    optimizer = make_optimizer(0.01)
    with strategy.extended.colocate_vars_with(model.layers[2].kernel):
      _ = optimizer.iterations  # on the free kernel's ps
    model.compile(optimizer, "mse")
    runner = async_runner(model, coordinator)
  held, free = model.layers[0].kernel, model.layers[2].kernel
  assert held.device != free.device, (held.device, free.device)
  assert not legacy or optimizer.iterations.device == free.device, (optimizer.iterations.device, free.device)
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((tf.ones((4, 2)), tf.ones((4, 1)))).repeat()))
  before_held, before_free = held.numpy(), free.numpy()
  try:
    coordinator.schedule(runner.function, args=(iterator, tf.constant(1, tf.int64), runner.progress.next_sequence()))
    assert entered.wait(60)
    deadline = time.monotonic() + (30 if legacy else 2)
    counted = 1 if legacy and model.optimizer.iterations.device == free.device else 0  # while the other ps waits
    while time.monotonic() < deadline and not (legacy and (free.numpy() != before_free).any()
                                               and int(model.optimizer.iterations.numpy()) == counted):
      assert (held.numpy() == before_held).all()
      assert int(model.optimizer.iterations.numpy()) <= counted and int(runner.progress.variable[0].numpy()) == 0
      time.sleep(0.1)
    assert bool((free.numpy() != before_free).any()) == legacy  # the free kernel's ps applied its part, or waited
    assert int(model.optimizer.iterations.numpy()) == counted
    assert (held.numpy() == before_held).all() and int(runner.progress.variable[0].numpy()) == 0
  finally:
    release.set()
  coordinator.join()
  assert int(runner.progress.variable[0].numpy()) == 1 and int(model.optimizer.iterations.numpy()) == 1
  assert (held.numpy() != before_held).any() and (free.numpy() != before_free).any()


def test_an_optimizer_that_clips_its_gradients_trains_without_the_hold_back(cluster):
  """It derives the gradients it applies inside apply_gradients: holding the given ones back would send them twice."""
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
    model.compile(tf_keras.optimizers.SGD(0.01, global_clipnorm=1.0), "mse")
    runner = async_runner(model, coordinator)
    train_function, progress = runner.function, runner.progress
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((tf.ones((4, 2)), tf.ones((4, 1)))).repeat()))
  coordinator.schedule(train_function, args=(iterator, tf.constant(5, tf.int64), progress.next_sequence()))
  coordinator.join()
  assert int(model.optimizer.iterations.numpy()) == 5
  assert int(progress.variable[0].numpy()) == 5
  graph = train_function.get_concrete_function(iterator, tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64)).graph
  assert not [node.name for function in graph.as_graph_def().library.function for node in function.node_def
              if "tfps_gradient_in" in node.name]


def test_the_step_counter_is_settled_from_the_records_at_each_epoch_end(cluster, monkeypatch):
  """A step counted but not recorded (its worker died between the two) runs again; the count is taken back."""
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
    model.compile(tf_keras.optimizers.legacy.SGD(0.01), "mse")
    runner = async_runner(model, coordinator)
    train_function, progress = runner.function, runner.progress
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((tf.ones((4, 2)), tf.ones((4, 1)))).repeat()))
  logged = []
  monkeypatch.setattr(exactly_once.logging, "info", lambda message, *args: logged.append(message % args))
  counter = keras_steps.RunnerEpochs(runner)
  counter.set_model(model)
  for epoch, extra in enumerate((0, 2)):
    counter.on_epoch_begin(epoch)
    for steps in (5, 5, 3):
      coordinator.schedule(train_function, args=(iterator, tf.constant(steps, tf.int64), progress.next_sequence()))
    coordinator.join()
    model.optimizer.iterations.assign_add(extra)  # as two steps counted twice
    counter.on_epoch_end(epoch)
    assert int(model.optimizer.iterations.numpy()) == 13 * (epoch + 1)
  assert len(logged) == 1  # nothing to settle in the first epoch
  assert logged[0].startswith("Step counter settled at 26 from the steps recorded on the ps (it read 28)")


def test_the_coordinator_loop_settles_its_global_step_after_each_chunk(cluster, tmp_path):
  """Here every step's own extra increment of the global step stands for a count no record backs."""
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    global_step = loop.build_global_step()
    weight = tf.Variable(0.0)

  def step_fn(batch):
    weight.assign_add(tf.reduce_sum(batch))
    global_step.assign_add(1)
    return tf.constant(1.0), tf.constant(2, tf.int64)

  step = steps_lib.Step(run=step_fn, forward=step_fn, optimizer=lambda: None, variables=lambda: [weight],
                        trainable_variables=lambda: [weight], counter=global_step, counts_itself=False)
  runner = runners.build_runner(tfps.TrainingMode("async"), step, strategy=strategy, coordinator=coordinator,
                                num_workers=2, steps_per_execution=4)
  iterator = iter(coordinator.create_per_worker_dataset(lambda: tf.data.Dataset.from_tensors(tf.ones([2])).repeat()))
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(global_step=global_step, weight=weight), str(tmp_path), 3)
  train_loop = loop.TrainLoop(runner=runner, iterator=iterator, checkpoint_manager=manager,
                              config=loop.LoopConfig(log_every_steps=10, checkpoint_every_steps=20),
                              model_dir=str(tmp_path))
  assert train_loop.run(max_steps=30) == 30
  assert int(global_step.numpy()) == 30
  assert float(weight.numpy()) == 60.0  # 30 steps ran, each once
  assert [int(path.rsplit("-", 1)[1]) for path in manager.checkpoints] == [20, 30]


def test_a_step_run_again_skips_the_updates_a_ps_applied_already(cluster):
  """A dead worker's step can reach one ps and not the other; run again, it updates only the ps it had not reached."""
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(4), tf_keras.layers.Dense(1)])
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "mse")
    runner = async_runner(model, coordinator)
    train_function, progress = runner.function, runner.progress
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((tf.ones((4, 2)), tf.ones((4, 1)))).repeat()))
  coordinator.schedule(train_function, args=(iterator, tf.constant(1, tf.int64), tf.constant(0, tf.int64)))
  coordinator.join()  # a first step makes the records
  devices = sorted(progress.ps_records.vectors)
  assert len(devices) == 2  # the variables are spread over both ps
  reached = devices[0]
  before = {variable.name: variable.numpy() for variable in model.variables}
  # Function seq 2 (of 5 steps) ran its first step on `reached` only, then its worker died: mark 2 * 5 + 0 + 1.
  progress.ps_records.vectors[reached].scatter_update(tf.IndexedSlices(tf.constant([11], tf.int64), tf.constant([2])))
  coordinator.schedule(train_function, args=(iterator, tf.constant(1, tf.int64), tf.constant(2, tf.int64)))
  coordinator.join()
  for variable in model.variables:
    unchanged = (variable.numpy() == before[variable.name]).all()
    assert unchanged == (variable.device == reached), variable.name
  assert int(progress.variable[2].numpy()) == 11  # the step is recorded once it is whole
  assert {device: int(vector[2].numpy()) for device, vector in progress.ps_records.vectors.items()} == {
      device: 11 for device in devices}


@pytest.mark.parametrize("lock", [True, False])
def test_two_runs_of_one_step_at_once_apply_it_once_on_its_ps(cluster, lock):
  """A step's function can run twice at once: run again on another worker while the first run's part on a ps, which
  had all it needed, still applies it. The ps decides, applies and records the step holding a lock, so one of two runs
  at once applies it and the other skips it. Each step here is scheduled twice once both workers are idle (both run it
  at once) and its update is slow, so that without the lock (`records_lock=False`) both runs of some steps read no
  record before either writes one, and those steps are applied twice."""
  strategy, coordinator = tfps.build_strategy(cluster)
  records = ps_records.PsRecords(lock=lock)
  with strategy.scope():
    applied = tf.Variable(0, dtype=tf.int64)  # on its ps: the updates it applied
    records.make_for([applied])

  @tf.function
  def step(mark):
    once = records.once_per_ps(tf.constant([0]), mark)

    def update():
      product = tf.random.stateless_normal([256, 256], [1, 2])
      for _ in range(8):
        product = tf.matmul(product, product) / 256.
      with tf.control_dependencies([product]):
        return applied.assign_add(1)

    once.run(applied, update)
    with tf.control_dependencies(once.records()):
      return tf.constant(0)

  steps = 16
  for mark in range(1, steps + 1):
    for _ in range(2):
      coordinator.schedule(step, args=(tf.constant(mark, tf.int64),))
    coordinator.join()  # both workers idle: the next step's two runs start together
  assert int(applied.numpy()) == steps if lock else int(applied.numpy()) > steps
  assert int(records.vectors[applied.device][0].numpy()) == steps


def test_a_ps_applies_its_expected_updates_in_one_conditional_and_any_other_after_them(cluster):
  """`OncePerPs.expect`: the expected updates of a ps run in one conditional on its decision; an update not expected
  runs in one of its own after those held before it (in program order), and one still held when the records are made
  runs before them. A step run again skips them all."""
  strategy, coordinator = tfps.build_strategy(cluster)
  records = ps_records.PsRecords()
  with strategy.scope():
    first = tf.Variable(0, dtype=tf.int64)
    with strategy.extended.colocate_vars_with(first):
      second, never = tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64)
    records.make_for([first])
  conditionals = lambda graph: [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]

  @tf.function
  def common(mark):
    once = records.once_per_ps(tf.constant([0]), mark)
    once.expect([first, second])
    once.run(first, lambda: first.assign_add(1))
    once.run(second, lambda: second.assign_add(1))
    with tf.control_dependencies(once.records()):
      return tf.constant(0)

  @tf.function
  def mixed(mark):
    once = records.once_per_ps(tf.constant([0]), mark)
    once.expect([first, second, never])
    once.run(first, lambda: first.assign_add(1))
    once.run(first, lambda: first.assign(first * 10))  # not expected: after the held one, ((x + 1) * 10)
    once.run(second, lambda: second.assign_add(1))  # held until the records: `never` is never updated
    with tf.control_dependencies(once.records()):
      return tf.constant(0)

  assert len(conditionals(common.get_concrete_function(tf.TensorSpec([], tf.int64)).graph)) == 1
  assert len(conditionals(mixed.get_concrete_function(tf.TensorSpec([], tf.int64)).graph)) == 3
  for function, mark in ((common, 1), (common, 1), (mixed, 2), (mixed, 2), (mixed, 3)):
    coordinator.schedule(function, args=(tf.constant(mark, tf.int64),))
    coordinator.join()
  assert (int(first.numpy()), int(second.numpy()), int(never.numpy())) == (((1 + 1) * 10 + 1) * 10, 3, 0)
  assert int(records.vectors[first.device][0].numpy()) == 3


@pytest.mark.parametrize("reached_holds_the_counter", [True, False])
def test_a_sync_update_run_again_applies_the_step_only_where_it_is_missing(cluster, info_log, reached_holds_the_counter):
  """Sync: a worker that dies during a step's update can leave it applied on one ps and not the other, the step
  counter with it or not. The update run again applies the step on the other ps alone, and the counter ends at the
  steps applied."""
  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(4), tf_keras.layers.Dense(1)])
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "mse")
    runner = runners.build_runner(tfps.TrainingMode("sync"), keras_steps.keras_step(model), strategy=strategy,
                                  coordinator=coordinator, num_workers=2, steps_per_execution=1)
  iterator = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors((tf.ones((4, 2)), tf.ones((4, 1)))).repeat()))
  runner.schedule(iterator, 1)  # step 0, whole: makes the records
  devices = sorted(runner.ps_records.vectors)
  assert len(devices) == 2  # the variables are spread over both ps
  counter_ps = model.optimizer.iterations.device
  reached = counter_ps if reached_holds_the_counter else next(device for device in devices if device != counter_ps)
  before = {variable.name: variable.numpy() for variable in model.variables}
  runner.gather(iterator, step=1)  # step 1's gradients
  # Its update reached `reached` and was recorded there (and counted, where the counter is), then its worker died:
  # slot 1, mark 2. The update runs again.
  runner.ps_records.vectors[reached].scatter_update(tf.IndexedSlices(tf.constant([2], tf.int64), tf.constant([1])))
  if reached_holds_the_counter:
    model.optimizer.iterations.assign_add(1)
  coordinator.schedule(runner.update_function,
                       args=(tf.constant(1, tf.int64), tf.constant(0.0), tf.constant(0, tf.int64)))
  coordinator.join()
  runner.settle_step(1)
  for variable in model.variables:
    unchanged = (variable.numpy() == before[variable.name]).all()
    assert unchanged == (variable.device == reached), variable.name
  assert int(model.optimizer.iterations.numpy()) == 2
  assert ("Step counter settled at 2" in info_log.text) == reached_holds_the_counter
  assert {device: int(vector[1].numpy()) for device, vector in runner.ps_records.vectors.items()} == {
      device: 2 for device in devices}


_LEGACY_ADAGRAD = lambda: tf_keras.optimizers.legacy.Adagrad(0.1)
# Adam reads `iterations` in its updates; the learning rate halves at every step.
_CURRENT_ADAM = lambda: tf_keras.optimizers.Adam(tf_keras.optimizers.schedules.ExponentialDecay(0.1, 1, 0.5))


def _unrolled_run(cluster, mode, num_steps, features, labels, dataset_fn=None, optimizer=_LEGACY_ADAGRAD):
  """One function of `num_steps` async steps of a small model in `mode` on batches of `dataset_fn` (default: the batch
  `(features, labels)` repeated), compiled with `optimizer()`; checks that the weights end where as many steps on it in
  one process leave them and that each step is counted once. Returns `(model, coordinator, runner, args)`, `args` the
  function's arguments."""
  def build():
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(4, activation="tanh"),
                                 tf_keras.layers.Dense(1)])
    model.compile(optimizer(), "mse")
    return model

  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = build()
    runner = async_runner(model, coordinator, steps_per_execution=num_steps, mode=mode)
  local = build()
  local.set_weights(model.get_weights())
  iterator = iter(coordinator.create_per_worker_dataset(
      dataset_fn or (lambda: tf.data.Dataset.from_tensors((features, labels)).repeat())))
  args = (iterator, tf.constant(num_steps, tf.int64), runner.progress.next_sequence())
  coordinator.schedule(runner.function, args=args)
  coordinator.join()
  for _ in range(num_steps):
    local.train_on_batch(features, labels)
  assert int(model.optimizer.iterations.numpy()) == num_steps
  for trained, expected in zip(model.get_weights(), local.get_weights()):
    assert abs(trained - expected).max() < 1e-5, (trained, expected)
  return model, coordinator, runner, args


def _loops(runner, args) -> list:
  """The step loops of the function `runner` traced for `args`."""
  return [op for op in runner.function.get_concrete_function(*args).graph.get_operations()
          if op.type in ("While", "StatelessWhile")]


def _records_lock_ops(runner, args) -> dict:
  """`{op type: {ps task}}` of the records lock's takes (`MutexLock`) and releases (`ConsumeMutexLock`) in the function
  `runner` traced for `args`, its loops' bodies too; each ps as `(job, task)`."""
  graph_def = runner.function.get_concrete_function(*args).graph.as_graph_def()
  found = {}
  for node in list(graph_def.node) + [node for function in graph_def.library.function for node in function.node_def]:
    if node.op in ("MutexLock", "ConsumeMutexLock"):
      found.setdefault(node.op, set()).add(_task(node.device))
  return found


def _task(device: str) -> tuple:
  spec = tf.DeviceSpec.from_string(device)
  return spec.job, spec.task


@pytest.mark.parametrize("optimizer", [_LEGACY_ADAGRAD, _CURRENT_ADAM], ids=["legacy", "current_adam"])
def test_unrolled_steps_end_where_the_same_steps_in_one_process_do(cluster, optimizer):
  """`unrolled_steps=3`, a function of 7 steps: two loop iterations of 3 steps traced one after another, then the step
  left over. Each step reads the previous step's updates (the weights end where 7 steps in one process leave them),
  each is counted once, and the same function run again applies nothing. So with a current Adam whose learning rate
  follows a schedule: its updates read the learning rate and `iterations` copied onto their ps before it decides,
  the values its own reads give in one process."""
  features = tf.reshape(tf.range(24, dtype=tf.float32) / 24.0, (8, 3))
  labels = tf.reduce_sum(features, axis=1, keepdims=True)
  model, coordinator, runner, args = _unrolled_run(cluster, tfps.TrainingMode(unrolled_steps=3), 7, features, labels,
                                                   optimizer=optimizer)
  trained = model.get_weights()
  coordinator.schedule(runner.function, args=args)  # the same function again
  coordinator.join()
  assert int(model.optimizer.iterations.numpy()) == 7
  assert all((again == before).all() for again, before in zip(model.get_weights(), trained))
  assert len(_loops(runner, args)) == 2  # 3 steps per iteration, then the step left over
  # By default each ps that records takes the records lock and releases it (`TrainingMode.records_lock`).
  recording = {_task(device) for device in runner.progress.ps_records.vectors}
  assert len(recording) == 2 and sorted(runner.progress.ps_records.locks) == sorted(runner.progress.ps_records.vectors)
  assert _records_lock_ops(runner, args) == {"MutexLock": recording, "ConsumeMutexLock": recording}


def test_without_the_records_lock_no_ps_takes_it_and_each_step_is_applied_once(cluster):
  """`records_lock=False`: no ps makes, takes or releases the records lock, and a run without failures still applies
  each step once (the weights end where as many steps in one process leave them, each step counted once)."""
  features = tf.reshape(tf.range(24, dtype=tf.float32) / 24.0, (8, 3))
  labels = tf.reduce_sum(features, axis=1, keepdims=True)
  _, _, runner, args = _unrolled_run(cluster, tfps.TrainingMode(records_lock=False), 5, features, labels)
  assert len(runner.progress.ps_records.vectors) == 2 and runner.progress.ps_records.locks == {}
  assert _records_lock_ops(runner, args) == {}


_AUTO = tfps.TrainingMode(unrolled_steps="auto")


@pytest.mark.parametrize("rows, batched, mode, loops", [
    (64, "static", _AUTO, 2),  # 4 steps per iteration, then the step left over
    (2048, "static", _AUTO, 1),  # a batch above 1024, one step per iteration
    (64, "unknown", _AUTO, 1),  # the batch size is not static
    (64, "static", None, 1),  # the default: one step per iteration
])
def test_unrolled_steps_are_chosen_from_the_static_batch_size_with_auto(cluster, rows, batched, mode, loops):
  """With "auto" the steps per loop iteration are chosen when the function is traced, from its batches' static size:
  a function of 5 steps runs 4 in one iteration and the step left over in a second loop, or all 5 one per iteration;
  either way the weights end where 5 steps in one process leave them."""
  features = tf.reshape(tf.range(rows * 3, dtype=tf.float32) % 7.0 / 7.0, (rows, 3))
  labels = tf.reduce_sum(features, axis=1, keepdims=True)
  unknown = lambda: tf.data.Dataset.from_tensor_slices((features, labels)).batch(rows).repeat()  # a short last batch
  _, _, runner, args = _unrolled_run(cluster, mode, 5, features, labels, unknown if batched == "unknown" else None)
  assert len(_loops(runner, args)) == loops


@pytest.mark.parametrize("packed_reads", [False, True])
def test_gradients_packed_per_ps_reach_their_own_variables(cluster, packed_reads):
  """The dense gradients of each ps travel packed in one tensor and are split again there (and with `packed_reads`
  the reads too): every variable (kernels and biases of several shapes, on both ps) ends where the same steps in one
  process, without a strategy, leave it."""
  def build():
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(4, activation="tanh"),
                                 tf_keras.layers.Dense(2, activation="tanh"), tf_keras.layers.Dense(1)])
    model.compile(tf_keras.optimizers.legacy.Adagrad(0.1), "mse")
    return model

  strategy, coordinator = tfps.build_strategy(cluster)
  with strategy.scope():
    model = build()
    runner = async_runner(model, coordinator, mode=tfps.TrainingMode(packed_reads=packed_reads))
  devices = {variable.device for variable in model.trainable_variables}
  assert len(devices) == 2, devices  # the layers' variables are spread over both ps
  initial = model.get_weights()
  local = build()
  local.set_weights(initial)
  features = tf.reshape(tf.range(24, dtype=tf.float32) / 24.0, (8, 3))
  labels = tf.reduce_sum(features, axis=1, keepdims=True)

  def dataset_fn():
    return tf.data.Dataset.from_tensors((features, labels)).repeat()
  iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
  coordinator.schedule(runner.function, args=(iterator, tf.constant(5, tf.int64), runner.progress.next_sequence()))
  coordinator.join()
  for _ in range(5):
    local.train_on_batch(features, labels)
  assert int(model.optimizer.iterations.numpy()) == 5
  for trained, expected in zip(model.get_weights(), local.get_weights()):
    assert trained.shape == expected.shape
    assert abs(trained - expected).max() < 1e-5, (trained, expected)
  assert all(abs(trained - start).max() > 1e-4 for trained, start in zip(model.get_weights(), initial))  # all moved
