"""A feature spec: how the delimited reader (`tfps.data.delimited`) turns a click log's rows into model features.

A spec is data (a JSON file; `docs/data.md` has the format), so a CSV/TSV of any column layout trains the bundled
ranking models without code. Criteo (`tfps.data.criteo.criteo_spec`) and MovieLens ratings
(`tfps.data.movielens.ratings_spec`) are specs too; `configs/criteo.spec.json` and `configs/movielens.spec.json`
write them out. This module imports no TensorFlow: the flags check a spec when they are parsed.

    {"name": "clicks", "delimiter": "\\t", "header": true, "missing": ["", "NA"],
     "columns": ["clicked", "price", "user", "item", "ts"], "label": "clicked",
     "numeric": {"price": "log1p"}, "categorical": {"user": 100000, "item": {"buckets": 5000, "encoding": "hash"}}}

Columns that are neither the label nor a feature (`ts`) are read and ignored. What the reader yields:
`spec.dense_feature` ("dense"), float32 `[batch, len(numeric)]`, the numeric columns in spec order (missing -> 0,
then the transform); one int64 `[batch]` feature per categorical column, its bucket; the label, float32 `[batch]`.
"""

import dataclasses
import json
import math
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from tfps.errors import TfpsError

TRANSFORMS = ("none", "log1p", "standardize")
ENCODINGS = ("hash", "integer")
_KEYS = ("name", "delimiter", "header", "missing", "columns", "label", "label_threshold", "numeric", "categorical",
         "dense_feature")
NUMBER = r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?"  # a numeric field (RE2)
INTEGER = r"-?[0-9]+"  # an integer-encoded field (RE2)


class FeatureSpecError(TfpsError, ValueError):
  """A feature spec breaks a rule; the message is one line naming the field, its value and what is allowed."""


@dataclasses.dataclass(frozen=True)
class Numeric:
  """A numeric column: missing values become 0, then `transform` applies.

  `log1p` is `log(1 + max(x, 0))`; `standardize` is `(x - mean) / std`; `none` keeps `x`.
  """

  name: str
  transform: str = "none"
  mean: float = 0.0
  std: float = 1.0


@dataclasses.dataclass(frozen=True)
class Categorical:
  """A categorical column mapped to one of `buckets` ids.

  `hash`: the value's 64-bit fingerprint modulo `buckets` (every missing value hashes as ""); `integer`: the value
  itself (an integer) modulo `buckets` (missing values are 0).
  """

  name: str
  buckets: int
  encoding: str = "hash"


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  """What a delimited file holds and which features the reader makes of it; checked on construction.

  Attributes:
    columns: every column of a row, in file order; a row with another field count is malformed.
    label: the label column: 0 or 1, or, with `label_threshold`, a number (label = value >= threshold).
    numeric: numeric columns with their transform.
    categorical: categorical columns with their bucket count and encoding.
    delimiter: the one-character field separator ("," CSV, "\\t" TSV, "|", ...).
    header: whether each file's first line is a header (skipped).
    missing: the values that mean "missing" in a feature column ("" is an empty field).
    label_threshold: see `label`.
    dense_feature: the feature holding the numeric columns.
    name: what messages call the data.
    source: where the spec was read (errors name it); not part of the spec.
  """

  columns: Tuple[str, ...]
  label: str
  numeric: Tuple[Numeric, ...] = ()
  categorical: Tuple[Categorical, ...] = ()
  delimiter: str = ","
  header: bool = False
  missing: Tuple[str, ...] = ("",)
  label_threshold: Optional[float] = None
  dense_feature: str = "dense"
  name: str = "delimited"
  source: str = dataclasses.field(default="", compare=False, repr=False)

  def __post_init__(self):
    for key in ("columns", "numeric", "categorical", "missing"):  # lists given in Python are kept as tuples
      if isinstance(getattr(self, key), list):
        object.__setattr__(self, key, tuple(getattr(self, key)))
    _check_spec(self, self.source or repr(self.name))

  def index(self, column: str) -> int:
    """The position of `column` in a row."""
    return self.columns.index(column)

  def model_features(self) -> Tuple[Dict[str, int], Dict[str, int]]:
    """`(categorical vocabulary sizes, dense feature widths)` of the features the reader yields, for the models."""
    dense = {self.dense_feature: len(self.numeric)} if self.numeric else {}
    return {c.name: c.buckets for c in self.categorical}, dense

  def with_buckets(self, buckets: Union[int, Sequence[int]]) -> "FeatureSpec":
    """This spec with every categorical column's bucket count set to `buckets` (one int, or one per column)."""
    sizes = [buckets] * len(self.categorical) if isinstance(buckets, int) else list(buckets)
    if len(sizes) != len(self.categorical):
      raise FeatureSpecError(f"`buckets` ({buckets!r}) must be one int or {len(self.categorical)} of them")
    return dataclasses.replace(self, categorical=tuple(dataclasses.replace(c, buckets=size)
                                                       for c, size in zip(self.categorical, sizes)))

  def to_dict(self) -> Dict[str, Any]:
    """The JSON form (`spec_from_dict` reads it back)."""
    def numeric(n: Numeric):
      return n.transform if n.transform != "standardize" else {"transform": n.transform, "mean": n.mean,
                                                               "std": n.std}

    def categorical(c: Categorical):
      return c.buckets if c.encoding == "hash" else {"buckets": c.buckets, "encoding": c.encoding}

    spec = {"name": self.name, "delimiter": self.delimiter, "header": self.header, "missing": list(self.missing),
            "columns": list(self.columns), "label": self.label}
    if self.label_threshold is not None:
      spec["label_threshold"] = self.label_threshold
    spec["numeric"] = {n.name: numeric(n) for n in self.numeric}
    spec["categorical"] = {c.name: categorical(c) for c in self.categorical}
    if self.dense_feature != "dense":
      spec["dense_feature"] = self.dense_feature
    return spec

  def describe_row(self) -> str:
    """What a well-formed row is, in a few words (for error messages)."""
    label = "0/1" if self.label_threshold is None else "a number"
    return (f"{len(self.columns)} fields separated by {self.delimiter!r}: {self.label!r} {label}, "
            f"{len(self.numeric)} numbers (or missing: {list(self.missing)!r}), {len(self.categorical)} categorical")


