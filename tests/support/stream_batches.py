"""Reading a streaming-get planner's batches directly, as Spark's executors would."""

from __future__ import annotations

from mqspark.spark.stream import QueueStreamReader


def read_batch(reader: QueueStreamReader, start: dict, end: dict) -> list[tuple]:
    """The (delivery_seq, payload) rows of the batch from ``start`` to ``end``, in the order read."""
    rows = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            rows += [(r["delivery_seq"], r["payload"].decode()) for r in batch.to_pylist()]
    return rows
