"""Reading a streaming-get planner's batches directly, as Spark's executors would, and a real
streaming get that collects what it delivers."""

from __future__ import annotations

import time
from pathlib import Path

from mqspark.spark.stream import QueueStreamReader


def read_batch(reader: QueueStreamReader, start: dict, end: dict) -> list[tuple]:
    """The (delivery_seq, payload) rows of the batch from ``start`` to ``end``, in the order read."""
    rows = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            rows += [(r["delivery_seq"], r["payload"].decode()) for r in batch.to_pylist()]
    return rows


def collecting_query(spark, root: str, checkpoint: Path, seen: list[tuple[int, str]], **options: str):
    """A running streaming get of queue Q (with ``options``) whose ``foreachBatch`` appends each
    delivered message's (delivery_seq, payload) to ``seen``, every 200 ms."""

    def process(df, batch_id: int) -> None:
        seen.extend((r.delivery_seq, r.payload.decode()) for r in df.orderBy("delivery_seq").collect())

    reader = spark.readStream.format("mq").option("queue", "Q")
    for name, value in options.items():
        reader = reader.option(name, value)
    return (
        reader.load(root)
        .writeStream.foreachBatch(process)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def wait_for_finished_batches(query, count: int, timeout: float = 60) -> None:
    """Until ``count`` of ``query``'s micro-batches that read messages have finished. A batch is
    recorded consumed once it finishes, not when its ``foreachBatch`` has run: a query stopped in
    between replays it. (Batches are counted, not rows: a sort in ``foreachBatch`` reads its input
    twice, and ``numInputRows`` counts both reads.)"""
    deadline = time.monotonic() + timeout
    while sum(1 for p in query.recentProgress if p["numInputRows"] > 0) < count:
        assert time.monotonic() < deadline, f"after {timeout} s: {query.recentProgress}"
        time.sleep(0.1)
