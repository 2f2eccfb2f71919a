"""Cross-process transfers per step of a training path, counted in the partitioned graphs TensorFlow runs.

  .venv/bin/python bench/transfers.py --path=estimator       # or --path=fit; --batch_size=256
  .venv/bin/python bench/transfers.py --path=fit --num_ps=4  # each ps's partition

Trains `--steps` steps (a few scheduled functions; 20, one function of fit, count the same) of the benchmark
workload (`bench/workload.py`) on an in-process `--num_ps` ps + 1 worker cluster with `TF_DUMP_GRAPH_PREFIX` set (in a
child process: the variable must be set before TensorFlow loads; the child counts too, and this process loads no
TensorFlow), then counts in each ps's partition of the training function (that ps's partition with the most ops) the
`_Send` and `_Recv` ops, each one tensor moved between that ps and another task, served by one gRPC `RecvTensor`
call. The first loop of the function (`while/` frames) runs `--unrolled_steps` steps per iteration: its counts
divided by that are per step; a second loop (`while_1/`, the steps left over, one per iteration) is counted apart
(`per_leftover_step`); the rest (and what a loop runs once: the control inputs it waits for, its exits, the signal
that it ended) happens once per scheduled function. With one ps the output is that partition's counts; with more,
`{"ps": [counts of ps 0, ps 1, ...]}`. Each per-step transfer is printed with its dtype (FLOAT, BFLOAT16 with
`--bf16_rows`, ...). Each partition's `received_after_decision` lists the updates that need a tensor from another
task which the ps's decision on the step did not wait for (none is allowed: `tfps/training/ps_records.py`, rule 1).

`--variants=fit,estimator,fit+bf16,...` counts several configurations in one child, one after another on the same
cluster (each dumps into a folder of its own): the output is `{"variants": {variant: counts}}`. The workload's
optimizer is a tf-keras legacy Adagrad; the option `current` trains with a current `tf_keras.optimizers.Adagrad`
instead, `adam` with a current `tf_keras.optimizers.Adam` (what `optimizer="adam"` compiles to).
"""

import collections
import dataclasses
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import List, Optional

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

from bench import op_names  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfps.training import modes  # pylint: disable=g-import-not-at-top,wrong-import-position

_PATH = flags.DEFINE_enum("path", "estimator", ["fit", "estimator"], "The training path to count.")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 40, "Steps each variant trains (a few scheduled functions).", lower_bound=1)
_SPE = flags.DEFINE_integer("steps_per_execution", None, "Steps per scheduled function (default: the path's own).",
                            lower_bound=1)
_NUM_PS = flags.DEFINE_integer("num_ps", 1, "Parameter servers of the in-process cluster.", lower_bound=1)
_UNROLLED = flags.DEFINE_integer("unrolled_steps", None, "Steps per iteration of the step loop (default: tfps's).",
                                 lower_bound=1)
_PACKED = flags.DEFINE_boolean("packed_reads", None, "Read each ps's small dense variables in one transfer per step "
                               "(default: tfps's; --nopacked_reads: each one on its own).")
_BF16 = flags.DEFINE_boolean("bf16_rows", False, "Table rows and their gradients cross as bfloat16.")
_PER_FEATURE = flags.DEFINE_boolean("per_feature_tables", False, "A tf-keras Embedding per feature (deep and wide) "
                                    "instead of the stacked tables.")
_VARIANTS = flags.DEFINE_list("variants", None, "Configurations to count in one child, each PATH[+option...] with "
                               "the options unroll<N>, packed, unpacked, bf16, per_feature, pipelined, current, "
                               "adam (e.g. fit+bf16); instead of --path, --unrolled_steps, --packed_reads, "
                               "--bf16_rows and --per_feature_tables.")
_CHILD_DIR = flags.DEFINE_string("child_dump_dir", None, "(internal) train and dump into this folder.")
_CHILD_JSON = flags.DEFINE_string("child_counts", None, "(internal) then count, and write the counts here.")
_JSON = flags.DEFINE_string("json_out", None, "Also write the counts here.")
_LIST_OPS = flags.DEFINE_boolean("list_ops", False, "Also print each ps partition's ops by type and by name prefix "
                                 "(`op_types`, `op_prefixes` in the output).")
_DUMP_DIR = flags.DEFINE_string("dump_dir", None, "Dump the graphs into this folder and keep them (default: a "
                                "temporary one): each function's partitions, at each pass after partitioning.")

_NODE = re.compile(r'^node \{\n  name: "([^"]*)"\n  op: "([^"]*)"', re.M)
# The dtype of a `_Send` (attr T) or `_Recv` (attr tensor_type) within its node's text.
_DTYPE = re.compile(r'key: "(?:T|tensor_type)"\n    value \{\n      type: DT_(\w+)')


