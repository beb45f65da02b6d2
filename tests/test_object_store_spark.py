"""Spark's put, browse and streaming get on a queue manager on the object store (the Azurite
emulator), with credentials from the AZURE_* environment variables that the session's JVM and
Python workers inherited (see ``tests/conftest.py``). Checkpoints stay on the local disk."""

from __future__ import annotations

import json
import os
import time

from chispa import assert_df_equality

from mqspark import QueueManager, storage

from .test_stream_get import _expected_df, _reference


def _orders(folder, files: int) -> None:
    """``files`` JSON files of three ungrouped messages and a group of three, oldest first."""
    folder.mkdir()
    base = int(time.time()) - 100
    for f in range(files):
        rows = [{"payload": f"u{f}-{n}"} for n in range(3)]
        rows += [
            {"payload": f"g{f}-{n}", "group_id": f"G{f}", "msg_seq_number": n, "last_in_group": n == 3}
            for n in (1, 2, 3)
        ]
        path = folder / f"part-{f:03d}.json"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.utime(path, (base + f, base + f))


def test_a_streaming_put_and_a_streaming_get_on_the_object_store_deliver_in_logical_order(
    spark, azurite, az_root, tmp_path
):
    qm = QueueManager.create(az_root, "QM1")
    qm.define_queue("Q", delivery_sequence="fifo")
    _orders(tmp_path / "input", 4)
    producer = (
        spark.readStream.schema("payload string, group_id string, msg_seq_number int, last_in_group boolean")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "input"))
        .writeStream.format("mq")
        .option("queue", "Q")
        .option("checkpointLocation", str(tmp_path / "put"))
        .trigger(availableNow=True)
        .start(qm.root)
    )
    producer.awaitTermination()
    assert qm.depth("Q") == 24
    delivered: list[tuple] = []

    def collect(batch, batch_id: int) -> None:
        rows = batch.select("delivery_seq", "msg_id", "offset", "payload").collect()
        delivered.extend((r.delivery_seq, r.msg_id, r.offset, r.payload.decode()) for r in rows)

    consumer = (
        spark.readStream.format("mq")
        .option("queue", "Q")
        .option("consumer", "e2e")
        .option("maxMessagesPerTrigger", 5)
        .load(qm.root)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "get"))
        .trigger(availableNow=True)
        .start()
    )
    consumer.awaitTermination()
    got = spark.createDataFrame(sorted(delivered), "delivery_seq long, msg_id string, offset long, payload string")
    assert_df_equality(got, _expected_df(spark, _reference(qm)))
    assert qm.depth("Q", consumer="e2e") == 0


def test_a_batch_put_and_a_browse_on_the_object_store(spark, azurite, az_root):
    qm = QueueManager.create(az_root, "QM1")
    qm.define_queue("Q", delivery_sequence="priority")
    rows = [("low", 1), ("high", 9), ("mid", 5), ("high-2", 9)]
    spark.createDataFrame(rows, "payload string, priority int").write.format("mq").mode("append").option(
        "queue", "Q"
    ).save(qm.root)
    browsed = (
        spark.read.format("mq")
        .option("queue", "Q")
        .load(qm.root)
        .selectExpr("cast(payload as string) as payload", "priority")
    )
    expected = spark.createDataFrame(
        [("high", 9), ("high-2", 9), ("mid", 5), ("low", 1)], "payload string, priority int"
    )
    assert_df_equality(browsed, expected, ignore_nullable=True)


def test_delta_spark_reads_the_queue_table_on_the_object_store(spark, azurite, az_root):
    """The session reached the emulator through hadoop-azure's ABFS driver, set up from the same
    AZURE_* variables (``mqspark.session``)."""
    qm = QueueManager.create(az_root, "QM1")
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "a", "priority": 3}, {"payload": "b", "priority": 4}])
    table = spark.read.format("delta").load(storage.queue_location(az_root, "Q"))
    got = table.selectExpr("cast(payload as string) as payload", "priority").orderBy("payload")
    expected = spark.createDataFrame([("a", 3), ("b", 4)], "payload string, priority int")
    assert_df_equality(got, expected, ignore_nullable=True)
