"""Kubernetes manifests for a tfps training job: a JobSet, a Kubeflow TFJob, or plain Kubernetes, and a NetworkPolicy.

Imports no TensorFlow. Every task runs the same command (the training script and its flags, without cluster flags);
ps and workers given the run's model_dir exit 0 once training has ended (`tfps.cluster.job_end`), so every kind
completes. Which to choose, and what each does on each failure: docs/kubernetes.md.
  - JobSet (`jobset.x-k8s.io/v1alpha2`): one replicated job per task type, each one Indexed Job (pods
    `<name>-<type>-0-<index>` in the JobSet's headless service `<name>`, DNS host names on); the JobSet succeeds when
    the chief and the evaluator have; a failed ps fails its Job (no pod restarts), and the failure policy recreates
    the whole set (the chief resumes from its checkpoint) up to `max_restarts` times; workers, the chief and the
    evaluator are started again alone (restart policy OnFailure); workers and the chief start once every ps is ready.
  - TFJob: the operator writes each pod's TF_CONFIG (names `<name>-<type>-<index>.<namespace>.svc:2222`, the
    evaluator in the cluster); restart policy OnFailure for every replica type: a failed ps or chief is started
    again and the chief resumes from its last checkpoint (a lost ps makes the chief exit with status 3, and each
    worker, which follows its ps: `tfps.cluster.job_end`), a failed worker is started again alone and rejoins. Pods
    still running at the end are removed (cleanPodPolicy Running).
  - Plain Kubernetes: a headless Service `<name>` and an Indexed Job per task type (`<name>-ps`: pods with hostname
    `<name>-ps-0`... in the Service's subdomain), restart policy OnFailure; tfps derives the cluster at start from
    TFPS_ variables and JOB_COMPLETION_INDEX (`tfps.cluster.config.from_pod_environ`).
  - A NetworkPolicy admitting only the job's own pods to the task port (TF servers have no authentication).
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from tfps.cluster import config as cluster_lib
from tfps.errors import UsageError

LABEL = "tfps.job"
CONTAINER = "tensorflow"  # the container name the TFJob operator expects
TFJOB_PORT_NAME = "tfjob-port"
TFJOB_TYPES = {"chief": "Chief", "ps": "PS", "worker": "Worker", "evaluator": "Evaluator"}
SERVER_JOBS = ("ps", "worker")
START_ORDER = ("ps", "worker", "chief", "evaluator")
KINDS = ("jobset", "tfjob", "plain")
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
JOBSET_HOST_PATTERN = "{job}-{type}-0-{index}.{service}"  # <jobset>-<replicated job>-<job index>-<pod index>
DEFAULT_MAX_RESTARTS = 3
POD_BACKOFF_LIMIT = 10  # pod restarts of one job before it fails
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")


@dataclasses.dataclass(frozen=True)
class JobSpec:
  """What the manifests are made from.

  Attributes:
    name: the job's name (a DNS label: lowercase letters, digits, '-').
    namespace: its Kubernetes namespace.
    image: the container image holding tfps and the script.
    command: the command every task runs (e.g. `["python", "train.py", "--model_dir=/shared/run"]`).
    replicas: tasks per job, e.g. `{"chief": 1, "ps": 2, "worker": 3, "evaluator": 1}`.
    claim: the PersistentVolumeClaim holding model_dir, mounted at `mount_path` in every pod.
    port: every task's port.
    cpu, memory: each container's resource requests (and limits).
    max_restarts: JobSet: how many times the failure policy recreates the set.
  """
  name: str
  namespace: str
  image: str
  command: Tuple[str, ...]
  replicas: Tuple[Tuple[str, int], ...]
  claim: str
  mount_path: str = "/shared"
  port: int = cluster_lib.DEFAULT_PORT
  cpu: str = "1"
  memory: str = "2Gi"
  max_restarts: int = DEFAULT_MAX_RESTARTS

  def __post_init__(self):
    for field in ("name", "namespace"):
      value = getattr(self, field)
      if not value or len(value) > 40 or not set(value) <= _NAME_CHARS or value[0] == "-" or value[-1] == "-":
        raise UsageError(f"--{field}={value!r} is not a DNS label of at most 40 characters (a-z, 0-9, '-')")
    if not self.image:
      raise UsageError("--image is required: the container image holding tfps and the training script")
    if not self.claim:
      raise UsageError("--claim is required: the PersistentVolumeClaim every pod mounts for model_dir")
    counts = dict(self.replicas)
    for job, count in counts.items():
      if job not in cluster_lib.JOB_NAMES or count < 0:
        raise UsageError(f"replicas {job}={count}: allowed jobs {', '.join(cluster_lib.JOB_NAMES)}, counts >= 0")
    if counts.get("ps", 0) < 1 or counts.get("worker", 0) < 1 or counts.get("chief", 0) != 1:
      raise UsageError(f"replicas {replicas_text(self)}: a job needs 1 chief, at least 1 ps and 1 worker")
    if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
      raise UsageError(f"--max_restarts={self.max_restarts!r} must be an integer >= 0")

  def count(self, job: str) -> int:
    return dict(self.replicas).get(job, 0)

  def jobs(self) -> List[str]:
    return [job for job in cluster_lib.JOB_NAMES if self.count(job)]


def replicas_text(spec: JobSpec) -> str:
  """TFPS_REPLICAS: `chief=1,worker=3,ps=2,evaluator=1`."""
  return ",".join(f"{job}={count}" for job, count in spec.replicas if count)


def _labels(spec: JobSpec, job: str) -> Dict[str, str]:
  return {LABEL: spec.name, "tfps.task-type": job}


def _container(spec: JobSpec, env: Sequence[dict] = (), port_name: str = "grpc") -> dict:
  return {"name": CONTAINER, "image": spec.image, "command": list(spec.command), "env": list(env),
          "ports": [{"name": port_name, "containerPort": spec.port, "protocol": "TCP"}],
          "resources": {"requests": {"cpu": spec.cpu, "memory": spec.memory},
                        "limits": {"cpu": spec.cpu, "memory": spec.memory}},
          "volumeMounts": [{"name": "model-dir", "mountPath": spec.mount_path}]}


def _pod_spec(spec: JobSpec, container: dict, restart_policy: str, subdomain: Optional[str] = None) -> dict:
  pod = {"restartPolicy": restart_policy, "containers": [container],
         "volumes": [{"name": "model-dir", "persistentVolumeClaim": {"claimName": spec.claim}}]}
  if subdomain:
    pod["subdomain"] = subdomain
  return pod


def build_tfjob(spec: JobSpec) -> dict:
  """The Kubeflow TFJob (kubeflow.org/v1): one replica spec per job, restart policy OnFailure for each."""
  replica_specs = {}
  for job in spec.jobs():
    replica_specs[TFJOB_TYPES[job]] = {
        "replicas": spec.count(job), "restartPolicy": "OnFailure",
        "template": {"metadata": {"labels": _labels(spec, job)},
                     "spec": _pod_spec(spec, _container(spec, port_name=TFJOB_PORT_NAME), "OnFailure")}}
  return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
          "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": {LABEL: spec.name}},
          "spec": {"runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 10},
                   "tfReplicaSpecs": replica_specs}}


def pod_env(spec: JobSpec, job: str, host_pattern: Optional[str] = None) -> List[dict]:
  """The variables from which tfps derives a pod's cluster (`config.from_pod_environ`)."""
  env = [{"name": "TFPS_TASK_TYPE", "value": job}, {"name": "TFPS_REPLICAS", "value": replicas_text(spec)},
         {"name": "TFPS_JOB", "value": spec.name}, {"name": "TFPS_SERVICE", "value": spec.name},
         {"name": "TFPS_PORT", "value": str(spec.port)},
         {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
  if host_pattern:
    env.insert(4, {"name": "TFPS_HOST_PATTERN", "value": host_pattern})
  return env


def _indexed_job(spec: JobSpec, job: str, pod: dict, backoff_limit: int) -> dict:
  """The spec of an Indexed Job running the `job` tasks: pod `i` gets JOB_COMPLETION_INDEX `i`."""
  return {"completionMode": "Indexed", "completions": spec.count(job), "parallelism": spec.count(job),
          "backoffLimit": backoff_limit, "template": {"metadata": {"labels": _labels(spec, job)}, "spec": pod}}


def build_plain(spec: JobSpec) -> List[dict]:
  """A headless Service and an Indexed Job per task type, each pod started again where it fails."""
  meta = {"namespace": spec.namespace, "labels": {LABEL: spec.name}}
  service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": spec.name, **meta},
             "spec": {"clusterIP": "None", "selector": {LABEL: spec.name}, "publishNotReadyAddresses": True,
                      "ports": [{"name": "grpc", "port": spec.port, "targetPort": spec.port, "protocol": "TCP"}]}}
  documents = [service]
  for job in spec.jobs():
    pod = _pod_spec(spec, _container(spec, pod_env(spec, job)), "OnFailure", subdomain=spec.name)
    documents.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{spec.name}-{job}", **meta},
                      "spec": _indexed_job(spec, job, pod, POD_BACKOFF_LIMIT)})
  return documents


