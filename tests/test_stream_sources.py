"""Stream sources (tfps.data.stream) and their bad input, without a cluster: the mock Kafka cluster of
tests/online_stream.py, folders of slices, records parsed with a feature spec."""

import os
import re
import subprocess
import sys
import time

import portpicker
import pytest

import online_stream
from tfps.data.stream import batches as batches_lib
from tfps.data.stream import folder as folder_lib
from tfps.data.stream import holdout
from tfps.data.stream import kafka
from tfps.data.stream.sources import BrokerUnreachableError, MalformedRecordError, Record, StreamError
from tfps.errors import UsageError


def _source(bootstrap, topic, **kwargs):
  kwargs.setdefault("start", "earliest")
  return kafka.KafkaSource(bootstrap, topic, group_id=f"group-{topic}", connect_timeout_secs=10, **kwargs)


def _read_all(source, expected, timeout_secs=20):
  records, deadline = [], time.monotonic() + timeout_secs
  while len(records) < expected and time.monotonic() < deadline:
    records += source.read(100, 0.5)
  return records


def test_an_unreachable_broker_is_named_and_retried_until_the_connect_timeout():
  address = f"127.0.0.1:{portpicker.pick_unused_port()}"
  start = time.monotonic()
  with pytest.raises(BrokerUnreachableError, match=f"no broker at {address} answered within 2 s"):
    kafka.KafkaSource(address, "clicks", connect_timeout_secs=2, options={"log_level": 0})
  assert time.monotonic() - start < 20


BROKERS_GONE = """
import gc, sys
from confluent_kafka import Producer
from tfps.data.stream import kafka
holder = Producer({"test.mock.num.brokers": 1, "log_level": 0})
bootstrap = ",".join(f"{b.host}:{b.port}" for b in holder.list_topics(timeout=10).brokers.values())
producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
for i in range(4):
  producer.produce("gone", value=b"1,1,1")
producer.flush(10)
source = kafka.KafkaSource(bootstrap, "gone", group_id="g", start="earliest", connect_timeout_secs=10)
read = 0
while read < 4:
  read += len(source.read(10, 1.0))
del holder, producer
gc.collect()
print(sum(len(source.read(10, 1.0)) for _ in range(4)), flush=True)
"""


def test_brokers_lost_mid_stream_are_a_warning_and_librdkafkas_own_lines_stay_off_the_console(subprocess_env):
  result = subprocess.run([sys.executable, "-c", BROKERS_GONE], capture_output=True, text=True, timeout=120,
                          env=subprocess_env)
  assert result.stdout.strip().splitlines()[-1] == "0", result.stderr[-2000:]
  assert "|FAIL|" not in result.stderr  # librdkafka wrote one per broker and retry, 20 a second
  # librdkafka counts the brokers it knows ("1/1", or "0/2" with the bootstrap address): the line, whichever.
  assert re.search(r"\d+/\d+ brokers are down; no record is read until a broker answers", result.stderr), result.stderr
  assert result.stderr.count("Connection refused") <= 2, result.stderr  # each kind of error at most once a minute


def test_a_missing_topic_or_partition_is_one_line(kafka_broker):
  with pytest.raises(StreamError, match="topic 'absent' not found"):
    _source(kafka_broker, "absent")
  online_stream.produce(kafka_broker, range(4), topic="four")
  with pytest.raises(StreamError, match=r"partition\(s\) \[9\] not in the topic \(it has \[0, 1, 2, 3\]\)"):
    _source(kafka_broker, "four", partitions=[9])


def test_stream_start_earliest_latest_and_committed(kafka_broker):
  online_stream.produce(kafka_broker, range(8), topic="starts")
  assert len(_read_all(_source(kafka_broker, "starts"), 8)) == 8
  with pytest.raises(StreamError, match="no committed offset for this group; start with --stream_start=earliest"):
    _source(kafka_broker, "starts", start="committed")
  latest = _source(kafka_broker, "starts", start="latest")
  assert latest.read(100, 1.0) == []
  online_stream.produce(kafka_broker, range(8, 10), topic="starts")
  assert sorted(r.value for r in _read_all(latest, 2)) == [b"8,0,1.5", b"9,1,1.5"]
  latest.commit(latest.positions())
  assert _source(kafka_broker, "starts", start="committed").positions() == latest.positions()


