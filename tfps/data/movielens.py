"""MovieLens 100K read from a directory the user gives (its terms forbid redistribution: tfps never ships it).

`movielens_dataset_fn` yields `(features, label)` batches of ratings (`u.data`, `u1.base`, `u1.test`, ...):

* `user_id` [batch] int64 (1-943), `user_gender` (0 M, 1 F), `user_age` (7 age bands), `user_occupation` (index in
  `u.occupation` order);
* `movie_id` [batch] int64 (1-1682), `movie_genres` [batch, 19] float32 multi-hot;
* the label is `rating >= 4` (a binary "liked") as float32 [batch] (for ranking models; the retrieval model
  ignores it).

Ratings are read by the delimited reader (`tfps.data.delimited`) with their feature spec, `ratings_spec` (written
out as `configs/movielens.spec.json`): user and movie ids as integer ids, the label `rating >= 4`, malformed rows
skipped; the two small side tables (943 users, 1,682 movies) are read once in Python and gathered by id inside the
pipeline. A ratings file is one file, so pipelines shard it by line (`tfps.data.pipeline`).
"""

import dataclasses
import os
import re
from typing import Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from tfps.data import delimited
from tfps.data import pipeline
from tfps.data.spec import Categorical, FeatureSpec
from tfps.errors import UsageError

NUM_GENRES = 19
AGE_BANDS = (18, 25, 35, 45, 50, 56)  # band edges: <18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+
QUERY_FEATURES = ("user_id", "user_gender", "user_age", "user_occupation")
CANDIDATE_FEATURES = ("movie_id",)
GENRES = "movie_genres"
SHUFFLE_BUFFER = 100_000  # rows: all of u.data (a split or a worker's share is smaller)
LIKED = 4  # the label: rating >= LIKED


@dataclasses.dataclass(frozen=True)
class MovieLensTables:
  """The side tables of MovieLens 100K, indexed by id (row 0 unused).

  Attributes:
    data_dir: where they were read.
    user_gender: int64 [944].
    user_age: int64 [944], age band.
    user_occupation: int64 [944].
    movie_genres: float32 [1683, 19].
    num_occupations: entries of `u.occupation`.
  """

  data_dir: str
  user_gender: np.ndarray
  user_age: np.ndarray
  user_occupation: np.ndarray
  movie_genres: np.ndarray
  num_occupations: int

  @property
  def num_users(self) -> int:
    return len(self.user_gender) - 1

  @property
  def num_movies(self) -> int:
    return len(self.movie_genres) - 1

  def feature_spec(self) -> Tuple[Dict[str, int], Dict[str, int]]:
    """`(categorical vocabulary sizes, dense feature widths)` of every feature the reader yields."""
    categorical = {"user_id": self.num_users + 1, "user_gender": 2, "user_age": len(AGE_BANDS) + 1,
                   "user_occupation": self.num_occupations, "movie_id": self.num_movies + 1}
    return categorical, {GENRES: NUM_GENRES}


def _path(data_dir: str, name: str) -> str:
  path = os.path.join(data_dir, name)
  if not os.path.isfile(path):
    raise UsageError(f"`data_dir` ({data_dir!r}) has no {name}; point it at the unpacked MovieLens 100K folder "
                     "(ml-100k: u.data, u.item, u.user, u1.base, ...)")
  return path


def _split_path(data_dir: str, split: str) -> str:
  path = os.path.join(data_dir, split)
  if not os.path.isfile(path):
    ratings = sorted(name for name in os.listdir(data_dir) if re.fullmatch(r"u(\d*\.(base|test)|\.data)", name))
    raise UsageError(f"split {split!r} is not a file of {data_dir}; its ratings files: {', '.join(ratings)}")
  return path


