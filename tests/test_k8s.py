"""tfps-k8s: the manifests validate offline (core kinds, with kubernetes-validate), the TFJob has the structure the
Kubeflow operator needs, and the cluster a plain-Kubernetes pod derives from its manifest is the one the test-host
runs use (tests/test_many_hosts.py runs the same names and variables)."""

import json
import pathlib

import pytest

import needs
from tfps.cluster import config as cluster_lib
from tfps.cluster import k8s_cli


REPO = pathlib.Path(__file__).resolve().parents[1]
HOSTS = ["--ps_hosts=a:2222,b:2222", "--worker_hosts=c:2222,d:2222,e:2222", "--chief_hosts=f:2222",
         "--evaluator_hosts=g:2222"]
COMMAND = ["python", "scripts/train_keras.py", *HOSTS, "--flagfile=configs/wide_deep_synthetic.cfg",
           "--model_dir=/shared/run", "--epochs=2"]
K8S_VERSION = "1.30"


def manifests(tmp_path, *flags, command=COMMAND):
  out = tmp_path / "job.yaml"
  code = k8s_cli.main(["tfps-k8s", "--name=ctr", "--namespace=team", "--image=registry.example/tfps:1",
                       "--claim=tfps-models", f"--output={out}", *flags, "--", *command], cwd=str(REPO))
  assert code == 0
  return [json.loads(doc) for doc in out.read_text().split("---\n") if doc.strip()]


def test_tfjob_has_one_replica_spec_per_job_with_restart_on_failure(tmp_path):
  tfjob, policy = manifests(tmp_path)
  assert (tfjob["apiVersion"], tfjob["kind"]) == ("kubeflow.org/v1", "TFJob")
  specs = tfjob["spec"]["tfReplicaSpecs"]
  assert {name: spec["replicas"] for name, spec in specs.items()} == {"Chief": 1, "PS": 2, "Worker": 3,
                                                                     "Evaluator": 1}
  for spec in specs.values():
    assert spec["restartPolicy"] == "OnFailure"  # a lost ps makes the chief exit 2: it is started again and resumes
    container, = spec["template"]["spec"]["containers"]
    assert container["name"] == "tensorflow"
    assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222, "protocol": "TCP"}]
    assert container["command"] == ["python", "scripts/train_keras.py", "--flagfile=configs/wide_deep_synthetic.cfg",
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


def test_plain_kubernetes_validates_and_each_pod_derives_the_test_host_cluster(tmp_path):
  documents = manifests(tmp_path, "--kind=plain")
  kinds = [(d["kind"], d["metadata"]["name"]) for d in documents]
  assert kinds == [("Service", "ctr"), ("Job", "ctr-chief"),
                   ("StatefulSet", "ctr-worker"), ("StatefulSet", "ctr-ps"), ("Job", "ctr-evaluator"),
                   ("NetworkPolicy", "ctr-tasks")]
  validate(documents)
  broken = json.loads(json.dumps(documents[2]))
  broken["spec"]["replicas"] = "three"
  with pytest.raises(validator().ValidationError):  # the validator does look at the documents
    validate([broken])
  service = documents[0]
  assert service["spec"]["clusterIP"] == "None"
  for document in documents[1:-1]:
    pod = document["spec"]["template"]["spec"]
    job = document["metadata"]["name"].split("-", 1)[1]
    if document["kind"] == "Job":
      assert pod["subdomain"] == "ctr" and document["spec"]["completionMode"] == "Indexed"
    else:
      assert document["spec"]["serviceName"] == "ctr"
    env = {item["name"]: item.get("value") for item in pod["containers"][0]["env"]}
    env["POD_NAMESPACE"] = "team"  # from the fieldRef
    count = document["spec"].get("replicas") or document["spec"]["completions"]
    for index in range(count):
      pod_env = dict(env, HOSTNAME=f"ctr-{job}-{index}")  # StatefulSet pod name / Indexed Job hostname
      if document["kind"] == "Job":
        pod_env["JOB_COMPLETION_INDEX"] = str(index)
      config = cluster_lib.from_environ(pod_env)
      assert (config.task_type, config.task_index) == (job, index)
      assert config.address == f"ctr-{job}-{index}.ctr:2222"  # HostCluster(form="jobset") names its hosts so
      assert config.ps_hosts == ("ctr-ps-0.ctr:2222", "ctr-ps-1.ctr:2222")
      assert len(config.worker_hosts) == 3


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
])
def test_bad_input_is_one_line(tmp_path, capsys, flags, command, message):
  code = k8s_cli.main(["tfps-k8s", "--name=ctr", "--image=i", "--claim=c", *flags, "--", *command], cwd=str(REPO))
  err = capsys.readouterr().err
  assert code == 2
  assert message in err and err.count("\n") == 1, err
