"""Time to resume a run with a 1 GB table on 4 ps from a checkpoint saved on 2 ps, beside resuming it on 2 ps.

  .venv/bin/python bench/reshard.py                      # 2^24 rows x 16 floats (1.07 GB), 3 repeats (~5 min)
  .venv/bin/python bench/reshard.py --table_rows=1000000 # a quick look (64 MB)

Four ps and one worker serve for the whole bench. A chief on ps 0-1 trains one step of an embedding-bag model (plain
SGD: the table is the whole state) with `tfps.fit` and saves `ckpt-1`. After one unmeasured resume on 4 ps, a chief
on 2 ps and a chief on 4 ps resume in turn from a fresh copy of that model_dir the way `tfps.fit` does: they build the
model (the table created in place on its ps, `tfps.training.initialization`), check the checkpoint against it and
restore it
(`tfps.training.resharding`). Each chief reports the seconds of both phases; the bench prints the medians side by
side with their ratio and writes `--out/reshard.json`.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from absl import flags
import portpicker

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position

from bench import resume  # pylint: disable=g-import-not-at-top,wrong-import-position

tfps.define_flags()
_ROLE = flags.DEFINE_enum("role", "bench", ["bench", "save", "resume"], "What this process does (the bench starts "
                          "the others).")
_ROWS = flags.DEFINE_integer("table_rows", 1 << 24, "Rows of the table (16 float32 each).", lower_bound=2)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Resumes on each number of ps; the medians are reported.",
                                lower_bound=1)
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "The run's model_dir (save and resume roles).")
_OUT = flags.DEFINE_string("out", "bench/results", "Folder for reshard.json.")

DIM, IDS, BATCH = 16, 8, 64


def _build_model():
  import tf_keras  # pylint: disable=g-import-not-at-top
  ids = tf_keras.Input((IDS,), dtype="int64", name="ids")
  pooled = tf_keras.layers.GlobalAveragePooling1D()(tf_keras.layers.Embedding(_ROWS.value, DIM, name="table")(ids))
  model = tf_keras.Model({"ids": ids}, tf_keras.layers.Dense(1, activation="sigmoid")(pooled))
  model.compile(tf_keras.optimizers.legacy.SGD(0.1), "binary_crossentropy")
  return model


def _dataset(input_context=None):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  del input_context
  ids = tf.random.stateless_uniform([BATCH * 4, IDS], [1, 2], maxval=_ROWS.value, dtype=tf.int64)
  labels = tf.cast(ids[:, 0] % 2, tf.float32)
  return tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).repeat().batch(BATCH)


def _resume(cluster) -> dict:
  """What `tfps.fit` does before its first step on a model_dir with checkpoints, timed."""
  from tfps.training import checkpoints  # pylint: disable=g-import-not-at-top
  path = checkpoints.list_checkpoints(_MODEL_DIR.value)[-1]
  _, facts = resume.timed_resume(cluster, _build_model, _dataset(), path, tfps.strategy_options_from_flags(),
                                 table="table")
  return facts


def _chief(cluster):
  if _ROLE.value == "save":
    return tfps.fit(_build_model, _dataset, epochs=1, steps_per_epoch=1, model_dir=_MODEL_DIR.value, cluster=cluster)
  print("RESULT " + json.dumps(_resume(cluster)), flush=True)


def _run_chief(servers, num_ps, *args) -> dict:
  done = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--job_name=chief", "--task_index=0",
       f"--ps_hosts={','.join(servers['ps'][:num_ps])}", f"--worker_hosts={servers['worker']}",
       f"--chief_hosts=127.0.0.1:{portpicker.pick_unused_port()}", f"--table_rows={_ROWS.value}", *args],
      env=servers["env"], capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"chief on {num_ps} ps failed ({done.returncode}): {done.stderr[-2000:]}")
  lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
  return json.loads(lines[-1][len("RESULT "):]) if lines else {}


def _resume_once(servers, scratch: str, saved: str, num_ps: int, name) -> dict:
  model_dir = os.path.join(scratch, f"resume_{num_ps}_{name}")
  shutil.copytree(saved, model_dir)
  try:
    return _run_chief(servers, num_ps, "--role=resume", f"--model_dir={model_dir}")
  finally:
    shutil.rmtree(model_dir)


def _bench() -> dict:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  servers = {"ps": [f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(4)],
             "worker": f"127.0.0.1:{portpicker.pick_unused_port()}", "env": env}
  processes = [subprocess.Popen([sys.executable, os.path.abspath(__file__), f"--job_name={job}",
                                 f"--task_index={index}", f"--ps_hosts={','.join(servers['ps'])}",
                                 f"--worker_hosts={servers['worker']}"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
               for job, index in [("ps", k) for k in range(4)] + [("worker", 0)]]
  scratch = tempfile.mkdtemp(prefix="tfps_reshard_")
  try:
    saved = os.path.join(scratch, "saved")
    _run_chief(servers, 2, "--role=save", f"--model_dir={saved}")
    runs = []
    # Unmeasured: ps 2-3 serve their first table here (ps 0-1 served the saving run's), as ps of a running tier have.
    _resume_once(servers, scratch, saved, 4, "warmup")
    for repeat in range(_REPEATS.value):
      for num_ps in (2, 4):
        runs.append(_resume_once(servers, scratch, saved, num_ps, repeat))
        print(f"resume on {num_ps} ps: {runs[-1]}", flush=True)
  finally:
    for process in processes:
      process.kill()
      process.wait()
    shutil.rmtree(scratch, ignore_errors=True)
  return {"table_bytes": _ROWS.value * DIM * 4, "load_avg": os.getloadavg(), "runs": runs}


def _report(result: dict) -> None:
  medians = {n: {key: statistics.median(run[key] for run in result["runs"] if run["num_ps"] == n)
                 for key in ("create_secs", "restore_secs", "resume_secs")} for n in (2, 4)}
  result["medians"] = medians
  print(f"table {result['table_bytes'] / 1e9:.2f} GB saved on 2 ps; medians of {_REPEATS.value} resume(s) "
        f"(load average {result['load_avg'][0]:.1f})")
  print(f"{'':24}{'on 2 ps':>10}{'on 4 ps':>10}{'4 / 2':>8}")
  for key, label in (("create_secs", "create variables (s)"), ("restore_secs", "check + restore (s)"),
                     ("resume_secs", "resume total (s)")):
    print(f"{label:24}{medians[2][key]:10.2f}{medians[4][key]:10.2f}{medians[4][key] / medians[2][key]:7.2f}x")
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "reshard.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)


def main(argv):
  del argv
  if flags.FLAGS.job_name is None and _ROLE.value == "bench":
    _report(_bench())
    return
  tfps.run_task(_chief, cluster=tfps.config_from_flags())


if __name__ == "__main__":
  tfps.run_main(main)
