"""The cluster, strategy and mode flags (the models' and data's are in `tfps.cli.model_flags`); with the rest of
`tfps/cli/`, the only modules that define or read absl flags.

Flags are defined by calling `define_flags()` / `define_mode_flags()` (a user's script does it once at module level),
never as a side effect of importing tfps. Library functions never read flags: a script builds its settings here and
passes them on, e.g.

  tfps.run_task(chief, evaluator, cluster=tfps.config_from_flags(), model_dir=FLAGS.model_dir,
                **tfps.server_options_from_flags())
  tfps.fit(..., cluster=cluster, sync_mode=tfps.mode_from_flags(), strategy_options=tfps.strategy_options_from_flags())

A flag's way: absl parses it, `config_from_flags` builds a `ClusterConfig` (`tfps.cluster.config` checks the
cross-field rules), `mode_from_flags` a `TrainingMode`, `strategy_options_from_flags` a `StrategyOptions`.
"""

import ast
import dataclasses
import importlib.abc
import math
import os
import runpy
import sys
import types
from typing import Callable, Mapping, Optional, Sequence

from absl import flags

from tfps.cluster import config as cluster_lib
from tfps.errors import ClusterConfigError, UsageError
from tfps.errors import refuse
from tfps.training import modes

_HOST_FLAGS = ("ps_hosts", "worker_hosts", "chief_hosts", "evaluator_hosts")


