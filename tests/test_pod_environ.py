"""The cluster from the environment orchestrators give a pod: Kubeflow TFJob's TF_CONFIG, and the TFPS_ variables a
StatefulSet, Indexed Job or JobSet pod gets from tfps-k8s's manifests."""

import json

import pytest

from tfps import flags as flags_lib
from tfps.cluster import config as cluster_lib
from tfps.cluster import config_cli
from tfps.errors import ClusterConfigError

REPLICAS = "chief=1,ps=2,worker=3,evaluator=1"


def pod_env(**extra):
  env = {"TFPS_REPLICAS": REPLICAS, "TFPS_JOB": "ctr", "TFPS_TASK_TYPE": "worker"}
  env.update(extra)
  return env


def test_statefulset_pod_takes_its_index_from_the_hostname_ordinal():
  config = cluster_lib.from_environ(pod_env(HOSTNAME="ctr-worker-2"))
  assert (config.task_type, config.task_index) == ("worker", 2)
  assert config.ps_hosts == ("ctr-ps-0.ctr:2222", "ctr-ps-1.ctr:2222")
  assert config.worker_hosts == tuple(f"ctr-worker-{i}.ctr:2222" for i in range(3))
  assert config.chief_hosts == ("ctr-chief-0.ctr:2222",)
  assert config.evaluator_hosts == ("ctr-evaluator-0.ctr:2222",)
  assert "evaluator" not in config.to_tf_config()["cluster"]


def test_indexed_job_and_jobset_pods_take_their_index_from_job_completion_index():
  env = pod_env(TFPS_TASK_TYPE="ps", JOB_COMPLETION_INDEX="1", HOSTNAME="ctr-ps-0-1-x7k2q",
                TFPS_HOST_PATTERN="{job}-{type}-0-{index}.{service}.{namespace}.svc", TFPS_SERVICE="ctr-svc",
                POD_NAMESPACE="team", TFPS_PORT="3000")
  config = cluster_lib.from_environ(env)
  assert (config.task_type, config.task_index, config.address) == ("ps", 1, "ctr-ps-0-1.ctr-svc.team.svc:3000")


def test_explicit_task_index_wins_over_the_hostname():
  assert cluster_lib.from_environ(pod_env(TFPS_TASK_INDEX="0", HOSTNAME="ctr-worker-2")).task_index == 0


def test_flags_and_tfps_config_honour_the_pod_environment():
  env = pod_env(HOSTNAME="ctr-worker-1")
  from absl import flags
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["prog", "--job_name=worker", "--task_index=1"])
  assert flags_lib.config_from_flags(flag_values, env).address == "ctr-worker-1.ctr:2222"
  flag_values(["prog", "--task_index=2"])
  with pytest.raises(ClusterConfigError, match="--task_index=2 contradicts"):
    flags_lib.config_from_flags(flag_values, env)


def test_tfps_config_prints_the_derived_tf_config(capsys):
  assert config_cli.main(["tfps-config"], environ=pod_env(HOSTNAME="ctr-worker-0")) == 0
  printed = json.loads(capsys.readouterr().out)
  assert printed["task"] == {"type": "worker", "index": 0}
  assert printed["cluster"]["ps"] == ["ctr-ps-0.ctr:2222", "ctr-ps-1.ctr:2222"]


BAD_POD_ENVS = [
    (dict(TFPS_REPLICAS="ps=2,gpu=1"), "TFPS_REPLICAS entry 'gpu=1' is not job=count"),
    (dict(TFPS_REPLICAS="ps=two"), "TFPS_REPLICAS entry 'ps=two'"),
    (dict(TFPS_REPLICAS="ps=\u00b2,worker=2"), "TFPS_REPLICAS entry 'ps=\u00b2'"),
    (dict(TFPS_PORT="\u00b2", HOSTNAME="a-0"), "TFPS_PORT"),
    (dict(TFPS_HOST_PATTERN="{job.x}", HOSTNAME="a-0"), "TFPS_HOST_PATTERN='{job.x}' is not a pattern over"),
    (dict(TFPS_REPLICAS=""), "TFPS_REPLICAS='' names no job"),
    (dict(HOSTNAME="trainer"), "HOSTNAME='trainer' does not end in -<ordinal>"),
    (dict(HOSTNAME="ctr-worker-7"), "task_index 7 is out of range for job 'worker' with 3 task(s)"),
    (dict(JOB_COMPLETION_INDEX="-1"), "JOB_COMPLETION_INDEX='-1' is not a non-negative integer"),
    (dict(TFPS_PORT="99999", HOSTNAME="a-0"), "TFPS_PORT=99999 is out of range"),
    (dict(TFPS_HOST_PATTERN="{job}-{role}-{index}", HOSTNAME="a-0"), "TFPS_HOST_PATTERN='{job}-{role}-{index}'"),
    (dict(TFPS_JOB="", HOSTNAME="a-0"), "uses {job} but TFPS_JOB is not set"),
    (dict(TFPS_TASK_TYPE="master", HOSTNAME="a-0"), "job_name 'master' is not one of"),
    (dict(TF_CONFIG='{"cluster": {}}', HOSTNAME="a-0"), "both TF_CONFIG and TFPS_TASK_TYPE=worker are set"),
]


@pytest.mark.parametrize("extra,message", BAD_POD_ENVS)
def test_bad_pod_environment_is_a_one_line_error(extra, message):
  with pytest.raises(ClusterConfigError) as info:
    cluster_lib.from_environ(pod_env(**extra))
  assert message in str(info.value)
  assert "\n" not in str(info.value)


def tfjob_tf_config(task_type, index):
  """TF_CONFIG exactly as the Kubeflow training operator writes it for TFJob `ctr` in namespace `team`."""
  def names(rtype, count):
    return [f"ctr-{rtype}-{i}.team.svc:2222" for i in range(count)]
  return json.dumps({"cluster": {"chief": names("chief", 1), "evaluator": names("evaluator", 1),
                                 "ps": names("ps", 2), "worker": names("worker", 3)},
                     "task": {"type": task_type, "index": index}, "environment": "cloud"})


@pytest.mark.parametrize("task_type,index", [("chief", 0), ("ps", 1), ("worker", 2), ("evaluator", 0)])
def test_kubeflow_tfjob_tf_config_is_honoured(task_type, index):
  config = cluster_lib.from_environ({"TF_CONFIG": tfjob_tf_config(task_type, index)})
  assert (config.task_type, config.task_index) == (task_type, index)
  assert config.address == f"ctr-{task_type}-{index}.team.svc:2222"
  assert config.evaluator_hosts == ("ctr-evaluator-0.team.svc:2222",)
  assert set(config.to_tf_config()["cluster"]) == {"chief", "ps", "worker"}  # the chief never waits for the evaluator
