"""Model and data flags: `define_model_flags(flag_values)` defines them (never an import side effect);
`data_from_flags` and `model_from_flags` turn them into dataset functions and a model.

A flagfile (`configs/wide_deep_criteo.cfg`, ...) holds one `--flag=value` a line. `--data` picks the source:

* `synthetic`: Criteo-schema files generated into `--data_dir` (default `/tmp/tfps_synthetic`; it must be visible to
  every worker) by the first process that builds a dataset from them (the chief), reused where `synthetic.json`
  there records the same spec; the last file is held out for evaluation;
* `criteo`: `--train_files` and `--eval_files` globs of Criteo CSV (with header) or TSV files, scanned for malformed
  rows by the first process that builds a dataset from them;
* `movielens`: the MovieLens 100K folder `--data_dir`, splits `--train_split` and `--eval_split`;
* `csv`: `--train_files` and `--eval_files` of any delimited click log (CSV, TSV, ...) read as the JSON feature spec
  `--feature_spec` says (`docs/data.md`; `configs/criteo.spec.json` is Criteo's), checked when flags are parsed.
"""

import dataclasses
import functools
import glob
import os
from typing import Callable, Dict, List, Optional

from absl import flags

from tfps.cli import flags as flags_lib
from tfps.errors import UsageError

MODELS = ("wide_deep", "dcn", "retrieval")
DATA = ("synthetic", "criteo", "movielens", "csv")
DEFAULT_SYNTHETIC_DIR = "/tmp/tfps_synthetic"
EMBEDDINGS = ("hashed", "dynamic")


