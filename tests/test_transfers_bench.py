"""bench/transfers.py: the tensors a training step moves between ps and worker, counted in the partitioned graphs
TensorFlow runs; the Estimator path moves no more per step than the Keras path (the same runner, and its step count
made on the ps: no round trip to the worker)."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import op_names  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.slow


# Every configuration the tests compare on 1 ps, counted by one child on one in-process cluster. The switches are
# counted with one step per loop iteration (the default): each loop iteration's tensors are then one step's.
# Each variant trains 20 steps (`--steps`, one scheduled function of fit): the graphs counted are those of the bench's
# default 40 steps.
_STEPS = "--steps=20"
_VARIANTS = ("fit", "estimator", "fit+unroll4", "fit+unpacked", "fit+bf16", "fit+bf16+per_feature")


@pytest.fixture(scope="module")
def counts(tmp_path_factory, module_subprocess_env) -> dict:
  """`{variant: counts}` of `_VARIANTS` (one run of bench/transfers.py)."""
  out = tmp_path_factory.mktemp("transfers") / "counts.json"
  command = [sys.executable, "bench/transfers.py", f"--variants={','.join(_VARIANTS)}", _STEPS, f"--json_out={out}"]
  result = subprocess.run(command, cwd=REPO, env=module_subprocess_env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  variants = json.loads(out.read_text())["variants"]
  assert sorted(variants) == sorted(_VARIANTS)
  return variants


@pytest.fixture
def default_fit(counts) -> dict:
  """The counts of tfps.fit with tfps's defaults (the one each test compares with)."""
  return counts["fit"]


def test_estimator_step_moves_no_more_tensors_than_the_keras_step(counts, default_fit):
  estimator = counts["estimator"]
  fit = default_fit
  for counted in (estimator, fit):
    assert "job:ps" in counted["file"] and "_steps_" in counted["file"]
    # Every step reads the dense weights (packed: one tensor) and looks up the 2 tables on the ps, and sends their
    # gradients there.
    assert counted["per_step"]["send"] >= 3 and counted["per_step"]["recv"] >= 3, counted
  total = lambda counted: counted["per_step"]["send"] + counted["per_step"]["recv"]
  assert total(estimator) <= total(fit), (estimator["per_step_names"], fit["per_step_names"])
  # The ps sends no tensor's metadata (a `Shape` for a gradient, in host memory) to the worker in any step.
  for counted in (estimator, fit):
    assert not [name for name in counted["per_step_names"] if name.startswith("_HostSend")], counted
  # The step loop's index stays on the worker: the ps sends no loop input (the index, for the condition and the
  # step's mark) in any step.
  for counted in (estimator, fit):
    assert not [name for name in counted["per_step_names"] if name.startswith("_Send Func/while/")], counted
  # The step count is made on the ps: nothing the worker casts comes back to the ps after the updates.
  assert not [name for name in estimator["per_step_names"] if name.startswith("_Recv") and "/Cast" in name]


def test_a_ps_applies_a_steps_updates_in_one_conditional(counts):
  """The ps skips or applies all of a step's updates in one `tf.cond` on its decision (`ps_records.OncePerPs`), not one
  per variable: its partition holds at most 4 `Merge`s (3 on fit; 25 while each variable's update had a conditional
  of its own, `bench/results/ps_floor/one_cond/`)."""
  for name in ("fit", "estimator", "fit+unpacked", "fit+bf16"):
    assert 0 < counts[name]["op_types"].get("Merge", 0) <= 4, (name, counts[name]["op_types"])


