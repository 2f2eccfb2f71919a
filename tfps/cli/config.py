"""`tfps-config <cluster flags>`: prints the TF_CONFIG JSON this task would get.

A debugging aid, and a way to write per-host environment files. Bad input: one line on stderr, exit status 2.
For a ps, worker or chief, a note on stderr says that its port is open on every interface of its host, whatever
address the cluster names (the JSON on stdout stays usable as it is).
"""

import json
import os
import sys
from typing import Optional, Sequence

from absl import flags

from tfps.cli import flags as flags_lib
from tfps.cluster import isolation
from tfps.errors import ClusterConfigError

USAGE = "usage: tfps-config --ps_hosts=H:P,... --worker_hosts=H:P,... [--chief_hosts=H:P] --job_name=J --task_index=I"


def main(argv: Sequence[str], environ=None) -> int:
  """Prints the TF_CONFIG for the task the flags (and/or $TF_CONFIG) describe; returns the exit status."""
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  help_text = flags_lib.help_text(argv, flag_values, USAGE, flags_lib.__name__)
  if help_text:
    print(help_text)
    return 0
  try:
    extra = flag_values(list(argv))[1:]
    if extra:
      raise ClusterConfigError(f"unexpected argument {extra[0]!r}; {USAGE}")
    config = flags_lib.config_from_flags(flag_values, os.environ if environ is None else environ)
    if config is None:
      raise ClusterConfigError(f"no cluster given and TF_CONFIG is unset; {USAGE}")
  except (flags.Error, ClusterConfigError) as e:
    print(f"tfps-config: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  print(json.dumps(config.to_tf_config(), sort_keys=True))
  if config.address and config.task_type in config.training_cluster():
    where = f"of its host (not only the one {config.address.rsplit(':', 1)[0]} names)"
    note = isolation.describe_exposure(f"{config.task_type}:{config.task_index}", config.address, where)
    print(f"tfps-config: note: {note}", file=sys.stderr)
  return 0


def run(argv: Optional[Sequence[str]] = None) -> None:
  """Console-script entry point of `tfps-config`."""
  sys.exit(main(sys.argv if argv is None else argv))


if __name__ == "__main__":
  run()