def define_model_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the model and data flags in `flag_values`; calling it again is harmless."""
  if "model" in flag_values:
    return
  _define_data_flags(flag_values)
  _define_model_flags(flag_values)
  for name in ("num_buckets", "deep_layers", "tower_layers"):
    flags.register_validator(name, _positive_ints, message=f"--{name} must be comma-separated positive integers",
                             flag_values=flag_values)
  flags.register_validator("feature_spec", _check_feature_spec, flag_values=flag_values)
  checked = ["model", "data", "data_dir", "train_files", "eval_files", "num_buckets", "feature_spec", "embedding",
             "stack_tables"] + ["stream"] * ("stream" in flag_values)  # define_stream_flags first: files optional
  flags.register_multi_flags_validator(checked, _check_data, flag_values=flag_values)
  flags_lib.declare_program_flags(flag_values, __name__)


def _define_data_flags(flag_values: flags.FlagValues) -> None:
  fv = {"flag_values": flag_values}
  flags.DEFINE_enum("data", "synthetic", DATA, "Data source (see tfps.cli.model_flags).", **fv)
  flags.DEFINE_string("data_dir", None, "MovieLens 100K folder, or where synthetic data is generated.", **fv)
  flags.DEFINE_list("train_files", [], "Criteo or --data=csv training files (paths or globs).", **fv)
  flags.DEFINE_list("eval_files", [], "Criteo or --data=csv evaluation files (paths or globs).", **fv)
  flags.DEFINE_string("feature_spec", None, "--data=csv: JSON feature spec of the files (columns, label, numeric and "
                      "categorical features, delimiter, header, missing values; see docs/data.md).", **fv)
  flags.DEFINE_string("train_split", "u1.base", "MovieLens ratings file for training.", **fv)
  flags.DEFINE_string("eval_split", "u1.test", "MovieLens ratings file for evaluation.", **fv)
  flags.DEFINE_integer("batch_size", 1024, "Examples per batch (per worker).", lower_bound=1, **fv)
  flags.DEFINE_integer("eval_batch_size", 4096, "Examples per evaluation batch.", lower_bound=1, **fv)
  flags.DEFINE_integer("shuffle_buffer", None, "Training rows in the shuffle buffer (0: file order); default: the "
                       "reader's (Criteo 10,000; MovieLens 100,000, a whole ratings file).", lower_bound=0, **fv)
  flags.DEFINE_list("num_buckets", ["100000"], "Hash buckets per Criteo categorical feature: one or 26 ints.", **fv)
  flags.DEFINE_bool("strict_data", False, "Stop at a malformed Criteo or --data=csv row instead of skipping it.",
                    **fv)
  flags.DEFINE_integer("synthetic_rows", 1_000_000, "Rows of generated data.", lower_bound=1, **fv)
  flags.DEFINE_integer("synthetic_files", 8, "Files of generated data (the last is held out).", lower_bound=2, **fv)
  flags.DEFINE_integer("synthetic_vocab_size", 100_000, "Distinct ids per generated categorical column.",
                       lower_bound=1, **fv)
  flags.DEFINE_integer("synthetic_seed", 0, "Seed of the generated data.", lower_bound=0, **fv)


def _define_model_flags(flag_values: flags.FlagValues) -> None:
  fv = {"flag_values": flag_values}
  flags.DEFINE_enum("model", "wide_deep", MODELS, "Model to train.", **fv)
  flags.DEFINE_integer("embedding_dim", 16, "Width of every embedding table.", lower_bound=1, **fv)
  flags.DEFINE_list("deep_layers", ["256", "128", "64"], "MLP widths of Wide&Deep and DCN.", **fv)
  flags.DEFINE_bool("stack_tables", False, "Wide&Deep and DCN: one table for all categorical features instead of one "
                    "per feature (fewer remote lookups and updates per step under ParameterServerStrategy).", **fv)
  flags.DEFINE_enum("embedding", "hashed", EMBEDDINGS, "Wide&Deep and DCN tables: `hashed` (a row per id of the "
                    "reader's id space) or `dynamic` (tfps.layers.DynamicEmbedding: rows given to the ids seen, no two "
                    "live ids sharing one; docs/dynamic_embeddings.md).", **fv)
  flags.DEFINE_integer("dynamic_capacity", 1_000_000, "--embedding=dynamic: the most rows of one feature's table.",
                       lower_bound=1, **fv)
  flags.DEFINE_integer("dynamic_min_count", 1, "--embedding=dynamic: training steps an id is seen in before it gets "
                       "a row.", lower_bound=1, **fv)
  flags.DEFINE_integer("dynamic_steps_to_live", 0, "--embedding=dynamic: free the row of an id unseen for this many "
                       "steps (0: never).", lower_bound=0, **fv)
  flags.DEFINE_integer("num_cross_layers", 3, "DCN cross layers.", lower_bound=1, **fv)
  flags.DEFINE_integer("projection_dim", 0, "DCN low-rank projection (0: full rank).", lower_bound=0, **fv)
  flags.DEFINE_list("tower_layers", ["64", "32"], "Retrieval tower MLP widths; the last is the output width.", **fv)
  flags.DEFINE_enum("optimizer", "adagrad", ("adagrad", "adam", "sgd"), "Optimizer (tf-keras legacy).", **fv)
  flags.DEFINE_float("learning_rate", 0.05, "Learning rate.", lower_bound=0.0, **fv)
  flags.DEFINE_integer("seed", None, "Seed of the model's initial values and of the training rows' order: the same "
                       "run at every launch with 1 worker or in sync mode (docs/repeatability.md); unset: other ones "
                       "at each launch.", lower_bound=0, **fv)


def _check_data(values: dict) -> bool:
  """Cross-flag rules of the data source, checked when flags are parsed."""
  if values["model"] == "retrieval" and values["data"] != "movielens":
    raise flags.ValidationError(f"--model=retrieval needs --data=movielens (given --data={values['data']})")
  if values["data"] == "movielens" and not values["data_dir"]:
    raise flags.ValidationError("--data=movielens needs --data_dir, the MovieLens 100K folder")
  if values["data"] in ("criteo", "csv") and not values.get("stream") and not (values["train_files"] and
                                                                              values["eval_files"]):
    raise flags.ValidationError(f"--data={values['data']} needs --train_files and --eval_files (paths or globs)")
  if (values["data"] == "csv") != bool(values["feature_spec"]):
    raise flags.ValidationError(f"--feature_spec ({values['feature_spec']!r}) goes with --data=csv, and --data=csv "
                                f"needs it (given --data={values['data']})")
  if values["embedding"] == "dynamic" and values["stack_tables"]:
    raise flags.ValidationError("--embedding=dynamic and --stack_tables exclude each other: a dynamic table keeps one "
                                "id map per feature")
  if values["data"] in ("csv", "movielens") and values["num_buckets"] != ["100000"]:  # not its default
    raise flags.ValidationError(f"--num_buckets ({','.join(values['num_buckets'])}) is for --data=criteo and "
                                f"synthetic; --data={values['data']} takes its bucket counts from "
                                f"{'the feature spec' if values['data'] == 'csv' else 'the MovieLens tables'}")
  if values["data"] in ("csv", "criteo") and values["data_dir"]:
    raise flags.ValidationError(f"--data_dir ({values['data_dir']}) is for --data=movielens and synthetic; "
                                f"--data={values['data']} reads --train_files and --eval_files")
  if len(values["num_buckets"]) not in (1, 26):
    raise flags.ValidationError(f"--num_buckets has {len(values['num_buckets'])} values; give 1 or 26")
  return True


def _check_feature_spec(path: Optional[str]) -> bool:
  """Reads the spec when flags are parsed, so a bad one stops every task at once with one line."""
  if path:
    from tfps.data import spec  # pylint: disable=g-import-not-at-top  (no TensorFlow)
    try:
      spec.load_spec(path)
    except spec.FeatureSpecError as e:
      raise flags.ValidationError(str(e)) from None
  return True


def _positive_ints(values) -> bool:
  return all(str(v).isascii() and str(v).isdigit() and int(v) > 0 for v in values)


def _ints(flag_values: flags.FlagValues, name: str):
  return [int(v) for v in flag_values[name].value]


@dataclasses.dataclass(frozen=True)
class Data:
  """The data a flagfile names.

  Attributes:
    train_dataset_fn: `input_context -> Dataset`, repeating, for training.
    eval_dataset_fn: `input_context -> Dataset`, one pass keeping the last partial batch, for evaluation.
    categorical: vocabulary size of each categorical feature.
    dense: width of each dense feature.
    candidates: for retrieval, a function returning a Dataset of every candidate (None otherwise).
    batch_size: examples per training batch (per worker).
  """

  train_dataset_fn: Callable
  eval_dataset_fn: Callable
  categorical: Dict[str, int]
  dense: Dict[str, int]
  candidates: Optional[Callable] = None
  batch_size: Optional[int] = None


def data_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> Data:
  """The dataset functions and feature spec of the `--data` flags (generating synthetic data if needed)."""
  from tfps.data import criteo  # pylint: disable=g-import-not-at-top  (TensorFlow only once flags are parsed)
  from tfps.data import movielens  # pylint: disable=g-import-not-at-top
  fv = flag_values
  common = {"batch_size": fv.batch_size, "seed": fv.seed}
  if fv.shuffle_buffer is not None:
    common["shuffle_buffer"] = fv.shuffle_buffer
  once = {"batch_size": fv.eval_batch_size, "repeat": False, "shuffle_buffer": 0, "drop_remainder": False}
  if fv.data == "movielens":  # side tables are small: read now, so a wrong --data_dir fails at once
    tables = movielens.load_tables(fv.data_dir)
    categorical, dense = tables.feature_spec()
    return Data(movielens.movielens_dataset_fn(fv.data_dir, fv.train_split, tables=tables, **common),
                movielens.movielens_dataset_fn(fv.data_dir, fv.eval_split, tables=tables, **once),
                categorical, dense, candidates=lambda: movielens.candidates_dataset(tables),
                batch_size=fv.batch_size)
  if fv.data == "csv":
    from tfps.data import delimited  # pylint: disable=g-import-not-at-top
    from tfps.data import spec  # pylint: disable=g-import-not-at-top
    feature_spec = spec.load_spec(fv.feature_spec)
    make = functools.partial(delimited.delimited_dataset_fn, spec=feature_spec, strict=fv.strict_data)
    categorical, dense = feature_spec.model_features()
  else:
    buckets = _ints(fv, "num_buckets")
    buckets = buckets[0] if len(buckets) == 1 else buckets
    make = functools.partial(criteo.criteo_dataset_fn, num_buckets=buckets, strict=fv.strict_data)
    categorical, dense = criteo.feature_spec(buckets)

  def files(train: bool):
    if fv.data in ("criteo", "csv"):
      return _existing_files("train_files" if train else "eval_files", fv)
    generated = _synthetic_files(fv)
    return generated[:-1] if train else generated[-1:]

  return Data(_deferred(lambda: make(files(True), **common)), _deferred(lambda: make(files(False), **once)),
              categorical, dense, batch_size=fv.batch_size)


def _existing_files(name: str, fv: flags.FlagValues) -> List[str]:
  """`--name`'s paths and globs, where at least one file matches; else `UsageError` naming the flag (a folder given:
  with a glob of its files to give instead)."""
  given = fv[name].value
  if not any(os.path.isfile(path) for pattern in given for path in glob.glob(pattern)):
    folders = [pattern for pattern in given if os.path.isdir(pattern)]
    hint = f" ({folders[0]} is a folder: give its files, e.g. {os.path.join(folders[0], '*')})" if folders else ""
    raise UsageError(f"--{name}={','.join(given)} matches no file{hint}; give paths or globs of existing files")
  return given


def _synthetic_files(fv: flags.FlagValues):
  from tfps.data import synthetic  # pylint: disable=g-import-not-at-top
  spec = synthetic.SyntheticSpec(rows=fv.synthetic_rows, num_files=fv.synthetic_files, seed=fv.synthetic_seed,
                                 vocab_size=fv.synthetic_vocab_size)
  return list(synthetic.ensure_generated(os.path.abspath(fv.data_dir or DEFAULT_SYNTHETIC_DIR), spec).files)


def _deferred(make: Callable[[], Callable]) -> Callable:
  """A dataset function that `make()`s the real one on its first call, in the process calling it (the chief or the
  evaluator): ps and worker processes parsing the same flags then neither generate nor scan data. The first call may
  come while PSS traces it; the files are generated and scanned eagerly all the same."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  built = []

  def dataset_fn(input_context=None):
    if not built:
      with tf.init_scope():  # eager, and not converted by AutoGraph: the scan iterates a dataset in Python
        built.append(tf.autograph.experimental.do_not_convert(make)())
    return built[0](input_context)

  return dataset_fn


