"""Stream sources for online training: records read on the chief, in order, with their positions.

* `kafka.KafkaSource`: the partitions of a Kafka topic, read with explicit assignment at given offsets
  (confluent-kafka); positions are offsets, committed to the consumer group after the checkpoint that holds them.
* `folder.FolderSource`: files appearing in a folder over time, each read once complete (a `.done` marker beside it,
  or its final name after a rename), in name order; a position is the file and the lines read from it.
* `batches.StreamBatches`: records parsed with a feature spec (`tfps.data.spec`) into fixed-size batches, each with
  the positions just after its last record.

See docs/online.md.
"""