def declare_program_flags(flag_values: flags.FlagValues, module_name: str) -> None:
  """Makes the flags `module_name` defined key flags of the program being run, so its `--help` lists them.

  absl's `--help` lists only the main module's key flags; tfps defines flags for a script in its own modules.
  """
  for flag in flag_values.flags_by_module_dict().get(module_name, []):
    flag_values.register_key_flag_for_module(sys.argv[0], flag)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the cluster and strategy flags in `flag_values`; calling it again is harmless."""
  if "ps_hosts" in flag_values:
    return
  for job in ("ps", "worker", "chief", "evaluator"):
    flags.DEFINE_list(f"{job}_hosts", [], f"Comma-separated host:port of each {job} task.", flag_values=flag_values)
  flags.DEFINE_string("job_name", None, "This task's job: chief, worker, ps or evaluator.", flag_values=flag_values)
  flags.DEFINE_integer("task_index", 0, "This task's index within its job.", flag_values=flag_values)
  flags.DEFINE_integer("num_shards", None, "Shards of each large variable (default: the number of ps).",
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_float("connect_timeout_secs", 60.0, "Seconds the chief waits for every ps and worker to answer, and a ps "
                     "or worker for the name of its own address to resolve.",
                     lower_bound=0.0, flag_values=flag_values)
  flags.DEFINE_float("lost_task_timeout_secs", 30.0, "Seconds a ps may stay silent mid-run before the chief stops "
                     "with an error naming it (to be started again; it resumes from its checkpoint).",
                     lower_bound=1.0, flag_values=flag_values)
  flags.DEFINE_float("lost_chief_timeout_secs", cluster_lib.DEFAULT_LOST_CHIEF_TIMEOUT_SECS,
                     "Seconds a ps or worker waits for a silent chief while training has not ended before it exits "
                     "with status 3 (to be started again with the chief).", lower_bound=1.0, flag_values=flag_values)
  flags.DEFINE_integer("min_shard_bytes", 256 << 10,
                       "Variables smaller than this are not sharded (0 shards every variable with >= 2 rows).",
                       lower_bound=0, flag_values=flag_values)
  flags.DEFINE_boolean("thread_spinning", cluster_lib.DEFAULT_THREAD_SPINNING,
                       "ps and workers: idle threads spin waiting for work (TensorFlow's default) instead of sleeping "
                       "(tfps's: measured faster where tasks share cores).", flag_values=flag_values)
  declare_program_flags(flag_values, __name__)


def help_text(argv: Sequence[str], flag_values: flags.FlagValues, usage: str, module_name: str) -> Optional[str]:
  """For a program that parses its own `FlagValues`: its usage and the flags `module_name` defined when `argv` asks
  for help (`--help`, `-h`, ... before any `--`), else None."""
  own_args = list(argv[1:argv.index("--")] if "--" in argv else argv[1:])
  if not any(arg in _HELP_ARGS for arg in own_args):
    return None
  return f"{usage}\n{flag_values.module_help(module_name)}"


_HELP_ARGS = ("--help", "-h", "-help", "--helpshort", "--helpfull", "-?")


def _flag_given(flag_values: flags.FlagValues, name: str) -> bool:
  return name in flag_values and flag_values[name].present


def config_from_flags(flag_values: flags.FlagValues = flags.FLAGS,
                      environ: Optional[Mapping[str, str]] = None) -> Optional[cluster_lib.ClusterConfig]:
  """The cluster of this task from flags and/or a TF_CONFIG already set by an orchestrator.

  A TF_CONFIG is honoured; a flag given together with it must agree with it (a contradiction is an error naming both
  values, never a silent override). Returns None where neither flags nor TF_CONFIG describe a cluster.

  Raises:
    ClusterConfigError: a rule is broken or flags contradict TF_CONFIG.
  """
  environ = os.environ if environ is None else environ
  from_env = cluster_lib.from_environ(environ)
  given = [name for name in _HOST_FLAGS + ("job_name", "task_index") if _flag_given(flag_values, name)]
  if from_env is not None:
    for name in given:
      _check_agrees(name, flag_values[name].value, from_env)
    return from_env
  if not given:
    return None
  if not flag_values["job_name"].value:
    raise ClusterConfigError("--job_name is required with cluster flags; allowed: chief, worker, ps, evaluator")
  return cluster_lib.from_hosts(
      ps_hosts=flag_values["ps_hosts"].value, worker_hosts=flag_values["worker_hosts"].value,
      chief_hosts=flag_values["chief_hosts"].value, evaluator_hosts=flag_values["evaluator_hosts"].value,
      task_type=flag_values["job_name"].value, task_index=flag_values["task_index"].value)


def _check_agrees(name: str, flag_value, from_env: cluster_lib.ClusterConfig) -> None:
  if name in _HOST_FLAGS:
    flag_norm = cluster_lib.parse_hosts(flag_value, f"--{name}")
    env_value = getattr(from_env, name)
    shown_flag, shown_env = ",".join(flag_norm), ",".join(env_value) or "(none)"
    env_key = f"cluster.{name[:-len('_hosts')]}"
  elif name == "job_name":
    flag_norm, env_value = flag_value, from_env.task_type
    shown_flag, shown_env, env_key = flag_value, env_value, "task.type"
  else:
    flag_norm, env_value = flag_value, from_env.task_index
    shown_flag, shown_env, env_key = flag_value, env_value, "task.index"
  if flag_norm != env_value:
    raise ClusterConfigError(f"--{name}={shown_flag} contradicts TF_CONFIG {env_key}={shown_env}; give one or make "
                             "them agree")


def strategy_options_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> "options_lib.StrategyOptions":
  """The `tfps.StrategyOptions` of the strategy flags (`--num_shards`, `--min_shard_bytes`, `--connect_timeout_secs`,
  `--lost_task_timeout_secs`, `--thread_spinning`; the defaults where they are not defined), for
  `tfps.fit(strategy_options=options)`, `tfps.Estimator(strategy_options=options)` or `build_strategy(config, options)`.
  """
  from tfps.cluster import options as options_lib  # pylint: disable=g-import-not-at-top  (scripts that read no
  # strategy flags, such as the plain-PSS peer of bench/, load no more of tfps)
  if "num_shards" not in flag_values:
    return options_lib.StrategyOptions()
  return options_lib.StrategyOptions(**{name: flag_values[name].value for name in options_lib.FIELDS})


def server_options_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> dict:
  """`thread_spinning`, `lost_chief_timeout_secs` and `connect_timeout_secs` from the flags (empty where undefined),
  for `tfps.run_task(..., **options)`."""
  if "thread_spinning" not in flag_values:
    return {}
  return {"thread_spinning": flag_values["thread_spinning"].value,
          "lost_chief_timeout_secs": flag_values["lost_chief_timeout_secs"].value,
          "connect_timeout_secs": flag_values["connect_timeout_secs"].value}


def define_mode_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """--sync_mode, --geo_steps, --replicas_to_aggregate, --packed_reads, --lockfree_row_updates, --pipelined_updates,
  --unrolled_steps, --bf16_rows and --records_lock (`tfps.training.modes`); calling it again is harmless."""
  if "sync_mode" in flag_values:
    return
  flags.DEFINE_string("sync_mode", "async", f"How the ps applies the workers' work: {', '.join(modes.MODES)}.",
                      flag_values=flag_values)
  flags.DEFINE_integer("geo_steps", None, f"geo: local steps per push (default {modes.DEFAULT_GEO_STEPS}).",
                       flag_values=flag_values)
  flags.DEFINE_integer("replicas_to_aggregate", None, "sync: worker batches per step (default: every worker's).",
                       flag_values=flag_values)
  flags.DEFINE_boolean("packed_reads", None, "async: read the small dense variables of each ps in one transfer per "
                       "step (default: on with async; --nopacked_reads reads each one on its own).",
                       flag_values=flag_values)
  flags.DEFINE_boolean("lockfree_row_updates", False, "async: a legacy Adagrad updates a batch's table rows at once "
                       "without the lock it holds by default (concurrent updates of one row may be lost).",
                       flag_values=flag_values)
  flags.DEFINE_boolean("pipelined_updates", False, "async: each ps applies a step's updates while the worker computes "
                       "the next step (faster; gradients one step late; not with table layers).",
                       flag_values=flag_values)
  flags.DEFINE_string("unrolled_steps", None, "async: steps traced one after another in each iteration of a "
                      "scheduled function's loop (default 1), or auto: chosen at the trace, "
                      f"{modes.AUTO_UNROLLED_STEPS} where a worker's batches have a static size up to "
                      f"{modes.AUTO_UNROLL_MAX_BATCH}, else 1. More: faster with small batches, slower with large ones "
                      "on several workers, a longer trace at every start and restart.", flag_values=flag_values)
  flags.DEFINE_boolean("bf16_rows", False, "async: table rows and their gradients cross the network as bfloat16 "
                       "(half their bytes; rows rounded to 8 significant bits).", flag_values=flag_values)
  flags.DEFINE_boolean("records_lock", True, "async: each ps holds a lock from its decision on a step's updates to "
                       "its record of them (default; switched off side by side with it on, nothing measurable was "
                       "gained on 2 cores: bench/results/records_lock/NOTES.md). --norecords_lock takes none: a step "
                       "whose function runs again while its first run still applies it on a ps (its worker died then) "
                       "can then be applied twice there.", flag_values=flag_values)
  declare_program_flags(flag_values, __name__)


def mode_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> modes.TrainingMode:
  """The `TrainingMode` the mode flags give (async where they are not defined).

  Raises:
    UsageError: a mode flag is not allowed with the mode (one line naming it).
  """
  if "sync_mode" not in flag_values:
    return modes.TrainingMode()
  values = {field.name: flag_values[field.name].value for field in dataclasses.fields(modes.TrainingMode)}
  unrolled = values["unrolled_steps"]
  if unrolled is not None and unrolled.strip().isdigit():  # else "auto", or what TrainingMode refuses in one line
    values["unrolled_steps"] = int(unrolled)
  return modes.TrainingMode(**values)


def define_launch_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the flags of `tfps-launch` in `flag_values`."""
  flags.DEFINE_integer("num_ps", 1, "Parameter servers to start.", lower_bound=1, flag_values=flag_values)
  flags.DEFINE_integer("num_workers", 2, "Workers to start.", lower_bound=1, flag_values=flag_values)
  flags.DEFINE_boolean("evaluator", False, "Also start a sidecar evaluator task.", flag_values=flag_values)
  log_dir_help = "One log file per task is written here (default: logs)."
  if "log_dir" in flag_values:  # absl.logging defines --log_dir in FLAGS; the launcher uses it as its own
    flag_values["log_dir"].help = log_dir_help
  else:
    flags.DEFINE_string("log_dir", "", log_dir_help, flag_values=flag_values)
  flags.DEFINE_string("host", "127.0.0.1", "Address the tasks reach each other at (in their TF_CONFIG). Whatever it "
                      "is, TensorFlow's servers listen on every interface; without --expose_ports the tasks run in a "
                      "private network namespace with only loopback, so it must be a loopback address.",
                      flag_values=flag_values)
  flags.DEFINE_boolean("expose_ports", False, "Run the tasks in this machine's network namespace instead of a "
                       "private one with only loopback: every task port then accepts unauthenticated connections "
                       "from any host that can reach this machine (see docs/security.md), and the tasks can reach "
                       "the network (e.g. remote storage). Needed where namespaces cannot be made.",
                       flag_values=flag_values)
  flags.DEFINE_float("stop_grace_secs", 5.0, "Seconds a task gets to exit after SIGTERM before SIGKILL.",
                     lower_bound=0.0, flag_values=flag_values)
  flags.DEFINE_integer("max_restarts", 3, "Restarts after task failures before the launcher gives up (0: none).",
                       lower_bound=0, flag_values=flag_values)
  flags.DEFINE_float("evaluator_timeout_secs", 300.0,
                     "After the chief finishes, seconds the evaluator gets to evaluate the last checkpoint.",
                     lower_bound=0.0, flag_values=flag_values)
  flags.DEFINE_boolean("verbose", False, "Show TensorFlow's C++ info lines, its CUDA probe, config dumps and retracing "
                       "warnings on the console (the task logs keep them either way).", flag_values=flag_values)
  flags.DEFINE_boolean("fork_tasks", sys.platform.startswith("linux"),
                       "Start the Python tasks from a fork server that has imported TensorFlow once, instead of one "
                       "fresh Python each (a task then starts without importing TensorFlow, and shares the imported "
                       "modules' memory); --nofork_tasks starts each task as its own Python. Without a fork server (one that "
                       "cannot start) the tasks start as their own Python, after one warning line.",
                       flag_values=flag_values)
  declare_program_flags(flag_values, __name__)
  flag_values.register_key_flag_for_module(sys.argv[0], flag_values["log_dir"])


