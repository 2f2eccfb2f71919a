"""The online-training flags: `--stream` and its source's (`define_stream_flags`), and the stream's batches they give
(`stream_batches_from_flags`; docs/online.md)."""

from typing import Callable

from absl import flags

from tfps.cli.flags import declare_program_flags
from tfps.errors import UsageError


def define_stream_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """--stream and its source's flags (online training: docs/online.md); calling it again is harmless. The records'
  feature spec, batch size and strictness are the model flags' --feature_spec, --batch_size and --strict_data; the
  brokers' connect timeout is --connect_timeout_secs."""
  if "stream" in flag_values:
    return
  fv = {"flag_values": flag_values}
  flags.DEFINE_enum("stream", None, ["kafka", "folder"], "Train without end on a stream: a Kafka topic, or a folder "
                    "slices appear in (docs/online.md).", **fv)
  flags.DEFINE_string("kafka_bootstrap", None, "--stream=kafka: host:port[,host:port] of the brokers.", **fv)
  flags.DEFINE_string("kafka_topic", None, "--stream=kafka: the topic.", **fv)
  flags.DEFINE_list("kafka_partitions", [], "--stream=kafka: the partitions to read (default: all).", **fv)
  flags.DEFINE_string("kafka_group", "tfps", "--stream=kafka: the consumer group offsets are committed to (after "
                      "the checkpoint that holds them).", **fv)
  flags.DEFINE_enum("stream_start", "earliest", ["earliest", "latest", "committed"], "Where a stream starts without "
                    "a checkpoint: the oldest record kept, the next one written, or the group's committed offsets.",
                    **fv)
  flags.DEFINE_string("stream_folder", None, "--stream=folder: the folder slices appear in.", **fv)
  flags.DEFINE_string("stream_pattern", "*", "--stream=folder: the slices' file names (a glob).", **fv)
  flags.DEFINE_enum("stream_complete", "marker", ["marker", "rename"], "--stream=folder: a slice is complete when "
                    "its <name>.done marker is there, or (rename) as soon as its name matches.", **fv)
  flags.DEFINE_enum("record_format", "delimited", ["delimited", "json"], "A record: a line as --feature_spec "
                    "describes, or a JSON object with its columns.", **fv)
  flags.DEFINE_float("checkpoint_every_secs", None, "Online training: a checkpoint at least this often (besides "
                     "every --save_checkpoints_steps steps and whenever the stream pauses).", lower_bound=1, **fv)
  flags.DEFINE_float("stream_idle_flush_secs", 10, "A record that has waited this long for its batch to fill is "
                     "trained in a partial batch (a pause in the stream); not in sync mode unless given (a sync step "
                     "trains one batch per worker slot, so there it is refused).", lower_bound=0, **fv)
  flags.DEFINE_integer("stream_holdout_every", None, "Hold out about one message in this many (by a hash of its "
                       "partition and offset), never trained on: the evaluation windows.", lower_bound=2, **fv)
  flags.DEFINE_integer("stream_holdout_window", 2000, "The newest held-out messages an evaluation uses.",
                       lower_bound=1, **fv)
  flags.DEFINE_integer("stream_eval_every_steps", None, "Evaluate the newest checkpoint on the newest held-out "
                       "window every this many steps (needs --stream_holdout_every).", lower_bound=1, **fv)
  flags.DEFINE_float("stream_eval_every_secs", None, "Evaluate the newest checkpoint on the newest held-out "
                     "window after this many seconds (needs --stream_holdout_every).", lower_bound=0, **fv)
  flags.register_multi_flags_validator(["stream", "kafka_bootstrap", "kafka_topic", "kafka_partitions",
                                        "stream_folder"], _check_stream,
                                       flag_values=flag_values)
  declare_program_flags(flag_values, __name__)


def _check_stream(values: dict) -> bool:
  needed = {"kafka": ("kafka_bootstrap", "kafka_topic"), "folder": ("stream_folder",)}.get(values["stream"], ())
  missing = [name for name in needed if not values[name]]
  if missing:
    raise flags.ValidationError(f"--stream={values['stream']} needs " + " and ".join(f"--{n}" for n in missing))
  if not all(str(p).isdigit() for p in values["kafka_partitions"]):
    raise flags.ValidationError(f"--kafka_partitions ({','.join(values['kafka_partitions'])}) must be partition "
                                "numbers, e.g. 0,1,2")
  return True


def _idle_flush_secs(fv: flags.FlagValues):
  """--stream_idle_flush_secs, or None (no partial batches) in sync mode where it was not given."""
  if "sync_mode" in fv and fv["sync_mode"].value == "sync" and not fv["stream_idle_flush_secs"].present:
    return None
  return fv.stream_idle_flush_secs


def stream_batches_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> Callable:
  """`make_batches(positions)` for `tfps.estimator.online.train_on_stream`: the `--stream` source's batches of
  --batch_size records parsed with --feature_spec, starting at `positions` (a checkpoint's; None: --stream_start)."""
  from tfps.data import spec as spec_lib  # pylint: disable=g-import-not-at-top  (TensorFlow once flags are parsed)
  from tfps.data.stream import batches, folder, holdout, kafka  # pylint: disable=g-import-not-at-top
  fv = flag_values
  if not fv["feature_spec"].value:
    raise UsageError("--stream needs --feature_spec, the JSON feature spec of its records (docs/data.md)")
  feature_spec = spec_lib.load_spec(fv["feature_spec"].value)

  def make_batches(positions):
    if fv.stream == "kafka":
      partitions = [int(p) for p in fv.kafka_partitions] or None
      source = kafka.KafkaSource(fv.kafka_bootstrap, fv.kafka_topic, group_id=fv.kafka_group, partitions=partitions,
                                 start=fv.stream_start, positions=positions,
                                 connect_timeout_secs=fv.connect_timeout_secs)
    else:
      source = folder.FolderSource(fv.stream_folder, pattern=fv.stream_pattern, complete=fv.stream_complete,
                                   skip_header=feature_spec.header, positions=positions)
    held_out = (holdout.HeldOut(fv.stream_holdout_every, fv.stream_holdout_window)
                if fv.stream_holdout_every else None)
    return batches.StreamBatches(source, feature_spec, batch_size=fv["batch_size"].value,
                                 record_format=fv.record_format, strict=fv["strict_data"].value, held_out=held_out,
                                 idle_flush_secs=_idle_flush_secs(fv))

  return make_batches