def model_options_from_flags(flag_values: flags.FlagValues = flags.FLAGS, num_ps: int = 1) -> dict:
  """The keyword options of `tfps.models.build_model` for `--model`; `num_ps`: the cluster's (dynamic tables are
  sharded as the strategy's partitioner shards them: `--num_shards` ways, by default one per ps)."""
  fv = flag_values
  if fv.model == "retrieval":
    options = {"embedding_dim": fv.embedding_dim, "layer_sizes": _ints(fv, "tower_layers")}
  else:
    options = {"embedding_dim": fv.embedding_dim, "deep_layers": _ints(fv, "deep_layers"),
               "stack_tables": fv.stack_tables}
  if fv.embedding == "dynamic":
    from tfps.models.layers import DynamicTables  # pylint: disable=g-import-not-at-top  (TensorFlow)
    strategy = flags_lib.strategy_options_from_flags(fv)
    sharding = {"num_shards": strategy.num_shards or num_ps, "min_shard_bytes": strategy.min_shard_bytes}
    options["dynamic"] = DynamicTables(fv.dynamic_capacity, min_count=fv.dynamic_min_count,
                                       steps_to_live=fv.dynamic_steps_to_live or None, **sharding)
  if fv.model == "dcn":
    options.update(num_cross_layers=fv.num_cross_layers, projection_dim=fv.projection_dim or None)
  return options


def seed_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """With `--seed`, seeds what a model's initial values are drawn from (`tf_keras.utils.set_random_seed`: TensorFlow,
  tf-keras's initializers, which do not follow TensorFlow's seed, Python and NumPy); call it before building one."""
  if flag_values.seed is not None:
    import tf_keras  # pylint: disable=g-import-not-at-top  (TensorFlow only once flags are parsed)
    tf_keras.utils.set_random_seed(flag_values.seed)


def model_from_flags(data: Data, flag_values: flags.FlagValues = flags.FLAGS, num_ps: int = 1):
  """The compiled `--model` over `data`'s features; call it under `strategy.scope()` to shard its tables. `num_ps`:
  the cluster's, for `--embedding=dynamic` (`model_options_from_flags`)."""
  from tfps import models  # pylint: disable=g-import-not-at-top
  seed_from_flags(flag_values)
  model = models.build_model(flag_values.model, data.categorical, data.dense,
                             **model_options_from_flags(flag_values, num_ps))
  return models.compile_model(model, optimizer=flag_values.optimizer, learning_rate=flag_values.learning_rate)

