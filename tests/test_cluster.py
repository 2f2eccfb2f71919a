"""Cluster rules: every broken rule is a one-line ClusterConfigError naming the offending value."""

import json

import pytest

from tfps.cluster import config as cluster_lib
from tfps.errors import ClusterConfigError

PS = "127.0.0.1:2000"
W0, W1 = "127.0.0.1:2001", "127.0.0.1:2002"
CHIEF = "127.0.0.1:2003"
EVAL = "127.0.0.1:2004"


def hosts(ps=(PS,), worker=(W0, W1), chief=(), evaluator=(), task_type="chief", task_index=0):
  return dict(ps_hosts=ps, worker_hosts=worker, chief_hosts=chief, evaluator_hosts=evaluator, task_type=task_type,
              task_index=task_index)


BAD_HOSTS = [
    (hosts(ps=()), "ps_hosts is empty"),
    (hosts(worker=()), "worker_hosts is empty"),
    (hosts(ps=""), "ps_hosts is empty"),
    (hosts(chief=(CHIEF, "127.0.0.1:2005")), "chief_hosts has 2 entries (127.0.0.1:2003, 127.0.0.1:2005); at most one"),
    (hosts(evaluator=(EVAL, "127.0.0.1:2006")), "at most one evaluator"),
    (hosts(ps=("localhost",)), "ps_hosts: 'localhost' is not host:port"),
    (hosts(ps=("127.0.0.1:",)), "ps_hosts: '127.0.0.1:' is not host:port"),
    (hosts(ps=(":2222",)), "ps_hosts: ':2222' is not host:port"),
    (hosts(worker=(W0, "host:port")), "worker_hosts: 'host:port' is not host:port"),
    (hosts(worker=("a b:1",)), "worker_hosts: 'a b:1' is not host:port"),
    (hosts(worker=("::1:2222",)), "worker_hosts: '::1:2222' is not host:port"),
    (hosts(ps=("127.0.0.1:0",)), "ps_hosts: port 0 in '127.0.0.1:0' is out of range; allowed 1-65535"),
    (hosts(ps=("127.0.0.1:65536",)), "port 65536 in '127.0.0.1:65536' is out of range; allowed 1-65535"),
    (hosts(worker=("127.0.0.1:99999",)), "worker_hosts: port 99999"),
    (hosts(chief=("[::1]:70000",)), "chief_hosts: port 70000 in '[::1]:70000' is out of range"),
    (hosts(ps=("127.0.0.1:-1",)), "ps_hosts: '127.0.0.1:-1' is not host:port"),
    (hosts(worker=(W0, "")), "worker_hosts: empty entry"),
    (hosts(worker=f"{W0},,{W1}"), "worker_hosts: empty entry"),
    (hosts(worker=(W0, W0)), "127.0.0.1:2001 is used twice (worker_hosts[0] and worker_hosts[1])"),
    (hosts(ps=(W0,)), "127.0.0.1:2001 is used twice (worker_hosts[0] and ps_hosts[0])"),
    (hosts(chief=(PS,)), "127.0.0.1:2000 is used twice (chief_hosts[0] and ps_hosts[0])"),
    (hosts(evaluator=(W1,)), "127.0.0.1:2002 is used twice (worker_hosts[1] and evaluator_hosts[0])"),
    (hosts(ps=("H0:2222",), worker=("h0:02222", W1)), "H0:2222 is used twice (worker_hosts[0] and ps_hosts[0])"),
    (hosts(task_type="master"), "job_name 'master' is not one of chief, worker, ps, evaluator"),
    (hosts(task_type=""), "job_name '' is not one of"),
    (hosts(task_type="worker", task_index=2), "task_index 2 is out of range for job 'worker' with 2 task(s); allowed 0-1"),
    (hosts(task_type="ps", task_index=1), "task_index 1 is out of range for job 'ps' with 1 task(s); allowed 0-0"),
    (hosts(task_type="worker", task_index=-1), "task_index -1 is out of range"),
    (hosts(task_type="chief", task_index=1), "task_index 1 is out of range for job 'chief' with 0 task(s)"),
    (hosts(task_type="evaluator", task_index=1, evaluator=(EVAL,)), "task_index 1 is out of range for job 'evaluator'"),
    (hosts(task_type="worker", task_index="1"), "task_index '1' is not an integer"),
    (hosts(ps=5), "ps_hosts: expected a list of host:port strings, got 5"),
    (hosts(ps=(2222,)), "ps_hosts: entry 2222 is not a host:port string"),
]


