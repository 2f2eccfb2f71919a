"""Synthetic Criteo-schema data with a planted signal: the default data of the main job, and for scale tests.

Rows follow the Criteo schema (label, 13 integer, 26 categorical columns) and are written as files the Criteo reader
reads (CSV with header, or TSV without). Everything is a pure function of `seed`:

* integer features: `floor(exp(N(mu_j, 1)))` with per-column `mu_j`, each missing (empty) with `missing_rate`;
* categorical features: ids of rank `k` in 1..vocabulary drawn with probability proportional to `k ** -zipf_exponent`
  (heavy-tailed like real click logs), written as 8-digit hex strings unique per column; missing with `missing_rate`;
* label: Bernoulli(sigmoid(logit)) from a planted logistic model over `log1p` of 4 integer features (I1-I4) and
  per-id effects (N(0, 1) per id) of 6 categorical features (C1-C6), its bias calibrated to `positive_rate`; a model
  that learns the planted effects beats chance, and the planted model's own AUC on the rows (about 0.91; the best
  any model can do, up to noise) is reported as `planted_auc`.

Generation is vectorised numpy: rows are encoded as a byte matrix and written without a per-row Python loop
(about 1M rows in a few seconds).
"""

import dataclasses
import json
import os
from typing import Dict, List, Tuple

import numpy as np

from tfps import checks
from tfps.data import schema as criteo
from tfps.errors import UsageError

SIGNAL_DENSE = 4  # I1..I4 carry signal
SIGNAL_CATEGORICAL = 6  # C1..C6 carry signal
_DENSE_WIDTH = 9  # integer features are clipped below 10**9
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
METADATA_FILE = "synthetic.json"


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
  """What to generate; validated on construction.

  Attributes:
    rows: total rows.
    num_files: files to split the rows over (workers shard by file).
    seed: every value derives from it.
    vocab_size: distinct ids per categorical column.
    zipf_exponent: exponent of the id-rank distribution (> 0; larger is more skewed).
    missing_rate: probability that a feature value is empty.
    positive_rate: target mean click probability (the planted bias is calibrated to it); in (0, 1).
    file_format: "csv" (with header) or "tsv" (raw Criteo, no header).
  """

  rows: int = 100_000
  num_files: int = 4
  seed: int = 0
  vocab_size: int = 10_000
  zipf_exponent: float = 1.1
  missing_rate: float = 0.05
  positive_rate: float = 0.25
  file_format: str = "csv"

  def __post_init__(self):
    for name in ("rows", "num_files", "vocab_size"):
      checks.positive_int(name, getattr(self, name))
    checks.non_negative_int("seed", self.seed)
    if not self.zipf_exponent > 0:
      raise UsageError(f"`zipf_exponent` ({self.zipf_exponent!r}) must be positive")
    if not 0 <= self.missing_rate < 1:
      raise UsageError(f"`missing_rate` ({self.missing_rate!r}) must be in [0, 1)")
    if not 0 < self.positive_rate < 1:
      raise UsageError(f"`positive_rate` ({self.positive_rate!r}) must be in (0, 1)")
    criteo.check_format(self.file_format)


@dataclasses.dataclass(frozen=True)
class SyntheticData:
  """What `generate_criteo` wrote.

  Attributes:
    files: the files, in order.
    spec: the spec they follow.
    positive_rate: fraction of label 1.
    planted_auc: AUC of the planted model's own logits on these rows.
  """

  files: Tuple[str, ...]
  spec: SyntheticSpec
  positive_rate: float
  planted_auc: float


