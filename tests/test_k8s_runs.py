"""The manifests of `tfps-k8s`, run: for each kind, every pod's command and environment come from its manifest and run
on a test host of its own (`tfps.testing.k8s_pods`, which also plays the controller's restart and success rules as
the manifest states them). One run per kind, on one shared set of 5 hosts (2 ps, 2 workers, the chief): a worker
killed after the first checkpoint, a ps killed after the second (JobSet: its Job fails and the whole set is started
again; TFJob and plain: the ps is started again, the workers and the chief exit 3 and are started again), and the run
ends with every step applied exactly once on each ps (bench/worker_kills_train.py: a step counter on each ps,
`tfps.testing.applied_steps`, read from the final checkpoint) and every process exited 0 by itself."""

import json
import pathlib
import re
import sys
import time

import pytest

import needs
from tfps.cli import k8s as k8s_cli
from tfps.testing import applied_steps
from tfps.testing import hosts as hosts_lib
from tfps.testing import k8s_pods
from tfps.training import checkpoints as checkpoints_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
EPOCHS, STEPS = 4, 100
TASKS = [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("chief", 0)]

pytestmark = pytest.mark.slow


def dns_names(task):
  """The names each kind's controller gives `task`'s pod (JobSet, plain Job, TFJob), all on its one test host."""
  job, index = task
  return [f"ctr-{job}-0-{index}.ctr", f"ctr-{job}-{index}.ctr", f"ctr-{job}-{index}.team.svc"]


@pytest.fixture(scope="module")
def hosts():
  needs.require_root()
  made = hosts_lib.TestHosts([k8s_pods.K8sPods.host_name(task) for task in TASKS],
                             aliases={k8s_pods.K8sPods.host_name(task): dns_names(task) for task in TASKS})
  yield made
  netns = [host.netns for host in made.hosts.values()]
  made.close()
  assert not set(netns) & set(hosts_lib.leftovers()), "test hosts left behind"


def manifests(tmp_path, kind):
  out = tmp_path / "job.yaml"
  command = [sys.executable, str(REPO / "bench" / "worker_kills_train.py"), "--ps_hosts=a:2222,b:2222",
             "--worker_hosts=c:2222,d:2222", "--chief_hosts=e:2222", f"--model_dir={tmp_path}/shared/run",
             f"--epochs={EPOCHS}", f"--steps_per_epoch={STEPS}"]
  code = k8s_cli.main(["tfps-k8s", "--name=ctr", "--namespace=team", "--image=registry.example/tfps:1",
                       "--claim=tfps-models", f"--mount_path={tmp_path}/shared", f"--kind={kind}", f"--output={out}",
                       "--", *command], cwd=str(REPO))
  assert code == 0
  return [json.loads(doc) for doc in out.read_text().split("---\n") if doc.strip()]


class Faults:
  """Kills worker:1 once checkpoint 1 is there, then ps:1 once checkpoint 2 is."""

  def __init__(self, model_dir):
    self.model_dir = str(model_dir)
    self.done = []

  def __call__(self, pods):
    for number, task in ((1, ("worker", 1)), (2, ("ps", 1))):
      if task not in self.done and checkpoints_lib.is_registered(self.model_dir, number):
        pods.kill(task)
        self.done.append(task)


@pytest.mark.parametrize("kind", ["jobset", "tfjob", "plain"])
def test_each_kind_survives_a_worker_and_a_ps_failure_and_ends_exact(hosts, tmp_path, subprocess_env, kind):
  pods = k8s_pods.K8sPods(manifests(tmp_path, kind), hosts, str(tmp_path / "logs"), env=subprocess_env)
  assert sorted(pods.pods) == sorted(TASKS)
  faults = Faults(tmp_path / "shared" / "run")
  started = time.monotonic()
  try:
    pods.start()
    state = pods.run_until_done(timeout_secs=900, on_poll=faults)
    assert state == "Succeeded", (state, pods.events, pods.log(("chief", 0))[-3000:])
    succeeded = time.monotonic()
    deadline = time.monotonic() + 60
    while pods.poll() and pods.running() and time.monotonic() < deadline:  # ps and workers end by themselves
      time.sleep(0.2)
    assert not pods.running(), (pods.running(), pods.events)
    ended = time.monotonic()
  finally:
    for task in pods.pods:
      pods.kill(task)
  assert faults.done == [("worker", 1), ("ps", 1)], pods.events
  assert all(pod.exit_codes[-1] == 0 for pod in pods.pods.values()), {
      task: pod.exit_codes for task, pod in pods.pods.items()}
  assert pods.events[0] == "worker-1 exited -9"  # started again alone: the set was not restarted for it
  if kind == "jobset":
    assert pods.events[1:] == ["ps-1 exited -9", "job ps failed: the set restarted (1)"], pods.events
  else:  # the ps started again alone, and beside it each worker (it exits 3 once the process of a ps it served
    # ended: `tfps.cluster.job_end`) and the chief (it exits 3 when it loses the ps). worker:1's second process, if its
    # watch had not reached the ps when the ps was killed (seen even after its `Serving` line), follows the ps's next
    # process instead, and goes on: worker:0, serving from the start, is the one that must end.
    later = pods.events[1:]
    expected = {"ps-1 exited -9", "worker-0 exited 3", "chief-0 exited 3"}
    assert expected <= set(later) <= expected | {"worker-1 exited 3"}, later
    once = [f"{name} exited {code}" for name, code in (("ps-1", -9), ("worker-0", 3))]
    assert [later.count(event) for event in once] == [1, 1] and later.count("worker-1 exited 3") <= 1, later
    assert pods.set_restarts == 0
    # Workers left running beside the restarted ps stalled the restarted chief's first steps until gRPC ended the
    # stuck calls ("Too many pings", 126-153 s, again after each restart of the chief)
    assert "Too many pings" not in pods.log(("chief", 0))
  assert re.search(r"Resumed from \S+ at epoch", pods.log(("chief", 0)))
  final = json.loads((tmp_path / "shared" / "run" / "checkpoints" / "FINAL").read_text())
  assert final["step"] == EPOCHS * STEPS, final
  assert applied_steps.applied_per_ps(final["last_checkpoint"], pods.log(("chief", 0))) == {
      "ps:0": EPOCHS * STEPS, "ps:1": EPOCHS * STEPS}
  exits = [line for line in pods.log(("chief", 0)).splitlines() if line.startswith("worker_kills_train.py: ")]
  print(f"{kind}: succeeded after {succeeded - started:.0f}s, every pod ended {ended - succeeded:.1f}s later; "
        f"events {pods.events}; the chief's exits: {exits}")
