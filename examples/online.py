"""Online training on a click stream whose click model drifts: the AUC on the newest held-out clicks drops at each drift
and recovers as training goes on.

  python -m tfps.cli.launch --num_ps=1 --num_workers=2 examples/online.py

The chief starts a Kafka broker of its own (librdkafka's mock cluster, in its process) and a producer thread that
writes clicks of users on items: a click's chance comes from a planted score per item that is drawn anew at each
drift. Every tenth click is held out; after each checkpoint the chief evaluates the newest checkpoint on the newest
held-out clicks. The model trains on the stream (scripts/train_online.py does the same on your brokers).
"""
import collections, json, os, tempfile, threading, time
import numpy as np
import tfps
from tfps.data import delimited, spec as spec_lib
from tfps.data.stream import batches, kafka
from tfps.estimator import online
from tfps.models import model_fns

USERS, ITEMS, PHASES, PER_PHASE, HELD_OUT = 1000, 500, 3, 30_000, 1000
SPEC = spec_lib.spec_from_dict({"name": "clicks", "columns": ["user", "item", "label", "hour"], "label": "label",
                                "numeric": {"hour": {"transform": "standardize", "mean": 12, "std": 7}},
                                "categorical": {"user": {"buckets": USERS, "encoding": "integer"},
                                                "item": {"buckets": ITEMS, "encoding": "integer"}}})

def click(rng, score):                           # one click record: user, item, label, hour
  item = rng.integers(0, ITEMS)
  return f"{rng.integers(0, USERS)},{item},{int(rng.random() < 1 / (1 + np.exp(-score[item])))},{rng.integers(0, 24)}"

def produce(bootstrap, held_out, phase, trained, done):  # clicks from a planted model that drifts every PER_PHASE
  from confluent_kafka import Producer
  producer, rng = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20}), np.random.default_rng(0)
  for number in range(PHASES):
    while trained[0] * 256 < number * PER_PHASE * 9 // 10 - 256:
      time.sleep(0.2)                            # the drift comes once the model has caught up with the last phase
    score = rng.normal(0, 2, ITEMS)              # the drift: every item's appeal drawn anew
    held_out.clear()                             # the newest window: held-out clicks of this phase only, the first
    held_out.extend(click(rng, score) for _ in range(HELD_OUT))  # of them before any of the phase is trained on
    phase[0] = number
    for start in range(0, PER_PHASE, 500):
      for n in range(500):
        line = click(rng, score)
        (held_out.append(line) if n % 10 == 0 else producer.produce("clicks", value=line.encode(), partition=n % 4))
      producer.poll(0)
      time.sleep(0.15)                           # ~3,000 clicks/s
  producer.flush(60)
  done.set()

def train(cluster):
  from confluent_kafka import Producer
  run_dir = tempfile.mkdtemp(prefix="tfps_online_")
  holder = Producer({"test.mock.num.brokers": 1, "log_level": 2})    # the broker lives as long as this producer
  bootstrap = ",".join(f"{b.host}:{b.port}" for b in holder.list_topics(timeout=10).brokers.values())
  held_out, phase, trained = collections.deque(maxlen=HELD_OUT), [0], [0]
  done, stop = threading.Event(), threading.Event()
  threading.Thread(target=produce, args=(bootstrap, held_out, phase, trained, done), daemon=True).start()
  categorical, dense = SPEC.model_features()
  estimator = tfps.Estimator(model_fns.build_model_fn("wide_deep", categorical, dense, deep_layers=[32],
                                                      learning_rate=0.5),
                             model_dir=f"{run_dir}/model", cluster=cluster,
                             config=tfps.RunConfig(save_checkpoints_steps=100_000, log_step_count_steps=10))
  def make_batches(positions):
    source = kafka.KafkaSource(bootstrap, "clicks", start="earliest", positions=positions)
    return batches.StreamBatches(source, SPEC, batch_size=256)
  def evaluate_newest(step):                     # after each checkpoint: AUC on the newest held-out clicks
    trained[0] = step
    window_phase, window = phase[0], list(held_out)   # (a drift may come while it is read: told by the next line)
    with open(f"{run_dir}/window.csv", "w") as f:
      f.write("".join(line + "\n" for line in window))
    input_fn = delimited.delimited_dataset_fn(f"{run_dir}/window.csv", SPEC, batch_size=500, repeat=False,
                                              scan=False, shuffle_buffer=0, drop_remainder=False)
    auc = estimator.evaluate(input_fn)["auc"]
    print(json.dumps({"step": step, "phase": window_phase, "newest_window_auc": round(float(auc), 4)}), flush=True)
    if done.is_set() and step >= PHASES * PER_PHASE * 9 // 10 // 256:
      stop.set()                                 # every full batch of the clicks written has been trained on
  online.train_on_stream(estimator, make_batches, checkpoint_every_secs=1, stop=stop, after_checkpoint=evaluate_newest)

tfps.run_main(lambda argv: tfps.run_task(train))  # ps and workers serve until stopped; the chief runs train()
