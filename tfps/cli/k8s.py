"""`tfps-k8s`: Kubernetes manifests for the training command a user runs on each host.

  tfps-k8s --name=ctr --namespace=team --image=registry/tfps:1 --claim=tfps-models [--kind=tfjob|plain] \
      -- python scripts/train_keras.py --flagfile=configs/run.cfg --ps_hosts=a:2222,b:2222 --worker_hosts=... \
         --chief_hosts=... --evaluator_hosts=... --model_dir=/shared/run

The command after `--` is the one each task runs; its cluster flags (on the command line or in its flagfiles) give
the number of tasks per job and are left out of the pods' command (the pods get their cluster from TF_CONFIG or the
TFPS_ variables). Writes the manifests (JSON documents, which kubectl reads as YAML) to --output or stdout.
Bad input: one line on stderr, exit status 2.
"""

import json
import os
import posixpath
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from absl import flags

from tfps.cluster import config as cluster_lib
from tfps.cluster import k8s
from tfps.cli import flags as flags_lib
from tfps.errors import TfpsError
from tfps.errors import UsageError

USAGE = ("usage: tfps-k8s --name=N --namespace=NS --image=IMAGE --claim=PVC [--kind=jobset|tfjob|plain] "
         "[--max_restarts=N] -- python SCRIPT --ps_hosts=... --worker_hosts=... [--chief_hosts=...] "
         "[--evaluator_hosts=...] --model_dir=MOUNT/...")
_CLUSTER_FLAGS = tuple(f"{job}_hosts" for job in cluster_lib.JOB_NAMES) + ("job_name", "task_index")
_VALUED_FLAGS = ("model_dir", "flagfile")  # read from the command too
_QUANTITY = re.compile(r"^(?=.*[1-9])[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")  # a positive one


def define_flags(flag_values: flags.FlagValues) -> None:
  flags.DEFINE_string("name", None, "The job's name (a DNS label).", flag_values=flag_values)
  flags.DEFINE_string("namespace", "default", "Kubernetes namespace.", flag_values=flag_values)
  flags.DEFINE_string("image", None, "Container image holding tfps and the training script.", flag_values=flag_values)
  flags.DEFINE_string("claim", None, "PersistentVolumeClaim every pod mounts for model_dir.", flag_values=flag_values)
  flags.DEFINE_string("mount_path", "/shared", "Where the claim is mounted; --model_dir must be under it.",
                      flag_values=flag_values)
  flags.DEFINE_enum("kind", "jobset", list(k8s.KINDS), "A JobSet (jobset.x-k8s.io), a Kubeflow TFJob, or a headless "
                    "Service with an Indexed Job per task type (docs/kubernetes.md).", flag_values=flag_values)
  flags.DEFINE_integer("max_restarts", None, f"--kind=jobset: times the set is recreated after a ps (or a job out of "
                       f"pod restarts) failed (default {k8s.DEFAULT_MAX_RESTARTS}).", lower_bound=0,
                       flag_values=flag_values)
  flags.DEFINE_integer("port", cluster_lib.DEFAULT_PORT, "Every task's port.", lower_bound=1, upper_bound=65535,
                       flag_values=flag_values)
  flags.DEFINE_string("cpu", "1", "CPU request and limit of each task.", flag_values=flag_values)
  flags.DEFINE_string("memory", "2Gi", "Memory request and limit of each task.", flag_values=flag_values)
  flags.DEFINE_string("output", "-", "File to write the manifests to ('-': stdout).", flag_values=flag_values)


def read_script_flags(args: Sequence[str], cwd: str = ".") -> Tuple[Dict[str, str], List[str]]:
  """`({flag: value}, command args without cluster flags)` from the script's args and the flagfiles they name.

  Raises:
    UsageError: a flagfile is missing, or sets a cluster flag (the pods' command would contradict TF_CONFIG).
  """
  values, kept = {}, []
  for arg in args:
    name, _, value = arg.lstrip("-").partition("=")
    if arg.startswith("--") and "=" not in arg and name in (*_CLUSTER_FLAGS, *_VALUED_FLAGS):
      raise UsageError(f"give --{name} with its value after '=' (--{name}=VALUE): tfps-k8s reads the command's "
                       f"cluster flags, model_dir and flagfiles in that form")
    if arg.startswith("--") and name in _CLUSTER_FLAGS:
      values[name] = value
      continue
    kept.append(arg)
    if arg.startswith("--") and name == "flagfile":
      for flag, flag_value in _read_flagfile(os.path.join(cwd, value), cwd).items():
        if flag in _CLUSTER_FLAGS:
          raise UsageError(f"flagfile {value} sets --{flag}; in Kubernetes each pod gets its cluster from TF_CONFIG, "
                           "so give the cluster flags on the command line instead")
        values.setdefault(flag, flag_value)
    elif arg.startswith("--") and "=" in arg:
      values[name] = value
  return values, kept


