"""A first model of one's own: a click model trained on a parameter-server cluster over generated click logs.

  python -m tfps.cli.launch --num_ps=1 --num_workers=2 examples/first_model.py
"""
import os, tempfile
import tfps                                      # first: selects tf-keras (Keras 2) for TensorFlow
import tf_keras
from tfps.data import criteo, synthetic

def build_model():                               # runs under the strategy: large tables are sharded over the ps
  inputs = {"dense": tf_keras.Input((13,))}      # 13 numeric features, then 26 categorical ids C1..C26
  inputs |= {name: tf_keras.Input((), dtype="int64", name=name) for name in criteo.CATEGORICAL_COLUMNS}
  embedded = [tf_keras.layers.Embedding(10_000, 8)(inputs[name]) for name in criteo.CATEGORICAL_COLUMNS]
  hidden = tf_keras.layers.Dense(64, activation="relu")(tf_keras.layers.Concatenate()([inputs["dense"], *embedded]))
  model = tf_keras.Model(inputs, tf_keras.layers.Dense(1, activation="sigmoid")(hidden))
  model.compile(tf_keras.optimizers.legacy.Adam(0.002), "binary_crossentropy", metrics=[tf_keras.metrics.AUC()])
  return model

def train(cluster):                              # the chief's job; data, checkpoints and TensorBoard logs in run_dir
  run_dir = os.path.join(tempfile.gettempdir(), "tfps_first_model")
  files = synthetic.ensure_generated(f"{run_dir}/data", synthetic.SyntheticSpec(rows=100_000, num_files=5)).files
  history = tfps.fit(build_model, criteo.criteo_dataset_fn(files[:4], batch_size=256, num_buckets=10_000),
                     validation_dataset_fn=criteo.criteo_dataset_fn(files[4:], batch_size=1000, repeat=False,
                                                                    num_buckets=10_000),
                     exact_evaluation=True, epochs=3, steps_per_epoch=100, model_dir=f"{run_dir}/model",
                     cluster=cluster)
  print("final:", {name: round(float(values[-1]), 4) for name, values in history.history.items()})

tfps.run_main(lambda argv: tfps.run_task(train))  # ps and workers serve; the chief runs train()
