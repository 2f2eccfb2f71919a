"""Cluster description, TF_CONFIG building and parsing, and every cluster rule.

This module imports no TensorFlow: the launcher and `tfps-config` use it without paying for a TensorFlow import.

A `ClusterConfig` holds the hosts of each job and the task this process is. Building one checks every rule; a broken
rule raises `ClusterConfigError` with a one-line message naming the offending value and what is allowed.
"""

import dataclasses
import json
import re
from typing import Mapping, Optional, Sequence, Tuple, Union

from tfps.errors import ClusterConfigError

JOB_NAMES = ("chief", "worker", "ps", "evaluator")
TRAINING_JOBS = ("chief", "worker", "ps")  # the jobs the chief connects to; never the evaluator
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]+)$")
_MAX_PORT = 65535

# TensorFlow's thread pools spin by default: a thread out of work keeps polling for more before it sleeps. A ps and a
# worker take turns within a step, so each one's idle threads spin while the other works, taking CPU from it where they
# share cores; sleeping measured 3-8% more examples/s at 1 ps + 1 worker on 2 cores (bench/results/profile/NOTES.md).
# tfps's servers let them sleep unless told otherwise (`--thread_spinning`).
DEFAULT_THREAD_SPINNING = False
# How long a ps or worker waits for a silent chief before it fails (`tfps.cluster.job_end`): long enough for a chief
# pod to be scheduled again and its image pulled.
DEFAULT_LOST_CHIEF_TIMEOUT_SECS = 600.0
# Set by a supervisor that starts every task again when a ps fails (tfps-launch; a JobSet's failure policy): its
# workers need not end themselves when a ps's process ends (`tfps.cluster.job_end`).
PS_FAILURE_RESTARTS_ALL_ENV = "TFPS_PS_FAILURE_RESTARTS_ALL"
DEFAULT_CONNECT_TIMEOUT_SECS = 60.0  # the chief waits this long for every task; a task for its own name to resolve

Hosts = Union[str, Sequence[str], None]


def parse_hosts(value: Hosts, field: str) -> Tuple[str, ...]:
  """Returns the `host:port` entries of `value` ("a:1, b:2" or a list), checking each one's syntax and port.

  Args:
    value: comma-separated string (spaces after commas tolerated), a sequence of strings, or None.
    field: the name used in error messages, e.g. "ps_hosts".
  """
  if value is None:
    return ()
  if isinstance(value, str):
    items = [item.strip() for item in value.split(",")] if value.strip() else []
  elif isinstance(value, (list, tuple)):
    items = list(value)
  else:
    raise ClusterConfigError(f"{field}: expected a list of host:port strings, got {value!r}")
  hosts = []
  for item in items:
    if not isinstance(item, str):
      raise ClusterConfigError(f"{field}: entry {item!r} is not a host:port string")
    hosts.append(_check_host_port(item.strip(), field))
  return tuple(hosts)