@dataclasses.dataclass(frozen=True)
class Variant:
  """One configuration to count: the training path and the options its step is traced with."""

  path: str
  unrolled_steps: Optional[int] = None
  packed_reads: Optional[bool] = None
  bf16_rows: bool = False
  per_feature_tables: bool = False
  pipelined_updates: bool = False
  optimizer: str = "legacy"  # a key of `_optimizers()`


def _optimizers() -> dict:
  """The optimizers a variant can train with: `{option: class}` (None: the workload's legacy Adagrad)."""
  import tf_keras  # pylint: disable=g-import-not-at-top  (TensorFlow only in the child)
  return {"legacy": None, "current": tf_keras.optimizers.Adagrad, "adam": tf_keras.optimizers.Adam}


def parse_variant(variant: str) -> Variant:
  """The `Variant` of "PATH[+option...]"; raises `app.UsageError` on an unknown path or option."""
  path, *options = variant.split("+")
  if path not in ("fit", "estimator"):
    raise app.UsageError(f"--variants: {variant!r}: the path {path!r} is not one of fit, estimator")
  fields = {}
  for option in options:
    if re.fullmatch(r"unroll[1-9][0-9]*", option):
      fields["unrolled_steps"] = int(option[6:])
    elif option in ("packed", "unpacked"):
      fields["packed_reads"] = option == "packed"
    elif option in ("bf16", "per_feature", "pipelined"):
      field = {"bf16": "bf16_rows", "per_feature": "per_feature_tables", "pipelined": "pipelined_updates"}[option]
      fields[field] = True
    elif option in ("current", "adam"):
      fields["optimizer"] = option
    else:
      raise app.UsageError(f"--variants: {variant!r} has the option {option!r}; allowed: unroll<N>, packed, unpacked, "
                           "bf16, per_feature, pipelined, current, adam")
  return Variant(path, **fields)


def _variants() -> List[Variant]:
  """The configurations to count: `--variants`, else the one of `--path` and its flags."""
  if _VARIANTS.value:
    return [parse_variant(variant) for variant in _VARIANTS.value]
  return [Variant(_PATH.value, _UNROLLED.value, _PACKED.value, _BF16.value, _PER_FEATURE.value)]


def _variant_dir(dump_dir: str, index: int) -> str:
  return os.path.join(dump_dir, str(index))


def _train_all(dump_dir: str) -> None:
  """In the child: each variant's few scheduled functions on one in-process cluster, its graphs dumped into a folder
  of its own (`TF_DUMP_GRAPH_PREFIX` is read at every dump)."""
  from tfps.testing import in_process  # pylint: disable=g-import-not-at-top
  cluster = in_process.local_cluster(num_workers=1, num_ps=_NUM_PS.value)
  for index, variant in enumerate(_variants()):
    os.environ["TF_DUMP_GRAPH_PREFIX"] = _variant_dir(dump_dir, index)
    _train(variant, cluster)


def _train(variant: Variant, cluster) -> None:
  """A few scheduled functions of `variant` on `cluster`."""
  import tfps  # pylint: disable=g-import-not-at-top
  from bench import workload as workload_lib  # pylint: disable=g-import-not-at-top
  workload = workload_lib.Workload(batch_size=_BATCH.value, vocab_size=10_000,
                                   stack_tables=not variant.per_feature_tables)
  settings = {"unrolled_steps": variant.unrolled_steps, "packed_reads": variant.packed_reads,
              "bf16_rows": variant.bf16_rows, "pipelined_updates": variant.pipelined_updates}
  optimizer = _optimizers()[variant.optimizer]
  if variant.path == "fit":
    tfps.fit(lambda: workload_lib.build_model(workload, optimizer), workload_lib.dataset_fn(workload), epochs=1,
             steps_per_epoch=_STEPS.value, steps_per_execution=_SPE.value, cluster=cluster, batch_size=_BATCH.value,
             sync_mode=tfps.TrainingMode(**settings))
    return
  with tempfile.TemporaryDirectory(prefix="tfps_transfers_") as model_dir:
    options = {} if _SPE.value is None else {"steps_per_execution": _SPE.value}
    estimator = tfps.Estimator(workload_lib.build_model_fn(workload, optimizer), model_dir=model_dir, cluster=cluster,
                               config=tfps.RunConfig(save_checkpoints_steps=1000, **settings, **options))
    estimator.train(lambda: workload_lib.dataset(workload), max_steps=_STEPS.value)


