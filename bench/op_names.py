"""Where an op of a partitioned training function runs and what made it, read from its name alone (no flags, no
TensorFlow: `bench/transfers.py` counts with it, tests import it)."""

import re

_LOOP = re.compile(r"^(?:Func/|GroupCrossDeviceControlEdges_\d+/)*(while(?:_\d+)?)/")
# What a lowered loop runs once, not per iteration, though named in its frame: the control inputs it waits for before
# its first iteration (`LoopControlInputs`), its exits after the last one, and the signal that it ended (`LoopExecuted`,
# which ops after the loop wait for).
_ONCE_PER_LOOP = re.compile(r"^(?:LoopControlInputs|exit|LoopExecuted)(?:_\d+)?/")


# The frames a partitioned function's op names carry: function inputs, grouped control edges, loops, their bodies.
_FRAMES = re.compile(r"^(?:(?:Func|ConstantFoldingCtrl|_cloop\w*|GroupCrossDeviceControlEdges_\d+|while(?:_\d+)?|body|"
                     r"_\d+|input|output)/)*")


def op_prefix(name: str, depth: int = 2) -> str:
  """The first `depth` parts of an op's name past its frames (`while/body/_1/while/...`), their numbers dropped:
  what made the op, as "Adagrad/Adagrad", "wide_deep/deep_mlp", "VariableShape", "enter" (a loop's input)."""
  parts = [re.sub(r"_\d+$", "", part) for part in _FRAMES.sub("", name).split("/")]
  return "/".join([part for part in parts if part][:depth]) or "(input)"


def runs(name: str) -> str:
  """How often the op `name` of a partitioned training function runs: "per_step" (in the first loop, per iteration),
  "per_leftover_step" (in the second loop) or "per_function"."""
  loop = _LOOP.match(name)
  if not loop or _ONCE_PER_LOOP.match(name[loop.end():]):
    return "per_function"
  return "per_step" if loop.group(1) == "while" else "per_leftover_step"
