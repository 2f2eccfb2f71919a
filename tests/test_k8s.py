"""tfps-k8s: the manifests validate offline (core kinds with kubernetes-validate, the JobSet against the JobSet CRD's
own schema, vendored in tests/fixtures), the TFJob has the structure the Kubeflow operator needs, and the cluster a
JobSet or plain-Kubernetes pod derives from its manifest is the one the test-host runs use (tests/test_many_hosts.py
runs the same names and variables)."""

import copy
import json
import pathlib

import jsonschema
import pytest

import needs
from tfps.cluster import config as cluster_lib
from tfps.cluster import k8s_cli


REPO = pathlib.Path(__file__).resolve().parents[1]
HOSTS = ["--ps_hosts=a:2222,b:2222", "--worker_hosts=c:2222,d:2222,e:2222", "--chief_hosts=f:2222",
         "--evaluator_hosts=g:2222"]
COMMAND = ["python", "scripts/train.py", *HOSTS, "--flagfile=configs/wide_deep_synthetic.cfg",
           "--model_dir=/shared/run", "--epochs=2"]
K8S_VERSION = "1.30"


def manifests(tmp_path, *flags, command=COMMAND):
  out = tmp_path / "job.yaml"
  code = k8s_cli.main(["tfps-k8s", "--name=ctr", "--namespace=team", "--image=registry.example/tfps:1",
                       "--claim=tfps-models", f"--output={out}", *flags, "--", *command], cwd=str(REPO))
  assert code == 0
  return [json.loads(doc) for doc in out.read_text().split("---\n") if doc.strip()]


