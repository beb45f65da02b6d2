"""Reading a streaming-get planner's batches directly, as Spark's executors would, and a real
streaming get that collects what it delivers."""

from __future__ import annotations

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
