"""`tfps-delta`: serve a base export with its deltas applied (docs/delta_export.md).

  tfps-delta apply BASE [DELTA ...] --out=DIR
      a SavedModel answering as a full export at the last delta's step would (`tfps.delta.apply`);
  tfps-delta watch FOLDER --serving=DIR [--keep=3] [--interval=1] [--once]
      follows a folder of deltas and keeps DIR/<version> current (TF Serving's layout, each version renamed in whole;
      the newest --keep stay), looking every --interval seconds until stopped (SIGTERM, Ctrl-C), or once.

The arguments, and the chain `apply` is given, are checked before TensorFlow is imported. Bad input (a gap in the
chain, a delta of another base or model, a delta cut short, an existing `--out`, a bad option): one line on stderr,
exit status 2, nothing written; `watch` tells a refused chain in one line and goes on serving the last good version
(`--once`: exit status 2).
"""

import math
import os
import re
import signal
import sys
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from tfps.training import delta_files

USAGE = {"apply": "usage: tfps-delta apply BASE [DELTA ...] --out=DIR",
         "watch": "usage: tfps-delta watch FOLDER --serving=DIR [--keep=3] [--interval=1] [--once]"}
OPTIONS = {"apply": {"--out": True}, "watch": {"--serving": True, "--keep": True, "--interval": True, "--once": False}}


def _split(command: str, args: Sequence[str]) -> Tuple[List[str], Dict[str, str]]:
  """`(positional arguments, {option: value})` of `command`'s arguments; `ValueError` naming what is wrong."""
  positional, options = [], {}
  for arg in args:
    if not arg.startswith("--"):
      positional.append(arg)
      continue
    name, has_value, value = arg.partition("=")
    if name not in OPTIONS[command]:
      raise ValueError(f"unknown option {arg!r} (known: {', '.join(OPTIONS[command])}); {USAGE[command]}")
    if name in options:
      raise ValueError(f"{name} is given twice; {USAGE[command]}")
    if OPTIONS[command][name] and not value:
      raise ValueError(f"{name} takes a value ({name}=...), given {arg!r}; {USAGE[command]}")
    if not OPTIONS[command][name] and has_value:
      raise ValueError(f"{name} takes no value, given {arg!r}; {USAGE[command]}")
    options[name] = value
  return positional, options


def _number(name: str, text: str, kind, command: str):
  try:
    value = kind(text)
  except ValueError:
    value = None
  if value is None or not 0 < value < math.inf:
    raise ValueError(f"{name}={text!r} must be a positive {'integer' if kind is int else 'number'}; {USAGE[command]}")
  return value


def _check_apply(args: Sequence[str]) -> Tuple[str, List[str], str]:
  paths, options = _split("apply", args)
  if "--out" not in options:
    raise ValueError(f"give --out=DIR once; {USAGE['apply']}")
  if not paths:
    raise ValueError(f"give the base export; {USAGE['apply']}")
  delta_files.check_apply(paths[0], paths[1:], options["--out"])
  return paths[0], paths[1:], options["--out"]


def _check_watch(args: Sequence[str]) -> dict:
  folders, options = _split("watch", args)
  if len(folders) != 1:
    raise ValueError(f"give one folder of deltas (given: {len(folders)}); {USAGE['watch']}")
  if not os.path.isdir(folders[0]):
    raise ValueError(f"the folder of deltas {folders[0]!r} is not a folder; {USAGE['watch']}")
  serving = options.get("--serving")
  if serving is None:
    raise ValueError(f"give --serving=DIR, the folder of served versions; {USAGE['watch']}")
  if os.path.exists(serving) and not os.path.isdir(serving):
    raise ValueError(f"--serving={serving!r} is a file, not a folder; {USAGE['watch']}")
  if "--once" in options and not any(re.match(r"^(base|delta)-\d+$", name) for name in os.listdir(folders[0])):
    raise ValueError(f"no export in {folders[0]!r} to serve (a run's exports are in its model_dir/deltas); "
                     f"{USAGE['watch']}")
  return {"folder": folders[0], "serving_dir": serving, "once": "--once" in options,
          "keep": _number("--keep", options.get("--keep", "3"), int, "watch"),
          "interval_secs": _number("--interval", options.get("--interval", "1"), float, "watch")}


def _report(line: str, ok: bool) -> None:
  print(line if ok else f"tfps-delta: {line}", file=sys.stdout if ok else sys.stderr, flush=True)


def _run_watch(settings: dict) -> int:
  from tfps.keras import delta_watch  # pylint: disable=g-import-not-at-top  (TensorFlow once the arguments are right)
  stop = threading.Event()
  for number in (signal.SIGTERM, signal.SIGINT) if not settings["once"] else ():
    signal.signal(number, lambda *_: stop.set())
  os.makedirs(settings["serving_dir"], exist_ok=True)
  ok = delta_watch.watch(**settings, stop=stop, report=_report)
  return 0 if ok or not settings["once"] else 2


def main(argv: Sequence[str]) -> int:
  """Runs `tfps-delta` on `argv` (with the program name first); returns the exit status."""
  if len(argv) < 2:
    print("tfps-delta: give a command (apply, watch)\n" + "\n".join(USAGE.values()), file=sys.stderr)
    return 2
  if argv[1] == "help" or any(arg in ("-h", "--help") for arg in argv[1:]):
    print(__doc__.split("\n\n")[0].replace("`", "") + "\n" + "\n".join(USAGE.values()))
    return 0
  command = argv[1]
  try:
    if command not in USAGE:
      raise ValueError(f"unknown command {command!r} (known: {', '.join(USAGE)}); {USAGE['apply']}")
    settings = _check_apply(argv[2:]) if command == "apply" else _check_watch(argv[2:])
    if command == "watch":
      return _run_watch(settings)
    from tfps.keras import deltas  # pylint: disable=g-import-not-at-top  (TensorFlow once the arguments are right)
    print(deltas.apply(*settings))
  except (ValueError, OSError) as e:  # DeltaError is a ValueError
    print(f"tfps-delta: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  return 0


def run(argv: Optional[Sequence[str]] = None) -> None:
  """Console-script entry point of `tfps-delta`."""
  sys.exit(main(sys.argv if argv is None else argv))


if __name__ == "__main__":
  run()
