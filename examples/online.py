"""Online training on a click stream whose click model drifts: the AUC on the newest held-out clicks drops at each drift
and recovers as training goes on.

  python -m tfps.cli.launch --num_ps=1 --num_workers=2 examples/online.py

The chief starts a Kafka broker of its own (librdkafka's mock cluster, in its process) and a producer thread that
writes clicks of users on items: a click's chance comes from a planted score per item that is drawn anew at each
drift. About one click in ten is held out (by its position: --stream_holdout_every); every second the chief evaluates
the newest checkpoint on the newest 1,000 held-out clicks, and prints it. The model trains on the stream
(scripts/train_online.py does the same on your brokers).
"""
import json, tempfile, threading, time
import numpy as np
import tfps
from tfps import run_records
from tfps.data import spec as spec_lib
from tfps.data.stream import batches, holdout, kafka
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

def produce(bootstrap, phase, trained, done):  # clicks from a planted model that drifts every PER_PHASE clicks
  from confluent_kafka import Producer
  producer, rng = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20}), np.random.default_rng(0)
  for number in range(PHASES):
    while trained[0] * 256 < number * PER_PHASE * 9 // 10 - 256:
      time.sleep(0.2)                            # the drift comes once the model has caught up with the last phase
    score = rng.normal(0, 2, ITEMS)              # the drift: every item's appeal drawn anew
    phase[0] = number
    for start in range(0, PER_PHASE, 500):
      for n in range(500):
        producer.produce("clicks", value=click(rng, score).encode(), partition=n % 4)
      producer.poll(0)
      time.sleep(0.15)                           # ~3,000 clicks/s
  producer.flush(60)
  done.set()

def train(cluster):
  from confluent_kafka import Producer
  run_dir = tempfile.mkdtemp(prefix="tfps_online_")
  holder = Producer({"test.mock.num.brokers": 1, "log_level": 2})    # the broker lives as long as this producer
  bootstrap = ",".join(f"{b.host}:{b.port}" for b in holder.list_topics(timeout=10).brokers.values())
  phase, trained, printed = [0], [0], [0]
  done, stop = threading.Event(), threading.Event()
  threading.Thread(target=produce, args=(bootstrap, phase, trained, done), daemon=True).start()
  categorical, dense = SPEC.model_features()
  estimator = tfps.Estimator(model_fns.build_model_fn("wide_deep", categorical, dense, deep_layers=[32],
                                                      learning_rate=0.5),
                             model_dir=f"{run_dir}/model", cluster=cluster,
                             config=tfps.RunConfig(save_checkpoints_steps=100_000, log_step_count_steps=10))
  def make_batches(positions):
    source = kafka.KafkaSource(bootstrap, "clicks", start="earliest", positions=positions)
    return batches.StreamBatches(source, SPEC, batch_size=256, held_out=holdout.HeldOut(10, HELD_OUT))
  def after_checkpoint(step):                    # prints the evaluations on the newest window since the last call
    trained[0] = step
    windows = [r for r in run_records.read_run(f"{run_dir}/model")["progress"] if r["kind"] == "window"]
    for record in windows[printed[0]:]:          # (the phase when printed: a drift shows in the next lines)
      print(json.dumps({"step": record["step"], "phase": phase[0],
                        "newest_window_auc": round(record["metrics"]["auc"], 4)}), flush=True)
    printed[0] = len(windows)
    if done.is_set() and step >= PHASES * PER_PHASE * 89 // 100 // 256:
      stop.set()                                 # every full batch of the clicks trained on (about 1 in 10 held out)
  online.train_on_stream(estimator, make_batches, checkpoint_every_secs=1, stop=stop, after_checkpoint=after_checkpoint,
                         evaluate_every_secs=1, eval_batch_size=500)

tfps.run_main(lambda argv: tfps.run_task(train))  # ps and workers serve until stopped; the chief runs train()
