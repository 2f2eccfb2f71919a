"""Online training on a click stream whose click model drifts: the AUC on the newest held-out clicks drops at each drift
and recovers as training goes on.

  python -m tfps.cli.launch --num_ps=1 --num_workers=2 examples/online.py [-- --clicks_per_phase=6000]

The chief starts a Kafka broker of its own (librdkafka's mock cluster, in its process) and a producer thread that
writes clicks of users on items: a click's chance comes from a planted score per item that is drawn anew at each
drift. About one click in ten is held out (by its position: --stream_holdout_every); about five times a phase the
chief evaluates the newest checkpoint on the newest held-out clicks (those of a third of a phase), and prints a line:
the step, the phase of the newest clicks read and the AUC. A line marks each drift, and one each delta export of the rows changed (every 5 s,
docs/delta_export.md). The model trains on the stream (scripts/train_online.py does the same on your brokers).
--clicks_per_phase=6000: a shorter run, the same drifts.
"""
import json, tempfile, threading, time
from absl import flags
import numpy as np
import tfps
from tfps import run_records
from tfps.data import spec as spec_lib
from tfps.data.stream import batches, holdout, kafka
from tfps.estimator import online
from tfps.models import model_fns
from tfps.training import delta_files

PHASES = 3
_PER_PHASE = flags.DEFINE_integer("clicks_per_phase", 30_000, "Clicks written between drifts (fewer: a shorter run; "
                                  "the users, items and steps between evaluations scale with it).", lower_bound=3000)

def click_spec(users, items):                    # a click: user, item, label, hour
  return spec_lib.spec_from_dict({"name": "clicks", "columns": ["user", "item", "label", "hour"], "label": "label",
                                  "numeric": {"hour": {"transform": "standardize", "mean": 12, "std": 7}},
                                  "categorical": {"user": {"buckets": users, "encoding": "integer"},
                                                  "item": {"buckets": items, "encoding": "integer"}}})

def click(rng, users, score):                    # one click record: user, item, label, hour
  item = rng.integers(0, len(score))
  return f"{rng.integers(0, users)},{item},{int(rng.random() < 1 / (1 + np.exp(-score[item])))},{rng.integers(0, 24)}"

def produce(bootstrap, per_phase, trained, flowing, done):  # clicks of a planted model drifting every per_phase
  from confluent_kafka import Producer
  producer, rng = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20}), np.random.default_rng(0)
  for number in range(PHASES):
    while trained[0] * 256 < number * per_phase * 9 // 10 - 256:
      time.sleep(0.2)                            # the drift comes once the model has caught up with the last phase
    score = rng.normal(0, 2, per_phase // 60)    # the drift: every item's appeal drawn anew
    if number:
      print(json.dumps({"drift": number, "step": trained[0]}), flush=True)
    for start in range(0, per_phase, 500):
      for n in range(min(500, per_phase - start)):
        producer.produce("clicks", value=click(rng, per_phase // 30, score).encode(), partition=n % 4)
      if flowing.is_set():
        producer.poll(0)
      else:                                      # the topic exists once its first clicks are written
        producer.flush(30)
        flowing.set()
      time.sleep(0.15)                           # ~3,000 clicks/s
  producer.flush(60)
  done.set()

def train(cluster):
  from confluent_kafka import Producer
  run_dir, per_phase = tempfile.mkdtemp(prefix="tfps_online_"), _PER_PHASE.value
  holder = Producer({"test.mock.num.brokers": 1, "log_level": 2})    # the broker lives as long as this producer
  bootstrap = ",".join(f"{b.host}:{b.port}" for b in holder.list_topics(timeout=10).brokers.values())
  trained, printed = [0], [0, 0]                # steps trained; evaluations and deltas printed
  flowing, done, stop = threading.Event(), threading.Event(), threading.Event()
  threading.Thread(target=produce, args=(bootstrap, per_phase, trained, flowing, done), daemon=True).start()
  flowing.wait(60)                               # the stream is read from its start, once the topic has clicks
  spec = click_spec(users=per_phase // 30, items=per_phase // 60)  # each seen ~30 and ~60 times a phase
  categorical, dense = spec.model_features()
  every = per_phase // 1500                      # steps between evaluations: about 5 a phase
  estimator = tfps.Estimator(model_fns.build_model_fn("wide_deep", categorical, dense, deep_layers=[32], optimizer="adam",
                                                      learning_rate=0.05),
                             model_dir=f"{run_dir}/model", cluster=cluster,
                             config=tfps.RunConfig(save_checkpoints_steps=100_000, log_step_count_steps=every,
                                                   delta_export_secs=5))  # the rows changed, every 5 s
  def make_batches(positions):
    source = kafka.KafkaSource(bootstrap, "clicks", start="earliest", positions=positions)
    return batches.StreamBatches(source, spec, batch_size=256, held_out=holdout.HeldOut(10, per_phase // 30))
  def print_news():                              # the evaluations and deltas since the last call
    windows = [r for r in run_records.read_run(f"{run_dir}/model")["progress"] if r["kind"] == "window"]
    for record in windows[printed[0]:]:          # phase: of the newest clicks read (trained or held out) by then
      read = sum(record["window"]["positions"].values())
      print(json.dumps({"step": record["step"], "phase": min(PHASES - 1, read // per_phase),
                        "newest_window_auc": round(record["metrics"]["auc"], 4)}), flush=True)
    for version, path in sorted(delta_files.versions_in(f"{run_dir}/model/deltas").items()):
      if version <= printed[1]:                  # printed already, or the base (version 0)
        continue
      manifest = delta_files.read_manifest(path)
      print(json.dumps({"delta": version, "step": manifest["step"], "folder": path,
                        "rows_changed": sum(v.get("rows", 0) for v in manifest["variables"])}), flush=True)
      printed[1] = version
    printed[0] = len(windows)
  def after_checkpoint(step):
    trained[0] = step
    print_news()
    if done.is_set() and step >= PHASES * per_phase * 89 // 100 // 256:
      stop.set()                                 # every full batch of the clicks trained on (about 1 in 10 held out)
  online.train_on_stream(estimator, make_batches, stop=stop, after_checkpoint=after_checkpoint,
                         evaluate_every_steps=every, eval_batch_size=500)
  print_news()

tfps.run_main(lambda argv: tfps.run_task(train))  # ps and workers serve until stopped; the chief runs train()