def _check_host_port(entry: str, field: str) -> str:
  if not entry:
    raise ClusterConfigError(f"{field}: empty entry; expected comma-separated host:port (e.g. 127.0.0.1:2222)")
  match = _HOST_PORT.match(entry)
  if not match:
    raise ClusterConfigError(f"{field}: {entry!r} is not host:port (e.g. 127.0.0.1:2222 or [::1]:2222)")
  port = int(match.group(2))
  if not 1 <= port <= _MAX_PORT:
    raise ClusterConfigError(f"{field}: port {port} in {entry!r} is out of range; allowed 1-{_MAX_PORT}")
  return entry


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
  """The hosts of each job and the task this process runs as.

  An empty `chief_hosts` means the coordinator runs in a process that is not listed (a notebook, a test, or a chief
  started without `--chief_hosts`); the strategy then gives it an address of its own.

  Attributes:
    ps_hosts: `host:port` of each parameter server (at least one).
    worker_hosts: `host:port` of each worker (at least one).
    chief_hosts: at most one `host:port`.
    evaluator_hosts: at most one `host:port`; the evaluator never joins the training cluster.
    task_type: one of `JOB_NAMES`.
    task_index: index of this task within `task_type`.
  """

  ps_hosts: Tuple[str, ...]
  worker_hosts: Tuple[str, ...]
  chief_hosts: Tuple[str, ...] = ()
  evaluator_hosts: Tuple[str, ...] = ()
  task_type: str = "chief"
  task_index: int = 0

  def __post_init__(self):
    for job in JOB_NAMES:
      field = f"{job}_hosts"
      object.__setattr__(self, field, parse_hosts(getattr(self, field), field))
    _validate(self)

  def hosts(self, job: str) -> Tuple[str, ...]:
    """The `host:port` entries of `job`."""
    if job not in JOB_NAMES:
      raise ClusterConfigError(f"job {job!r} is not one of {', '.join(JOB_NAMES)}")
    return getattr(self, f"{job}_hosts")

  @property
  def num_ps(self) -> int:
    return len(self.ps_hosts)

  @property
  def num_workers(self) -> int:
    return len(self.worker_hosts)

  @property
  def address(self) -> Optional[str]:
    """This task's `host:port`, or None for a coordinator or evaluator not listed in the cluster."""
    hosts = self.hosts(self.task_type)
    return hosts[self.task_index] if self.task_index < len(hosts) else None

  def training_cluster(self) -> dict:
    """The jobs the chief connects to (chief, worker, ps), as `{job: [host:port, ...]}`; never the evaluator."""
    return {job: list(self.hosts(job)) for job in TRAINING_JOBS if self.hosts(job)}

  def for_task(self, task_type: str, task_index: int = 0) -> "ClusterConfig":
    """The same cluster seen from another task."""
    return dataclasses.replace(self, task_type=task_type, task_index=task_index)

  def to_tf_config(self) -> dict:
    """The TF_CONFIG of this task: the training cluster and this task.

    The evaluator is left out of the cluster of every task (TensorFlow issue 46169: a chief that sees an evaluator in
    its cluster waits for it forever); the evaluator's own TF_CONFIG names it as its task, as `tf.estimator` did.
    """
    return {"cluster": self.training_cluster(), "task": {"type": self.task_type, "index": self.task_index}}

  def sizes(self) -> str:
    """The size of each job, for logs: `1 chief, 2 worker, 1 ps`."""
    return ", ".join(f"{len(self.hosts(job))} {job}" for job in JOB_NAMES if self.hosts(job))

  def describe(self) -> str:
    """This task and the cluster, for logs: `chief:0 of 1 chief, 2 worker, 1 ps`."""
    return f"{self.task_type}:{self.task_index} of {self.sizes()}"


def _address_key(host: str) -> Tuple[str, str]:
  """What makes two `host:port` entries one address: host names ignore case, and a port is a number (02222 is
  2222)."""
  name, _, port = host.rpartition(":")
  return name.lower(), port.lstrip("0")


def _validate(config: ClusterConfig) -> None:
  if not config.ps_hosts:
    raise ClusterConfigError("ps_hosts is empty; a parameter-server cluster needs at least one ps")
  if not config.worker_hosts:
    raise ClusterConfigError("worker_hosts is empty; a parameter-server cluster needs at least one worker")
  for job in ("chief", "evaluator"):
    hosts = config.hosts(job)
    if len(hosts) > 1:
      raise ClusterConfigError(f"{job}_hosts has {len(hosts)} entries ({', '.join(hosts)}); at most one {job} "
                               "is allowed")
  seen = {}
  for job in JOB_NAMES:
    for index, host in enumerate(config.hosts(job)):
      where, key = f"{job}_hosts[{index}]", _address_key(host)
      if key in seen:
        raise ClusterConfigError(f"{host} is used twice ({seen[key]} and {where}); each task needs its own "
                                 "host:port")
      seen[key] = where
  if config.task_type not in JOB_NAMES:
    raise ClusterConfigError(f"job_name {config.task_type!r} is not one of {', '.join(JOB_NAMES)}")
  if isinstance(config.task_index, bool) or not isinstance(config.task_index, int):
    raise ClusterConfigError(f"task_index {config.task_index!r} is not an integer")
  count = len(config.hosts(config.task_type))
  # A chief or evaluator may run unlisted (then it is the only one of its job, index 0).
  allowed = max(count, 1) if config.task_type in ("chief", "evaluator") else count
  if not 0 <= config.task_index < allowed:
    raise ClusterConfigError(f"task_index {config.task_index} is out of range for job {config.task_type!r} with "
                             f"{count} task(s); allowed 0-{allowed - 1}")


