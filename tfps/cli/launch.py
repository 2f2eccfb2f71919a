"""`tfps-launch`: runs a whole parameter-server cluster on this machine, one process per task.

A straight line: parse flags -> `LaunchConfig` -> unless `--expose_ports`, run again inside a private network
namespace with only loopback (`isolation`) -> pick ports (`build_cluster`) -> start one process per task with its own
TF_CONFIG and log file (`launch_tasks`) -> watch and restart them (`supervise.Supervisor`) -> print the run summary
(`summary.report_run`) -> stop every task -> exit with the chief's status.
Imports no TensorFlow.
"""

import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import List, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import portpicker

from tfps.cluster import config as cluster_lib
from tfps.cli import flags as flags_lib
from tfps.cluster import forkserver
from tfps.cluster import isolation
from tfps.cluster import summary
from tfps.cluster import supervise
from tfps.cluster import tasks as tasks_lib
from tfps.errors import EXIT_REFUSED
from tfps.errors import refuse

PROGRAM = "tfps-launch"
USAGE = "usage: tfps-launch [flags] SCRIPT [-- SCRIPT_ARGS]"
HELP = f"""{USAGE}

Runs SCRIPT (a tfps script: `tfps.run_task` serves each role) as a whole parameter-server cluster on this machine:
one process per task (ps, workers, the chief; with --evaluator a sidecar evaluator), each with its TF_CONFIG and a
log file in --log_dir; arguments after `--` go to every task. A failed task is restarted (--max_restarts); the run
ends with a summary and the chief's exit status.
  tfps-launch --num_ps=1 --num_workers=2 examples/first_model.py
  tfps-launch --num_ps=1 --num_workers=2 --evaluator scripts/train.py -- --flagfile=configs/main.cfg
"""


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
  """What to launch. Checked on construction; a bad field raises `app.UsageError` naming it."""

  script: str
  script_args: Sequence[str] = ()
  num_ps: int = 1
  num_workers: int = 2
  evaluator: bool = False
  log_dir: str = "logs"
  host: str = "127.0.0.1"
  stop_grace_secs: float = 5.0
  evaluator_timeout_secs: float = 300.0
  max_restarts: int = 3
  expose_ports: bool = False
  verbose: bool = False
  fork_tasks: bool = False

  def __post_init__(self):
    if not pathlib.Path(self.script).is_file():
      raise app.UsageError(f"script {self.script!r} is not a file; {USAGE}")
    for name in ("num_ps", "num_workers"):
      if getattr(self, name) < 1:
        raise app.UsageError(f"--{name}={getattr(self, name)} must be at least 1")
    if ":" in self.host:
      raise app.UsageError(f"--host={self.host}: an IPv6 address is not supported; use 127.0.0.1 (the default)")
    _check_log_dir(self.log_dir)
    if not self.expose_ports and not isolation.is_loopback(self.host):
      raise app.UsageError(f"--host={self.host} is not a loopback address, and the tasks run in a network namespace "
                           f"with only loopback; use 127.0.0.1 (the default), or {isolation.OPT_OUT_FLAG} to run "
                           "them in this one, reachable from other hosts (docs/security.md)")


def _check_log_dir(log_dir: str) -> None:
  """Raises `app.UsageError` where `log_dir` is a file or cannot be made (tried, and what the try made removed: the
  tasks' group makes it once the launch goes on)."""
  path = pathlib.Path(log_dir).absolute()
  if path.exists():
    if not path.is_dir():
      raise app.UsageError(f"--log_dir={log_dir} is a file, not a directory")
    return
  missing = [path, *(parent for parent in path.parents if not parent.exists())]
  try:
    path.mkdir(parents=True)
  except OSError as e:
    raise app.UsageError(f"--log_dir={log_dir} cannot be made a directory ({e.strerror})") from None
  for made in missing:
    made.rmdir()