def define_report_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the flags of `tfps-report` in `flag_values`."""
  flags.DEFINE_string("out", None, "PNG file to write (default: MODEL_DIR/run/report.png).", flag_values=flag_values)
  flags.DEFINE_string("serving", None, "The folder `tfps-delta watch --serving=` keeps current: each served "
                      "version's freshness (docs/delta_export.md).", flag_values=flag_values)
  declare_program_flags(flag_values, __name__)


def command_line_parser(program: str, unknown_hint: str = "",
                        arguments: bool = True) -> Callable[[Sequence[str]], list]:
  """absl's flag parsing for `absl.app.run(flags_parser=...)`, but a bad flag (unknown, or a bad value) ends the
  process with one line `program: ...` and status `EXIT_REFUSED`: absl's own ends it with two lines and status 1,
  which a supervisor takes for a failure and restarts. `unknown_hint` follows the line of an unknown flag.
  `arguments=False`: a word that is not a flag is refused too (`--sync true` would leave async on, `true` unread)."""
  def parse(argv: Sequence[str]) -> list:
    try:
      remaining = flags.FLAGS(list(argv))
    except flags.Error as e:
      hint = f" ({unknown_hint})" if unknown_hint and isinstance(e, flags.UnrecognizedFlagError) else ""
      refuse(program, str(e).splitlines()[0] + hint)
    if not arguments and len(remaining) > 1:
      refuse(program, f"unexpected argument {remaining[1]!r}: this program takes flags only (--name=value; a "
                      f"boolean flag is --name or --noname)")
    not_finite = _not_finite_float(flags.FLAGS)
    if not_finite is not None:
      refuse(program, f"--{not_finite.name}={not_finite.value}: must be a finite number")
    if all(field.name in flags.FLAGS for field in dataclasses.fields(modes.TrainingMode)):  # define_mode_flags's
      try:  # the mode flags together, here: tfps-launch's check of a script's flags refuses them before any task
        mode_from_flags(flags.FLAGS)
      except UsageError as e:
        refuse(program, str(e))
    return remaining
  return parse


def _not_finite_float(flag_values: flags.FlagValues):
  """A float flag set to nan or inf, which absl's parser (and its bounds) let through; None if there is none."""
  for name in flag_values:
    flag = flag_values[name]
    if isinstance(flag.value, float) and not math.isfinite(flag.value):
      return flag
  return None


