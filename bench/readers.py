"""Reader equivalence: digests of the batches the Criteo and MovieLens readers yield, and the AUC a model reaches.

Run it on two checkouts (before and after a reader change) and compare the JSON: identical digests mean identical
batches (every feature's dtype, shape and bytes, in order); the AUCs come from a seeded single-process Wide&Deep
(no strategy, op determinism on) trained on those batches. Where the checkout has `tfps.data.delimited`, the same
digests are also taken through `configs/criteo.spec.json` and `configs/movielens.spec.json` read by the generic reader.

  python bench/readers.py --data_dir=../shared/data --json_out=bench/results/readers.json
Before a change, on the older code: `git archive BASE tfps | tar -x -C /tmp/old` and run this file with
`/tmp/old` first on `sys.path` (the editable install's path entry precedes PYTHONPATH):
  python -c "import sys, runpy; sys.path.insert(0, '/tmp/old'); sys.argv[0] = 'bench/readers.py'; \
      runpy.run_path('bench/readers.py', run_name='__main__')" --data_dir=../shared/data
The older checkout has no `tfps.data.delimited`: its `spec_readers` stay empty.
"""

import hashlib
import json
import os
import tempfile

from absl import app
from absl import flags

import tfps  # pylint: disable=unused-import  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
import numpy as np
import tensorflow as tf

from tfps import models
from tfps.data import criteo
from tfps.data import movielens
from tfps.data import synthetic

_DATA_DIR = flags.DEFINE_string("data_dir", "../shared/data", "The shared data folder (criteo/, ml-100k/).")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Where to write the results (JSON).")
_STEPS = flags.DEFINE_integer("steps", 300, "Training steps of each AUC run.", lower_bound=1)
_REPO = flags.DEFINE_string("repo", os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "The checkout whose configs/*.spec.json to read.")
TRAIN = {"batch_size": 256, "seed": 7}
ONCE = {"batch_size": 1000, "repeat": False, "shuffle_buffer": 0, "drop_remainder": False}


def digest(dataset_fn, max_batches: int = 40) -> str:
  """sha256 over the first `max_batches` batches: every feature's name, dtype, shape and bytes, then the label.

  Seeds are reset before the dataset is made: a seeded shuffle's order also depends on the global seed."""
  tf.keras.utils.set_random_seed(0)
  sha = hashlib.sha256()
  for features, label in dataset_fn(None).take(max_batches):
    for name in sorted(features):
      value = features[name].numpy()
      sha.update(f"{name}:{value.dtype}:{value.shape}".encode())
      sha.update(np.ascontiguousarray(value).tobytes())
    sha.update(np.ascontiguousarray(label.numpy()).tobytes())
  return sha.hexdigest()[:16]


def auc(train_fn, eval_fn, categorical, dense, steps: int) -> float:
  """Test AUC of a seeded Wide&Deep trained `steps` steps in this process."""
  tf.keras.utils.set_random_seed(0)
  model = models.compile_model(models.build_model("wide_deep", categorical, dense, embedding_dim=8,
                                                  deep_layers=(32, 16)))
  model.fit(train_fn(None), steps_per_epoch=steps, epochs=1, verbose=0)
  return round(float(model.evaluate(eval_fn(None), verbose=0, return_dict=True)["auc"]), 6)


def readers(data_dir: str, work_dir: str):
  """`{case: (train dataset fn, eval dataset fn, categorical, dense)}` through the dedicated readers."""
  sample = os.path.join(data_dir, "criteo", "criteo_sample.csv")
  generated = synthetic.ensure_generated(work_dir, synthetic.SyntheticSpec(rows=40_000, num_files=4, seed=3,
                                                                             vocab_size=2_000)).files
  ml = os.path.join(data_dir, "ml-100k")
  tables = movielens.load_tables(ml)
  return {
      "criteo_sample": (criteo.criteo_dataset_fn(sample, num_buckets=1000, **TRAIN),
                        criteo.criteo_dataset_fn(sample, num_buckets=1000, **ONCE)),
      "synthetic_criteo": (criteo.criteo_dataset_fn(generated[:-1], num_buckets=2000, **TRAIN),
                           criteo.criteo_dataset_fn(generated[-1:], num_buckets=2000, **ONCE),
                           *criteo.feature_spec(2000)),
      "movielens": (movielens.movielens_dataset_fn(ml, "u1.base", tables=tables, **TRAIN),
                    movielens.movielens_dataset_fn(ml, "u1.test", tables=tables, **ONCE), *tables.feature_spec()),
  }


def spec_readers(data_dir: str, work_dir: str):
  """The same cases through `configs/*.spec.json` and the generic reader, where this checkout has it."""
  try:
    from tfps.data import delimited  # pylint: disable=g-import-not-at-top
    from tfps.data import spec as spec_lib  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {}
  criteo_spec = spec_lib.load_spec(os.path.join(_REPO.value, "configs", "criteo.spec.json"))
  sample_spec, synthetic_spec = criteo_spec.with_buckets(1000), criteo_spec.with_buckets(2000)
  generated = synthetic.ensure_generated(work_dir, synthetic.SyntheticSpec(rows=40_000, num_files=4, seed=3,
                                                                             vocab_size=2_000)).files
  sample = os.path.join(data_dir, "criteo", "criteo_sample.csv")
  ml_spec = spec_lib.load_spec(os.path.join(_REPO.value, "configs", "movielens.spec.json"))
  ml = os.path.join(data_dir, "ml-100k")
  return {
      "criteo_sample": (delimited.delimited_dataset_fn(sample, sample_spec, **TRAIN),
                        delimited.delimited_dataset_fn(sample, sample_spec, **ONCE)),
      "synthetic_criteo": (delimited.delimited_dataset_fn(generated[:-1], synthetic_spec, **TRAIN),
                           delimited.delimited_dataset_fn(generated[-1:], synthetic_spec, **ONCE),
                           *synthetic_spec.model_features()),
      # Ratings only: the generic reader has no side tables (user and movie features are MovieLens's own join).
      "movielens_ratings": (delimited.delimited_dataset_fn(os.path.join(ml, "u1.base"), ml_spec,
                                                           shuffle_buffer=100_000, **TRAIN),
                            delimited.delimited_dataset_fn(os.path.join(ml, "u1.test"), ml_spec, **ONCE),
                            *ml_spec.model_features()),
  }


def measure(cases, steps: int):
  results = {}
  for name, (train_fn, eval_fn, *features) in cases.items():
    results[name] = {"train_digest": digest(train_fn), "eval_digest": digest(eval_fn, 1000)}
    if features:
      results[name]["auc"] = auc(train_fn, eval_fn, *features, steps)
    print(name, results[name], flush=True)
  return results


def main(argv):
  del argv
  tf.config.experimental.enable_op_determinism()
  with tempfile.TemporaryDirectory() as work_dir:
    results = {"readers": measure(readers(_DATA_DIR.value, work_dir), _STEPS.value),
               "spec_readers": measure(spec_readers(_DATA_DIR.value, work_dir), _STEPS.value)}
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