def config_from_args(argv: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS) -> LaunchConfig:
  """The launch from parsed flags and the positional arguments `SCRIPT [SCRIPT_ARGS...]`."""
  if len(argv) < 2:
    raise app.UsageError(f"no script given; {USAGE}")
  return LaunchConfig(script=argv[1], script_args=tuple(argv[2:]), num_ps=flag_values.num_ps,
                      num_workers=flag_values.num_workers, evaluator=flag_values.evaluator,
                      log_dir=flag_values.log_dir or "logs", host=flag_values.host,
                      stop_grace_secs=flag_values.stop_grace_secs,
                      evaluator_timeout_secs=flag_values.evaluator_timeout_secs,
                      max_restarts=flag_values.max_restarts, expose_ports=flag_values.expose_ports,
                      verbose=flag_values.verbose, fork_tasks=flag_values.fork_tasks)


def build_cluster(config: LaunchConfig) -> cluster_lib.ClusterConfig:
  """A cluster of free ports on `config.host`: one chief, `num_workers` workers, `num_ps` ps."""
  def hosts(count):
    return [f"{config.host}:{portpicker.pick_unused_port()}" for _ in range(count)]
  return cluster_lib.from_hosts(ps_hosts=hosts(config.num_ps), worker_hosts=hosts(config.num_workers),
                                chief_hosts=hosts(1))


def task_names(config: LaunchConfig) -> List[tasks_lib.TaskName]:
  """Every task to start: ps first (workers and chief connect to them), then workers, chief, evaluator."""
  names = [("ps", i) for i in range(config.num_ps)] + [("worker", i) for i in range(config.num_workers)]
  names.append(("chief", 0))
  if config.evaluator:
    names.append(("evaluator", 0))
  return names


_CHECK_TIMEOUT_SECS = 300.0


def check_script_flags(config: LaunchConfig) -> None:
  """Parses the script's flags once, in a child without a cluster, before any task starts
  (`tfps.flags.check_script_flags`): a flag the script refuses stops the launch within seconds, in the script's one
  line, instead of after every task imported TensorFlow; so does a script that does not compile. A script that is not
  an absl program, or fails otherwise without a cluster, is left to its tasks.

  Raises:
    app.UsageError: the script refused its flags (its line), or does not compile.
  """
  _check_compiles(config.script)
  code = "import sys; from tfps import flags; flags.check_script_flags(sys.argv[1], sys.argv[2:])"
  environ = {key: value for key, value in os.environ.items() if key not in ("TF_CONFIG", "TFPS_TASK_TYPE")}
  try:
    result = subprocess.run([sys.executable, "-c", code, config.script, *config.script_args], env=environ,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_CHECK_TIMEOUT_SECS)
  except subprocess.TimeoutExpired:
    return
  if result.returncode == EXIT_REFUSED:
    lines = result.stderr.strip().splitlines()
    raise app.UsageError(lines[-1] if lines else f"{config.script} refused its flags {config.script_args}")


def _check_compiles(script: str) -> None:
  """Raises `app.UsageError` unless `script` compiles as Python: every task would fail at once (restarted until
  --max_restarts, the same traceback each time)."""
  try:
    with open(script, "rb") as f:
      compile(f.read(), script, "exec")
  except (SyntaxError, ValueError) as e:
    message = str(getattr(e, "msg", e))
    where = f" (line {e.lineno})" if getattr(e, "lineno", None) and "line" not in message else ""
    raise app.UsageError(f"script {script!r} does not compile as Python: {message}{where}; "
                         f"{USAGE}") from None


def launch_tasks(config: LaunchConfig, cluster: cluster_lib.ClusterConfig) -> tasks_lib.TaskGroup:
  """Starts one process per task, each with its own TF_CONFIG and log file; streams the chief's output."""
  group = tasks_lib.TaskGroup(log_dir=pathlib.Path(config.log_dir), stop_grace_secs=config.stop_grace_secs,
                              verbose=config.verbose)
  if config.fork_tasks:
    group.start_fork_server(forkserver.preload_for(config.script))
  command = [sys.executable, config.script, *config.script_args]
  for task_type, task_index in task_names(config):
    group.start(cluster.for_task(task_type, task_index), command, stream=task_type == "chief")
  return group