def build_jobset(spec: JobSpec) -> dict:
  """The JobSet: a replicated job per task type (ps first), success on the chief and the evaluator, the set recreated
  when a ps fails."""
  replicated = []
  for job in sorted(spec.jobs(), key=START_ORDER.index):
    # the failure policy recreates the set when a ps fails: workers need not end themselves then (`job_end`)
    container = _container(spec, pod_env(spec, job, JOBSET_HOST_PATTERN) + [
        {"name": cluster_lib.PS_FAILURE_RESTARTS_ALL_ENV, "value": "1"}])
    if job in SERVER_JOBS:  # ready once it serves: the chief and workers start after every ps is
      container["readinessProbe"] = {"tcpSocket": {"port": spec.port}, "periodSeconds": 2}
    ps_job = job == "ps"  # a failed ps has lost its variables: no pod restart, its Job fails and the set restarts
    pod = _pod_spec(spec, container, "Never" if ps_job else "OnFailure")
    entry = {"name": job, "replicas": 1, "template": {
        "metadata": {"labels": _labels(spec, job)},
        "spec": _indexed_job(spec, job, pod, 0 if ps_job else POD_BACKOFF_LIMIT)}}
    if job in ("worker", "chief"):
      entry["dependsOn"] = [{"name": "ps", "status": "Ready"}]
    replicated.append(entry)
  succeed = [job for job in ("chief", "evaluator") if spec.count(job)]
  return {"apiVersion": JOBSET_API, "kind": "JobSet",
          "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": {LABEL: spec.name}},
          "spec": {"network": {"enableDNSHostnames": True, "subdomain": spec.name, "publishNotReadyAddresses": True},
                   "successPolicy": {"operator": "All", "targetReplicatedJobs": succeed},
                   "failurePolicy": {"maxRestarts": spec.max_restarts, "rules": [
                       {"name": "psFailed", "action": "RestartJobSet", "targetReplicatedJobs": ["ps"]}]},
                   "replicatedJobs": replicated}}


def build_network_policy(spec: JobSpec) -> dict:
  """Only the job's own pods reach the task port of its pods."""
  selector = {"matchLabels": {LABEL: spec.name}}
  return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": {"name": f"{spec.name}-tasks", "namespace": spec.namespace, "labels": {LABEL: spec.name}},
          "spec": {"podSelector": selector, "policyTypes": ["Ingress"],
                   "ingress": [{"from": [{"podSelector": selector}],
                                "ports": [{"protocol": "TCP", "port": spec.port}]}]}}


def build_manifests(spec: JobSpec, kind: str) -> List[dict]:
  """`kind` "jobset", "tfjob" or "plain": the job's manifests, NetworkPolicy included."""
  if kind == "jobset":
    return [build_jobset(spec), build_network_policy(spec)]
  if kind == "tfjob":
    return [build_tfjob(spec), build_network_policy(spec)]
  if kind == "plain":
    return [*build_plain(spec), build_network_policy(spec)]
  raise UsageError(f"--kind={kind!r}: allowed {', '.join(KINDS)}")
