"""The pods of `tfps-k8s` manifests run as processes on test hosts, under the restart and success rules the manifests
themselves state, as their controller would apply them.

Everything a pod runs is taken from the manifest: its command, its environment (a `fieldRef` to the namespace gives
the namespace), and what its controller adds: HOSTNAME and JOB_COMPLETION_INDEX of an Indexed Job's pod (a JobSet's
pod is `<jobset>-<job>-0-<index>`, a plain Job's `<job name>-<index>`, both in the subdomain the manifest names), or
the TF_CONFIG the TFJob operator writes (`<name>-<type>-<index>.<namespace>.svc:<port>`, the evaluator included). Each
pod runs on its own test host, which answers to that DNS name.

The rules, from the manifest: a pod that fails is started again where its restart policy is OnFailure (TFJob:
the replica's), and counts against its Job's `backoffLimit` either way; a Job past it fails. A JobSet then applies
the first failure-policy rule that targets the Job (none: RestartJobSet): every pod is killed and the set started
again, ps first, at most `maxRestarts` times. A TFJob or plain Job that fails fails the run. The run has succeeded
when the jobs a JobSet's successPolicy names (TFJob: the chief; plain: every Job) have completed.

    with TestHosts(K8sPods.host_names(replicas), aliases=...) as hosts:
      pods = K8sPods(documents, hosts, log_dir)
      pods.start()
      state = pods.run_until_done(timeout_secs=600, on_poll=inject_faults)
"""

import json
import os
import signal
import subprocess
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tfps.testing import hosts as hosts_lib

Task = Tuple[str, int]
START_ORDER = ("ps", "worker", "chief", "evaluator")
TFJOB_JOBS = {"Chief": "chief", "PS": "ps", "Worker": "worker", "Evaluator": "evaluator"}


class Pod:
  """One pod: its task, command, environment, DNS name, restart policy and its Job's name."""

  def __init__(self, task: Task, argv: List[str], env: Dict[str, str], dns_name: str, restart_policy: str,
               job: str):
    self.task, self.argv, self.env, self.dns_name = task, argv, env, dns_name
    self.restart_policy, self.job = restart_policy, job
    self.process: Optional[subprocess.Popen] = None
    self.exit_codes: List[int] = []


def _env(container: dict, namespace: str) -> Dict[str, str]:
  env = {}
  for item in container.get("env", []):
    ref = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    env[item["name"]] = namespace if ref == "metadata.namespace" else item["value"]
  return env


def _indexed_pods(job_spec: dict, job: str, job_name: str, hostname: Callable[[int], str], subdomain: str,
                  namespace: str) -> List[Pod]:
  pod_spec = job_spec["template"]["spec"]
  container = pod_spec["containers"][0]
  return [Pod((job, index), list(container["command"]),
              dict(_env(container, namespace), HOSTNAME=hostname(index), JOB_COMPLETION_INDEX=str(index)),
              f"{hostname(index)}.{subdomain}", pod_spec["restartPolicy"], job_name)
          for index in range(job_spec["completions"])]


def pods_of(documents: Sequence[dict]) -> Tuple[str, List[Pod], Dict[str, int], dict]:
  """`(kind, pods, backoff limit per Job, the JobSet's or TFJob's spec)` of the manifests `documents`."""
  main = documents[0]
  namespace = main["metadata"]["namespace"]
  if main["kind"] == "JobSet":
    name, spec = main["metadata"]["name"], main["spec"]
    pods, limits = [], {}
    for replicated in spec["replicatedJobs"]:
      job, job_spec = replicated["name"], replicated["template"]["spec"]
      pods += _indexed_pods(job_spec, job, job, lambda i, job=job: f"{name}-{job}-0-{i}",
                            spec["network"]["subdomain"], namespace)
      limits[job] = job_spec["backoffLimit"]
    return "jobset", pods, limits, spec
  if main["kind"] == "TFJob":
    return "tfjob", *_tfjob_pods(main, namespace)
  pods, limits = [], {}
  for document in documents:
    if document["kind"] == "Job":
      job_name, job_spec = document["metadata"]["name"], document["spec"]
      job = job_name.rsplit("-", 1)[1]
      pods += _indexed_pods(job_spec, job, job_name, lambda i, job_name=job_name: f"{job_name}-{i}",
                            job_spec["template"]["spec"]["subdomain"], namespace)
      limits[job_name] = job_spec["backoffLimit"]
  return "plain", pods, limits, {}