def test_malformed_records_are_counted_and_skipped_or_stop_a_strict_stream(kafka_broker):
  online_stream.produce(kafka_broker, [], extra=[b"1,1,1.5", b"not,a,number", b"2,0", b"3,0,2.5"], topic="bad")
  stream = batches_lib.StreamBatches(_source(kafka_broker, "bad", partitions=[0]), online_stream.SPEC, batch_size=2)
  batch = stream.next_batch(10)
  assert batch.element[0]["id"].numpy().tolist() == [1, 3]
  assert (stream.malformed, batch.positions) == (2, {"0": 4})
  strict = batches_lib.StreamBatches(_source(kafka_broker, "bad", partitions=[0]), online_stream.SPEC, batch_size=2,
                                     strict=True)
  with pytest.raises(MalformedRecordError, match=r"record bad/0@1 is malformed: b'not,a,number'"):
    strict.next_batch(10)


def test_a_spec_that_matches_no_record_is_said_while_the_stream_waits(tmp_path, caplog):
  _write(tmp_path, "slice-1.csv", [f"{i},1,1,extra" for i in range(150)])  # a column more than the spec
  stream = batches_lib.StreamBatches(folder_lib.FolderSource(str(tmp_path), poll_secs=0.05), online_stream.SPEC,
                                     batch_size=2)
  assert stream.next_batch(0.5) is None
  assert "150 of the 150 records read so far are malformed; does the feature spec describe this stream?" in \
      caplog.text


def test_json_records_are_read_by_the_spec_columns(kafka_broker):
  records = [b'{"id": 5, "label": 1, "price": 3}', b'{"id": 6, "label": 0}', b"[1]"]
  online_stream.produce(kafka_broker, [], extra=records, topic="json")
  stream = batches_lib.StreamBatches(_source(kafka_broker, "json", partitions=[0]), online_stream.SPEC, batch_size=2,
                                     record_format="json")
  features, label = stream.next_batch(10).element
  assert features["id"].numpy().tolist() == [5, 6] and label.numpy().tolist() == [1, 0]
  assert stream.malformed == 1  # the array is not an object (records are checked as they are read)
  assert stream.next_batch(0.5) is None


def test_a_batch_carries_when_its_records_were_written(kafka_broker, tmp_path):
  """Kafka: the messages' timestamps; a folder: the slice's complete time (its marker's, or a renamed slice's own
  modification time, to the sub-second)."""
  before = time.time()
  online_stream.produce(kafka_broker, [7, 8, 9], topic="stamps")
  after = time.time()
  batch = batches_lib.StreamBatches(_source(kafka_broker, "stamps"), online_stream.SPEC, batch_size=3).next_batch(10)
  assert before - 0.002 <= batch.written[0] <= batch.written[1] <= after + 0.002, (before, batch.written, after)
  _write(tmp_path, "slice-1.csv", ["1,1,1", "2,0,1"])
  os.utime(tmp_path / "slice-1.csv.done", (1_700_000_000.25, 1_700_000_000.25))
  marked = batches_lib.StreamBatches(folder_lib.FolderSource(str(tmp_path), pattern="slice-*.csv"),
                                     online_stream.SPEC, batch_size=2).next_batch(1)
  assert marked.written == (1_700_000_000.25, 1_700_000_000.25)
  renamed = tmp_path / "renamed"
  renamed.mkdir()
  _write(renamed, "slice-1.csv", ["1,1,1"], done=False)
  os.utime(renamed / "slice-1.csv", (1_700_000_100.5, 1_700_000_100.5))
  source = folder_lib.FolderSource(str(renamed), complete="rename")
  assert [record.timestamp for record in source.read(10, 1.0)] == [1_700_000_100.5]


