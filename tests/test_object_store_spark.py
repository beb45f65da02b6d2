"""Spark's put, browse and streaming get on a queue manager on the object store (the Azurite
emulator), with credentials from the AZURE_* environment variables that the session's JVM and
Python workers inherited (see ``tests/conftest.py``). Checkpoints stay on the local disk."""

from __future__ import annotations

import re
import threading
import time

import pytest
from chispa import assert_df_equality
from pyspark.errors import StreamingQueryException

from mqspark import QueueManager, store

from .test_object_store import OUTAGE
from .test_reconnect_spark import _start_get, _wait
from .test_stream_get import _expected_df, _orders, _put_orders, _reference


def put_then_drain_in_logical_order(spark, root: str, tmp_path, files: int) -> None:
    """A streaming put of ``files`` order files into queue Q of a new queue manager at ``root``, then
    a streaming get of group e2e that delivers every message once, in logical order."""
    qm = QueueManager.create(root, "QM1")
    qm.define_queue("Q", delivery_sequence="fifo")
    _orders(tmp_path / "input", files)
    _put_orders(spark, tmp_path / "input", tmp_path / "put", qm.root).awaitTermination()
    assert qm.depth("Q") == 6 * files
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


def test_a_streaming_put_and_a_streaming_get_on_the_object_store_deliver_in_logical_order(
    spark, azurite, az_root, tmp_path
):
    put_then_drain_in_logical_order(spark, az_root, tmp_path, 4)


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
    table = spark.read.format("delta").load(store.queue_location(az_root, "Q"))
    got = table.selectExpr("cast(payload as string) as payload", "priority").orderBy("payload")
    expected = spark.createDataFrame([("a", 3), ("b", 4)], "payload string, priority int")
    assert_df_equality(got, expected, ignore_nullable=True)


def _fill(az_root: str) -> QueueManager:
    qm = QueueManager.create(az_root, "QM1")
    qm.define_queue("Q", delivery_sequence="fifo")
    for put in range(3):
        rows = [{"payload": f"u{put}-{n}"} for n in range(3)]
        rows += [
            {"payload": f"g{put}-{n}", "group_id": f"G{put}", "msg_seq_number": n, "last_in_group": n == 3}
            for n in (3, 1, 2)
        ]
        qm.put("Q", rows)
    return qm


# The columns each delivered batch keeps, for chispa against the reference model.
COLUMNS = ("delivery_seq", "msg_id", "offset", "payload")


def _delivered(spark, batches: dict):
    rows = sorted(row for batch in batches.values() for row in batch)
    return spark.createDataFrame(rows, "delivery_seq long, msg_id string, offset long, payload string")


def test_a_streaming_get_with_reconnect_yes_rides_out_the_object_store_stopped_and_restarted(
    spark, azurite, az_root, tmp_path
):
    """Azurite is down for longer than delta-rs's own retries last, so a call gives up while the store
    is down and the store may answer again before mqspark looks: the query must still reconnect."""
    qm = _fill(az_root)
    expected = _reference(qm)
    batches: dict[int, list] = {}
    query = _start_get(spark, qm, tmp_path / "get", batches, COLUMNS, reconnect="yes", reconnectTimeout="180")
    try:
        _wait(lambda: len(batches) >= 1, query, 180)
        azurite.stop()
        restart = threading.Timer(OUTAGE, azurite.start)
        restart.start()
        try:
            time.sleep(OUTAGE / 2)
            during = sum(map(len, batches.values()))
        finally:
            restart.join()
        _wait(lambda: sum(map(len, batches.values())) >= len(expected), query, 180)
        _wait(lambda: qm.depth("Q", consumer="default") == 0, query, 180)
        assert query.exception() is None
    finally:
        query.stop()
        if azurite.process is None:
            azurite.start()
    assert during < len(expected)
    assert_df_equality(_delivered(spark, batches), _expected_df(spark, expected))


def test_a_streaming_get_in_mode_no_fails_with_2009_when_the_object_store_stops_and_resumes_exactly(
    spark, azurite, az_root, tmp_path
):
    qm = _fill(az_root)
    expected = _reference(qm)
    batches: dict[int, list] = {}
    query = _start_get(spark, qm, tmp_path / "get", batches, COLUMNS, reconnect="no")
    try:
        _wait(lambda: len(batches) >= 1, query, 180)
        azurite.stop()
        try:
            with pytest.raises(StreamingQueryException) as caught:
                query.awaitTermination(180)
        finally:
            azurite.start()
    finally:
        query.stop()
    assert re.search(
        r"MQRC_CONNECTION_BROKEN \(2009\): streaming get of queue Q \((planning|partitions|read|commit)\): "
        rf"queue manager QM1 at {re.escape(qm.root)} cannot be reached \(.*\); reconnect is no",
        str(caught.value),
    ), str(caught.value)
    again = _start_get(spark, qm, tmp_path / "get", batches, COLUMNS, reconnect="no")
    try:
        _wait(lambda: sum(map(len, batches.values())) >= len(expected), again, 180)
    finally:
        again.stop()
    assert_df_equality(_delivered(spark, batches), _expected_df(spark, expected))
