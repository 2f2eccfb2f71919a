"""bench/throughput.py with the plain-PSS peer (bench/plain_pss_train.py), the ps's floor and one process in a tiny
mode: every side trains, each fit and Estimator row gets its ratio to the peer of the same shape, its CPU against the
one process's and its ps CPU against the floor's, neither the peer nor the floor loads tfps's training code, and no
process is left behind. The peer is TensorFlow's tutorial code (MinSizePartitioner); the FixedShards peer measured
before is its own variant, `keras_pss_fixed_*`, with its own ratio."""

import contextlib
import json
import logging as py_logging
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import aims  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import ps_floor_layout  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import workload as workload_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench_modules import bench_module  # pylint: disable=g-import-not-at-top,wrong-import-position

throughput = bench_module("throughput")

# tfps modules the peer may load: the workload's model (tfps.models) and what importing the tfps package brings
# (its layer packages, whose __init__ holds only a docstring, its cluster description, its mode names and the console
# filter every process that imports tfps gets, with the base modules it reads: run_records).
_PEER_PACKAGES = ("tfps", "tfps.cluster", "tfps.training", "tfps.cli")
_PEER_ALLOWED = ("tfps.models", "tfps.data", "tfps.checks", "tfps.errors", "tfps._env", "tfps._aliases",
                 "tfps.cli.flags", "tfps.cluster.config", "tfps.cluster.console", "tfps.run_records",
                 "tfps.training.modes")


@contextlib.contextmanager
def _throughput(tmp_path, subprocess_env, processes_naming, variants: str):
  """Runs bench/throughput.py on `variants` at batch 256, one short repetition without the trivial function, tables
  of 10,000 rows; yields `(result, report)`, then checks that no process of the run is left."""
  env = dict(subprocess_env, TFPS_BENCH_LOGS=str(tmp_path / "logs"))
  # Windows of 40 steps: a window shorter than the bench's CPU sampling gets its tasks' cores from their CPU time
  # interpolated at its ends (bench/runner.py).
  command = [sys.executable, "bench/throughput.py", f"--variants={variants}", "--batch_sizes=256", "--repeats=1",
             "--measure=1", "--window_examples=10240", "--vocab_size=10000", "--notrivial", f"--out={tmp_path}"]
  result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=500)
  try:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    yield result, json.loads((tmp_path / "throughput.json").read_text())
  finally:
    leftovers = processes_naming(str(tmp_path))
    for process in leftovers:
      process.kill()
    assert not leftovers, f"processes left behind: {leftovers}"