class _Stopped(Exception):
  def __init__(self, signum):
    super().__init__(signum)
    self.signum = signum


def _raise_stopped(signum, frame):
  """Ends the run; a second signal (a terminal's Ctrl-C reaches the launcher inside twice: directly and passed on)
  is ignored from here on, so it cannot interrupt the clean-up."""
  del frame
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
  raise _Stopped(signum)


def launch(config: LaunchConfig) -> int:
  """Runs the cluster to its end and stops every task; returns the exit status. SIGTERM/SIGINT stop it all too."""
  started = time.monotonic()
  cluster = build_cluster(config)
  previous = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGTERM, signal.SIGINT)}
  group = None
  try:
    group = launch_tasks(config, cluster)
    logging.info("Started %d tasks (%s%s); logs in %s", len(group.tasks), cluster.sizes(),
                 ", 1 evaluator" if config.evaluator else "", os.path.abspath(config.log_dir))
    logging.info("Task ports: %s", ", ".join(f"{task.label} {task.config.address}" for task in group.tasks
                                             if task.config.address))
    if config.expose_ports:
      logging.warning("%s: every task port accepts unauthenticated connections from any host that can reach this "
                      "machine (docs/security.md)", isolation.OPT_OUT_FLAG)
    else:
      logging.info("The tasks run in a private network namespace with only loopback: no other host reaches them")
    supervisor = supervise.Supervisor(group, config.max_restarts, config.evaluator_timeout_secs)
    status = supervisor.run()
    summary.report_run(config.log_dir, supervisor.restart_log, time.monotonic() - started, sys.stdout)
    return status
  except _Stopped as stopped:
    print(f"tfps-launch: received {signal.Signals(stopped.signum).name}; stopping every task", file=sys.stderr)
    return 128 + stopped.signum
  finally:
    for sig in (signal.SIGTERM, signal.SIGINT):
      signal.signal(sig, signal.SIG_IGN)  # nor may a signal that comes after the run ended
    if group is not None:
      group.stop_all()
      group.close_fork_server()
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def _inner_command(command_line: Sequence[str]) -> List[str]:
  """This launch again, for inside the namespace; it imports this very tfps (not one the working directory holds)."""
  package_parent = str(pathlib.Path(__file__).resolve().parents[2])
  code = f"import sys; sys.path.insert(0, {package_parent!r}); from tfps.cli import launch; launch.run()"
  return [sys.executable, "-c", code, *command_line[1:]]


def main(argv: Sequence[str], command_line: Optional[Sequence[str]] = None) -> int:
  """Launches the cluster `argv` (parsed) describes; unless `--expose_ports`, first runs the whole `command_line`
  (unparsed; default `sys.argv`) again inside a private network namespace."""
  try:
    config = config_from_args(argv)
    if not os.environ.get(isolation.INSIDE_ENV):  # once, before the namespace and before any task
      check_script_flags(config)
    if os.environ.pop(isolation.INSIDE_ENV, None):
      isolation.enter_namespace()
    elif not config.expose_ports:
      isolation.check_possible()
      return isolation.run_isolated(_inner_command(command_line or sys.argv), config.stop_grace_secs)
  except (app.UsageError, isolation.IsolationError) as e:
    refuse(PROGRAM, str(e))
  return launch(config)


def run(argv: Optional[Sequence[str]] = None) -> None:
  """Console-script entry point of `tfps-launch`: bad flags or arguments give one line on stderr and status 2."""
  flags_lib.define_launch_flags(flags.FLAGS)
  flags_lib.show_usage_in_help(HELP)
  parser = flags_lib.command_line_parser(PROGRAM, unknown_hint=f"the script's own flags go after `--`: {USAGE}")
  app.run(lambda args: sys.exit(main(args, argv)), argv=argv, flags_parser=parser)


if __name__ == "__main__":
  run()
