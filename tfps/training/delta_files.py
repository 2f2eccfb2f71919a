"""The files of delta exports, without TensorFlow: their names, manifests, how a chain of them is checked, and the
atomic write (a hidden temporary folder, synced, renamed). `tfps-delta` checks its arguments with it before
TensorFlow is imported; `tfps.training.deltas` writes and applies the deltas themselves.
"""

import json
import os
import re
import shutil
import uuid
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from tfps.errors import UsageError

FORMAT = "tfps-delta/1"
MANIFEST = "manifest.json"
BASE_MANIFEST = "tfps_delta.json"  # inside a base SavedModel folder
TENSORS = "tensors.npz"
_NAME = re.compile(r"^(base|delta)-(\d{6,})$")


class DeltaError(UsageError):
  """A delta or a chain of deltas that cannot be applied (one line naming the versions)."""


def name_of(kind: str, version: int) -> str:
  """The folder name of export `version` of `kind` (base or delta): `delta-000003`."""
  return f"{kind}-{version:06d}"


def versions_in(directory: str) -> Dict[int, str]:
  """`{version: folder}` of the complete exports (base or delta) in `directory`."""
  found = {}
  for entry in os.listdir(directory) if os.path.isdir(directory) else ():
    match = _NAME.match(entry)
    if match and os.path.exists(os.path.join(directory, entry, _manifest_name(match.group(1)))):
      found[int(match.group(2))] = os.path.join(directory, entry)
  return found


def _manifest_name(kind: str) -> str:
  return BASE_MANIFEST if kind == "base" else MANIFEST


def write_atomically(directory: str, name: str, fill: Callable[[str], None]) -> str:
  """Runs `fill(folder)` on a hidden temporary folder in `directory`, syncs what it wrote and renames it to `name`;
  on any error removes the temporary folder (nothing half written stays) and raises. Returns the final path."""
  os.makedirs(directory, exist_ok=True)
  final = os.path.join(directory, name)
  if os.path.exists(final):
    raise DeltaError(f"export {final!r} exists already; an export is never overwritten")
  scratch = os.path.join(directory, f".tmp-{name}-{uuid.uuid4().hex[:8]}")
  try:
    fill(scratch)
    _sync_tree(scratch)
    os.rename(scratch, final)
    _sync(directory)
  except BaseException:
    shutil.rmtree(scratch, ignore_errors=True)
    raise
  return final


def _sync_tree(folder: str) -> None:
  for root, _, files in os.walk(folder):
    for name in files:
      with open(os.path.join(root, name), "rb+") as f:
        os.fsync(f.fileno())
    _sync(root)


def _sync(folder: str) -> None:
  descriptor = os.open(folder, os.O_RDONLY)
  try:
    os.fsync(descriptor)
  finally:
    os.close(descriptor)


def write_json(path: str, value: dict) -> None:
  """Writes `value` to `path` as indented JSON (a manifest)."""
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=1, sort_keys=True)


def read_manifest(path: str) -> dict:
  """The manifest of the export (base or delta) at `path`; a `DeltaError` where it is not a complete export."""
  name = os.path.basename(os.path.normpath(path))
  if not os.path.isdir(path):
    raise DeltaError(f"{path!r} is not a folder (an export is a folder with a manifest)")
  if name.startswith(".tmp-"):
    raise DeltaError(f"{path!r} is a delta still being written or cut short (a temporary folder); it is never read")
  for candidate in (MANIFEST, BASE_MANIFEST):
    if os.path.exists(os.path.join(path, candidate)):
      with open(os.path.join(path, candidate), encoding="utf-8") as f:
        manifest = json.load(f)
      if manifest.get("format") != FORMAT:
        raise DeltaError(f"{path!r} is not a {FORMAT} export (format {manifest.get('format')!r})")
      return manifest
  raise DeltaError(f"{path!r} has no {MANIFEST}: not a complete export (a delta cut short is never read)")