def count(dump_dir: str, num_ps: int = 1, unrolled_steps: Optional[int] = None, batch_size: int = 256) -> dict:
  """`{file, ops, per_step: {send, recv}, per_function: {send, recv}, per_step_names}` (each "op name DTYPE") of the
  biggest partition of a ps; with `num_ps` > 1, `{"ps": [those of ps 0, ps 1, ...]}`, the biggest partition of each.
  `unrolled_steps`: the steps per iteration of the step loop it was trained with (default: what tfps chooses for
  batches of `batch_size`)."""
  files = glob.glob(os.path.join(dump_dir, "*partition__job_ps*after_partition_passes*.pbtxt"))
  files += glob.glob(os.path.join(dump_dir, "*partition__job:ps*after_partition_passes*.pbtxt"))
  if not files:
    raise RuntimeError(f"no ps partition was dumped into {dump_dir}: {sorted(os.listdir(dump_dir))[:20]}")
  biggest = {}
  for path in set(files):
    task = re.search(r"task[_:](\d+)", os.path.basename(path))
    task = int(task.group(1)) if task else 0
    with open(path, encoding="utf-8") as graph:
      nodes = _nodes(graph.read())
    if task not in biggest or len(nodes) > len(biggest[task][1]):
      biggest[task] = (path, nodes)
  if num_ps == 1:
    return _counted(*biggest[min(biggest)], unrolled_steps, batch_size)
  missing = sorted(set(range(num_ps)) - set(biggest))
  if missing:
    raise RuntimeError(f"no partition of ps {missing} was dumped into {dump_dir}")
  return {"ps": [_counted(*biggest[task], unrolled_steps, batch_size) for task in range(num_ps)]}


def _nodes(text: str) -> list:
  """`(name, op, dtype)` of every node of a dumped graph; dtype ("FLOAT", "BFLOAT16") where a transfer names one."""
  matches = list(_NODE.finditer(text))
  nodes = []
  for match, following in zip(matches, matches[1:] + [None]):
    dtype = _DTYPE.search(text, match.end(), following.start() if following else len(text))
    nodes.append((match.group(1), match.group(2), dtype.group(1) if dtype else ""))
  return nodes


_INPUT = re.compile(r'^  input: "\^?([^":]*)', re.M)
# Ops that change a variable (its value or a slot's): after a ps's decision on a step's updates where they descend
# from it.
_WRITES = re.compile(r"Resource(Sparse)?Apply|ResourceScatter|Assign(Add|Sub)?VariableOp$")


def _graph(text: str) -> dict:
  """`{name: (op, [input names])}` of a dumped graph (control inputs included, output indices dropped)."""
  graph = {}
  for block in text.split("\nnode {")[1:]:
    name, op = _NODE.match("node {" + block).groups()
    graph[name] = (op, _INPUT.findall(block))
  return graph


def received_after_decision(graph: dict) -> List[str]:
  """"update <- transfer" for each op of a ps partition that changes a variable after a decision of that ps on a
  step's updates (descending from a `ps_records.DECISION`: an op of the conditional updates, `.../cond/...`, or the
  ps's record, `ps_records.RECORD`) and needs a tensor received from another task that none of the decisions it
  descends from waited for. A dying worker can take such a tensor with it once the ps has
  decided: the ps then applies a part of the step and no record, and the step run again applies that part twice."""
  from tfps.training import ps_records  # pylint: disable=g-import-not-at-top  (TensorFlow: only in the child)
  received, decided = {}, {}
  for name in graph:  # iteratively, deepest inputs first; a loop's back edges (NextIteration) are not followed
    stack = [name]
    while stack:
      node = stack[-1]
      if node in received:
        stack.pop()
        continue
      inputs = [i for i in graph.get(node, ("", []))[1] if i in graph and graph[i][0] != "NextIteration"]
      pending = [i for i in inputs if i not in received and i not in stack]
      if pending:
        stack.extend(pending)
        continue
      op = graph.get(node, ("", []))[0]
      received[node] = frozenset({node} if op in ("_Recv", "_HostRecv") else ()).union(
          *(received.get(i, frozenset()) for i in inputs))
      decided[node] = frozenset({node} if node.rsplit("/", 1)[-1].startswith(ps_records.DECISION) else ()).union(
          *(decided.get(i, frozenset()) for i in inputs))
      stack.pop()
  late = []
  for name, (op, _) in sorted(graph.items()):
    last = name.rsplit("/", 1)[-1]
    if decided[name] and _WRITES.match(op) and ("/cond/" in name or last.startswith(ps_records.RECORD)):
      waited = frozenset().union(*(received[decision] for decision in decided[name]))
      late += [f"{name} <- {transfer}" for transfer in sorted(received[name] - waited)]
  return late


