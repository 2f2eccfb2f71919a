"""A parameter-server cluster on test hosts: each task on a host of its own, started as a user would type it there.

Seven hosts by default (2 ps, 3 workers, a chief, a sidecar evaluator), network namespaces on one bridge
(`tfps.testing.hosts`). Each task's command is the training script with its flags, or with the environment an
orchestrator gives a pod:

  form="flags"   python train.py --job_name=ps --task_index=0 --ps_hosts=ps-0:2222,... --worker_hosts=...
  form="tfjob"   TF_CONFIG exactly as the Kubeflow TFJob operator writes it: names `<job>-<type>-<index>.<ns>.svc`,
                 the evaluator in the cluster, "environment": "cloud"
  form="jobset"  the pod environment of `tfps-k8s`'s manifests (TFPS_TASK_TYPE, TFPS_REPLICAS, TFPS_JOB, no
                 TF_CONFIG) and HOSTNAME `<job>-<type>-<index>`: the pods of an Indexed Job `<job>-<type>` in the
                 headless Service `<job>`'s subdomain (`tfps-k8s --kind=plain`; a JobSet's own pods are
                 `<job>-<type>-0-<index>`, run by `tfps.testing.k8s_pods`); tfps derives the cluster at start

Every orchestrator name resolves to the task's test host. `model_dir` is one folder every host sees (shared
storage). The harness plays the orchestrator's restart policy with `restart(task)`: the same command again.

    with HostCluster("scripts/train_keras.py", ["--model_dir=/tmp/run"], log_dir="/tmp/logs") as cluster:
      cluster.start_all()
      exit_code = cluster.wait("chief", timeout_secs=300)  # 0: the chief finished
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from tfps import run_records
from tfps.testing import hosts as hosts_lib

Task = Tuple[str, int]
DEFAULT_REPLICAS = (("ps", 2), ("worker", 3), ("chief", 1), ("evaluator", 1))
FORMS = ("flags", "tfjob", "jobset")
SERVER_JOBS = ("ps", "worker")


def task_label(task: Task) -> str:
  return f"{task[0]}:{task[1]}"


class HostCluster:
  """The tasks of one training job, each on a test host named `<type>-<index>` (e.g. `ps-1`).

  Args:
    script: the training script (one absl script for every role).
    script_args: arguments every task gets (model flags, `--model_dir` on the shared folder).
    log_dir: one log file per task, `<type>-<index>.log`; a restart appends to it.
    form: how a task learns the cluster: "flags", "tfjob" or "jobset" (see the module docstring).
    replicas: tasks per job.
    port: every task's port (each task has a host of its own).
    job_name, namespace: the orchestrator's job and namespace, for the names of the "tfjob" and "jobset" forms.
    role_args: extra arguments per job (e.g. the evaluator's), `{"evaluator": [...]}`.
    env: the environment of every task (default: this process's).
  """

  def __init__(self, script: str, script_args: Sequence[str], log_dir: str, *, form: str = "flags",
               replicas: Sequence[Tuple[str, int]] = DEFAULT_REPLICAS, port: int = 2222, job_name: str = "ctr",
               namespace: str = "team", role_args: Optional[Dict[str, Sequence[str]]] = None,
               env: Optional[Dict[str, str]] = None, python: str = sys.executable):
    if form not in FORMS:
      raise ValueError(f"`form` ({form!r}) must be one of {', '.join(FORMS)}")
    self.script, self.script_args, self.log_dir, self.form = script, list(script_args), log_dir, form
    self.replicas = dict(replicas)
    self.port, self.job_name, self.namespace, self.python = port, job_name, namespace, python
    self.role_args = {job: list(args) for job, args in (role_args or {}).items()}
    self.env = dict(os.environ if env is None else env)
    self.tasks: List[Task] = [(job, index) for job, count in replicas for index in range(count)]
    self.processes: Dict[Task, subprocess.Popen] = {}
    self.started_at: Dict[Task, float] = {}
    os.makedirs(log_dir, exist_ok=True)
    aliases = {self.host(task): [self.orchestrator_name(task)] for task in self.tasks}
    self.hosts = hosts_lib.TestHosts([self.host(task) for task in self.tasks], aliases=aliases)

  def __enter__(self) -> "HostCluster":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @staticmethod
  def host(task: Task) -> str:
    """The test host of `task`."""
    return f"{task[0]}-{task[1]}"

  def orchestrator_name(self, task: Task) -> str:
    """The name an orchestrator gives `task`'s pod (TFJob: `<job>-<type>-<index>.<namespace>.svc`; the "jobset"
    form: pod `<index>` of the Indexed Job `<job>-<type>` in the headless Service `<job>`'s subdomain,
    `<job>-<type>-<index>.<job>`)."""
    if self.form == "jobset":
      return f"{self.job_name}-{task[0]}-{task[1]}.{self.job_name}"
    return f"{self.job_name}-{task[0]}-{task[1]}.{self.namespace}.svc"

  def address(self, task: Task) -> str:
    """`task`'s `host:port` as its cluster lists it."""
    name = self.host(task) if self.form == "flags" else self.orchestrator_name(task)
    return f"{name}:{self.port}"

  def addresses(self, job: str) -> List[str]:
    return [self.address((job, index)) for index in range(self.replicas.get(job, 0))]

  def command(self, task: Task) -> Tuple[List[str], Dict[str, str]]:
    """The command line and environment of `task`, as a user (or an orchestrator) would give them on its host."""
    job, index = task
    argv = [self.python, self.script, *self.script_args, *self.role_args.get(job, ())]
    env = dict(self.env, PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    if self.form == "flags":
      argv += [f"--job_name={job}", f"--task_index={index}"] + [
          f"--{name}_hosts={','.join(self.addresses(name))}" for name in self.replicas if self.addresses(name)]
    elif self.form == "tfjob":
      env["TF_CONFIG"] = json.dumps({"cluster": {name: self.addresses(name) for name in self.replicas},
                                     "task": {"type": job, "index": index}, "environment": "cloud"})
    else:
      env.update(TFPS_TASK_TYPE=job, TFPS_JOB=self.job_name, TFPS_PORT=str(self.port),
                 TFPS_REPLICAS=",".join(f"{name}={count}" for name, count in self.replicas.items()),
                 HOSTNAME=f"{self.job_name}-{job}-{index}")
    return argv, env

  def log_path(self, task: Task) -> str:
    return os.path.join(self.log_dir, f"{task[0]}-{task[1]}.log")

  def start(self, task: Task) -> subprocess.Popen:
    """Starts `task` on its host (again, after a failure: the same command); its output goes to its log."""
    argv, env = self.command(task)
    with open(self.log_path(task), "ab") as log:
      log.write(f"===== {time.strftime('%H:%M:%S')} start {task_label(task)}: {' '.join(argv)}\n".encode())
      log.flush()
      self.processes[task] = self.hosts.popen(self.host(task), argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL)
    self.started_at[task] = time.monotonic()
    return self.processes[task]

  def start_all(self, jobs: Sequence[str] = ("ps", "worker", "chief", "evaluator")) -> None:
    for task in self.tasks:
      if task[0] in jobs:
        self.start(task)

  def stop(self, task: Task) -> None:
    """Kills `task` (SIGKILL to its process group) and waits for it."""
    process = self.processes.get(task)
    if process is not None and process.poll() is None:
      try:
        os.killpg(process.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      process.wait(timeout=30)

  def restart(self, task: Task) -> subprocess.Popen:
    """What an orchestrator's restart policy does: the same command on the same host."""
    self.stop(task)
    return self.start(task)

  def wait(self, task: Task, timeout_secs: float) -> Optional[int]:
    """`task`'s exit status, or None if it still runs after `timeout_secs`."""
    try:
      return self.processes[task].wait(timeout=timeout_secs)
    except subprocess.TimeoutExpired:
      return None

  def log(self, task: Task) -> str:
    with open(self.log_path(task), errors="replace") as f:
      return f.read()

  def cut(self, task: Task) -> None:
    """Takes `task`'s host off the network (its link down) until `restore`."""
    self.hosts.cut(self.host(task))

  def restore(self, task: Task) -> None:
    self.hosts.restore(self.host(task))

  def limit_rate(self, task: Task, kbit: int) -> None:
    """Caps what `task`'s host sends at `kbit` kbit/s (0: no cap)."""
    self.hosts.limit_rate(self.host(task), kbit)

  def traffic(self, task: Task) -> Tuple[int, int]:
    """Bytes `task`'s host has received and sent so far."""
    return self.hosts.traffic(self.host(task))

  def wait_until_sending(self, task: Task, like: Task, timeout_secs: float, window_secs: float = 2.0,
                         share: float = 0.5, while_running: Task = ("chief", 0)) -> Optional[float]:
    """Seconds until `task`'s host sends at least `share` of what `like`'s sends in a `window_secs` window (e.g. a
    worker back at work beside another one), or None if that has not happened within `timeout_secs` or before the
    task `while_running` ended."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_secs and self.processes[while_running].poll() is None:
      before = self.traffic(task)[1], self.traffic(like)[1]
      time.sleep(window_secs)
      sent, reference = self.traffic(task)[1] - before[0], self.traffic(like)[1] - before[1]
      if reference > 0 and sent >= share * reference:
        return time.monotonic() - start
    return None

  def fault_counts(self) -> Dict[str, Dict[str, int]]:
    """`{"ps:0": {"dropped": packets, "delayed": packets}, ...}`: what the fault rules (`drop`, `delay`) of each
    task's host have taken so far (`TestHosts.fault_counts`)."""
    return {task_label(task): self.hosts.fault_counts(self.host(task)) for task in self.tasks}

  def drop(self, probability: float) -> None:
    """Drops `probability` of the packets every host receives (iptables), on every link; 0 removes the rule."""
    for task in self.tasks:
      self.hosts.drop(self.host(task), probability)

  def delay(self, ms: float) -> None:
    """Holds every packet every host receives for `ms` milliseconds (a round trip grows by 2 x ms); 0 removes it."""
    for task in self.tasks:
      self.hosts.delay(self.host(task), ms)

  def close(self) -> None:
    """Kills every task and removes every test host."""
    self.hosts.close()


def progress_steps(model_dir: str, since: float, until: float) -> List[int]:
  """The steps of the chief's progress records (`model_dir/run/progress.jsonl`) written between the wall-clock times
  `since` and `until`."""
  records = run_records.read_jsonl(os.path.join(run_records.run_dir(model_dir), run_records.PROGRESS_FILE))
  return [record["step"] for record in records if since <= record["time"] <= until and record["kind"] == "train"]


def worker_failed(chief_log: str, task: Task) -> bool:
  """Whether the chief's log shows TensorFlow's coordinator found worker `task` failed (`UnavailableError`), after
  which it gives that worker's function to the others."""
  return f"Worker /job:worker/replica:0/task:{task[1]} failed with UnavailableError" in chief_log
