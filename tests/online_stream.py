"""What the online-training tests share: a mock Kafka cluster (librdkafka's, inside this process, served on
loopback), messages that each carry an id, and a model_fn that counts how many times each message was applied.

The model is one embedding row per message id, starting at 0; the loss is minus the sum of the batch's rows and the
optimizer plain SGD at rate 1, so every application of a message's step adds exactly 1 to its row (in sync mode a
step averages the gradients of `replicas` batches: the rate is `replicas`). After training, row `i` of the
checkpoint's table is the number of times message `i` was applied. `model_fn` is the Estimator path's model,
`build_keras_model` the Keras path's.
"""

import json
import time

from absl import logging
import numpy as np
import tensorflow as tf
import tf_keras

import tfps
from tfps.data import spec as spec_lib

TOPIC = "clicks"
MAX_MESSAGES = 4096  # ids (and table rows)
SPEC = spec_lib.spec_from_dict({"name": "clicks", "columns": ["id", "label", "price"], "label": "label",
                                "numeric": {"price": "log1p"},
                                "categorical": {"id": {"buckets": MAX_MESSAGES, "encoding": "integer"}}})
TABLE = "counts"


def log_placement(table) -> None:
  """Logs where the shards of `table` (a variable, sharded or not) live: `counting table on <device>, ...` (the
  process tests check that the table is sharded over every ps)."""
  shards = table.variables if isinstance(table, tf.__internal__.distribute.ShardedVariable) else [table]
  logging.info("counting table on %s", ", ".join(getattr(shard, "device", "?") for shard in shards))


def counting_model_fn(rate: float = 1.0):
  """The Estimator path's counting model_fn, its SGD at `rate`."""
  def model_fn(features, labels, mode):
    del labels
    layer = tf_keras.layers.Embedding(MAX_MESSAGES, 1, embeddings_initializer="zeros", name=TABLE)
    rows = layer(features["id"])
    log_placement(layer.embeddings)
    return tfps.EstimatorSpec(mode, loss=-tf.reduce_sum(rows), optimizer=tf_keras.optimizers.legacy.SGD(rate))
  return model_fn


model_fn = counting_model_fn()


class CountingModel(tf_keras.Model):
  """The Keras path's counting model: its loss (added in `call`) is minus the sum of the batch's rows."""

  def __init__(self):
    super().__init__()
    self.counts = tf_keras.layers.Embedding(MAX_MESSAGES, 1, embeddings_initializer="zeros", name=TABLE)

  def call(self, features):
    rows = self.counts(features["id"])
    log_placement(self.counts.embeddings)
    self.add_loss(-tf.reduce_sum(rows))
    return rows[:, 0]


def build_keras_model(rate: float = 1.0) -> tf_keras.Model:
  """The compiled counting model (no loss but its own; SGD at `rate`)."""
  model = CountingModel()
  model.compile(tf_keras.optimizers.legacy.SGD(rate))
  return model


def mock_cluster():
  """`(producer, bootstrap)`: a producer that holds a one-broker mock cluster, and the cluster's address."""
  from confluent_kafka import Producer  # pylint: disable=g-import-not-at-top
  holder = Producer({"test.mock.num.brokers": 1, "log_level": 2})
  brokers = holder.list_topics(timeout=10).brokers.values()
  bootstrap = ",".join(f"{broker.host}:{broker.port}" for broker in brokers)
  return holder, bootstrap


def produce(bootstrap: str, ids, *, json_records: bool = False, extra=(), topic: str = TOPIC) -> None:
  """Writes one message per id (label id % 2) to `topic`, spread over its partitions, then `extra` raw values (to
  partition 0)."""
  from confluent_kafka import Producer  # pylint: disable=g-import-not-at-top
  producer = Producer({"bootstrap.servers": bootstrap, "log_level": 2})
  for i in ids:
    if json_records:
      value = json.dumps({"id": int(i), "label": int(i) % 2, "price": 1.5})
    else:
      value = f"{int(i)},{int(i) % 2},1.5"
    producer.produce(topic, value=value.encode())
  for value in extra:
    producer.produce(topic, value=value, partition=0)
  producer.flush(30)


def end_offsets(bootstrap: str, topic: str = TOPIC) -> dict:
  """`{partition: end offset}` of `topic`."""
  from confluent_kafka import Consumer, TopicPartition  # pylint: disable=g-import-not-at-top
  consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe", "log_level": 2})
  try:
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    return {str(p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
  finally:
    consumer.close()


def committed(bootstrap: str, group: str, topic: str = TOPIC) -> dict:
  """`{partition: offset}` committed by `group` on `topic` (-1001 where none)."""
  from confluent_kafka import Consumer, TopicPartition  # pylint: disable=g-import-not-at-top
  consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 2})
  try:
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    return {str(tp.partition): tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in partitions],
                                                                       timeout=10)}
  finally:
    consumer.close()


def counts_in(checkpoint: str) -> np.ndarray:
  """The counting table of `checkpoint` (its shards put together, in row order), one count per message id."""
  names = sorted((name for name, shape in tf.train.list_variables(checkpoint)
                  if name.startswith("model/") and shape[-1:] == [1]),
                 key=lambda name: [int(part) if part.isdigit() else part for part in name.replace("/", "_").split("_")])
  return np.concatenate([tf.train.load_variable(checkpoint, name) for name in names])[:, 0]


def wait_for(condition, what: str, timeout_secs: float = 300, alive=None):
  """Polls `condition()` until it is true (returns it); fails after `timeout_secs` or when `alive()` is false."""
  deadline = time.monotonic() + timeout_secs
  while not (found := condition()):
    assert alive is None or alive(), f"{what}: the run ended first"
    assert time.monotonic() < deadline, f"{what}: not within {timeout_secs}s"
    time.sleep(0.1)
  return found