def _tfjob_pods(tfjob: dict, namespace: str) -> Tuple[List[Pod], Dict[str, int], dict]:
  name, spec = tfjob["metadata"]["name"], tfjob["spec"]
  replicas = {TFJOB_JOBS[kind]: replica for kind, replica in spec["tfReplicaSpecs"].items()}
  def dns(job, index):
    return f"{name}-{job}-{index}.{namespace}.svc"
  cluster = {}
  for job, replica in replicas.items():
    port = replica["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    cluster[job] = [f"{dns(job, index)}:{port}" for index in range(replica["replicas"])]
  pods = []
  for job, replica in replicas.items():
    container = replica["template"]["spec"]["containers"][0]
    for index in range(replica["replicas"]):
      tf_config = {"cluster": cluster, "task": {"type": job, "index": index}, "environment": "cloud"}
      pods.append(Pod((job, index), list(container["command"]),
                      dict(_env(container, namespace), TF_CONFIG=json.dumps(tf_config)), dns(job, index),
                      replica["restartPolicy"], name))
  return pods, {name: spec["runPolicy"]["backoffLimit"]}, spec


class K8sPods:
  """Runs the pods of `documents` on `hosts` (each pod on the host `host_name(task)`), logs in `log_dir`."""

  def __init__(self, documents: Sequence[dict], hosts: hosts_lib.TestHosts, log_dir: str,
               env: Optional[Dict[str, str]] = None):
    self.kind, pods, self.backoff_limits, self.spec = pods_of(documents)
    self.pods = {pod.task: pod for pod in sorted(pods, key=lambda p: (START_ORDER.index(p.task[0]), p.task[1]))}
    self.hosts, self.log_dir, self.base_env = hosts, log_dir, dict(os.environ if env is None else env)
    self.failures = {job: 0 for job in self.backoff_limits}
    self.set_restarts = 0
    self.state = "Running"
    self.events: List[str] = []
    os.makedirs(log_dir, exist_ok=True)

  @staticmethod
  def host_name(task: Task) -> str:
    return f"{task[0]}-{task[1]}"

  def log_path(self, task: Task) -> str:
    return os.path.join(self.log_dir, f"{self.host_name(task)}.log")

  def log(self, task: Task) -> str:
    with open(self.log_path(task), errors="replace") as f:
      return f.read()

  def start(self, tasks: Optional[Sequence[Task]] = None) -> None:
    """Starts `tasks` (default: every pod), ps first."""
    for task in tasks or list(self.pods):
      pod = self.pods[task]
      env = dict(self.base_env, PYTHONUNBUFFERED="1", **pod.env)
      if "TF_CONFIG" not in pod.env:
        env.pop("TF_CONFIG", None)
      with open(self.log_path(task), "ab") as log:
        log.write(f"===== {time.strftime('%H:%M:%S')} start {pod.dns_name}\n".encode())
        log.flush()
        pod.process = self.hosts.popen(self.host_name(task), pod.argv, env=env, stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

  def kill(self, task: Task) -> None:
    """SIGKILL to `task`'s pod (a fault); the rules then act on its exit."""
    process = self.pods[task].process
    if process is not None and process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait(timeout=30)

  def _job(self, pod: Pod) -> str:
    return pod.job if self.kind != "jobset" else pod.task[0]

  def poll(self) -> str:
    """Applies the rules to every pod that exited since the last call; returns the run's state."""
    for pod in self.pods.values():
      if pod.process is None or pod.process.poll() is None:
        continue
      code = pod.process.returncode
      pod.exit_codes.append(code)
      pod.process = None
      if code == 0 or self.state != "Running":
        continue
      job = self._job(pod)
      self.failures[job] += 1
      self.events.append(f"{self.host_name(pod.task)} exited {code}")
      if self.failures[job] > self.backoff_limits[job]:
        self._job_failed(job)
      elif pod.restart_policy == "OnFailure" or self.kind != "tfjob":
        self.start([pod.task])  # OnFailure: the container again; Never: a new pod of the Job, the same name
    if self.state == "Running" and self._succeeded():
      self.state = "Succeeded"
    return self.state

  def _job_failed(self, job: str) -> None:
    if self.kind != "jobset":
      self.state = "Failed"
      return
    policy = self.spec.get("failurePolicy", {})
    rule = next((rule for rule in policy.get("rules", []) if job in rule.get("targetReplicatedJobs") or
                 not rule.get("targetReplicatedJobs")), {"action": "RestartJobSet"})
    if rule["action"] != "RestartJobSet" or self.set_restarts >= policy.get("maxRestarts", 0):
      self.state = "Failed"
      return
    self.set_restarts += 1
    self.events.append(f"job {job} failed: the set restarted ({self.set_restarts})")
    for task in self.pods:
      self.kill(task)
      self.pods[task].process = None
    self.failures = {name: 0 for name in self.failures}
    self.start()

  def _succeeded(self) -> bool:
    def done(job):
      return all(done_task(pod) for pod in self.pods.values() if self._job(pod) == job)
    if self.kind == "jobset":
      targets = self.spec["successPolicy"].get("targetReplicatedJobs") or list(self.backoff_limits)
      return all(done(job) for job in targets)
    if self.kind == "tfjob":
      return done_task(self.pods[("chief", 0)])
    return all(done(job) for job in self.backoff_limits)

  def run_until_done(self, timeout_secs: float, on_poll: Optional[Callable[["K8sPods"], None]] = None) -> str:
    """Polls until the run succeeded or failed (or `timeout_secs`: "Timeout"); `on_poll(self)` injects faults."""
    deadline = time.monotonic() + timeout_secs
    while self.poll() == "Running":
      if time.monotonic() > deadline:
        return "Timeout"
      if on_poll is not None:
        on_poll(self)
      time.sleep(0.2)
    return self.state

  def running(self) -> List[Task]:
    """The pods whose process still runs (call `poll` first to record the others' exits)."""
    return [task for task, pod in self.pods.items() if pod.process is not None]


def done_task(pod: Pod) -> bool:
  return pod.process is None and pod.exit_codes[-1:] == [0]
