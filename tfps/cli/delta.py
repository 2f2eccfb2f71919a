"""`tfps-delta apply BASE DELTA... --out=DIR`: a SavedModel of a base export with its deltas applied, for serving.

It answers as a full export at the last delta's step would (`tfps.delta.apply`, docs/delta_export.md). Bad input (a
gap in the chain, a delta of another base or model, a delta cut short, an existing `--out`): one line on stderr,
exit status 2, nothing written.
"""

import sys
from typing import Optional, Sequence

USAGE = "usage: tfps-delta apply BASE [DELTA ...] --out=DIR"


def _parse(argv: Sequence[str]):
  """`(base, deltas, out)` from the arguments after the program name; `ValueError` naming what is wrong."""
  args = list(argv)
  if not args or args[0] != "apply":
    raise ValueError(f"unknown command {args[0] if args else None!r} (known: apply); {USAGE}")
  outs = [arg for arg in args[1:] if arg.startswith("--out=")]
  paths = [arg for arg in args[1:] if not arg.startswith("--out=")]
  unknown = [arg for arg in paths if arg.startswith("--")]
  if unknown:
    raise ValueError(f"unknown option {unknown[0]!r}; {USAGE}")
  if len(outs) != 1 or not outs[0][len("--out="):]:
    raise ValueError(f"give --out=DIR once; {USAGE}")
  if not paths:
    raise ValueError(f"give the base export; {USAGE}")
  return paths[0], paths[1:], outs[0][len("--out="):]


def main(argv: Sequence[str]) -> int:
  """Runs `tfps-delta` on `argv` (with the program name first); returns the exit status."""
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(__doc__.splitlines()[0].replace("`", "") + "\n" + USAGE)
    return 0
  try:
    base, delta_paths, out = _parse(argv[1:])
  except ValueError as e:
    print(f"tfps-delta: {e}", file=sys.stderr)
    return 2
  # TensorFlow is imported only once the arguments are right.
  from tfps.keras import deltas  # pylint: disable=g-import-not-at-top
  from tfps.training.deltas import DeltaError  # pylint: disable=g-import-not-at-top
  try:
    deltas.apply(base, delta_paths, out)
  except (DeltaError, OSError) as e:
    print(f"tfps-delta: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  print(out)
  return 0


def run(argv: Optional[Sequence[str]] = None) -> None:
  """Console-script entry point of `tfps-delta`."""
  sys.exit(main(sys.argv if argv is None else argv))


if __name__ == "__main__":
  run()
