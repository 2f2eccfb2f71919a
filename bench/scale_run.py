"""One run of the table-size bench (bench/scale.py): every role of a cluster runs this script under `tfps-launch`
(`bench/runner.py`); the chief trains and times the table (`bench/scale_train.py`) and writes `--benchmark_json`.

  tfps-launch --num_ps=2 --num_workers=2 bench/scale_run.py -- --table=dynamic --table_rows=1000000
"""

import os
import sys

from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root, for `bench`

import tfps  # pylint: disable=g-import-not-at-top,wrong-import-position

from bench import chief_result  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench import scale_train  # pylint: disable=g-import-not-at-top,wrong-import-position

tfps.define_flags()
_TABLE = flags.DEFINE_enum("table", "hashed", ["hashed", "dynamic"], "The table: raw ids hashed into an Embedding, "
                           "or tfps.layers.DynamicEmbedding.")
_ROWS = flags.DEFINE_integer("table_rows", 100_000, "Rows of the table (16 float32 each).", lower_bound=2)
_BATCH = flags.DEFINE_integer("batch_size", 256, "Examples per step (per worker).", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 200, "Steps per epoch (the first epoch is not timed).", lower_bound=20)
_MEASURE = flags.DEFINE_integer("measure", 3, "Timed epochs after the first.", lower_bound=1)
_SAVE_TO = flags.DEFINE_string("save_to", None, "Write a checkpoint to this folder after training (timed).")
_RESUME_FROM = flags.DEFINE_string("resume_from", None, "Do not train: resume from the checkpoint of this folder "
                                   "(timed).")
_JSON = flags.DEFINE_string("benchmark_json", None, "Where the chief writes its result.")
_LINGER = flags.DEFINE_float("linger_secs", 1.5, "Seconds the chief waits before exiting (the driver reads the ps "
                             "memory meanwhile).", lower_bound=0)


def main(argv):
  del argv
  settings = scale_train.Settings(table=_TABLE.value, table_rows=_ROWS.value, batch_size=_BATCH.value,
                                  steps=_STEPS.value, measure=_MEASURE.value, save_to=_SAVE_TO.value,
                                  resume_from=_RESUME_FROM.value, strategy_options=tfps.strategy_options_from_flags())
  result = tfps.run_task(lambda cluster: scale_train.run(cluster, settings), cluster=tfps.config_from_flags())
  chief_result.write_and_exit(result, _JSON.value, _LINGER.value)


if __name__ == "__main__":
  tfps.run_main(main)