def _counted(path: str, nodes: list, unrolled_steps: Optional[int], batch_size: int) -> dict:
  counts = {"per_step": collections.Counter(), "per_leftover_step": collections.Counter(),
            "per_function": collections.Counter()}
  names = []
  for name, op, dtype in nodes:
    if op not in ("_Send", "_Recv", "_HostSend", "_HostRecv"):
      continue
    where = op_names.runs(name)
    counts[where]["send" if "Send" in op else "recv"] += 1
    if where == "per_step":
      names.append(f"{op} {name} {dtype}".rstrip())
  unrolled = modes.TrainingMode(unrolled_steps=unrolled_steps).steps_per_iteration(
      _SPE.value or modes.DEFAULT_STEPS_PER_EXECUTION, batch_size)
  with open(path, encoding="utf-8") as graph:
    late = received_after_decision(_graph(graph.read()))
  return {"file": os.path.basename(path), "ops": len(nodes), "unrolled_steps": unrolled,
          "received_after_decision": late,
          "op_types": dict(collections.Counter(op for _, op, _ in nodes).most_common()),
          "op_prefixes": dict(collections.Counter(op_names.op_prefix(name) for name, _, _ in nodes).most_common()),
          "per_step": {kind: n / unrolled for kind, n in counts["per_step"].items()},
          "per_leftover_step": dict(counts["per_leftover_step"]), "per_function": dict(counts["per_function"]),
          "per_step_names": sorted(names)}


def _count_all(dump_dir: str, variants: List[Variant]) -> list:
  """`count` of each variant's folder, with its path and batch size."""
  return [dict(count(_variant_dir(dump_dir, index), _NUM_PS.value, variant.unrolled_steps, _BATCH.value),
               path=variant.path, batch_size=_BATCH.value) for index, variant in enumerate(variants)]


def _print(result: dict) -> None:
  for ps, counted in enumerate(result.get("ps", [result])):
    for name in counted["per_step_names"]:
      print(f"ps {ps}: {name}")
    for kind in ("op_types", "op_prefixes") if _LIST_OPS.value else ():
      print(f"ps {ps}: {kind}: " + ", ".join(f"{key} {n}" for key, n in counted[kind].items()))
  hidden = ("per_step_names", "op_types", "op_prefixes")
  shown = [{k: v for k, v in counted.items() if k not in hidden} for counted in result.get("ps", [result])]
  print(json.dumps(dict(result, ps=shown) if "ps" in result else shown[0], indent=1))


def main(argv):
  del argv
  variants = _variants()  # an unknown option fails here, before any training
  if _CHILD_DIR.value:
    _train_all(_CHILD_DIR.value)
    if _CHILD_JSON.value:  # counted here, where TensorFlow is loaded already (the parent never loads it)
      with open(_CHILD_JSON.value, "w", encoding="utf-8") as out:
        json.dump(_count_all(_CHILD_DIR.value, variants), out)
    sys.stdout.flush()
    os._exit(0)  # the graphs are dumped: no remote-function clean-up at exit (seconds under PSS)
  with tempfile.TemporaryDirectory(prefix="tfps_dump_") as temporary:
    dump_dir = _DUMP_DIR.value or temporary
    os.makedirs(dump_dir, exist_ok=True)
    # each function's partitions alone (the passes before partitioning are not read here, and cost seconds to write)
    env = dict(os.environ, TF_DUMP_GRAPH_PREFIX=dump_dir, TF_DUMP_GRAPH_NAME_FILTER="partition",
               TF_DUMP_GRAPH_GROUPS="main", TF_CPP_MIN_LOG_LEVEL="2")
    args = [sys.executable, os.path.abspath(__file__), f"--path={_PATH.value}", f"--batch_size={_BATCH.value}",
            f"--num_ps={_NUM_PS.value}", f"--child_dump_dir={dump_dir}",
            f"--child_counts={os.path.join(temporary, 'counts.json')}"]
    args += [f"--steps={_STEPS.value}"]
    args += [f"--steps_per_execution={_SPE.value}"] if _SPE.value else []
    args += [f"--unrolled_steps={_UNROLLED.value}"] if _UNROLLED.value else []
    args += [] if _PACKED.value is None else ["--packed_reads" if _PACKED.value else "--nopacked_reads"]
    args += ["--bf16_rows"] if _BF16.value else []
    args += ["--per_feature_tables"] if _PER_FEATURE.value else []
    args += [f"--variants={','.join(_VARIANTS.value)}"] if _VARIANTS.value else []
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(temporary, "counts.json"), encoding="utf-8") as counted:
      results = json.load(counted)
  for name, result in zip(_VARIANTS.value or [None], results):
    if name:
      print(f"--- {name}")
    _print(result)
  output = {"variants": dict(zip(_VARIANTS.value, results))} if _VARIANTS.value else results[0]
  if _JSON.value:
    with open(_JSON.value, "w", encoding="utf-8") as out:
      json.dump(output, out, indent=2)


if __name__ == "__main__":
  app.run(main)