def from_tf_config(text: str) -> ClusterConfig:
  """Parses a TF_CONFIG JSON string (as an orchestrator such as a Kubernetes TFJob sets it)."""
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ClusterConfigError(f"TF_CONFIG is not valid JSON ({e.msg} at position {e.pos}): {text[:80]!r}") from None
  if not isinstance(data, dict) or not isinstance(data.get("cluster"), dict):
    raise ClusterConfigError(f"TF_CONFIG needs a 'cluster' object mapping jobs to host lists: {text[:80]!r}")
  cluster = data["cluster"]
  unknown = sorted(set(cluster) - set(JOB_NAMES))
  if unknown:
    raise ClusterConfigError(f"TF_CONFIG cluster has unknown job {unknown[0]!r}; allowed jobs are "
                             f"{', '.join(JOB_NAMES)}")
  task = data.get("task")
  if not isinstance(task, dict) or "type" not in task:
    raise ClusterConfigError(f"TF_CONFIG needs a 'task' object with 'type' and 'index': {text[:80]!r}")
  index = task.get("index", 0)
  if isinstance(index, bool) or not isinstance(index, int):
    raise ClusterConfigError(f"TF_CONFIG task index {index!r} is not an integer")
  for job, value in cluster.items():
    if not isinstance(value, list):
      raise ClusterConfigError(f"TF_CONFIG cluster.{job}: expected a list of host:port strings, got {value!r}")
  hosts = {f"{job}_hosts": parse_hosts(cluster.get(job), f"TF_CONFIG cluster.{job}") for job in JOB_NAMES}
  return ClusterConfig(task_type=task["type"], task_index=index, **hosts)


def from_hosts(ps_hosts: Hosts, worker_hosts: Hosts, chief_hosts: Hosts = None, evaluator_hosts: Hosts = None,
               task_type: str = "chief", task_index: int = 0) -> ClusterConfig:
  """A `ClusterConfig` from host lists (strings "a:1,b:2" or sequences)."""
  return ClusterConfig(ps_hosts=parse_hosts(ps_hosts, "ps_hosts"),
                       worker_hosts=parse_hosts(worker_hosts, "worker_hosts"),
                       chief_hosts=parse_hosts(chief_hosts, "chief_hosts"),
                       evaluator_hosts=parse_hosts(evaluator_hosts, "evaluator_hosts"), task_type=task_type,
                       task_index=task_index)


def from_environ(environ: Mapping[str, str]) -> Optional[ClusterConfig]:
  """The cluster in `environ["TF_CONFIG"]`, or the one derived from a pod's environment (`from_pod_environ`), or None
  where neither is set."""
  text = environ.get("TF_CONFIG", "").strip()
  derived = environ.get("TFPS_TASK_TYPE", "").strip()
  if text and derived:
    raise ClusterConfigError(f"both TF_CONFIG and TFPS_TASK_TYPE={derived} are set; give one of them")
  if text:
    return from_tf_config(text)
  return from_pod_environ(environ) if derived else None


DEFAULT_HOST_PATTERN = "{job}-{type}-{index}.{service}"
DEFAULT_PORT = 2222
_PATTERN_FIELDS = ("job", "type", "index", "service", "namespace")
_ORDINAL = re.compile(r"-([0-9]+)$")


