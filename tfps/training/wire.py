"""Table rows on the network as bfloat16 (`tfps.TrainingMode(bf16_rows=True)`, async, opt-in): half their bytes.

Every step moves a batch's distinct table rows from their ps to the worker and the rows' gradients back, the bulk of
a step's bytes (at batch 4096 on the benchmark workload about 7 MB each way, against 1.2 MB of dense weights). With
`bf16_rows` each of them is cast to bfloat16 where it is made and back to float32 where it is used, so only bfloat16
crosses: the rows every table lookup of a step gathers (`tfps.training.distinct_rows.lookup`: the bundled models'
stacked tables, and every tf-keras `Embedding` layer while the step is traced) and every sparse gradient of a
float32 variable on its way to its ps (`tfps.training.ps_records`). Tables, optimizer slots and the updates'
arithmetic stay float32; the model computes with rows rounded to 8 significant bits, and each gradient row it sends
is rounded the same way (a relative error of at most 2^-8 per element). A looked-up row's gradient is rounded where
the worker's cast back is differentiated (the gradient of a cast is the cast of the gradient), and casting it again
on its way to the ps changes nothing: it is rounded once.
"""

from typing import Optional

import tensorflow as tf

from tfps.training import strategy as strategy_lib

WIRE_DTYPE = tf.bfloat16


def crossed(tensor: tf.Tensor, destination: Optional[str], source: Optional[str] = None) -> tf.Tensor:
  """In a tf.function: `tensor` (float32) cast to bfloat16 on device `source` and back to float32 on `destination`
  (None: where the caller's ops run), so that bfloat16 crosses between the two. Another dtype is returned as it is."""
  if tensor.dtype != tf.float32:
    return tensor
  with strategy_lib.on_device(source):
    narrow = tf.cast(tensor, WIRE_DTYPE, name="tfps_bf16_out")
  with strategy_lib.on_device(destination):
    return tf.cast(narrow, tensor.dtype, name="tfps_bf16_in")