def _fail(source: str, field: str, value, allowed: str):
  raise FeatureSpecError(f"feature spec {source}: `{field}` ({value!r}) {allowed}")


def _check_spec(spec: FeatureSpec, source: str) -> None:
  """Raises FeatureSpecError naming the first field that breaks a rule."""
  if not isinstance(spec.name, str) or not spec.name:
    _fail(source, "name", spec.name, "must be a non-empty string")
  if not isinstance(spec.delimiter, str) or len(spec.delimiter) != 1 or spec.delimiter in "\n\r":
    _fail(source, "delimiter", spec.delimiter, 'must be one character other than a line break (",", "\\t", "|")')
  if not isinstance(spec.header, bool):
    _fail(source, "header", spec.header, "must be true or false")
  if any(not isinstance(m, str) or spec.delimiter in m for m in spec.missing):
    _fail(source, "missing", list(spec.missing), f"must be strings without the delimiter {spec.delimiter!r}")
  names = spec.columns
  if not names or any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
    _fail(source, "columns", list(names), "must be a non-empty list of distinct non-empty column names")
  if spec.label not in names:
    _fail(source, "label", spec.label, f"must be one of `columns` ({', '.join(names)})")
  if spec.label_threshold is not None and (isinstance(spec.label_threshold, bool) or
                                           not isinstance(spec.label_threshold, (int, float)) or
                                           not math.isfinite(spec.label_threshold)):
    _fail(source, "label_threshold", spec.label_threshold, "must be a finite number or null")
  used = {spec.label: "label"}
  for kind, features in (("numeric", spec.numeric), ("categorical", spec.categorical)):
    for feature in features:
      if feature.name not in names:
        _fail(source, f"{kind}.{feature.name}", feature.name, f"must be one of `columns` ({', '.join(names)})")
      if feature.name in used:
        _fail(source, f"{kind}.{feature.name}", feature.name, f"is already the {used[feature.name]}")
      used[feature.name] = f"{kind} column {feature.name!r}"
  for n in spec.numeric:
    if n.transform not in TRANSFORMS:
      _fail(source, f"numeric.{n.name}", n.transform, f"must be one of {', '.join(TRANSFORMS)}")
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in (n.mean, n.std)) \
        or n.std <= 0:
      _fail(source, f"numeric.{n.name}", {"mean": n.mean, "std": n.std}, "needs a finite `mean` and a `std` > 0")
    if n.transform != "standardize" and (n.mean, n.std) != (0.0, 1.0):
      _fail(source, f"numeric.{n.name}", {"transform": n.transform, "mean": n.mean, "std": n.std},
            'gives `mean` and `std`, which only "standardize" uses')
  for c in spec.categorical:
    if isinstance(c.buckets, bool) or not isinstance(c.buckets, int) or c.buckets < 1:
      _fail(source, f"categorical.{c.name}.buckets", c.buckets, "must be a positive integer")
    if c.encoding not in ENCODINGS:
      _fail(source, f"categorical.{c.name}.encoding", c.encoding, f"must be one of {', '.join(ENCODINGS)}")
  if not spec.numeric and not spec.categorical:
    _fail(source, "numeric", {}, "and `categorical` are both empty: name at least one feature column")
  if not isinstance(spec.dense_feature, str) or not spec.dense_feature or spec.dense_feature in names:
    _fail(source, "dense_feature", spec.dense_feature, "must be a non-empty name that is not a column")