def _read_flagfile(path: str, cwd: str) -> Dict[str, str]:
  try:
    with open(path, encoding="utf-8") as f:
      lines = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
  except OSError as e:
    raise UsageError(f"flagfile {path} cannot be read ({e.strerror})") from None
  values = {}
  for line in lines:
    name, _, value = line.lstrip("-").partition("=")
    if name == "flagfile":
      values.update(_read_flagfile(os.path.join(cwd, value), cwd))
    else:
      values[name] = value
  return values


def spec_from_flags(flag_values: flags.FlagValues, command: Sequence[str], cwd: str = ".") -> k8s.JobSpec:
  """The `JobSpec` from tfps-k8s's flags and the training command."""
  if not command:
    raise UsageError(f"no training command after `--`; {USAGE}")
  script_values, kept = read_script_flags(command[1:], cwd)
  replicas = []
  for job in cluster_lib.JOB_NAMES:
    hosts = cluster_lib.parse_hosts(script_values.get(f"{job}_hosts", ""), f"--{job}_hosts")
    replicas.append((job, len(hosts)))
  model_dir = script_values.get("model_dir")
  model_dir = model_dir and posixpath.normpath(model_dir)
  mount = flag_values["mount_path"].value.rstrip("/")
  if not model_dir or not (model_dir == mount or model_dir.startswith(mount + "/")):
    raise UsageError(f"--model_dir={model_dir} is not under --mount_path={mount}: every pod must see model_dir on the "
                     "claim")
  if not flag_values["name"].value:
    raise UsageError(f"--name is required; {USAGE}")
  max_restarts = flag_values["max_restarts"].value
  for name in ("cpu", "memory"):
    if not _QUANTITY.match(flag_values[name].value):
      raise UsageError(f"--{name}={flag_values[name].value} is not a Kubernetes quantity (e.g. 2, 500m, 4Gi)")
  if max_restarts is not None and flag_values["kind"].value != "jobset":
    raise UsageError(f"--max_restarts={max_restarts} is a JobSet's (the set recreated after a ps failed); "
                     f"--kind={flag_values['kind'].value} restarts each failed pod alone, up to "
                     f"{k8s.POD_BACKOFF_LIMIT} times per job")
  return k8s.JobSpec(name=flag_values["name"].value, namespace=flag_values["namespace"].value,
                     image=flag_values["image"].value or "", command=(command[0], *kept), replicas=tuple(replicas),
                     claim=flag_values["claim"].value or "", mount_path=mount, port=flag_values["port"].value,
                     cpu=flag_values["cpu"].value, memory=flag_values["memory"].value,
                     max_restarts=k8s.DEFAULT_MAX_RESTARTS if max_restarts is None else max_restarts)


def render(documents: Sequence[dict]) -> str:
  """Documents as JSON separated by `---` (JSON is YAML: kubectl apply -f reads it)."""
  return "".join(f"---\n{json.dumps(document, indent=2)}\n" for document in documents)


def main(argv: Sequence[str], cwd: str = ".") -> int:
  """Writes the manifests; returns the exit status."""
  argv = list(argv)
  split = argv.index("--") if "--" in argv else len(argv)
  flag_values = flags.FlagValues()
  define_flags(flag_values)
  help_text = flags_lib.help_text(argv, flag_values, USAGE, __name__)
  if help_text:
    print(help_text)
    return 0
  try:
    extra = flag_values(argv[:split])[1:]
    if extra:
      raise UsageError(f"unexpected argument {extra[0]!r} before `--`; {USAGE}")
    spec = spec_from_flags(flag_values, argv[split + 1:], cwd)
    text = render(k8s.build_manifests(spec, flag_values["kind"].value))
  except (flags.Error, TfpsError) as e:
    print(f"tfps-k8s: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  if flag_values["output"].value == "-":
    sys.stdout.write(text)
    return 0
  try:
    with open(flag_values["output"].value, "w", encoding="utf-8") as f:
      f.write(text)
  except OSError as e:
    print(f"tfps-k8s: --output={flag_values['output'].value} cannot be written ({e.strerror})", file=sys.stderr)
    return 2
  return 0


def run(argv: Optional[Sequence[str]] = None) -> None:
  """Console-script entry point of `tfps-k8s`."""
  sys.exit(main(sys.argv if argv is None else argv))


if __name__ == "__main__":
  run()