@pytest.mark.parametrize("kwargs,message", BAD_HOSTS)
def test_bad_cluster_is_a_one_line_error_naming_the_value(kwargs, message):
  with pytest.raises(ClusterConfigError) as info:
    cluster_lib.ClusterConfig(**kwargs)
  assert message in str(info.value)
  assert "\n" not in str(info.value)


BAD_TF_CONFIGS = [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ("[]", "TF_CONFIG needs a 'cluster' object"),
    ('{"task": {"type": "worker", "index": 0}}', "TF_CONFIG needs a 'cluster' object"),
    ('{"cluster": {"ps": ["a:1"], "worker": ["b:2"], "master": ["c:3"]}, "task": {"type": "worker"}}',
     "TF_CONFIG cluster has unknown job 'master'"),
    ('{"cluster": {"ps": ["a:1"], "worker": ["b:2"]}}', "TF_CONFIG needs a 'task' object"),
    ('{"cluster": {"ps": ["a:1"], "worker": ["b:2"]}, "task": {"type": "worker", "index": "0"}}',
     "TF_CONFIG task index '0' is not an integer"),
    ('{"cluster": {"ps": "a:1", "worker": ["b:2"]}, "task": {"type": "worker", "index": 0}}',
     "TF_CONFIG cluster.ps: expected a list"),
    ('{"cluster": {"ps": ["a:x"], "worker": ["b:2"]}, "task": {"type": "worker", "index": 0}}',
     "TF_CONFIG cluster.ps: 'a:x' is not host:port"),
    ('{"cluster": {"ps": ["a:1"], "worker": ["b:2"]}, "task": {"type": "worker", "index": 1}}',
     "task_index 1 is out of range for job 'worker'"),
    ('{"cluster": {"worker": ["b:2"]}, "task": {"type": "worker", "index": 0}}', "ps_hosts is empty"),
]


@pytest.mark.parametrize("text,message", BAD_TF_CONFIGS)
def test_bad_tf_config_is_a_one_line_error(text, message):
  with pytest.raises(ClusterConfigError) as info:
    cluster_lib.from_tf_config(text)
  assert message in str(info.value)
  assert "\n" not in str(info.value)


def test_hosts_from_comma_string_tolerate_spaces():
  config = cluster_lib.from_hosts(ps_hosts=PS, worker_hosts=f"{W0}, {W1}", task_type="worker", task_index=1)
  assert config.worker_hosts == (W0, W1)
  assert config.address == W1


def test_tf_config_round_trip_keeps_evaluator_out_of_the_training_cluster():
  config = cluster_lib.ClusterConfig(**hosts(chief=(CHIEF,), evaluator=(EVAL,), task_type="worker", task_index=1))
  tf_config = config.to_tf_config()
  assert tf_config == {"cluster": {"chief": [CHIEF], "worker": [W0, W1], "ps": [PS]},
                       "task": {"type": "worker", "index": 1}}
  parsed = cluster_lib.from_tf_config(json.dumps(tf_config))
  assert parsed.worker_hosts == (W0, W1) and parsed.task_type == "worker" and parsed.task_index == 1


def test_orchestrator_tf_config_with_evaluator_is_accepted_but_not_connected_to():
  # Kubernetes TFJob and TonY list the evaluator in every task's cluster; the chief must not connect to it.
  text = json.dumps({"cluster": {"chief": [CHIEF], "worker": [W0], "ps": [PS], "evaluator": [EVAL]},
                     "task": {"type": "evaluator", "index": 0}})
  config = cluster_lib.from_tf_config(text)
  assert config.evaluator_hosts == (EVAL,)
  assert "evaluator" not in config.for_task("chief").training_cluster()


def test_evaluator_unlisted_as_tf_docs_describe_it():
  text = json.dumps({"cluster": {"worker": [W0], "ps": [PS]}, "task": {"type": "evaluator", "index": 0}})
  assert cluster_lib.from_tf_config(text).task_type == "evaluator"


def test_ipv6_loopback_and_hostnames_are_valid():
  config = cluster_lib.from_hosts(ps_hosts="[::1]:2222", worker_hosts="localhost:2223,my-host.example_1:2224")
  assert config.num_ps == 1 and config.num_workers == 2