def from_pod_environ(environ: Mapping[str, str]) -> ClusterConfig:
  """The cluster of a pod started by a StatefulSet, an Indexed Job or a JobSet, from the variables it sets.

  Variables (the manifests of `tfps-k8s` set the TFPS_ ones):
    TFPS_TASK_TYPE: this pod's job (chief, worker, ps or evaluator).
    TFPS_REPLICAS: tasks per job, e.g. "chief=1,ps=2,worker=3,evaluator=1".
    TFPS_HOST_PATTERN: a task's host name, with fields {job} {type} {index} {service} {namespace}
      (default "{job}-{type}-{index}.{service}": StatefulSet `<job>-<type>` behind headless Service `<service>`;
      a JobSet pod is "{job}-{type}-0-{index}.{service}").
    TFPS_JOB: the training job's name ({job}); TFPS_SERVICE: the headless Service (default: TFPS_JOB);
    TFPS_NAMESPACE (else POD_NAMESPACE, else "default"); TFPS_PORT: every task's port (default 2222).
    This task's index: TFPS_TASK_INDEX, else JOB_COMPLETION_INDEX (Indexed Job, JobSet), else the ordinal ending
      HOSTNAME (StatefulSet pod `name-3`).

  Raises:
    ClusterConfigError: a variable is missing or malformed; the message names it and its value.
  """
  task_type = environ.get("TFPS_TASK_TYPE", "").strip()
  replicas = parse_replicas(environ.get("TFPS_REPLICAS", ""))
  port = _env_int(environ, "TFPS_PORT", DEFAULT_PORT)
  if not 1 <= port <= _MAX_PORT:
    raise ClusterConfigError(f"TFPS_PORT={port} is out of range; allowed 1-{_MAX_PORT}")
  fields = {"job": environ.get("TFPS_JOB", "").strip(),
            "namespace": environ.get("TFPS_NAMESPACE", "").strip() or environ.get("POD_NAMESPACE", "").strip()
                         or "default"}
  fields["service"] = environ.get("TFPS_SERVICE", "").strip() or fields["job"]
  pattern = environ.get("TFPS_HOST_PATTERN", "").strip() or DEFAULT_HOST_PATTERN
  hosts = {f"{job}_hosts": tuple(f"{_host_name(pattern, fields, job, index)}:{port}" for index in range(count))
           for job, count in replicas.items()}
  return ClusterConfig(task_type=task_type, task_index=_pod_task_index(environ), **hosts)


def parse_replicas(text: str) -> dict:
  """`{"ps": 2, "worker": 3}` from "ps=2,worker=3" (the value of TFPS_REPLICAS)."""
  replicas = {}
  for item in (part.strip() for part in text.split(",") if part.strip()):
    job, _, count = item.partition("=")
    job = job.strip()
    if job not in JOB_NAMES or not _is_number(count.strip()):
      raise ClusterConfigError(f"TFPS_REPLICAS entry {item!r} is not job=count with job one of "
                               f"{', '.join(JOB_NAMES)} (e.g. ps=2,worker=3,chief=1)")
    replicas[job] = int(count)
  if not replicas:
    raise ClusterConfigError(f"TFPS_REPLICAS={text!r} names no job; expected e.g. chief=1,ps=2,worker=3")
  return replicas


def _host_name(pattern: str, fields: dict, task_type: str, index: int) -> str:
  try:
    name = pattern.format(**fields, type=task_type, index=index)
  except (KeyError, IndexError, ValueError, AttributeError) as e:
    raise ClusterConfigError(f"TFPS_HOST_PATTERN={pattern!r} is not a pattern over "
                             f"{', '.join('{' + f + '}' for f in _PATTERN_FIELDS)} ({e})") from None
  if "{job}" in pattern and not fields["job"]:
    raise ClusterConfigError(f"TFPS_HOST_PATTERN={pattern!r} uses {{job}} but TFPS_JOB is not set")
  return name


def _is_number(text: str) -> bool:
  """Whether `text` is digits 0-9 (`str.isdigit` takes "²" too, which `int` refuses)."""
  return text.isascii() and text.isdigit()


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
  text = environ.get(name, "").strip()
  if not text:
    return default
  if not _is_number(text):
    raise ClusterConfigError(f"{name}={text!r} is not a non-negative integer")
  return int(text)


def _pod_task_index(environ: Mapping[str, str]) -> int:
  for name in ("TFPS_TASK_INDEX", "JOB_COMPLETION_INDEX"):
    if environ.get(name, "").strip():
      return _env_int(environ, name, 0)
  hostname = environ.get("HOSTNAME", "").strip()
  match = _ORDINAL.search(hostname.split(".")[0])
  if not match:
    raise ClusterConfigError(f"no task index: TFPS_TASK_INDEX and JOB_COMPLETION_INDEX are unset and HOSTNAME="
                             f"{hostname!r} does not end in -<ordinal> (as a StatefulSet pod's does)")
  return int(match.group(1))