def spec_from_dict(raw: Mapping[str, Any], source: str = "") -> FeatureSpec:
  """The spec of a JSON object (see the module doc); `source` (a path) prefixes errors."""
  source = source or "(dict)"
  if not isinstance(raw, Mapping):
    _fail(source, "<top>", type(raw).__name__, "must be a JSON object")
  unknown = [key for key in raw if key not in _KEYS]
  if unknown:
    _fail(source, unknown[0], raw[unknown[0]], f"is not a spec field; fields: {', '.join(_KEYS)}")
  for key in ("columns", "label"):
    if key not in raw:
      _fail(source, key, None, "is required")
  for key, kind in (("columns", list), ("missing", list), ("numeric", dict), ("categorical", dict)):
    if key in raw and not isinstance(raw[key], kind):
      _fail(source, key, raw[key], f"must be a JSON {'array' if kind is list else 'object'}")
  numeric = tuple(_numeric(source, name, value) for name, value in raw.get("numeric", {}).items())
  categorical = tuple(_categorical(source, name, value) for name, value in raw.get("categorical", {}).items())
  fields = {key: raw[key] for key in ("name", "delimiter", "header", "label", "label_threshold", "dense_feature")
            if key in raw}
  return FeatureSpec(**fields, columns=tuple(raw["columns"]), numeric=numeric, categorical=categorical,
                     missing=tuple(raw.get("missing", ("",))), source=source)


def _numeric(source: str, name: str, value) -> Numeric:
  if isinstance(value, str):
    return Numeric(name, value)
  if not isinstance(value, dict) or not set(value) <= {"transform", "mean", "std"}:
    _fail(source, f"numeric.{name}", value, f'must be a transform ({", ".join(TRANSFORMS)}) or '
          '{"transform": "standardize", "mean": M, "std": S}')
  return Numeric(name, value.get("transform", "none"), value.get("mean", 0.0), value.get("std", 1.0))


def _categorical(source: str, name: str, value) -> Categorical:
  if isinstance(value, dict):
    if not set(value) <= {"buckets", "encoding"} or "buckets" not in value:
      _fail(source, f"categorical.{name}", value, 'must be a bucket count or {"buckets": N, "encoding": '
            f'{" or ".join(repr(e) for e in ENCODINGS)}}}')
    return Categorical(name, value["buckets"], value.get("encoding", "hash"))
  return Categorical(name, value)


def load_spec(path: Union[str, os.PathLike]) -> FeatureSpec:
  """Reads and checks the JSON spec at `path`.

  Raises:
    FeatureSpecError: the file is missing, not JSON, or breaks a rule (one line naming the field and its value).
  """
  path = os.fspath(path)
  try:
    with open(path, encoding="utf-8") as f:
      raw = json.load(f, object_pairs_hook=lambda pairs: _without_repeats(path, pairs))
  except OSError as e:
    raise FeatureSpecError(f"feature spec {path}: cannot be read ({e.strerror})") from None
  except json.JSONDecodeError as e:
    raise FeatureSpecError(f"feature spec {path}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
  except UnicodeDecodeError as e:
    raise FeatureSpecError(f"feature spec {path}: not UTF-8 text (byte {e.object[e.start]:#04x} at {e.start}); "
                           "save it as UTF-8") from None
  return spec_from_dict(raw, path)


def _without_repeats(path: str, pairs) -> dict:
  """A JSON object's dict, refusing a key given twice (JSON keeps the last one without a word)."""
  keys = [key for key, _ in pairs]
  repeated = next((key for key in keys if keys.count(key) > 1), None)
  if repeated is not None:
    raise FeatureSpecError(f"feature spec {path}: the key {repeated!r} is given twice in one object")
  return dict(pairs)


def _literal(text: str) -> str:
  """`text` as an RE2 pattern matching exactly it."""
  return "".join(f"\\x{{{ord(char):x}}}" for char in text)


def row_pattern(spec: FeatureSpec) -> str:
  """The RE2 pattern a well-formed row matches in full: the field count, the label, and every numeric (and
  integer-encoded) field a number or a missing value."""
  any_field = f"[^{_literal(spec.delimiter)}]*"
  missing = "|".join(_literal(m) for m in spec.missing if m)
  optional = "?" if "" in spec.missing else ""

  def value(number: str) -> str:
    return f"({number}{'|' + missing if missing else ''}){optional}"

  kinds = {n.name: value(NUMBER) for n in spec.numeric}
  kinds.update({c.name: value(INTEGER) for c in spec.categorical if c.encoding == "integer"})
  kinds[spec.label] = "[01]" if spec.label_threshold is None else NUMBER
  return _literal(spec.delimiter).join(kinds.get(name, any_field) for name in spec.columns)