def _write(folder, name, lines, done=True):
  with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
    f.write("".join(line + "\n" for line in lines))
  if done:
    open(os.path.join(folder, name + ".done"), "w", encoding="utf-8").close()


def test_a_folder_slice_is_read_once_complete_in_order_and_resumed_at_its_line(tmp_path):
  _write(tmp_path, "slice-2.csv", ["3,1,1", "4,0,1"], done=False)
  _write(tmp_path, "slice-1.csv", ["1,1,1", "2,0,1"])
  source = folder_lib.FolderSource(str(tmp_path), pattern="slice-*.csv", poll_secs=0.05)
  assert [r.where for r in source.read(10, 0.3)] == ["slice-1.csv:1", "slice-1.csv:2"]
  assert source.read(10, 0.3) == []  # slice-2 has no marker yet
  open(tmp_path / "slice-2.csv.done", "w", encoding="utf-8").close()
  assert [r.value for r in source.read(1, 1.0)] == [b"3,1,1"]
  resumed = folder_lib.FolderSource(str(tmp_path), pattern="slice-*.csv", positions=source.positions())
  assert [r.value for r in resumed.read(10, 0.3)] == [b"4,0,1"]


def test_a_slice_completed_after_a_later_one_is_waited_for_and_one_appearing_behind_is_named(tmp_path, caplog):
  _write(tmp_path, "slice-1.csv", ["1,1,1"])
  _write(tmp_path, "slice-2.csv", ["2,0,1"], done=False)
  _write(tmp_path, "slice-3.csv", ["3,1,1"])
  source = folder_lib.FolderSource(str(tmp_path), pattern="slice-*.csv", poll_secs=0.05)
  assert [r.value for r in source.read(10, 0.3)] == [b"1,1,1"]  # slice-3 is complete, but slice-2 comes first
  assert source.read(10, 0.3) == []
  assert "waiting for slice slice-2.csv to be complete (its .done marker) before slice-3.csv" in caplog.text
  open(tmp_path / "slice-2.csv.done", "w", encoding="utf-8").close()
  assert [r.value for r in source.read(10, 1.0)] == [b"2,0,1", b"3,1,1"]
  _write(tmp_path, "slice-0.csv", ["0,0,1"])  # behind the position: never read, named once
  _write(tmp_path, "slice-4.csv", ["4,0,1"])
  assert [r.value for r in source.read(10, 1.0)] == [b"4,0,1"]
  assert caplog.text.count("slice(s) slice-0.csv appeared after slice-3.csv was read") == 1


def test_a_kafka_run_on_fewer_partitions_carries_the_others_positions(kafka_broker):
  online_stream.produce(kafka_broker, range(40), topic="narrowed")
  first = _source(kafka_broker, "narrowed")
  _read_all(first, 40)
  ends = first.positions()
  assert sorted(ends) == ["0", "1", "2", "3"]
  narrowed = _source(kafka_broker, "narrowed", partitions=[0], positions=ends)
  assert narrowed.positions() == ends  # a later run on every partition starts each where this checkpoint leaves it
  online_stream.produce(kafka_broker, range(40, 60), topic="narrowed")
  read = _read_all(narrowed, 60 - 40, timeout_secs=3)
  assert {record.key for record in read} <= {"0"} and narrowed.positions()["1"] == ends["1"]


def test_a_renamed_slice_is_complete_and_a_vanished_one_is_named(tmp_path):
  _write(tmp_path, ".slice-1.csv.tmp", ["1,1,1"], done=False)
  source = folder_lib.FolderSource(str(tmp_path), complete="rename", poll_secs=0.05)
  assert source.read(10, 0.3) == []
  os.rename(tmp_path / ".slice-1.csv.tmp", tmp_path / "slice-1.csv")
  assert [r.value for r in source.read(10, 1.0)] == [b"1,1,1"]
  os.remove(tmp_path / "slice-1.csv")
  with pytest.raises(StreamError, match=r"slice 'slice-1.csv', read up to line 1, has vanished"):
    folder_lib.FolderSource(str(tmp_path), complete="rename", positions=source.positions())


