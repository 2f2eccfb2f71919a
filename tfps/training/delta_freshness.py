"""Freshness of served versions: the time from an example being written to the stream to the moment `tfps-delta watch`
swapped in the version whose delta first ships it. No TensorFlow (`tfps-report` and the watch read it).

A delta trained on a stream holds, in its manifest's `stream.written`, the oldest and newest write time of the
examples it is the first to ship (Kafka: the message timestamp; a folder stream: the slice's complete time). When the
watch renames a new version into place it appends a record to `serving_dir/freshness.jsonl` (a file, which TF
Serving does not take for a version): the version, its step, the swap time and, over the deltas applied in that swap,
the write times, the time the newest of them was written (its manifest's modification time) and

- `freshness_secs`: swap time - oldest write time (the longest any example shipped in it waited to be served);
- `newest_freshness_secs`: swap time - newest write time (the shortest).

Clocks: write times are the producer's (or the broker's) clock, the swap time the watch's; on one host they agree.
"""

import os
import statistics
import time
from typing import List, Optional, Sequence

from tfps import run_records

FRESHNESS_FILE = "freshness.jsonl"  # in the serving folder


def version_record(version: int, step: int, delta_manifests: Sequence[dict], delta_paths: Sequence[str],
                   swapped_at: float) -> Optional[dict]:
  """The freshness record of served `version` (at `step`), swapped in at `swapped_at` with the deltas of
  `delta_manifests` (their folders `delta_paths`) applied; None where none of them was trained on a stream. Where a
  stream's delta holds no write times (written by a tfps that did not record them) `missing` names it and no
  freshness is given."""
  streamed = [(manifest, path) for manifest, path in zip(delta_manifests, delta_paths) if "stream" in manifest]
  if not streamed:
    return None
  record = {"version": version, "step": step, "swapped_at": round(swapped_at, 3),
            "deltas": [manifest["version"] for manifest in delta_manifests]}
  missing = [os.path.basename(os.path.normpath(path)) for manifest, path in streamed
             if "written" not in manifest["stream"]]
  if missing:
    return dict(record, missing=missing)
  spans = [manifest["stream"]["written"] for manifest, _ in streamed]
  oldest, newest = min(span["oldest"] for span in spans), max(span["newest"] for span in spans)
  exported = max(os.path.getmtime(os.path.join(path, "manifest.json")) for _, path in streamed)
  return dict(record, written={"oldest": oldest, "newest": newest}, exported_at=round(exported, 3),
              freshness_secs=round(swapped_at - oldest, 3), newest_freshness_secs=round(swapped_at - newest, 3))


def describe(record: dict) -> str:
  """A served version's freshness in a few words, or the one line saying why it is not measured."""
  if "freshness_secs" in record:
    return f"freshness {record['newest_freshness_secs']:.2f}-{record['freshness_secs']:.2f} s"
  return (f"freshness not measured: {', '.join(record['missing'])} holds no write times of its stream's examples "
          f"(written by an older tfps, which did not record them)")


def append(serving_dir: str, record: dict) -> None:
  """Appends `record` to the serving folder's freshness records."""
  run_records.append_jsonl(os.path.join(serving_dir, FRESHNESS_FILE), record)


def read(serving_dir: str, since: Optional[float] = None) -> List[dict]:
  """The freshness records of `serving_dir` in the order written ([] where there are none), those of versions
  swapped in at `since` (a time) or later where given (the folder keeps earlier runs' versions); a line cut short (the
  watch killed while it wrote) is skipped."""
  records = run_records.read_jsonl(os.path.join(serving_dir, FRESHNESS_FILE))
  return [record for record in records if since is None or record["swapped_at"] >= since]


def summary_line(records: Sequence[dict]) -> Optional[str]:
  """One line over the versions measured: how many, the median and worst freshness; None where none was."""
  measured = [record["freshness_secs"] for record in records if "freshness_secs" in record]
  if not measured:
    return None
  unmeasured = len(records) - len(measured)
  return (f"freshness of {len(measured)} served version(s), from an example's write to the version serving it: "
          f"median {statistics.median(measured):.2f} s, worst {max(measured):.2f} s"
          + (f" ({unmeasured} version(s) without write times)" if unmeasured else ""))


def table(records: Sequence[dict]) -> List[str]:
  """The records as text lines (a header, then one per version: version, step, swap time, freshness, the time
  waited for the export and from the export to the swap); [] where there are none."""
  if not records:
    return []
  lines = [f"{'version':>7} {'step':>8} {'swapped (UTC)':>19} {'freshness s':>11} {'newest s':>8} "
           f"{'to export s':>11} {'to swap s':>9}"]
  for record in records:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record["swapped_at"]))
    if "freshness_secs" not in record:
      lines.append(f"{record['version']:>7} {record['step']:>8} {when:>19}  {describe(record)}")
      continue
    to_export = record["exported_at"] - record["written"]["oldest"]
    to_swap = record["swapped_at"] - record["exported_at"]
    lines.append(f"{record['version']:>7} {record['step']:>8} {when:>19} {record['freshness_secs']:>11.2f} "
                 f"{record['newest_freshness_secs']:>8.2f} {to_export:>11.2f} {to_swap:>9.2f}")
  return lines
