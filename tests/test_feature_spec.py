"""Feature specs and the delimited reader on a click log the project does not ship: generated here, with its own
column layout, string ids, a header or not, "NA" or "\\N" for missing values, a TSV or "|" delimiter. The reader parses
it, bad specs fail in one line naming the field, the Criteo and MovieLens specs are the readers', and the train
script trains Wide&Deep on the generated log under tfps-launch."""

import json
import logging
import pathlib
import subprocess
import sys

from absl import flags
from fixtures.launcher import QUICK_STOP
import numpy as np
import psutil
import pytest
import tensorflow as tf

from tfps.data import criteo
from tfps.data import delimited
from tfps.data import movielens
from tfps.data import spec as spec_lib
from tfps.errors import UsageError
from tfps.models import flags as model_flags

REPO = pathlib.Path(__file__).resolve().parents[1]
COLUMNS = ["event_time", "country", "user", "price", "clicked", "item", "age"]
NUM_USERS, NUM_ITEMS = 200, 40
LAYOUTS = {"tsv_header_NA": ("\t", True, ["NA"]), "pipe_no_header_backslash_N": ("|", False, ["\\N", ""])}


def click_log_spec(delimiter, header, missing):
  return {"name": "shop", "delimiter": delimiter, "header": header, "missing": missing, "columns": COLUMNS,
          "label": "clicked",
          "numeric": {"price": "log1p", "age": {"transform": "standardize", "mean": 40, "std": 12}},
          "categorical": {"user": 256, "item": 64, "country": 16}}