def _refused(subprocess_env, variants: str) -> str:
  """The last line bench/throughput.py writes to stderr for `variants`, checked to come before any run."""
  result = subprocess.run([sys.executable, "bench/throughput.py", f"--variants={variants}"], cwd=REPO,
                          env=subprocess_env, capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert "repeat 1/" not in result.stdout
  return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_throughput_compares_fit_with_the_plain_pss_peer_one_process_and_the_ps_floor(tmp_path, subprocess_env,
                                                                                     processes_naming):
  """One run of every kind of side (each run costs a cluster's start-up): the peer, one process, the floor."""
  with _throughput(tmp_path, subprocess_env, processes_naming,
                   "fit_1x1,estimator_1x1,keras_pss_1x1,single,ps_floor_1x1,ps_floor_1x1+packed") as (result, report):
    assert "trivial" not in result.stdout and report["summary"]["trivial_functions_per_sec"] is None
    rows = {row["variant"]: row for row in report["summary"]["rows"]}
    assert set(rows) == {"fit_1x1", "estimator_1x1", "keras_pss_1x1", "single", "ps_floor_1x1", "ps_floor_1x1+packed"}
    fit, peer = rows["fit_1x1"], rows["keras_pss_1x1"]
    assert fit["examples_per_sec"] > 0 and peer["examples_per_sec"] > 0
    assert fit["vs_keras_pss"] == pytest.approx(fit["examples_per_sec"] / peer["examples_per_sec"])
    assert "vs_keras_pss" not in peer
    estimator = rows["estimator_1x1"]  # timed per window as fit's epochs, with its tasks' cores
    assert estimator["vs_keras_pss"] == pytest.approx(estimator["examples_per_sec"] / peer["examples_per_sec"])
    assert set(estimator["cores"]) == {"chief:0", "ps:0", "worker:0"} and estimator["cores"]["ps:0"] > 0
    assert set(peer["cores"]) == {"chief:0", "ps:0", "worker:0"}  # the peer's processes carry their TF_CONFIG
    target = report["summary"]["targets"][f"fit_1x1 >= {aims.VS_TUTORIAL_PEER} x keras_pss (the tutorial's peer) "
                                          "at batch 256"]
    assert target == [round(fit["vs_keras_pss"], 3), fit["vs_keras_pss"] >= aims.VS_TUTORIAL_PEER]
    # CPU side by side: the one process is sampled too, and every cluster row's CPU per example is a multiple of its.
    single = rows["single"]
    assert set(single["cores"]) == {"single:0"} and single["cores"]["single:0"] > 0.1
    assert single["cpu_ms_per_step"]["total"] == pytest.approx(1000 * single["cores"]["single:0"] * single["step_secs"])
    cpu = fit["cpu_ms_per_step"]
    assert set(cpu) == {"ps", "worker", "chief", "total"} and cpu["ps"] > 0 and cpu["worker"] > 0
    assert cpu["total"] == pytest.approx(cpu["ps"] + cpu["worker"] + cpu["chief"])
    assert cpu["ps"] == pytest.approx(1000 * fit["cores"]["ps:0"] * fit["step_secs"])
    assert fit["cpu_vs_single"] == pytest.approx(cpu["total"] / single["cpu_ms_per_step"]["total"])
    assert peer["cpu_vs_single"] == pytest.approx(peer["cpu_ms_per_step"]["total"] / single["cpu_ms_per_step"]["total"])
    targets = report["summary"]["targets"]
    assert targets[f"estimator_1x1 CPU per example <= {aims.CPU_VS_SINGLE} x single at batch 256"] == [
        round(estimator["cpu_vs_single"], 3), estimator["cpu_vs_single"] <= aims.CPU_VS_SINGLE]
    peer_run = next(run for run in report["runs"]["results"] if run["variant"] == "keras_pss_1x1")
    assert peer_run["steps_per_execution"] == 20 and peer_run["num_ps"] == 1
    assert peer_run["partitioner"] == "min_size"  # the tutorial's: MinSizePartitioner(256 KiB, max_shards=#ps)
    loaded = [name for name in peer_run["tfps_modules"]
              if name not in _PEER_PACKAGES and not name.startswith(_PEER_ALLOWED)]
    assert not loaded, f"the plain peer loaded tfps code beyond the workload: {loaded}"
    assert "| vs keras_pss |" in result.stdout and f"| {fit['vs_keras_pss']:.2f} |" in result.stdout
    assert f"| {cpu['ps']:.1f} | {cpu['total']:.1f} | {fit['cpu_vs_single']:.2f} |" in result.stdout
    # The ps's floor, beside fit: its own cluster, no tfps training code, fit's ps CPU against it.
    floor, packed = rows["ps_floor_1x1"], rows["ps_floor_1x1+packed"]
    for row in (floor, packed):  # its own cluster's processes, sampled as tasks: the ps works every step
      assert set(row["cores"]) == {"chief:0", "ps:0", "worker:0"} and row["cpu_ms_per_step"]["ps"] > 0
      assert "vs_keras_pss" not in row and "ps_vs_floor" not in row
    runs = {run["variant"]: run for run in report["runs"]["results"]}
    assert runs["ps_floor_1x1"]["path"] == "ps_floor" and runs["ps_floor_1x1"]["packed_dense"] is False
    assert runs["ps_floor_1x1+packed"]["packed_dense"] is True
    for variant in ("ps_floor_1x1", "ps_floor_1x1+packed"):  # it trains the workload's model: its loss falls
      losses = runs[variant]["losses"]
      assert len(losses) == 2 and losses[-1] < losses[0], (variant, losses)
    loaded = [name for name in runs["ps_floor_1x1"]["tfps_modules"]
              if name not in _PEER_PACKAGES and not name.startswith(_PEER_ALLOWED)]
    assert not loaded, f"the floor loaded tfps code beyond the workload's column names: {loaded}"
    # Against the floor without options, not the packed one.
    assert fit["ps_vs_floor"] == pytest.approx(fit["cpu_ms_per_step"]["ps"] / floor["cpu_ms_per_step"]["ps"])
    targets = report["summary"]["targets"]
    assert targets["ps_floor_1x1 (the ps's floor) ps CPU per step at batch 256"] == [
        round(floor["cpu_ms_per_step"]["ps"], 2), None]
    assert targets[f"fit_1x1 ps CPU per step <= {aims.PS_VS_FLOOR} x the ps's floor at batch 256"] == [
        round(fit["ps_vs_floor"], 3), fit["ps_vs_floor"] <= aims.PS_VS_FLOOR]
    assert f"fit_1x1 batch 256: ps CPU per step {fit['ps_vs_floor']:.2f}x the ps's floor" in result.stdout


@pytest.mark.slow
def test_an_unknown_variant_option_is_refused_before_any_run(subprocess_env):
  assert _refused(subprocess_env, "fit_1x1,fit_1x1+pipelind") == (
      "--variants: 'fit_1x1+pipelind' has the option 'pipelind'; allowed: per_feature, spe<N>, unroll<N>, intra<N>, "
      "inter<N>, packed, unpacked, spin, nospin, lockfree, pipelined, bf16, nolock")


def test_the_ps_floor_on_two_ps_is_laid_out_as_tfps_lays_out_the_workload():
  """At 2 ps the floor's pieces are tfps's 15 (read from the model built under tfps's strategy): both tables and the
  first deep kernel split (first piece a row longer), the other dense variables whole, alternating; at 1 ps all whole
  on the one ps. ps_floor_2x2 runs; +packed is refused beyond 1 ps with its one-line error."""
  workload = workload_lib.Workload(batch_size=256)
  rows = sum(workload.categorical().values())
  shapes = dict(enumerate(workload.dense_shapes()), deep=[rows, 16], wide=[rows, 1])
  placed = ps_floor_layout.placement(shapes, 2)
  assert sum(len(pieces) for pieces in placed.values()) == 15
  half = rows // 2
  assert placed["wide"] == [(half, 0), (half, 1)] and placed["deep"] == [(half, 1), (half, 0)]
  assert placed[2] == [(215, 1), (214, 0)]  # the 429 x 256 kernel: 439 KB, over the 256 KiB tfps shards from
  assert [placed[index] for index in (0, 1, 3, 4, 5, 6, 7, 8, 9)] == [
      [(13, 0)], [(1, 1)], [(256, 1)], [(256, 0)], [(128, 1)], [(128, 0)], [(64, 1)], [(64, 0)], [(1, 1)]]
  assert all(pieces == [(shapes[name][0], 0)] for name, pieces in ps_floor_layout.placement(shapes, 1).items())
  assert throughput._option_args("ps_floor_2x2") == [] and throughput._option_args("ps_floor_1x1+packed") == [
      "--packed_dense"]
  with pytest.raises(throughput.app.UsageError) as refused:
    throughput._option_args("ps_floor_2x2+packed")
  assert str(refused.value) == ("--variants: 'ps_floor_2x2+packed': the ps floor's one option is packed, with 1 ps "
                                "only (ps_floor_1x<workers>+packed)")


def test_the_ps_against_the_floor_at_two_ps_is_per_ps():
  """fit_2x2's ps CPU per step against ps_floor_2x2's: the mean over the 2 ps (the sums' ratio), and the busiest ps's
  against the floor's busiest."""
  cores = {"fit_2x2": {"ps:0": 0.5, "ps:1": 0.3}, "ps_floor_2x2": {"ps:0": 0.3, "ps:1": 0.2}}
  runs = {"results": [{"variant": variant, "batch_size": 256, "examples_per_sec": 100.0, "step_secs": 0.01,
                       "chief_schedule_share": 0.01, "chief_cpu_share": 0.02,
                       "tasks": {task: {"cores": value} for task, value in tasks.items()}}
                      for variant, tasks in cores.items()]}
  summary = throughput.summarize(runs)
  fit = next(row for row in summary["rows"] if row["variant"] == "fit_2x2")
  assert fit["ps_vs_floor"] == pytest.approx(8.0 / 5.0) and fit["ps_vs_floor_of"] == "the mean over the ps"
  assert fit["ps_vs_floor_largest"] == pytest.approx(5.0 / 3.0)
  assert summary["targets"][f"fit_2x2 ps CPU per step <= {aims.PS_VS_FLOOR} x the ps's floor at batch 256"] == (
      1.6, False)


@contextlib.contextmanager
def _bench_flags(*argv):
  """bench/throughput.py's flags parsed from `argv` (its defaults otherwise), as they were afterwards: a parsed command
  line or absl's level left behind would hide INFO lines from this process's later tests."""
  flags, absl_level = throughput.flags.FLAGS, py_logging.getLogger("absl").level
  parsed = flags.is_parsed()
  try:
    flags(["throughput.py", *argv], known_only=True)
    yield
  finally:
    if not parsed:
      flags.unparse_flags()
    py_logging.getLogger("absl").setLevel(absl_level)


def test_thread_options_set_the_runs_environment_and_leave_the_flags(monkeypatch):
  """`+intra<N>` / `+inter<N>` reach every process of the run as TensorFlow's thread-count variables, not as flags;
  the other options still give their flags, and a row with them is compared with the peer without them."""
  calls = []
  monkeypatch.setattr(throughput.runner, "run", lambda args, **kwargs: calls.append((args, kwargs)) or {})
  with _bench_flags():
    throughput._run("fit_1x1+intra1+unroll4+inter2", 256, 0)
  args, kwargs = calls[0]
  assert kwargs["env"] == {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"}
  assert "--unrolled_steps=4" in args and not any("intra" in arg or "inter" in arg for arg in args)
  assert throughput._option_args("single+intra1") == []
  assert not throughput._peer_has("intra1") and throughput._peer_has("per_feature")


def test_a_window_keeps_every_worker_busy_and_the_warm_up_runs_each_workers_first_function():
  """Windows are whole scheduled functions per worker: at batch 4096 a window of ~120,000 examples is one function of
  20 steps for one worker but two (40 steps) for two, and `+spe<N>` functions count as N steps."""
  with _bench_flags("--window_examples=120000"):
    assert [throughput.window_steps(variant, 4096) for variant in ("single", "fit_1x1", "keras_pss_2x2",
                                                                   "estimator_4x2", "fit_2x2+spe30")] == [
                                                                       20, 20, 40, 40, 60]
    assert throughput.window_steps("fit_2x2", 256) == 480 and throughput.window_steps("fit_1x1", 256) == 460


def test_the_tutorial_peer_and_the_fixed_shards_peer_are_run_and_compared_apart():
  """keras_pss_* runs plain_pss_train.py as the tutorial writes it, keras_pss_fixed_* with --partitioner=fixed; a
  fit or Estimator row gets one ratio per peer of its shape and batch, each from its own peer's rate."""
  assert throughput._path_args("keras_pss") == []
  assert throughput._path_args("keras_pss_fixed") == ["--partitioner=fixed"]
  assert throughput._path_args("ps_floor") == ["--path=ps_floor"] and throughput._path_args("fit") == ["--path=fit"]
  assert throughput.variant_shape("keras_pss_fixed_2x2") == ("keras_pss_fixed", 2, 2, ())
  rates = {"fit_2x2": 150.0, "fit_2x2+pipelined": 165.0, "estimator_2x2": 120.0, "keras_pss_2x2": 100.0,
           "keras_pss_fixed_2x2": 125.0, "fit_1x1": 90.0, "keras_pss_fixed_1x1": 60.0}
  cores = {"fit_1x1": 0.77, "ps_floor_1x1": 0.7}  # the ps's cores: 7.7 and 7.0 ms of CPU per 10 ms step
  rates["ps_floor_1x1"] = 95.0
  runs = {"results": [{"variant": variant, "batch_size": 256, "examples_per_sec": rate, "step_secs": 0.01,
                       "chief_schedule_share": 0.01, "chief_cpu_share": 0.02,
                       "tasks": {"ps:0": {"cores": cores[variant]}} if variant in cores else {}}
                      for variant, rate in rates.items()]}
  summary = throughput.summarize(runs)
  rows = {row["variant"]: row for row in summary["rows"]}
  assert rows["fit_2x2"]["vs_keras_pss"] == pytest.approx(1.5)
  assert rows["fit_2x2"]["vs_keras_pss_fixed"] == pytest.approx(1.2)
  assert rows["fit_2x2+pipelined"]["vs_keras_pss"] == pytest.approx(1.65)  # the peer has no such switch
  assert rows["estimator_2x2"]["vs_keras_pss"] == pytest.approx(1.2)
  assert rows["estimator_2x2"]["vs_keras_pss_fixed"] == pytest.approx(0.96)
  assert "vs_keras_pss" not in rows["fit_1x1"] and rows["fit_1x1"]["vs_keras_pss_fixed"] == pytest.approx(1.5)
  for peer in ("keras_pss_2x2", "keras_pss_fixed_2x2"):
    assert "vs_keras_pss" not in rows[peer] and "vs_keras_pss_fixed" not in rows[peer]
  # The aim is against the tutorial's peer; its verdict comes from the unrounded ratio.
  aim = f" >= {aims.VS_TUTORIAL_PEER} x keras_pss (the tutorial's peer) at batch 256"
  assert summary["targets"]["fit_2x2" + aim] == (1.5, True)
  assert summary["targets"]["estimator_2x2" + aim] == (1.2, True)
  assert "fit_1x1" + aim not in summary["targets"]  # its only peer is the FixedShards one
  assert summary["targets"][f"fit_1x1 ps CPU per step <= {aims.PS_VS_FLOOR} x the ps's floor at batch 256"] == (
      1.1, False)