def test_tfjob_has_one_replica_spec_per_job_with_restart_on_failure(tmp_path):
  tfjob, policy = manifests(tmp_path, "--kind=tfjob")
  assert (tfjob["apiVersion"], tfjob["kind"]) == ("kubeflow.org/v1", "TFJob")
  assert tfjob["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"  # pods still running at the end are removed
  specs = tfjob["spec"]["tfReplicaSpecs"]
  assert {name: spec["replicas"] for name, spec in specs.items()} == {"Chief": 1, "PS": 2, "Worker": 3,
                                                                     "Evaluator": 1}
  for spec in specs.values():
    assert spec["restartPolicy"] == "OnFailure"  # a lost ps makes the chief exit 2: it is started again and resumes
    container, = spec["template"]["spec"]["containers"]
    assert container["name"] == "tensorflow"
    assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"}]
    assert container["command"] == ["python", "scripts/train.py", "--flagfile=configs/wide_deep_synthetic.cfg",
                                    "--model_dir=/shared/run", "--epochs=2"]  # cluster flags left to TF_CONFIG
    assert container["volumeMounts"] == [{"name": "model-dir", "mountPath": "/shared"}]
    assert spec["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {"claimName": "tfps-models"}
  validate([policy])


def validator():
  """kubernetes-validate (a test dependency), or the test's skip (its failure under CI=true)."""
  return needs.require_module("kubernetes_validate", "pip install -e '.[test]'")


def validate(documents):
  for document in documents:
    validator().validate(document, K8S_VERSION, strict=True)


def check_pods_derive_their_cluster(job, job_spec, hostname, address):
  """Each pod of an Indexed Job `job_spec` (for task type `job`) derives its own task and the cluster's names from
  its manifest's variables, JOB_COMPLETION_INDEX and HOSTNAME; `hostname(i)`, `address(job, i)` are the orchestrator's
  names."""
  pod = job_spec["template"]["spec"]
  assert job_spec["completionMode"] == "Indexed" and job_spec["completions"] == job_spec["parallelism"]
  env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
  env["POD_NAMESPACE"] = "team"  # from the fieldRef
  for index in range(job_spec["completions"]):
    config = cluster_lib.from_environ(dict(env, HOSTNAME=hostname(index), JOB_COMPLETION_INDEX=str(index)))
    assert (config.task_type, config.task_index) == (job, index)
    assert config.address == address(job, index)
    assert config.ps_hosts == (address("ps", 0), address("ps", 1))
    assert len(config.worker_hosts) == 3 and config.chief_hosts == (address("chief", 0),)


def test_plain_kubernetes_is_indexed_jobs_that_validate_and_derive_the_test_host_cluster(tmp_path):
  documents = manifests(tmp_path, "--kind=plain")
  kinds = [(d["kind"], d["metadata"]["name"]) for d in documents]
  assert kinds == [("Service", "ctr"), ("Job", "ctr-chief"), ("Job", "ctr-worker"), ("Job", "ctr-ps"),
                   ("Job", "ctr-evaluator"), ("NetworkPolicy", "ctr-tasks")]  # Jobs: a finished run completes
  validate(documents)
  broken = json.loads(json.dumps(documents[2]))
  broken["spec"]["completions"] = "three"
  with pytest.raises(validator().ValidationError):  # the validator does look at the documents
    validate([broken])
  assert documents[0]["spec"]["clusterIP"] == "None"
  for document in documents[1:-1]:
    job = document["metadata"]["name"].split("-", 1)[1]
    pod = document["spec"]["template"]["spec"]
    assert pod["subdomain"] == "ctr" and pod["restartPolicy"] == "OnFailure"  # a failed pod restarts alone
    # An Indexed Job's pod is named <job name>-<index>; HostCluster(form="jobset") names its hosts so.
    check_pods_derive_their_cluster(job, document["spec"], lambda i, job=job: f"ctr-{job}-{i}",
                                    lambda job, i: f"ctr-{job}-{i}.ctr:2222")


JOBSET_SCHEMA = json.loads((REPO / "tests" / "fixtures" / "jobset_v1alpha2_schema.json").read_text())


def strict(schema):
  """`schema` with unknown fields refused where it lists an object's fields (kubectl's strict field validation),
  so that a misspelt field fails instead of being pruned by the API server."""
  schema = copy.deepcopy(schema)
  def close(node):
    if isinstance(node, dict):
      if "properties" in node and "additionalProperties" not in node and not node.get(
          "x-kubernetes-preserve-unknown-fields"):
        node["additionalProperties"] = False
      for value in node.values():
        close(value)
    elif isinstance(node, list):
      for value in node:
        close(value)
  close(schema)
  return schema


STRICT_JOBSET_SCHEMA = strict(JOBSET_SCHEMA["openAPIV3Schema"])


def validate_jobset(document):
  jsonschema.validate(document, STRICT_JOBSET_SCHEMA, cls=jsonschema.Draft4Validator)


def test_jobset_validates_against_the_crds_schema_and_restarts_the_set_for_a_ps(tmp_path):
  jobset, policy = manifests(tmp_path, "--max_restarts=5")  # the default kind
  assert JOBSET_SCHEMA["commit"] == "08dfbdfd682714a9ab929633eca8dc95315187e7"  # the vendored CRD's version
  assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
  validate_jobset(jobset)
  validate([policy])
  for path, value in [(("spec", "successPolicy", "operator"), "Most"), (("spec", "replicatedJob"), []),
                      (("spec", "failurePolicy", "maxRestarts"), "5")]:
    broken = copy.deepcopy(jobset)
    parent = broken
    for key in path[:-1]:
      parent = parent[key]
    parent[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):  # the schema does look at the document
      validate_jobset(broken)
  spec = jobset["spec"]
  assert [job["name"] for job in spec["replicatedJobs"]] == ["ps", "worker", "chief", "evaluator"]
  assert spec["network"] == {"enableDNSHostnames": True, "subdomain": "ctr", "publishNotReadyAddresses": True}
  assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief", "evaluator"]}
  assert spec["failurePolicy"] == {"maxRestarts": 5, "rules": [
      {"name": "psFailed", "action": "RestartJobSet", "targetReplicatedJobs": ["ps"]}]}
  for replicated in spec["replicatedJobs"]:
    job, job_spec = replicated["name"], replicated["template"]["spec"]
    pod = job_spec["template"]["spec"]
    assert replicated["replicas"] == 1 and pod["containers"][0]["command"] == tfjob_command()
    assert job_spec["template"]["metadata"]["labels"]["tfps.job"] == "ctr"  # what the NetworkPolicy admits
    if job == "ps":  # a failed ps fails its Job at once (no pod restart): the set is recreated
      assert (pod["restartPolicy"], job_spec["backoffLimit"]) == ("Never", 0)
    else:  # a failed worker, chief or evaluator is started again alone
      assert pod["restartPolicy"] == "OnFailure" and job_spec["backoffLimit"] == 10
    assert replicated.get("dependsOn") == ([{"name": "ps", "status": "Ready"}] if job in ("worker", "chief")
                                           else None)  # started once every ps serves (its readiness probe)
    # A JobSet pod's host name: <jobset>-<replicated job>-<job index>-<pod index>.<subdomain>.
    check_pods_derive_their_cluster(job, job_spec, lambda i, job=job: f"ctr-{job}-0-{i}",
                                    lambda job, i: f"ctr-{job}-0-{i}.ctr:2222")


def tfjob_command():
  return ["python", "scripts/train.py", "--flagfile=configs/wide_deep_synthetic.cfg", "--model_dir=/shared/run",
          "--epochs=2"]


def test_network_policy_admits_only_the_jobs_pods_to_the_task_port(tmp_path):
  policy = manifests(tmp_path)[-1]
  assert policy["spec"]["podSelector"] == {"matchLabels": {"tfps.job": "ctr"}}
  assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": {"tfps.job": "ctr"}}}],
                                        "ports": [{"protocol": "TCP", "port": 2222}]}]


