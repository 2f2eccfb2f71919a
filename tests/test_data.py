"""tfps.data: Criteo reader and malformed rows, sharding, the synthetic generator, MovieLens 100K."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import needs
import tensorflow as tf

from tfps.data import criteo
from tfps.data import movielens
from tfps.data import pipeline
from tfps.data import synthetic
from tfps.errors import UsageError

BUCKETS = 1000


def _read_all(dataset_fn, input_context=None):
  """Every batch of a finite dataset, concatenated: (features, labels) as numpy."""
  batches = list(dataset_fn(input_context))
  features = {name: np.concatenate([b[0][name].numpy() for b in batches]) for name in batches[0][0]}
  return features, np.concatenate([b[1].numpy() for b in batches])


def _once(files, **options):
  options = {"batch_size": 64, "num_buckets": BUCKETS, "repeat": False, "shuffle_buffer": 0,
             "drop_remainder": False, **options}
  return criteo.criteo_dataset_fn(files, **options)


@pytest.fixture
def criteo_sample(shared_data):
  return str(shared_data / "criteo" / "criteo_sample.csv")


def test_criteo_sample_rows_and_shapes(criteo_sample):
  summary = criteo.scan_criteo(criteo_sample)
  assert (summary.rows, summary.malformed) == (200, 0)
  batch_features, batch_label = next(iter(criteo.criteo_dataset_fn(criteo_sample, batch_size=32,
                                                                    num_buckets=BUCKETS)(None)))
  assert batch_features["dense"].shape == (32, 13) and batch_features["dense"].dtype == tf.float32
  assert batch_features["C26"].shape == (32,) and batch_features["C26"].dtype == tf.int64
  assert batch_label.shape == (32,)
  features, labels = _read_all(_once(criteo_sample))
  assert len(labels) == 200 and set(np.unique(labels)) <= {0.0, 1.0}
  assert set(features) == {"dense", *criteo.CATEGORICAL_COLUMNS}
  assert features["dense"].min() >= 0.0  # log1p(max(x, 0))
  # First row: I2=3, I3=260.0, I5=17668.0, I1 empty.
  np.testing.assert_allclose(features["dense"][0, [0, 1, 2, 4]], np.log1p([0.0, 3.0, 260.0, 17668.0]), rtol=1e-6)
  for name in criteo.CATEGORICAL_COLUMNS:
    assert 0 <= features[name].min() and features[name].max() < BUCKETS


def test_per_feature_buckets_and_tsv_match_csv(criteo_sample, tmp_path):
  sizes = list(range(2, 28))
  csv_features, csv_labels = _read_all(_once(criteo_sample, num_buckets=sizes))
  for name, size in zip(criteo.CATEGORICAL_COLUMNS, sizes):
    assert csv_features[name].max() < size
  lines = open(criteo_sample, encoding="utf-8").read().splitlines()[1:]
  tsv = tmp_path / "day_0"  # raw Criteo: no header, no extension
  tsv.write_text("".join(line.replace(",", "\t") + "\n" for line in lines))
  tsv_features, tsv_labels = _read_all(_once(str(tsv), num_buckets=sizes))
  np.testing.assert_array_equal(tsv_labels, csv_labels)
  for name in csv_features:
    np.testing.assert_array_equal(tsv_features[name], csv_features[name])


def _malformed_csv(tmp_path, good_rows):
  good = ["0," + ",".join(str(i) for i in range(13)) + "," + ",".join(f"{i:08x}" for i in range(26))] * good_rows
  bad = [
      "1,2,3",  # wrong column count
      "0," + ",".join(["x7"] + ["1"] * 12) + "," + ",".join(["ab"] * 26),  # non-numeric integer field
      "1," + ",".join(["1"] * 13) + "," + ",".join(["ab"] * 27),  # 41 fields
      "2," + ",".join(["1"] * 13) + "," + ",".join(["ab"] * 26),  # label not 0/1
  ]
  rows = good[:3] + bad[:2] + good[3:] + bad[2:]
  path = tmp_path / "bad.csv"
  path.write_text(",".join(criteo.COLUMNS) + "\n" + "\n".join(rows) + "\n")
  return str(path)


def test_malformed_rows_counted_and_skipped(tmp_path):
  path = _malformed_csv(tmp_path, good_rows=10)
  summary = criteo.scan_criteo(path)
  assert (summary.rows, summary.wrong_column_count, summary.non_numeric) == (14, 2, 2)
  assert [(line, reason) for _, line, reason, _ in summary.examples] == [
      (5, "wrong column count"), (6, "non-numeric label/numeric field"), (14, "wrong column count"),
      (15, "non-numeric label/numeric field")]
  assert "4 malformed skipped (2 wrong column count, 2 non-numeric" in summary.describe()
  features, labels = _read_all(_once(path))
  assert len(labels) == 10 and features["dense"].shape == (10, 13)


def test_malformed_rows_fail_in_strict_mode(tmp_path):
  path = _malformed_csv(tmp_path, good_rows=10)
  with pytest.raises(criteo.MalformedRowError, match=r"bad\.csv:5: malformed Criteo row \(wrong column count\)"):
    _once(path, strict=True)
  with pytest.raises(tf.errors.InvalidArgumentError, match="malformed Criteo row"):
    _read_all(_once(path, strict=True, scan=False))


def test_a_compressed_file_is_refused_and_a_header_that_is_not_utf8_compared(tmp_path, caplog):
  """A gzip file was read as malformed rows, or with a header, crashed on UnicodeDecodeError (a traceback, and
  tfps-launch restarted the chief); a latin-1 header (an export's) crashed alike."""
  import gzip  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(_malformed_csv(tmp_path, good_rows=4))
  packed = tmp_path / "bad.csv.gz"
  packed.write_bytes(gzip.compress(path.read_bytes()))
  with pytest.raises(UsageError, match=r"^.*bad\.csv\.gz is gzip-compressed; the reader reads plain text files: "
                     r"decompress it first$"):
    criteo.criteo_dataset_fn(str(packed), batch_size=2)
  latin = tmp_path / "latin.csv"
  latin.write_bytes(path.read_bytes().replace(b"label", b"l\xe4bel", 1))
  assert criteo.scan_criteo(str(latin)).rows == 8
  assert "differs from the spec's `columns` at column 1: 'l\ufffdbel' in the file, 'label' in the spec" in caplog.text


@pytest.mark.parametrize("repeat", [True, False], ids=["training", "evaluation"])
def test_files_without_a_usable_row_are_refused_instead_of_read_forever(tmp_path, repeat):
  path = _malformed_csv(tmp_path, good_rows=0)
  with pytest.raises(UsageError, match=r"^no usable row to read: Criteo: 4 rows in 1 file\(s\); 4 malformed skipped"):
    criteo.criteo_dataset_fn(path, batch_size=2, repeat=repeat)
  renamed = tmp_path / "sample.txt"  # a Criteo CSV not named *.csv: its format is guessed, and the error says so
  renamed.write_text(pathlib.Path(path).read_text())
  with pytest.raises(UsageError, match=r"^no usable row to read: .* \(read as Criteo TSV, guessed from the file names: "
                     r"CSV files are named \*\.csv; or give `file_format`, or --data=csv "
                     r"--feature_spec=configs/criteo.spec.json\)$"):
    criteo.criteo_dataset_fn(str(renamed), batch_size=2, repeat=repeat)
  header_only = tmp_path / "header.csv"
  header_only.write_text(",".join(criteo.COLUMNS) + "\n")
  with pytest.raises(UsageError, match=r"^no usable row to read: Criteo: 0 rows in 1 file\(s\)"):
    criteo.criteo_dataset_fn(str(header_only), batch_size=2, repeat=repeat)


def test_argument_errors(criteo_sample, tmp_path):
  with pytest.raises(ValueError, match=r"`file_pattern` \('.*nothing\*'\) matches no file"):
    _once(str(tmp_path / "nothing*"))
  with pytest.raises(ValueError, match=r"`num_buckets` \(\[1, 2\]\) must be a positive int or 26"):
    _once(criteo_sample, num_buckets=[1, 2])
  with pytest.raises(ValueError, match=r"`file_format` \('json'\) must be one of csv, tsv"):
    _once(criteo_sample, file_format="json")
  with pytest.raises(ValueError, match=r"`batch_size` \(0\) must be a positive integer"):
    _once(criteo_sample, batch_size=0)


def test_shard_plan_splits_files_then_lines():
  assert pipeline.shard_plan(5, tf.distribute.InputContext(2, 1)) == pipeline.Shard(2, 1, by_file=True)
  assert pipeline.shard_plan(1, tf.distribute.InputContext(3, 1)) == pipeline.Shard(3, 1, by_file=False)
  assert pipeline.shard_plan(5, None) is None
  assert pipeline.shard_plan(5, tf.distribute.InputContext()) is None  # outside PSS: one pipeline reads everything
  assert pipeline.shard_plan(5, tf.distribute.InputContext(2, 0), shard_index=1, num_shards=5) == pipeline.Shard(
      5, 1, by_file=True)
  assert pipeline.shard_plan(5, tf.distribute.InputContext(2, 0), shard_index=0, num_shards=1) is None
  with pytest.raises(ValueError, match=r"`shard_index` \(5\) must be an integer in 0-4"):
    pipeline.shard_plan(5, shard_index=5, num_shards=5)
  with pytest.raises(ValueError, match=r"give both `shard_index` \(1\) and `num_shards` \(None\) or neither"):
    pipeline.shard_plan(5, shard_index=1)


@pytest.fixture(scope="module")
def small_synthetic(tmp_path_factory):
  spec = synthetic.SyntheticSpec(rows=10_001, num_files=3, seed=7, vocab_size=500)
  return synthetic.generate_criteo(str(tmp_path_factory.mktemp("synthetic")), spec)


def test_workers_read_disjoint_shares(small_synthetic):
  """Each of 2 pipelines reads its own files; together they read every row once. Fewer files: lines."""
  for files in (small_synthetic.files, small_synthetic.files[:1]):
    counts, ids = [], []
    for index in range(2):
      features, labels = _read_all(_once(list(files), scan=False), tf.distribute.InputContext(2, index))
      counts.append(len(labels))
      ids.append(set(zip(*(features[name] for name in criteo.CATEGORICAL_COLUMNS[:8]))))
    total = criteo.scan_criteo(list(files)).rows
    assert sum(counts) == total and min(counts) > 0
    assert not ids[0] & ids[1]


def test_repeat_and_shuffle(small_synthetic):
  files = list(small_synthetic.files)
  _, labels = _read_all(_once(files, batch_size=1000, drop_remainder=True, scan=False))
  assert len(labels) == 10_000  # 10,001 rows once, the partial batch dropped
  endless = criteo.criteo_dataset_fn(files, batch_size=1000, num_buckets=BUCKETS, scan=False)(None)
  assert sum(1 for _ in endless.take(25)) == 25  # repeats past the 10 batches of one pass
  first = [b[1].numpy() for b in criteo.criteo_dataset_fn(files, batch_size=100, seed=3, scan=False)(None).take(3)]
  again = [b[1].numpy() for b in criteo.criteo_dataset_fn(files, batch_size=100, seed=3, scan=False)(None).take(3)]
  np.testing.assert_array_equal(first, again)


def test_synthetic_is_deterministic_and_heavy_tailed(small_synthetic, tmp_path):
  again = synthetic.generate_criteo(str(tmp_path / "again"), small_synthetic.spec)
  for a, b in zip(small_synthetic.files, again.files):
    assert open(a, "rb").read() == open(b, "rb").read()
  other = synthetic.generate_criteo(str(tmp_path / "other"), synthetic.SyntheticSpec(rows=100, num_files=1, seed=8,
                                                                                      vocab_size=500))
  assert open(other.files[0], "rb").read()[:2000] != open(small_synthetic.files[0], "rb").read()[:2000]
  summary = criteo.scan_criteo(list(small_synthetic.files))
  assert (summary.rows, summary.malformed) == (10_001, 0)
  assert [criteo.scan_criteo(path).rows for path in small_synthetic.files] == [3334, 3334, 3333]
  assert 0.2 < small_synthetic.positive_rate < 0.3 and small_synthetic.planted_auc > 0.85
  metadata = json.loads((tmp_path / "again" / synthetic.METADATA_FILE).read_text())
  assert metadata["spec"]["seed"] == 7 and metadata["planted_auc"] == pytest.approx(small_synthetic.planted_auc)
  column = [line.split(",")[15] for line in open(small_synthetic.files[0], encoding="utf-8").read().splitlines()[1:]]
  _, counts = np.unique([value for value in column if value], return_counts=True)
  counts = np.sort(counts)[::-1]
  assert counts[0] > 50 * np.median(counts)  # Zipf: the head id dwarfs the typical one


def test_synthetic_tsv_and_reuse(tmp_path):
  spec = synthetic.SyntheticSpec(rows=500, num_files=2, seed=1, vocab_size=50, file_format="tsv")
  data = synthetic.ensure_generated(str(tmp_path), spec)
  assert [p.rsplit("/", 1)[1] for p in data.files] == ["part-00000-of-00002.tsv", "part-00001-of-00002.tsv"]
  assert criteo.scan_criteo(list(data.files)).rows == 500
  mtime = (tmp_path / "part-00000-of-00002.tsv").stat().st_mtime_ns
  assert synthetic.ensure_generated(str(tmp_path), spec) == data
  assert (tmp_path / "part-00000-of-00002.tsv").stat().st_mtime_ns == mtime
  with pytest.raises(ValueError, match=r"`zipf_exponent` \(0\) must be positive"):
    synthetic.SyntheticSpec(zipf_exponent=0)


@pytest.fixture
def ml100k(shared_data):
  path = shared_data / "ml-100k"
  needs.require((path / "u.data").is_file(), f"MovieLens 100K at {path}")
  return str(path)


def test_movielens_splits(ml100k):
  tables = movielens.load_tables(ml100k)
  assert (tables.num_users, tables.num_movies, tables.num_occupations) == (943, 1682, 21)
  categorical, dense = tables.feature_spec()
  assert categorical == {"user_id": 944, "user_gender": 2, "user_age": 7, "user_occupation": 21, "movie_id": 1683}
  assert dense == {"movie_genres": 19}
  counts = {}
  for split in ("u1.base", "u1.test", "u.data"):
    features, labels = _read_all(movielens.movielens_dataset_fn(
        ml100k, split, batch_size=4096, repeat=False, shuffle_buffer=0, drop_remainder=False, tables=tables))
    counts[split] = len(labels)
    for name, size in categorical.items():
      assert features[name].min() >= 0 and features[name].max() < size
    assert features["movie_genres"].shape == (len(labels), 19)
    assert features["movie_genres"].sum(axis=1).min() >= 1  # every movie has a genre (or "unknown")
    assert 0.5 < labels.mean() < 0.6  # rating >= 4
  assert counts == {"u1.base": 80_000, "u1.test": 20_000, "u.data": 100_000}
  assert sum(len(b["movie_id"]) for b in movielens.candidates_dataset(tables)) == 1682


def test_movielens_split_that_is_not_a_ratings_file_is_one_line(ml100k):
  """A split in another format (u.item, pipe-separated) was read for a good row forever: training hung."""
  with pytest.raises(UsageError, match=r"^no usable row to read: MovieLens: 1,682 rows in 1 file\(s\); 1,682 "
                     r"malformed skipped \(1,682 wrong column count"):
    movielens.movielens_dataset_fn(ml100k, "u.item", batch_size=8)
  with pytest.raises(UsageError, match=r"^split 'u9.base' is not a file of .*ml-100k; its ratings files: u.data, "
                     r"u1.base, u1.test$"):
    movielens.movielens_dataset_fn(ml100k, "u9.base", batch_size=8)


def test_movielens_missing_dir(tmp_path):
  with pytest.raises(ValueError, match=r"`data_dir` \('.*'\) has no u.occupation; point it at the unpacked MovieLens"):
    movielens.movielens_dataset_fn(str(tmp_path), "u1.base", batch_size=8)


def test_generate_data_script(tmp_path, subprocess_env):
  script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "generate_data.py"
  command = [sys.executable, str(script), f"--output_dir={tmp_path}", "--rows=1000", "--num_files=2", "--seed=4",
             "--vocab_size=100", "--format=tsv"]
  result = subprocess.run(command, env=subprocess_env, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert f"wrote 1,000 rows in 2 files to {tmp_path}" in result.stdout
  assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00000-of-00002.tsv", "part-00001-of-00002.tsv",
                                                        "synthetic.json"]
  assert json.loads((tmp_path / "synthetic.json").read_text())["spec"]["seed"] == 4
  bad = subprocess.run(command + ["--rows=0"], env=subprocess_env, capture_output=True, text=True, timeout=120,
                       check=False)
  assert bad.returncode != 0 and "--rows=0" in bad.stderr
