"""Kubernetes manifests for a tfps training job: a Kubeflow TFJob, or plain Kubernetes, and a NetworkPolicy.

Imports no TensorFlow. Every task runs the same command (the training script and its flags, without cluster flags):
  - TFJob: the operator writes each pod's TF_CONFIG (names `<name>-<type>-<index>.<namespace>.svc:2222`, the
    evaluator in the cluster); restart policy OnFailure for every replica type: a failed ps or chief is started
    again and the chief resumes from its last checkpoint (a lost ps makes the chief exit with status 3), a failed
    worker is started again alone and rejoins.
  - Plain Kubernetes: a headless Service `<name>`, a StatefulSet per server job (`<name>-ps`, `<name>-worker`:
    pods `<name>-ps-0`...) and an Indexed Job per finishing job (`<name>-chief`, `<name>-evaluator`: pods with
    hostname `<name>-chief-0` in the Service's subdomain); tfps derives the cluster at start from TFPS_ variables
    and the pod's ordinal or JOB_COMPLETION_INDEX (`tfps.cluster.config.from_pod_environ`).
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


def pod_env(spec: JobSpec, job: str) -> List[dict]:
  """The variables from which tfps derives a plain-Kubernetes pod's cluster (`config.from_pod_environ`)."""
  env = [{"name": "TFPS_TASK_TYPE", "value": job}, {"name": "TFPS_REPLICAS", "value": replicas_text(spec)},
         {"name": "TFPS_JOB", "value": spec.name}, {"name": "TFPS_SERVICE", "value": spec.name},
         {"name": "TFPS_PORT", "value": str(spec.port)},
         {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
  return env


def build_plain(spec: JobSpec) -> List[dict]:
  """A headless Service, a StatefulSet per server job and an Indexed Job per finishing job."""
  meta = {"namespace": spec.namespace, "labels": {LABEL: spec.name}}
  service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": spec.name, **meta},
             "spec": {"clusterIP": "None", "selector": {LABEL: spec.name}, "publishNotReadyAddresses": True,
                      "ports": [{"name": "grpc", "port": spec.port, "targetPort": spec.port, "protocol": "TCP"}]}}
  documents = [service]
  for job in spec.jobs():
    name = f"{spec.name}-{job}"
    template = {"metadata": {"labels": _labels(spec, job)}}
    container = _container(spec, pod_env(spec, job))
    if job in SERVER_JOBS:  # serve until the job is deleted; a failed one is started again with the same name
      template["spec"] = _pod_spec(spec, container, "Always")
      documents.append({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, **meta},
                        "spec": {"serviceName": spec.name, "replicas": spec.count(job),
                                 "podManagementPolicy": "Parallel",
                                 "selector": {"matchLabels": _labels(spec, job)}, "template": template}})
    else:  # finish; a failed one is started again (the chief resumes from its checkpoint)
      template["spec"] = _pod_spec(spec, container, "OnFailure", subdomain=spec.name)
      documents.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, **meta},
                        "spec": {"completionMode": "Indexed", "completions": spec.count(job),
                                 "parallelism": spec.count(job), "backoffLimit": 10, "template": template}})
  return documents


def build_network_policy(spec: JobSpec) -> dict:
  """Only the job's own pods reach the task port of its pods."""
  selector = {"matchLabels": {LABEL: spec.name}}
  return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": {"name": f"{spec.name}-tasks", "namespace": spec.namespace, "labels": {LABEL: spec.name}},
          "spec": {"podSelector": selector, "policyTypes": ["Ingress"],
                   "ingress": [{"from": [{"podSelector": selector}],
                                "ports": [{"protocol": "TCP", "port": spec.port}]}]}}


def build_manifests(spec: JobSpec, kind: str) -> List[dict]:
  """`kind` "tfjob" or "plain": the job's manifests, NetworkPolicy included."""
  if kind == "tfjob":
    return [build_tfjob(spec), build_network_policy(spec)]
  if kind == "plain":
    return [*build_plain(spec), build_network_policy(spec)]
  raise UsageError(f"--kind={kind!r}: allowed tfjob, plain")