class _PlantedModel:
  """The planted logistic model and per-column tables, drawn from the seed."""

  def __init__(self, spec: SyntheticSpec):
    rng = np.random.default_rng([spec.seed, 0])
    self.dense_mu = rng.uniform(0.0, 4.0, len(criteo.INTEGER_COLUMNS))
    self.dense_weights = rng.choice([-1.0, 1.0], SIGNAL_DENSE) * rng.uniform(0.3, 0.6, SIGNAL_DENSE)
    self.id_effects = rng.normal(0.0, 1.0, (SIGNAL_CATEGORICAL, spec.vocab_size))
    ranks = np.arange(1, spec.vocab_size + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -spec.zipf_exponent)
    self.rank_cdf = cdf / cdf[-1]
    # The hex id of rank k in column c: a per-column multiplicative hash, so columns never share id strings.
    salts = rng.integers(1, 1 << 31, len(criteo.CATEGORICAL_COLUMNS), dtype=np.uint64) * 2 + 1
    keys = (np.arange(spec.vocab_size, dtype=np.uint64)[None, :] * salts[:, None] + salts[:, None] * 7919)
    self.hex_ids = _to_hex(keys & np.uint64(0xFFFFFFFF))  # [26, vocab, 8] uint8
    self.bias = 0.0
    self.bias = self._calibrated_bias(spec)

  def _calibrated_bias(self, spec: "SyntheticSpec") -> float:
    """The bias giving a mean click probability of `spec.positive_rate` on a 20k-row calibration sample."""
    dense, dense_missing, ranks, categorical_missing = _draw_features(spec, self, 20_000,
                                                                      np.random.default_rng([spec.seed, 2]))
    logits = self.logits(dense, dense_missing, np.where(categorical_missing, 0, ranks))
    low, high = -20.0, 20.0
    for _ in range(50):
      mid = (low + high) / 2
      low, high = (mid, high) if np.mean(1 / (1 + np.exp(-(logits + mid)))) < spec.positive_rate else (low, mid)
    return (low + high) / 2

  def logits(self, dense: np.ndarray, dense_missing: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    values = np.where(dense_missing, 0.0, np.log1p(dense.astype(np.float64)))
    centred = values[:, :SIGNAL_DENSE] - self.dense_mu[:SIGNAL_DENSE]
    logit = self.bias + centred @ self.dense_weights
    for column in range(SIGNAL_CATEGORICAL):
      logit += self.id_effects[column, ranks[:, column]]
    return logit


def _to_hex(values: np.ndarray) -> np.ndarray:
  shifts = np.arange(28, -4, -4, dtype=np.uint64)
  nibbles = (values[..., None] >> shifts) & np.uint64(0xF)
  return _HEX[nibbles.astype(np.intp)]


def _draw(spec: SyntheticSpec, model: _PlantedModel, rows: int, part: int):
  """One part's columns: dense ints, their missing mask, id ranks, categorical missing mask, labels, logits."""
  rng = np.random.default_rng([spec.seed, 1, part])
  dense, dense_missing, ranks, categorical_missing = _draw_features(spec, model, rows, rng)
  logits = model.logits(dense, dense_missing, np.where(categorical_missing, 0, ranks))
  labels = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logits))).astype(np.int64)
  return dense, dense_missing, ranks, categorical_missing, labels, logits


def _draw_features(spec: SyntheticSpec, model: _PlantedModel, rows: int, rng: np.random.Generator):
  dense = np.floor(np.exp(rng.normal(model.dense_mu, 1.0, (rows, len(model.dense_mu))))).astype(np.int64)
  dense = np.minimum(dense, 10 ** _DENSE_WIDTH - 1)
  dense_missing = rng.random(dense.shape) < spec.missing_rate
  ranks = np.searchsorted(model.rank_cdf, rng.random((rows, len(criteo.CATEGORICAL_COLUMNS))))
  ranks = np.minimum(ranks, spec.vocab_size - 1)
  categorical_missing = rng.random(ranks.shape) < spec.missing_rate
  return dense, dense_missing, ranks, categorical_missing


def _encode(spec: SyntheticSpec, model: _PlantedModel, dense, dense_missing, ranks, categorical_missing,
            labels) -> bytes:
  """The rows as file bytes: fixed-width byte columns, NUL-padded, concatenated, then NULs dropped."""
  rows = len(labels)
  sep = np.full((rows, 1), ord(criteo.FORMATS[spec.file_format]), np.uint8)
  parts = [(labels + ord("0")).astype(np.uint8)[:, None]]
  for column in range(dense.shape[1]):
    text = dense[:, column].astype(f"S{_DENSE_WIDTH}").view(np.uint8).reshape(rows, _DENSE_WIDTH).copy()
    text[dense_missing[:, column]] = 0
    parts += [sep, text]
  for column in range(ranks.shape[1]):
    text = model.hex_ids[column][ranks[:, column]]
    text[categorical_missing[:, column]] = 0
    parts += [sep, text]
  parts.append(np.full((rows, 1), ord("\n"), np.uint8))
  matrix = np.concatenate(parts, axis=1)
  return matrix[matrix != 0].tobytes()