def check_chain(base: dict, deltas: Sequence[dict], paths: Sequence[str]) -> None:
  """Raises a one-line `DeltaError` unless `deltas` (manifests, in order) follow `base` one after another, each
  written for that base and the same model."""
  previous = base["version"]
  for manifest, path in zip(deltas, paths):
    if manifest.get("kind") != "delta":
      raise DeltaError(f"{path!r} is a {manifest.get('kind')}, not a delta")
    label = name_of("delta", manifest["version"])
    if manifest["model"] != base["model"]:
      raise DeltaError(f"{label} is from another model (fingerprint {manifest['model']}, the base's "
                       f"{base['model']}); it cannot be applied to {name_of('base', base['base']['version'])}")
    if manifest["base"]["id"] != base["base"]["id"]:
      raise DeltaError(f"{label} belongs to {name_of('base', manifest['base']['version'])} (id "
                       f"{manifest['base']['id']}), not to {name_of('base', base['base']['version'])} "
                       f"(id {base['base']['id']})")
    if manifest["previous"] != previous:
      raise DeltaError(f"the delta chain has a gap: {label} follows version {manifest['previous']}, but the version "
                       f"before it here is {previous}; give every delta from {previous + 1} on")
    previous = manifest["version"]


def check_apply(base: str, delta_paths: Sequence[str], out: str) -> Tuple[dict, List[dict]]:
  """The manifests of `base` and `delta_paths` when the deltas apply to the base one after another and `out` is a
  new folder; else a one-line `DeltaError` naming the versions or the folder."""
  base_manifest = read_manifest(base)
  if base_manifest.get("kind") != "base":
    raise DeltaError(f"{base!r} is a {base_manifest.get('kind')}, not a base export")
  manifests = [read_manifest(path) for path in delta_paths]
  check_chain(base_manifest, manifests, delta_paths)
  if os.path.exists(out):
    raise DeltaError(f"--out {out!r} exists already; give a new folder")
  return base_manifest, manifests


def served_versions(serving_dir: str) -> Dict[int, str]:
  """`{version: folder}` of the complete served versions in `serving_dir` (TF Serving's layout: a folder per version,
  named by its number; complete once renamed there, with the base manifest `apply` writes)."""
  found = {}
  for entry in os.listdir(serving_dir) if os.path.isdir(serving_dir) else ():
    if entry.isdigit() and os.path.exists(os.path.join(serving_dir, entry, BASE_MANIFEST)):
      found[int(entry)] = os.path.join(serving_dir, entry)
  return found


def next_to_serve(folder: str, served: Optional[str]) -> Optional[Tuple[str, List[str], int]]:
  """`(start, deltas, version)`: what to apply to serve the newest state of the exports in `folder`, where `served`
  (a folder `apply` wrote, or None) is served now; None when it is current. Starts from the newest base after
  `served` (a resumed run's), else from `served`. A gap, a delta of another base or model, or a folder whose
  exports are all older than `served`: a one-line `DeltaError`."""
  exports = versions_in(folder)
  current = read_manifest(served) if served else None
  newer = sorted(version for version in exports if current is None or version > current["version"])
  if not newer:
    if current and exports and max(exports) < current["version"]:
      raise DeltaError(f"the served version {current['version']} is newer than every export in {folder!r} (the "
                       f"newest: {max(exports)}); another run's folder?")
    return None
  manifests = {version: read_manifest(exports[version]) for version in newer}
  bases = [version for version in newer if manifests[version].get("kind") == "base"]
  if bases:
    start, start_manifest = exports[bases[-1]], manifests[bases[-1]]
    newer = [version for version in newer if version > bases[-1]]
  elif current is None:
    raise DeltaError(f"{folder!r} holds deltas ({name_of('delta', newer[0])}, ...) but no base export to apply "
                     "them to")
  else:
    start, start_manifest = served, current
  check_chain(start_manifest, [manifests[version] for version in newer], [exports[version] for version in newer])
  return start, [exports[version] for version in newer], (newer or [start_manifest["version"]])[-1]


def prune(serving_dir: str, keep: int) -> List[str]:
  """Removes all but the newest `keep` served versions of `serving_dir`; returns the folders removed."""
  versions = served_versions(serving_dir)
  removed = [versions[version] for version in sorted(versions)[:-keep]]
  for path in removed:
    shutil.rmtree(path, ignore_errors=True)
  return removed