def write_click_log(path, rows, seed, delimiter, header, missing, malformed=False):
  """A click log with a planted signal (per-user and per-item effects, price); returns the good rows' columns."""
  rng = np.random.default_rng(seed)
  effects = np.random.default_rng(1234)
  user_effect, item_effect = effects.normal(0, 1.5, NUM_USERS), effects.normal(0, 1.0, NUM_ITEMS)
  user, item = rng.integers(0, NUM_USERS, rows), rng.integers(0, NUM_ITEMS, rows)
  price, age = np.round(rng.lognormal(3, 1, rows), 2), rng.integers(18, 70, rows)
  logit = user_effect[user] + item_effect[item] - 0.8 * (np.log1p(price) - 3)
  clicked = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
  price_missing, country_missing = rng.random(rows) < 0.05, rng.random(rows) < 0.1
  country = rng.choice(["de", "fr", "us", "jp"], rows)
  token = missing[0]
  lines = [delimiter.join(COLUMNS)] if header else []
  for i in range(rows):
    lines.append(delimiter.join([f"2026-11-{1 + i % 28:02d}T10:00", token if country_missing[i] else country[i],
                                 f"user-{user[i]:04d}", token if price_missing[i] else str(price[i]), str(clicked[i]),
                                 f"sku_{chr(97 + item[i] % 26)}{item[i]}", str(age[i])]))
  if malformed:
    good = lines[-1].split(delimiter)
    lines.insert(len(lines) // 2, delimiter.join(good[:-1]))  # a field short
    lines.insert(len(lines) // 3, delimiter.join(good[:3] + ["cheap"] + good[4:]))  # price not a number
    lines.insert(len(lines) // 4, delimiter.join(good[:4] + ["yes"] + good[5:]))  # label not 0/1
  pathlib.Path(path).write_text("\n".join(lines) + "\n")
  return {"clicked": clicked, "price": np.where(price_missing, 0.0, price), "age": age, "user": user,
          "country_missing": country_missing}


def read_all(dataset_fn):
  batches = list(dataset_fn(None))
  features = {name: np.concatenate([b[0][name].numpy() for b in batches]) for name in batches[0][0]}
  return features, np.concatenate([b[1].numpy() for b in batches])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_reader_parses_a_generated_click_log(layout, tmp_path, caplog):
  delimiter, header, missing = LAYOUTS[layout]
  path = tmp_path / "clicks.txt"
  truth = write_click_log(path, 600, 0, delimiter, header, missing, malformed=True)
  spec = spec_lib.spec_from_dict(click_log_spec(delimiter, header, missing))

  summary = delimited.scan_files(str(path), spec)
  assert (summary.rows, summary.wrong_column_count, summary.non_numeric) == (603, 1, 2)
  with pytest.raises(delimited.MalformedRowError, match=r"clicks\.txt:\d+: malformed shop row \(non-numeric"):
    delimited.scan_files(str(path), spec, strict=True)
  if header:  # a header naming other columns than the spec is reported
    renamed = spec_lib.spec_from_dict({**click_log_spec(delimiter, header, missing),
                                       "columns": ["ts"] + COLUMNS[1:]})
    with caplog.at_level(logging.WARNING):
      delimited.scan_files(str(path), renamed)
    assert "differs from the spec's `columns` at column 1: 'event_time' in the file, 'ts' in the spec" in caplog.text
    headless = tmp_path / "part-ab"  # split off the file without its header: its first row is skipped, and said so
    headless.write_text("\n".join(path.read_text().splitlines()[1:3]) + "\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      delimited.scan_files(str(headless), spec)
    assert (f"shop: the first line of {headless} is a well-formed row, not a header; it is skipped, as the spec's "
            "`header: true` says") in caplog.text and "differs from" not in caplog.text

  features, labels = read_all(delimited.delimited_dataset_fn(str(path), spec, batch_size=64, repeat=False,
                                                             shuffle_buffer=0, drop_remainder=False))
  assert list(features) == ["dense", "user", "item", "country"]
  assert spec.model_features() == ({"user": 256, "item": 64, "country": 16}, {"dense": 2})
  np.testing.assert_array_equal(labels, truth["clicked"])  # the 3 malformed rows are skipped, the order kept
  np.testing.assert_allclose(features["dense"][:, 0], np.log1p(truth["price"]), rtol=1e-5)  # missing -> 0
  np.testing.assert_allclose(features["dense"][:, 1], (truth["age"] - 40) / 12, rtol=1e-5, atol=1e-6)
  for name, buckets in spec.model_features()[0].items():
    assert features[name].dtype == np.int64 and 0 <= features[name].min() and features[name].max() < buckets
  for user in np.unique(truth["user"])[:20]:  # a string id always lands in one bucket
    assert len(set(features["user"][truth["user"] == user])) == 1
  empty = tf.math.floormod(tf.strings.to_hash_bucket_fast([""], (1 << 62) - 1), 16).numpy()[0]
  assert set(features["country"][truth["country_missing"]]) == {empty}  # every missing value hashes as ""


def test_configs_specs_are_the_criteo_and_movielens_readers(shared_data):
  criteo_spec = spec_lib.load_spec(REPO / "configs" / "criteo.spec.json")
  assert criteo_spec == criteo.criteo_spec("csv", 100_000)
  assert spec_lib.load_spec(REPO / "configs" / "movielens.spec.json") == movielens.ratings_spec(943, 1682)
  sample = str(shared_data / "criteo" / "criteo_sample.csv")
  once = {"batch_size": 64, "repeat": False, "shuffle_buffer": 0, "drop_remainder": False}
  by_spec = read_all(delimited.delimited_dataset_fn(sample, criteo_spec.with_buckets(1000), **once))
  by_reader = read_all(criteo.criteo_dataset_fn(sample, num_buckets=1000, **once))
  np.testing.assert_array_equal(by_spec[1], by_reader[1])
  assert list(by_spec[0]) == list(by_reader[0])
  for name in by_reader[0]:
    np.testing.assert_array_equal(by_spec[0][name], by_reader[0][name])


BAD_SPECS = [
    ({"delimiter": ";;"}, r"`delimiter` \(';;'\) must be one character"),
    ({"label": "click"}, r"`label` \('click'\) must be one of `columns` \(event_time, country"),
    ({"numeric": {"price": "sqrt"}}, r"`numeric.price` \('sqrt'\) must be one of none, log1p, standardize"),
    ({"numeric": {"price": {"transform": "standardize", "std": 0}}}, r"`numeric.price` \(\{'mean': 0.0, 'std': 0\}\)"),
    ({"categorical": {"user": 0}}, r"`categorical.user.buckets` \(0\) must be a positive integer"),
    ({"categorical": {"user": {"buckets": 8, "encoding": "onehot"}}}, r"`categorical.user.encoding` \('onehot'\)"),
    ({"categorical": {"price": 8}}, r"`categorical.price` \('price'\) is already the numeric column 'price'"),
    ({"categorical": {"clicked": 8}}, r"`categorical.clicked` \('clicked'\) is already the label"),
    ({"header": "yes"}, r"`header` \('yes'\) must be true or false"),
    ({"delim": ","}, r"`delim` \(','\) is not a spec field; fields: name, delimiter"),
    ({"columns": None}, r"`columns` \(None\) must be a JSON array"),
    ({"numeric": {}, "categorical": {}}, r"`numeric` \(\{\}\) and `categorical` are both empty"),
    ({"label_threshold": float("nan")}, r"`label_threshold` \(nan\) must be a finite number or null"),  # JSON's NaN
    ({"numeric": {"price": {"transform": "log1p", "mean": 40, "std": 12}}},  # was ignored, or applied by another's
     r"`numeric.price` \(\{'transform': 'log1p', 'mean': 40, 'std': 12\}\) gives `mean` and `std`, which only "
     r"\"standardize\" uses$"),
]


@pytest.mark.parametrize("change, message", BAD_SPECS, ids=[str(change) for change, _ in BAD_SPECS])
def test_bad_spec_is_one_line_naming_the_field(change, message, tmp_path):
  path = tmp_path / "bad.spec.json"
  path.write_text(json.dumps({**click_log_spec(",", True, ["NA"]), **change}))
  with pytest.raises(spec_lib.FeatureSpecError, match=f"^feature spec {path}: {message}") as error:
    spec_lib.load_spec(path)
  assert "\n" not in str(error.value)


def test_unreadable_spec_and_flags(tmp_path):
  path = tmp_path / "broken.json"
  path.write_text('{"columns": ["a",]}')
  with pytest.raises(spec_lib.FeatureSpecError, match=r"broken\.json: not JSON \(Expecting value at line 1"):
    spec_lib.load_spec(path)
  with pytest.raises(spec_lib.FeatureSpecError, match=r"nope\.json: cannot be read \(No such file"):
    spec_lib.load_spec(tmp_path / "nope.json")
  (tmp_path / "twice.json").write_text('{"columns": ["a", "b"], "label": "a", "categorical": {"b": 100, "b": 5}}')
  with pytest.raises(spec_lib.FeatureSpecError, match=r"twice\.json: the key 'b' is given twice in one object$"):
    spec_lib.load_spec(tmp_path / "twice.json")  # JSON keeps the last one without a word
  (tmp_path / "utf16.json").write_bytes(b"\xff\xfe{")  # an editor's UTF-16
  with pytest.raises(spec_lib.FeatureSpecError, match=r"utf16\.json: not UTF-8 text \(byte 0xff at 0\); save it as "):
    spec_lib.load_spec(tmp_path / "utf16.json")

  def parse(*argv):
    flag_values = flags.FlagValues()
    model_flags.define_model_flags(flag_values)
    flag_values(["prog", *argv])
    return flag_values

  files = ["--train_files=a.csv", "--eval_files=b.csv"]
  with pytest.raises(flags.IllegalFlagValueError, match=r"feature spec .*broken\.json: not JSON"):
    parse("--data=csv", f"--feature_spec={path}", *files)
  with pytest.raises(flags.IllegalFlagValueError, match=r"--data=csv needs it \(given --data=csv\)"):
    parse("--data=csv", *files)
  good = tmp_path / "good.json"
  good.write_text(json.dumps(click_log_spec(",", True, ["NA"])))
  with pytest.raises(flags.IllegalFlagValueError, match=r"--feature_spec \('.*good.json'\) goes with --data=csv"):
    parse(f"--feature_spec={good}")
  with pytest.raises(flags.IllegalFlagValueError, match=r"--data=csv needs --train_files and --eval_files"):
    parse("--data=csv", f"--feature_spec={good}")
  assert parse("--data=csv", f"--feature_spec={good}", *files).feature_spec == str(good)
  # Files that do not exist are named by their flag when the chief reads them (not by a Python argument's name).
  (tmp_path / "clicks").mkdir()
  data = model_flags.data_from_flags(parse("--data=csv", f"--feature_spec={good}", f"--train_files={tmp_path}/clicks",
                                           f"--eval_files={tmp_path}/nope*.csv"))
  with pytest.raises(UsageError, match=rf"^--train_files={tmp_path}/clicks matches no file \({tmp_path}/clicks is a "
                     rf"folder: give its files, e.g. {tmp_path}/clicks/\*\); give paths or globs of existing files$"):
    data.train_dataset_fn(None)
  with pytest.raises(UsageError, match=r"^--eval_files=.*/nope\*\.csv matches no file; give paths or globs"):
    data.eval_dataset_fn(None)


@pytest.mark.slow
def test_train_script_trains_wide_deep_on_a_generated_tsv(tmp_path, subprocess_env):
  delimiter, header, missing = LAYOUTS["tsv_header_NA"]
  write_click_log(tmp_path / "train.tsv", 8000, 1, delimiter, header, missing, malformed=True)
  write_click_log(tmp_path / "eval.tsv", 2000, 2, delimiter, header, missing)
  (tmp_path / "shop.spec.json").write_text(json.dumps(click_log_spec(delimiter, header, missing)))
  command = [sys.executable, "-m", "tfps.cluster.launch", "--num_ps=1", "--num_workers=1", QUICK_STOP,
             f"--log_dir={tmp_path / 'logs'}", "scripts/train.py", "--", "--data=csv",
             f"--feature_spec={tmp_path / 'shop.spec.json'}", f"--train_files={tmp_path / 'train.tsv'}",
             f"--eval_files={tmp_path / 'eval.tsv'}", f"--model_dir={tmp_path / 'run'}", "--model=wide_deep",
             "--epochs=1", "--steps_per_epoch=60", "--batch_size=128", "--embedding_dim=8", "--deep_layers=32,16",
             "--learning_rate=0.1"]
  run = subprocess.Popen(command, cwd=REPO, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
  try:
    output, _ = run.communicate(timeout=300)
  finally:
    for child in psutil.Process(run.pid).children(recursive=True) if run.poll() is None else []:
      child.kill()
    if run.poll() is None:
      run.kill()
  assert run.returncode == 0, output[-3000:]
  chief_log = (tmp_path / "logs" / "chief-0.log").read_text()
  assert "shop: 8,003 rows in 1 file(s); 3 malformed skipped (1 wrong column count, 2 non-numeric" in chief_log
  final = [line for line in output.splitlines() + chief_log.splitlines() if "Final: " in line][0]
  assert float(final.split("val_auc ")[1].split()[0]) > 0.6, final


def test_a_number_beyond_its_type_is_refused_naming_file_line_and_column(tmp_path):
  """1e39 passed the row pattern and was read as inf (a NaN loss, the run ended 0); an integer-encoded id beyond
  int64 failed every training function (a traceback, then restarts). A 19-digit id within int64 is read."""
  spec = spec_lib.spec_from_dict({"columns": ["y", "price", "uid"], "label": "y", "numeric": {"price": "none"},
                                  "categorical": {"uid": {"buckets": 100, "encoding": "integer"}}}, "t")
  rows = {"float": ["1,2.5,7", "0,1e39,8"], "int": ["1,2.5,7", "0,1,99999999999999999999"],
          "within": ["1,2.5,7", "0,1e38,9223372036854775807", "1,-3,-0009223372036854775807"]}
  for name, lines in rows.items():
    (tmp_path / f"{name}.csv").write_text("\n".join(lines) + "\n")
  with pytest.raises(UsageError, match=r"^.*float\.csv:2: delimited column 'price' holds '1e39', beyond float32's "
                     r"range: the reader cannot skip such a row; fix it in the file or make it a missing value$"):
    delimited.delimited_dataset_fn(str(tmp_path / "float.csv"), spec, batch_size=2)
  with pytest.raises(UsageError, match=r"^.*int\.csv:2: delimited column 'uid' holds '99999999999999999999', beyond "
                     r"int64's range"):
    delimited.scan_files(str(tmp_path / "int.csv"), spec)
  features, _ = read_all(delimited.delimited_dataset_fn(str(tmp_path / "within.csv"), spec, batch_size=8,
                                                        repeat=False, shuffle_buffer=0, drop_remainder=False))
  assert features["uid"].tolist() == [7, (2**63 - 1) % 100, -(2**63 - 1) % 100]
