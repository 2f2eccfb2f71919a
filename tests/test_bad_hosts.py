"""Bad cluster addresses give one line naming the task, its address and what to check, within
--connect_timeout_secs: a name that does not resolve, a host that never answers, a port another program holds."""

import os
import socket
import subprocess
import sys
import time

import pytest

import needs
import tfps
from tfps.cluster import config as cluster_lib
from tfps.cluster import ports
from tfps.testing import hosts as hosts_lib
from tfps.training import strategy as strategy_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "train_keras.py")


def listener():
  """A plain TCP listener on a free loopback port that never speaks (like a program holding a task's port)."""
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  sock.listen()
  return sock


def test_a_port_held_by_another_program_is_named_within_the_timeout():
  with listener() as sock:
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    config = cluster_lib.from_hosts(ps_hosts=address, worker_hosts="127.0.0.1:1")
    start = time.monotonic()
    with pytest.raises(tfps.UnreachableTaskError) as info:
      strategy_lib.wait_for_tasks(config, timeout_secs=1.5)
  assert time.monotonic() - start < 3.0
  assert str(info.value).startswith(f"task ps:0 at {address} did not answer within 1.5s: something listens on port")
  assert "not a TensorFlow server" in str(info.value)


def test_a_name_that_does_not_resolve_is_named_within_the_timeout():
  config = cluster_lib.from_hosts(ps_hosts="no-such-host.invalid:2222", worker_hosts="127.0.0.1:1")
  start = time.monotonic()
  with pytest.raises(tfps.UnreachableTaskError, match=r"task ps:0 at no-such-host.invalid:2222 did not answer within "
                     r"1s: the name 'no-such-host.invalid' does not resolve .*check the host name"):
    strategy_lib.wait_for_tasks(config, timeout_secs=1)
  assert time.monotonic() - start < 3.0


def test_a_taken_port_is_refused_before_a_server_shares_it():
  with listener() as sock:
    config = cluster_lib.from_hosts(ps_hosts=f"127.0.0.1:{sock.getsockname()[1]}", worker_hosts="127.0.0.1:1",
                                    task_type="ps")
    with pytest.raises(tfps.TfpsError, match=r"task ps:0 cannot listen at 127.0.0.1:\d+: port \d+ is already in use"):
      ports.check_can_listen(config)