def test_a_folder_in_the_stream_folder_is_never_a_slice(tmp_path):
  """A run's model_dir (or any folder) whose name matches the pattern is passed over, not opened as a slice."""
  (tmp_path / "slice-0-run").mkdir()
  (tmp_path / "slice-0-run.done").write_text("")
  _write(tmp_path, "slice-1.csv", ["1,1,1"])
  for complete in ("marker", "rename"):
    source = folder_lib.FolderSource(str(tmp_path), pattern="slice-*", complete=complete, poll_secs=0.05)
    assert [r.value for r in source.read(10, 0.5)] == [b"1,1,1"]


def test_stream_flags_name_what_a_source_needs():
  from absl import flags  # pylint: disable=g-import-not-at-top
  from tfps.cli import stream_flags  # pylint: disable=g-import-not-at-top
  for argv, message in ((["--stream=kafka"], "--stream=kafka needs --kafka_bootstrap and --kafka_topic"),
                        (["--stream=folder"], "--stream=folder needs --stream_folder"),
                        (["--stream=kafka", "--kafka_bootstrap=h:1", "--kafka_topic=t", "--kafka_partitions=a"],
                         r"--kafka_partitions \(a\) must be partition numbers")):
    flag_values = flags.FlagValues()
    stream_flags.define_stream_flags(flag_values)
    with pytest.raises(flags.IllegalFlagValueError, match=message):
      flag_values(["prog", *argv])


def test_a_partial_batch_is_given_after_the_idle_flush_time_and_its_position_passes_held_out_records(tmp_path):
  _write(tmp_path, "slice-1.csv", [f"{i},{i % 2},1.5" for i in range(20)])
  held_out = holdout.HeldOut(every=4, window=100)
  stream = batches_lib.StreamBatches(folder_lib.FolderSource(str(tmp_path), poll_secs=0.05), online_stream.SPEC,
                                     batch_size=8, held_out=held_out, idle_flush_secs=0.3)
  full = stream.next_batch(5)
  assert full.size == 8 and held_out.count + 8 <= 20
  start = time.monotonic()
  batches = [full]
  while sum(b.size for b in batches) + held_out.count < 20:
    batches.append(stream.next_batch(5))
  assert 0 < batches[-1].size < 8 and time.monotonic() - start < 3  # the partial one came after 0.3 s, not 5
  trained = [int(i) for b in batches for i in b.element[0]["id"].numpy().reshape(-1)]
  held = [int(line.split(b",")[0]) for line in held_out.window()]
  assert sorted(trained + held) == list(range(20)) and len(held) == held_out.count > 0
  assert batches[-1].positions == {"folder": ["slice-1.csv", 20]}
  unheld = batches_lib.StreamBatches(folder_lib.FolderSource(str(tmp_path), poll_secs=0.05), online_stream.SPEC,
                                     batch_size=8)
  assert [unheld.next_batch(1).size for _ in range(2)] == [8, 8] and unheld.next_batch(0.5) is None  # no flush


def test_the_held_out_share_is_decided_by_position_and_bad_settings_are_one_line():
  picker = holdout.HeldOut(every=10, window=5)
  records = [Record(b"", str(p), offset, "") for p in range(4) for offset in range(1, 501)]
  taken = [r for r in records if picker.takes(r)]
  assert 120 <= len(taken) <= 280 and taken == [r for r in records if holdout.HeldOut(10, 1).takes(r)]
  for record in taken[:7]:
    picker.add(record, record.key.encode())
  assert len(picker.window()) == 5 and picker.count == 7
  for every, window, message in ((1, 5, "holdout_every must be an integer >= 2, got 1"),
                                 (10, 0, "holdout_window must be an integer >= 1, got 0")):
    with pytest.raises(UsageError, match=message):
      holdout.HeldOut(every, window)