def load_tables(data_dir: str) -> MovieLensTables:
  """Reads `u.user`, `u.occupation` and `u.item` of `data_dir`."""
  with open(_path(data_dir, "u.occupation"), encoding="latin-1") as f:
    occupations = {line.strip(): index for index, line in enumerate(f) if line.strip()}
  with open(_path(data_dir, "u.user"), encoding="latin-1") as f:
    users = [line.rstrip("\n").split("|") for line in f if line.strip()]
  with open(_path(data_dir, "u.item"), encoding="latin-1") as f:
    movies = [line.rstrip("\n").split("|") for line in f if line.strip()]
  num_users = max(int(user[0]) for user in users)
  gender, age, occupation = (np.zeros(num_users + 1, np.int64) for _ in range(3))
  for user_id, user_age, user_gender, user_occupation, _ in users:
    index = int(user_id)
    gender[index] = 1 if user_gender == "F" else 0
    age[index] = np.searchsorted(AGE_BANDS, int(user_age), side="right")
    occupation[index] = occupations[user_occupation]
  genres = np.zeros((max(int(movie[0]) for movie in movies) + 1, NUM_GENRES), np.float32)
  for movie in movies:
    genres[int(movie[0])] = [float(flag) for flag in movie[-NUM_GENRES:]]
  return MovieLensTables(data_dir=data_dir, user_gender=gender, user_age=age, user_occupation=occupation,
                         movie_genres=genres, num_occupations=len(occupations))


def movielens_dataset_fn(data_dir: str, split: str = "u1.base", *, batch_size: int, repeat: bool = True,
                         shuffle_buffer: int = SHUFFLE_BUFFER, seed: Optional[int] = None, drop_remainder: bool = True,
                         tables: Optional[MovieLensTables] = None, shard_index: Optional[int] = None,
                         num_shards: Optional[int] = None) -> pipeline.DatasetFn:
  """A function `input_context -> tf.data.Dataset` of MovieLens rating batches (see the module doc).

  Args:
    data_dir: the MovieLens 100K folder.
    split: ratings file in it: "u.data" (all 100,000), "u1.base" (80,000), "u1.test" (20,000), ...
    batch_size: ratings per batch.
    shuffle_buffer: rows in the shuffle buffer; the default holds a whole ratings file, which is sorted by user
      (with a 10,000-row buffer a batch sees about 10 users, and ranking AUC suffers); 0 keeps file order.
    repeat, seed, drop_remainder, shard_index, num_shards: as in `tfps.data.criteo_dataset_fn`.
    tables: side tables already loaded from `data_dir` (read again where None).
  """
  tables = tables or load_tables(data_dir)  # first: a data_dir that is not MovieLens's is named as such
  path = _split_path(data_dir, split)

  def add_side_features(features):
    user_id, movie_id = features["user_id"], features["movie_id"]
    return {"user_id": user_id, "user_gender": tf.gather(tables.user_gender, user_id),
            "user_age": tf.gather(tables.user_age, user_id),
            "user_occupation": tf.gather(tables.user_occupation, user_id), "movie_id": movie_id,
            GENRES: tf.gather(tables.movie_genres, movie_id)}

  return delimited.delimited_dataset_fn(
      path, ratings_spec(tables.num_users, tables.num_movies), batch_size=batch_size, repeat=repeat,
      shuffle_buffer=shuffle_buffer, seed=seed, drop_remainder=drop_remainder, shard_index=shard_index,
      num_shards=num_shards, add_features=add_side_features)


def ratings_spec(num_users: int = 943, num_movies: int = 1682) -> FeatureSpec:
  """The feature spec of a MovieLens ratings file (`user_id`, `movie_id`, `rating`, `timestamp`, tab separated)."""
  return FeatureSpec(columns=("user_id", "movie_id", "rating", "timestamp"), label="rating", label_threshold=LIKED,
                     categorical=(Categorical("user_id", num_users + 1, "integer"),
                                  Categorical("movie_id", num_movies + 1, "integer")),
                     delimiter="\t", header=False, missing=(), name="MovieLens")


def candidates_dataset(tables: MovieLensTables, batch_size: int = 256) -> tf.data.Dataset:
  """Every movie (ids 1-1682) as candidate features `{movie_id, movie_genres}`, batched, read once."""
  movie_ids = np.arange(1, tables.num_movies + 1, dtype=np.int64)
  return tf.data.Dataset.from_tensor_slices({"movie_id": movie_ids, GENRES: tables.movie_genres[1:]}).batch(
      batch_size)
