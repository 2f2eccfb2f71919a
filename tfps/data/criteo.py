"""Criteo display-ads data: the CSV with header (`label,I1..I13,C1..C26`) and the raw TSV without one.

A row is a 0/1 label, 13 integer features and 26 categorical features (hex ids in the raw set); any feature may be
empty. The reader yields `(features, label)` batches of fixed shape:

* `features["dense"]`: float32 `[batch, 13]`, `log(1 + max(x, 0))` of each integer feature, 0 where empty;
* `features["C1"]` .. `features["C26"]`: int64 `[batch]`, the value's 64-bit fingerprint modulo that feature's
  bucket count (an empty value hashes like any other string);
* `label`: float32 `[batch]`.

Criteo is a feature spec of the delimited reader (`criteo_spec`; `configs/criteo.spec.json` writes it out), so
malformed rows (a column count other than 40, or a label or integer field that is not a number) are found, counted
(`scan_criteo`), skipped, or in strict mode refused exactly as `tfps.data.delimited` documents.
"""

import os
from typing import Dict, Optional, Sequence, Tuple, Union

from tfps import checks
from tfps.data import delimited
from tfps.data import pipeline
from tfps.data.schema import CATEGORICAL_COLUMNS, COLUMNS, DENSE, FORMATS, INTEGER_COLUMNS, LABEL
from tfps.data.schema import check_format
from tfps.data.spec import Categorical, FeatureSpec, Numeric
from tfps.data.spec import row_pattern as spec_row_pattern
from tfps.errors import UsageError

MalformedRowError = delimited.MalformedRowError
ScanSummary = delimited.ScanSummary


def criteo_spec(file_format: str = "csv", num_buckets: Union[int, Sequence[int]] = 100_000) -> FeatureSpec:
  """The feature spec of Criteo files: "csv" (with header) or "tsv" (without), `num_buckets` as in the reader."""
  sep = FORMATS[check_format(file_format)]
  return FeatureSpec(columns=COLUMNS, label=LABEL, numeric=tuple(Numeric(name, "log1p") for name in INTEGER_COLUMNS),
                     categorical=tuple(Categorical(name, size) for name, size in zip(CATEGORICAL_COLUMNS,
                                                                                       bucket_sizes(num_buckets))),
                     delimiter=sep, header=file_format == "csv", missing=("",), dense_feature=DENSE, name="Criteo")


def row_pattern(file_format: str) -> str:
  """The RE2 pattern a well-formed row of `file_format` ("csv" or "tsv") matches in full."""
  return spec_row_pattern(criteo_spec(file_format, 1))


def guess_format(files: Sequence[str]) -> str:
  """"csv" where every file ends in `.csv`, "tsv" where none does (the raw Criteo files have no extension)."""
  is_csv = {os.fspath(path).endswith(".csv") for path in files}
  if len(is_csv) > 1:
    raise UsageError(f"files mix .csv and other extensions ({files[0]!r}, ...); give `file_format` explicitly")
  return "csv" if is_csv.pop() else "tsv"


def bucket_sizes(num_buckets: Union[int, Sequence[int]]) -> Tuple[int, ...]:
  """The bucket count of each of the 26 categorical features from one int or 26 ints."""
  sizes = (num_buckets,) * len(CATEGORICAL_COLUMNS) if isinstance(num_buckets, int) else tuple(num_buckets)
  if len(sizes) != len(CATEGORICAL_COLUMNS) or any(not checks.is_int(s) or s < 1 for s in sizes):
    raise UsageError(f"`num_buckets` ({num_buckets!r}) must be a positive int or {len(CATEGORICAL_COLUMNS)} of them")
  return sizes


def feature_spec(num_buckets: Union[int, Sequence[int]]) -> Tuple[Dict[str, int], Dict[str, int]]:
  """`(categorical vocabulary sizes, dense feature widths)` of the features this reader yields, for the models."""
  return criteo_spec("csv", num_buckets).model_features()


def criteo_dataset_fn(file_pattern: pipeline.FilePattern, *, batch_size: int,
                      num_buckets: Union[int, Sequence[int]] = 100_000, file_format: Optional[str] = None,
                      strict: bool = False, scan: bool = True, repeat: bool = True, shuffle_buffer: int = 10_000,
                      seed: Optional[int] = None, drop_remainder: bool = True, shard_index: Optional[int] = None,
                      num_shards: Optional[int] = None) -> pipeline.DatasetFn:
  """A function `input_context -> tf.data.Dataset` of Criteo `(features, label)` batches (see the module doc).

  Args:
    file_pattern: path, glob, or sequence of them.
    batch_size: rows per batch (per worker under PSS).
    num_buckets: hash buckets of every categorical feature (one int) or of each (26 ints).
    file_format: "csv" (with header) or "tsv" (without); guessed from the extension where None.
    strict, scan, repeat, shuffle_buffer, seed, drop_remainder, shard_index, num_shards: as in
      `tfps.data.delimited.delimited_dataset_fn`.

  Raises:
    MalformedRowError: `strict` and `scan` and a file has a malformed row.
  """
  files = pipeline.list_files(file_pattern)
  guessed = not file_format
  file_format = check_format(file_format) if file_format else guess_format(files)
  try:
    return delimited.delimited_dataset_fn(files, criteo_spec(file_format, num_buckets), batch_size=batch_size,
                                          strict=strict, scan=scan, repeat=repeat, shuffle_buffer=shuffle_buffer,
                                          seed=seed, drop_remainder=drop_remainder, shard_index=shard_index,
                                          num_shards=num_shards)
  except delimited.NoUsableRowError as e:
    if not guessed:
      raise
    raise delimited.NoUsableRowError(f"{e} (read as Criteo {file_format.upper()}, guessed from the file names: CSV files are named "
                     "*.csv; or give `file_format`, or --data=csv --feature_spec=configs/criteo.spec.json)") from None


def scan_criteo(file_pattern: pipeline.FilePattern, *, file_format: Optional[str] = None, strict: bool = False,
                max_examples: int = 5) -> ScanSummary:
  """Counts the rows and malformed rows of Criteo files with the pipeline's own row pattern
  (`tfps.data.delimited.scan_files`).

  Raises:
    MalformedRowError: `strict` and a malformed row was found; the message names its file and line.
  """
  files = pipeline.list_files(file_pattern)
  file_format = check_format(file_format) if file_format else guess_format(files)
  return delimited.scan_files(files, criteo_spec(file_format, 1), strict=strict, max_examples=max_examples)