@pytest.mark.slow
def test_bad_hosts_on_test_hosts_each_give_one_line_and_no_hang(tmp_path):
  """Each role as typed on its host; three failing commands run at once on test hosts."""
  needs.require_root()
  names = ["chief", "busy", "silent", "idle"]
  python = sys.executable
  common = ["--worker_hosts=idle:2223", "--connect_timeout_secs=3", "--epochs=1", "--steps_per_epoch=1"]
  chief_cases = {  # ps address -> what the chief's one line must say
      "no-such-host.invalid:2222": "the name 'no-such-host.invalid' does not resolve",
      "silent:2222": "silent does not answer",
  }  # a port held by another program and a refused connection: the loopback tests above
  with hosts_lib.TestHosts(names) as test_hosts:
    made = [host.netns for host in test_hosts.hosts.values()]
    test_hosts.popen("busy", [python, "-c", "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 2222)); "
                              "s.listen(); print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE)
    test_hosts.cut("silent")
    time.sleep(0.5)
    commands = {ps: ("chief", [python, SCRIPT, "--job_name=chief", f"--chief_hosts=chief:{3000 + i}",
                               f"--ps_hosts={ps}", "--model_dir=/tmp/tfps_bad_hosts", *common])
                for i, ps in enumerate(chief_cases)}
    commands["ps on busy"] = ("busy", [python, SCRIPT, "--job_name=ps", "--ps_hosts=busy:2222",
                                       "--chief_hosts=chief:3000", *common])
    start, started = time.monotonic(), {}
    for key, (host, argv) in commands.items():  # all at once, each forked from one import of TensorFlow
      outputs = tmp_path / f"{len(started)}.out", tmp_path / f"{len(started)}.err"
      with open(outputs[0], "w") as out, open(outputs[1], "w") as err:
        started[key] = (test_hosts.popen(host, argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL), outputs)
    runs = {}
    for key, (process, outputs) in started.items():
      code = process.wait(timeout=240)
      runs[key] = (subprocess.CompletedProcess(commands[key][1], code, *(path.read_text() for path in outputs)),
                   time.monotonic() - start)
  assert not set(made) & set(hosts_lib.leftovers())
  expected = {ps: f"train_keras.py: task ps:0 at {ps} did not answer within 3s: {text}"
              for ps, text in chief_cases.items()}
  expected["ps on busy"] = "train_keras.py: task ps:0 cannot listen at busy:2222: port 2222 is already in use"
  for key, prefix in expected.items():
    result, secs = runs[key]
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == (2 if key == "ps on busy" else 3), (key, result.stderr[-2000:])  # refused / lost
    assert last.startswith(prefix), (key, last)
    assert "Traceback" not in result.stderr, key
    print(f"{key}: exit 2 after {secs:.1f}s (TensorFlow import included): {last}")


def test_a_worker_whose_own_name_does_not_resolve_refuses_in_one_line(subprocess_env):
  """As typed on its host: the worker's own address is a name no one resolves; it must not serve unreached."""
  import portpicker
  address = f"w7.nowhere.invalid:{portpicker.pick_unused_port()}"
  start = time.monotonic()
  result = subprocess.run(
      [sys.executable, SCRIPT, "--ps_hosts=127.0.0.1:1", f"--worker_hosts=127.0.0.1:2,{address}",
       "--chief_hosts=127.0.0.1:3", "--job_name=worker", "--task_index=1", "--connect_timeout_secs=1"],
      env=subprocess_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
  last = result.stderr.strip().splitlines()[-1]
  assert result.returncode == 2, result.stderr[-2000:]  # refused: started again it would refuse again
  assert last.startswith(f"train_keras.py: task worker:1 cannot serve at {address} (waited 1s): the name "
                         "'w7.nowhere.invalid' does not resolve"), last
  assert "check the host name" in last and "Traceback" not in result.stderr
  print(f"refused after {time.monotonic() - start:.1f}s (TensorFlow import included)")


def test_watchdog_names_a_ps_that_stops_answering():
  from tfps.cluster import watchdog
  with listener() as sock:
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    config = cluster_lib.from_hosts(ps_hosts=address, worker_hosts="127.0.0.1:2",
                                    chief_hosts="127.0.0.1:3")
    lost = []
    start = time.monotonic()
    thread = watchdog.start_watchdog(config, timeout_secs=1.0, interval_secs=0.2, on_lost=lost.append)
    thread.join(timeout=10)
  assert 1.0 <= time.monotonic() - start < 5
  assert lost and lost[0].startswith(f"task ps:0 at {address} has not answered for 1s: something listens on port")
  assert "start this task again once it is back: it resumes from the last checkpoint" in lost[0]
  assert watchdog.start_watchdog(config, timeout_secs=1.0, on_lost=lost.append) is None  # one watch per cluster


def test_a_lost_ps_in_tensorflows_error_is_named_in_one_line():
  import tensorflow as tf
  from tfps.cluster import failures
  config = cluster_lib.from_hosts(ps_hosts="ps-0:2222,ps-1:2222", worker_hosts="w-0:2222,w-1:2222,w-2:2222",
                                  chief_hosts="chief-0:2222")
  text = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:10.250.60.2:2222: No route to host\n"
          "Additional GRPC error information from remote target /job:worker/replica:0/task:2 while calling ...\n"
          "Additional GRPC error information from remote target /job:ps/replica:0/task:1/device:CPU:0 while calling")
  message = failures.describe_lost_task(tf.errors.UnavailableError(None, None, text), config)
  assert message.startswith("task ps:1 at ps-1:2222 became unreachable (failed to connect to all addresses;")
  assert "\n" not in message and "start this task again" in message
  assert failures.describe_lost_task(ValueError(text), config) is None


# The shape of a graph function's error in TensorFlow 2.21 (atomic_function.InterpolateRuntimeError): a header, an
# empty line, the node and the frames that defined it, then the cause; the task is named only further down.
GRAPH_ERROR = """Graph execution error:

Detected at node StatefulPartitionedCall defined at (most recent call last):
  File "/work/scripts/train.py", line 88, in <module>

  File "/work/tfps/keras/fitting.py", line 140, in fit

<stack traces unavailable>
{{function_node __inference_train_function_5821}} failed to connect to all addresses; last error: UNAVAILABLE: \
ipv4:10.250.60.3:2222: Connection timed out
Additional GRPC error information from remote target /job:ps/replica:0/task:1/device:CPU:0 while calling \
/tensorflow.eager.EagerService/Enqueue:
:{"created":"@1700000000.1","description":"Error received from peer ipv4:10.250.60.3:2222","grpc_status":14}
\t [[{{node StatefulPartitionedCall}}]] [Op:__inference_train_function_5821]"""


def test_a_lost_ps_in_a_graph_functions_error_is_named_with_its_cause():
  import tensorflow as tf
  from tfps.cluster import failures
  config = cluster_lib.from_hosts(ps_hosts="ps-0:2222,ps-1:2222", worker_hosts="w-0:2222", chief_hosts="chief-0:2222")
  message = failures.describe_lost_task(tf.errors.UnavailableError(None, None, GRAPH_ERROR), config)
  assert message.startswith("task ps:1 at ps-1:2222 became unreachable (failed to connect to all addresses; last "
                            "error: UNAVAILABLE: ipv4:10.250.60.3:2222: Connection timed out); check that it runs")
  assert failures.cause("Graph execution error:\n\n") == "no detail given"


# A ps killed while a function ran: its error in TensorFlow 2.21 with two roots (seen in tests/test_k8s_runs.py).
TWO_ROOTS_ERROR = """Graph execution error:

Detected at node GroupCrossDeviceControlEdges_1/while/body/_1/while/NoOp/_128 defined at (most recent call last):
<stack traces unavailable>
Detected at node GroupCrossDeviceControlEdges_1/while/body/_1/while/NoOp/_128 defined at (most recent call last):
<stack traces unavailable>
2 root error(s) found.
  (0) UNAVAILABLE:  failed to connect to all addresses; last error: UNKNOWN: ipv4:10.250.114.2:2222: Failed to \
connect to remote host: Connection refused
Additional GRPC error information from remote target /job:ps/replica:0/task:1/device:CPU:0 while calling \
/tensorflow.eager.EagerService/RunComponentFunction:"""


def test_the_cause_of_an_error_with_several_roots_is_the_first_roots():
  from tfps.cluster import failures
  assert failures.cause(TWO_ROOTS_ERROR) == (
      "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.250.114.2:2222: Failed to connect to remote "
      "host: Connection refused")



# A ps killed and started again before the chief reached it next (tests/test_k8s_runs.py, TensorFlow 2.21).
RESTARTED_PS_ERROR = """Graph execution error:

Detected at node Minimum/_35 defined at (most recent call last):
<stack traces unavailable>
2 root error(s) found.
  (0) INVALID_ARGUMENT:  Unable to find the relevant tensor remote_handle: Op ID: 23, Output num: 0. One possible \
cause is that the tensor was accessed after deallocation in a distributed worker setup.
Additional GRPC error information from remote target /job:ps/replica:0/task:1/device:CPU:0 while calling \
/tensorflow.eager.EagerService/RunComponentFunction:
  (1) CANCELLED:  RecvFromRemoteAsync is cancelled.
Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling \
/tensorflow.eager.EagerService/Enqueue:"""


def test_a_ps_started_again_under_the_chief_is_named_in_one_line():
  import tensorflow as tf
  from tfps.cluster import failures
  config = cluster_lib.from_hosts(ps_hosts="ps-0:2222,ps-1:2222", worker_hosts="w-0:2222,w-1:2222",
                                  chief_hosts="chief-0:2222")
  message = failures.describe_lost_task(tf.errors.InvalidArgumentError(None, None, RESTARTED_PS_ERROR), config)
  assert message.startswith("task ps:1 at ps-1:2222 was started again and no longer has what this task made there "
                            "(Unable to find the relevant tensor remote_handle: Op ID: 23, Output num: 0.")
  assert "\n" not in message and message.endswith("start this task again: it resumes from the last checkpoint")
  aborted = ("Unable to find a context_id matching the specified one (15117322520186267765). Perhaps the worker was "
             "restarted, or the context was GC'd?\nAdditional GRPC error information from remote target "
             "/job:worker/replica:0/task:1 while calling /tensorflow.eager.EagerService/Enqueue:")
  assert failures.describe_lost_task(tf.errors.AbortedError(None, None, aborted), config).startswith(
      "task worker:1 at w-1:2222 was started again and no longer has what this task made there (Unable to find a "
      "context_id matching")
  # the same error type without a task started again is the user's own error, not a lost task
  assert failures.describe_lost_task(tf.errors.InvalidArgumentError(None, None, "indices[3] = 9 is not in [0, 5) "
                                                                    "/job:ps/replica:0/task:1"), config) is None