def _auc(labels: np.ndarray, scores: np.ndarray) -> float:
  """Mann-Whitney AUC (ties broken by order; scores here are continuous)."""
  order = np.argsort(scores, kind="stable")
  ranks = np.empty(len(scores), np.float64)
  ranks[order] = np.arange(1, len(scores) + 1)
  positives = labels.sum()
  negatives = len(labels) - positives
  if positives == 0 or negatives == 0:
    return float("nan")
  return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def generate_criteo(output_dir: str, spec: SyntheticSpec = SyntheticSpec()) -> SyntheticData:
  """Writes `spec.rows` synthetic Criteo rows over `spec.num_files` files in `output_dir` (created if needed).

  Files are named `part-00000-of-00004.csv` (`.tsv` for TSV) and a `synthetic.json`, written last, records the spec
  and the measured positive rate and planted AUC. Each file is written under a temporary name and renamed into
  place, so processes generating the same spec at once (every role of a job parsing the same flags) never expose a
  partial file. Existing files of the same names are replaced.

  Returns:
    The files written and their statistics.
  """
  checks.directory("data_dir", output_dir)
  model = _PlantedModel(spec)
  header = (",".join(criteo.COLUMNS) + "\n").encode() if spec.file_format == "csv" else b""
  sizes = [spec.rows // spec.num_files + (1 if part < spec.rows % spec.num_files else 0)
           for part in range(spec.num_files)]
  files: List[str] = []
  all_labels, all_logits = [], []
  for part, size in enumerate(sizes):
    path = os.path.join(output_dir, f"part-{part:05d}-of-{spec.num_files:05d}.{spec.file_format}")
    partial = f"{path}.tmp-{os.getpid()}"
    with open(partial, "wb") as f:
      f.write(header)
      for start in range(0, size, 100_000):
        dense, dense_missing, ranks, cat_missing, labels, logits = _draw(spec, model, min(100_000, size - start),
                                                                         part * 1_000_003 + start)
        f.write(_encode(spec, model, dense, dense_missing, ranks, cat_missing, labels))
        all_labels.append(labels)
        all_logits.append(logits)
    os.replace(partial, path)  # a reader (or a concurrent generator) never sees a partly written file
    files.append(path)
  labels, logits = np.concatenate(all_labels), np.concatenate(all_logits)
  data = SyntheticData(files=tuple(files), spec=spec, positive_rate=float(labels.mean()),
                       planted_auc=_auc(labels, logits))
  metadata_path = os.path.join(output_dir, METADATA_FILE)
  with open(f"{metadata_path}.tmp-{os.getpid()}", "w", encoding="utf-8") as f:
    json.dump(_metadata(data), f, indent=2)
  os.replace(f"{metadata_path}.tmp-{os.getpid()}", metadata_path)  # written last: its presence means complete
  return data


def _metadata(data: SyntheticData) -> Dict:
  return {"spec": dataclasses.asdict(data.spec), "files": [os.path.basename(p) for p in data.files],
          "positive_rate": data.positive_rate, "planted_auc": data.planted_auc}


def ensure_generated(output_dir: str, spec: SyntheticSpec = SyntheticSpec()) -> SyntheticData:
  """The data of `spec` in `output_dir`: reused where its `synthetic.json` records the same spec, else generated."""
  try:
    with open(os.path.join(output_dir, METADATA_FILE), encoding="utf-8") as f:
      metadata = json.load(f)
  except (OSError, ValueError):
    metadata = None
  if metadata and metadata.get("spec") == dataclasses.asdict(spec):
    files = tuple(os.path.join(output_dir, name) for name in metadata["files"])
    if all(os.path.isfile(path) for path in files):
      return SyntheticData(files=files, spec=spec, positive_rate=metadata["positive_rate"],
                           planted_auc=metadata["planted_auc"])
  return generate_criteo(output_dir, spec)