@pytest.mark.parametrize("flags,command,message", [
    ([], ["python", "t.py", "--ps_hosts=a:1", "--worker_hosts=b:1", "--chief_hosts=c:1", "--model_dir=/tmp/x"],
     "--model_dir=/tmp/x is not under --mount_path=/shared"),
    ([], ["python", "t.py", "--flagfile=configs/main.cfg", "--model_dir=/shared/x"],
     "a job needs 1 chief, at least 1 ps and 1 worker"),
    ([], ["python", "t.py", "--flagfile=configs/cluster_local.cfg", "--model_dir=/shared/x"],
     "flagfile configs/cluster_local.cfg sets --ps_hosts"),
    (["--name=Bad_Name"], COMMAND, "--name='Bad_Name' is not a DNS label"),
    (["--kind=helm"], COMMAND, "--kind"),
    ([], [], "no training command after `--`"),
    (["--kind=tfjob", "--max_restarts=2"], COMMAND, "--max_restarts=2 is a JobSet's (the set recreated after a ps "
     "failed); --kind=tfjob restarts each failed pod alone, up to 10 times per job"),
    (["--kind=plain", "--max_restarts=0"], COMMAND, "--max_restarts=0 is a JobSet's"),
    (["--max_restarts=-1"], COMMAND, "--max_restarts"),
    (["--image="], COMMAND, "--image is required"),
    (["--kind=tfjob", "--claim="], COMMAND, "--claim is required"),
    ([], [*COMMAND, "--evaluator_hosts", "g:2222"], "give --evaluator_hosts with its value after '='"),
    ([], [*COMMAND[:-1], "--model_dir=/shared/../etc/run"], "--model_dir=/etc/run is not under --mount_path=/shared"),
    (["--cpu=-1"], COMMAND, "--cpu=-1 is not a Kubernetes quantity (e.g. 2, 500m, 4Gi)"),
    (["--memory=lots"], COMMAND, "--memory=lots is not a Kubernetes quantity"),
])
def test_bad_input_is_one_line(tmp_path, capsys, flags, command, message):
  out = tmp_path / "job.yaml"
  code = k8s_cli.main(["tfps-k8s", "--name=ctr", "--image=i", "--claim=c", f"--output={out}", *flags, "--",
                       *command], cwd=str(REPO))
  err = capsys.readouterr().err
  assert code == 2
  assert message in err and err.count("\n") == 1, err
  assert not out.exists()  # nothing written


def test_an_output_that_cannot_be_written_is_one_line(capsys):
  code = k8s_cli.main(["tfps-k8s", "--name=ctr", "--image=i", "--claim=c", "--output=/proc/nope/job.yaml", "--",
                       *COMMAND], cwd=str(REPO))
  assert code == 2 and capsys.readouterr().err == "tfps-k8s: --output=/proc/nope/job.yaml cannot be written " \
      "(No such file or directory)\n"