def test_with_four_ps_no_ps_waits_for_another_ps_gradients(tmp_path, subprocess_env):
  """tfps.fit and the Estimator path with 4 ps (a legacy optimizer): each ps decides on its updates after its own
  gradients, so no ps receives another's gradient signal; each ps moves at most 20 tensors per step (20 on the
  busiest, 15-17 on the others; 26 and 17-19 while the function's slot went from its ps to every other ps in every
  step and the optimizer's `iterations` waited for every ps's updates; 39 and 26-28 while every ps waited for all 4
  ps's gradients). No ps receives a function input in every step (the slot, each ps now makes its own from the
  step's mark), nor sends the optimizer's update group (its `iterations` follows its own ps's updates). The
  Estimator path's step count waits for the updates on its own ps alone (while it waited for every ps's, its ps
  received 3 signals more per step), so it moves no more than fit (64 and 69 tensors per step over the 4 ps). No ps
  receives a legacy optimizer's learning rate in a step (each ps but the one holding it did).

  Once a ps decided on a step's updates, none of them needs a tensor from another task (on each path, pipelined
  updates too): each ps decided before the learning rate read from the ps holding it had arrived, and a worker that
  died in between left a legacy Adagrad's accumulator rows updated (they do not read it), the rest not, and no
  record; the step run again updated them twice (9 such updates on a ps of 2 before). The same holds with a
  current tf-keras optimizer (Adam on fit, Adagrad on the Estimator path), whose updates read the learning rate and
  `iterations` themselves: 7-19 such updates and records per ps before (the optimizer also summed sparse gradients
  and aggregated all gradients on the worker). Each of its ps moves at most 26 tensors per step (22-26 now, 44-71
  before; more than with a legacy one: every ps waits for every ps's gradients, as the optimizer increments
  `iterations` directly)."""
  out = tmp_path / "four_ps.json"
  command = [sys.executable, "bench/transfers.py", "--variants=fit,estimator,fit+pipelined,fit+adam,estimator+current",
             "--num_ps=4", _STEPS, f"--json_out={out}"]
  result = subprocess.run(command, cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  variants = {name: counted["ps"] for name, counted in json.loads(out.read_text())["variants"].items()}
  total = lambda one: one["per_step"].get("send", 0) + one["per_step"].get("recv", 0)
  for name, counted in variants.items():
    assert len(counted) == 4 and all(f"task:{ps}" in one["file"] for ps, one in enumerate(counted)), (name, counted)
    assert not [late for one in counted for late in one["received_after_decision"]], (name, counted)
    if name == "fit+pipelined":
      continue  # here for its decisions only: the bounds below are those of one step at a time
    if name in ("fit+adam", "estimator+current"):
      assert max(map(total, counted)) <= 26, (name, [one["per_step_names"] for one in counted])
      continue
    for one in counted:
      assert total(one) <= 20, (name, one["per_step_names"])
      assert not [step for step in one["per_step_names"] if "Func/while/" in step or "/group_deps" in step], (
          name, one["per_step_names"])
  # A legacy optimizer's learning rate is read on each ps from a copy set once per function (`rate_copies`): no ps
  # receives it in a step (each ps but its own did, from the ps holding it).
  for name in ("fit", "estimator", "fit+pipelined"):
    rate_reads = [step for one in variants[name] for step in one["per_step_names"]
                  if re.match(r"_Recv \S*/Cast(_\d+)?/ReadVariableOp/", step)]
    assert not rate_reads, (name, rate_reads)
  # The count (`Cast` of its increment) takes no control signal from another ps.
  count_signal = re.compile(r"_Recv GroupCrossDeviceControlEdges\S*/Cast(_\d+)?/")
  for one in variants["estimator"]:
    assert not [name for name in one["per_step_names"] if count_signal.match(name)], one["per_step_names"]
  assert sum(map(total, variants["estimator"])) <= sum(map(total, variants["fit"])), variants
  assert len(variants) == 5, variants


def test_unrolled_steps_move_fewer_tensors_per_step_than_one_step_per_loop_iteration(counts, default_fit):
  """Each iteration of the step loop moves its condition and control signals between the ps and the worker: with 4
  steps per iteration (`--unrolled_steps=4`, or auto's choice at batch 256) a step moves at least 2 tensors fewer
  than with 1, the default (8.75 against 11: the loop's condition, its body's control signal and the ps's signal
  that it ran the iteration, 3 per iteration; one step per iteration has one loop only: no second loop for the steps
  left over). What a loop runs once (the control inputs it waits for, the signal that it ended) is not a step's."""
  unrolled = counts["fit+unroll4"]
  single = default_fit
  total = lambda counted: counted["per_step"]["send"] + counted["per_step"]["recv"]
  assert unrolled["unrolled_steps"] == 4 and single["unrolled_steps"] == 1
  assert total(unrolled) <= total(single) - 2, (unrolled["per_step"], single["per_step_names"])
  assert unrolled["per_step"]["send"] >= 3  # still the dense weights and both lookups, every step
  assert not single["per_leftover_step"] and unrolled["per_leftover_step"]


def test_packed_reads_send_each_ps_dense_weights_in_one_tensor_per_step(counts):
  """By default (`--packed_reads`) the ps sends 4 tensors per step (the packed dense weights, 2 lookups and a control
  signal, one step per loop iteration); with `--nopacked_reads` it sends the 10 dense weights one by one. The gradients
  reach it either way."""
  packed = counts["fit"]
  sends = [name for name in packed["per_step_names"] if name.startswith("_Send")]
  assert packed["per_step"]["send"] == 4, sends
  assert not [name for name in sends if "ReadVariableOp" in name], sends
  assert packed["per_step"]["recv"] >= 3, packed["per_step_names"]
  unpacked = counts["fit+unpacked"]
  reads = [name for name in unpacked["per_step_names"] if name.startswith("_Send") and "ReadVariableOp" in name]
  assert len(reads) == 10 and unpacked["per_step"]["send"] == 4 - 1 + 10, unpacked["per_step_names"]
  assert unpacked["per_step"]["recv"] == packed["per_step"]["recv"], (unpacked["per_step"], packed["per_step"])


def test_bf16_rows_move_the_rows_and_their_gradients_as_bfloat16(counts):
  """With `--bf16_rows` the ps sends each table's rows and receives their gradients as bfloat16 (as float32 by
  default), and moves no more tensors per step than without it."""
  rows = lambda counted: [name for name in counted["per_step_names"]
                          if "_stacked/" in name and ("_Send" in name or "gradient_tape" in name)]
  narrow = counts["fit+bf16"]
  default = counts["fit"]
  # 2 tables (deep and wide): each one's rows out and its gradient in.
  assert len(rows(narrow)) == 4 and all(name.endswith(" BFLOAT16") for name in rows(narrow)), rows(narrow)
  assert len(rows(default)) == 4 and all(name.endswith(" FLOAT") for name in rows(default)), rows(default)
  assert narrow["per_step"] == default["per_step"], (narrow["per_step_names"], default["per_step_names"])
  assert not [name for name in narrow["per_step_names"] if name.endswith(" FLOAT") and "_stacked/" in name]


def test_bf16_rows_move_per_feature_tables_rows_as_bfloat16_too(counts):
  """A tf-keras `Embedding` per feature (26 deep and 26 wide tables): with `--bf16_rows` every table's rows leave the
  ps as bfloat16, and the rows' gradients come back as bfloat16: 26 deep ones, and the wide ones in one tensor
  (TensorFlow sends it once: every wide row's gradient is the logit's)."""
  narrow = counts["fit+bf16+per_feature"]
  names = narrow["per_step_names"]
  sends = [name for name in names if name.startswith("_Send") and re.search(r"/(embedding|wide)_C\d+/", name)]
  assert len(sends) == 52 and all(name.endswith(" BFLOAT16") for name in sends), sends
  gradients = [name for name in names if name.startswith("_Recv") and name.endswith(" BFLOAT16")]
  assert len(gradients) >= 27, names
  assert not [name for name in names if name.startswith("_Recv") and "gradient_tape" in name
              and name.endswith(" FLOAT")], names


def test_an_unknown_variant_option_is_refused_before_any_training(subprocess_env):
  result = subprocess.run([sys.executable, "bench/transfers.py", "--variants=fit,fit+bf61"], cwd=REPO,
                          env=subprocess_env, capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "--variants: 'fit+bf61' has the option 'bf61'; allowed: unroll<N>, packed, unpacked, bf16, per_feature, "
      "pipelined, current, adam")


def test_what_a_loop_runs_once_is_counted_once_per_function():
  """A lowered loop's control inputs, exits and end signal carry its frame's name but run once per function."""
  assert [op_names.runs(name) for name in (
      "while/LoopCond/_57/_115", "while/loop_body_control/_65/_38", "while/body/_1/while/concat/_97",
      "GroupCrossDeviceControlEdges_0/while/body/_1/while/NoOp_1/_107", "while_1/LoopCond/_9/_10",
      "while/LoopControlInputs/_49/_26", "while/LoopExecuted/_73/_54", "while/exit/_3/_4", "while/exit_2/_5/_6",
      "while_1/LoopExecuted/_8/_9", "progress/Read/_1")] == ["per_step"] * 4 + ["per_leftover_step"] + [
          "per_function"] * 6