def show_usage_in_help(usage: str) -> None:
  """Makes absl's `--help` begin with `usage`: it prints the `__main__` module's docstring, which a console script's
  generated wrapper lacks (absl then shows `USAGE: program [flags]`, no arguments) and which `python -m` takes from
  the module, written for its readers."""
  sys.modules["__main__"].__doc__ = usage


CHECK_RUN_NAME = "__tfps_flag_check__"  # the script's module name while its flags are checked: its main never runs
_TENSORFLOW_PACKAGES = ("tensorflow", "tf_keras", "tensorflow_recommenders")


class _TensorFlowImported(BaseException):  # not caught by a script's `except Exception`
  """The checked script imports TensorFlow where it defines its flags: too slow for a check; its tasks check them."""


class _WithoutTensorFlow(importlib.abc.MetaPathFinder):
  def find_spec(self, fullname, path, target=None):
    del path, target
    if fullname.split(".")[0] in _TENSORFLOW_PACKAGES:
      raise _TensorFlowImported(fullname)
    return None


def check_script_flags(script: str, args: Sequence[str]) -> None:
  """Parses `args` as `script` would, in this process (a quick child of tfps-launch, before any task starts): runs
  the script's module code under another name than `__main__` (its flags are defined, its main does not run) without
  TensorFlow, then, if it is an absl program (it refers to absl's `flags` or `app`, or to tfps), parses them like
  `tfps.run_main`: a bad flag ends the process with the script's one line and `EXIT_REFUSED`. A script that needs
  TensorFlow (or anything else) to define its flags ends it quietly: its tasks check them."""
  sys.argv = [script, *args]
  sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as when the script runs: its folder first
  sys.meta_path.insert(0, _WithoutTensorFlow())
  try:
    names = runpy.run_path(script, run_name=CHECK_RUN_NAME)
  except _TensorFlowImported:
    return
  modules = {value.__name__ for value in names.values() if isinstance(value, types.ModuleType)}
  if modules & {"absl.flags", "absl.app", "tfps"}:
    command_line_parser(os.path.basename(script), arguments=_takes_arguments(script))(sys.argv)


def _takes_arguments(script: str) -> bool:
  """False where `script` calls `run_main(..., arguments=False)` (`tfps.run_main`: it takes flags only)."""
  with open(script, "rb") as f:
    tree = ast.parse(f.read(), script)
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "run_main":
      if any(keyword.arg == "arguments" and isinstance(keyword.value, ast.Constant) and keyword.value.value is False
             for keyword in node.keywords):
        return False
  return True


def run_main(main: Callable[[Sequence[str]], Optional[int]], argv: Optional[Sequence[str]] = None,
             arguments: bool = True) -> None:
  """`tfps.run_main`: `tfps.cluster.roles.run_main` with a bad flag refused in one line too (`command_line_parser`);
  `arguments=False` for a program that takes flags only (a stray word is refused, not ignored)."""
  from tfps.cluster import roles  # pylint: disable=g-import-not-at-top  (here: scripts that only read flags, such as
  # the plain-PSS peer of bench/, load no task machinery)
  roles.run_main(main, argv, flags_parser=command_line_parser(os.path.basename(sys.argv[0]), arguments=arguments))
