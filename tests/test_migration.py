"""Queue tables written before ``failure_queue`` existed keep working: read, got, put to (which adds
the column), and read by delta-spark. The fixture under ``tests/fixtures`` was written by mqspark
before the change: a queue manager OLDQM with queues REQUESTS and REPLIES and a declared group."""

from __future__ import annotations

import shutil
from pathlib import Path

from chispa import assert_df_equality

from mqspark import QueueManager, store

FIXTURE = Path(__file__).parent / "fixtures" / "qm-before-failure-queue"


def _old_root(tmp_path: Path) -> str:
    root = tmp_path / "qm"
    shutil.copytree(FIXTURE, root)
    return str(root)


def test_a_queue_table_without_failure_queue_is_read_got_and_put_to(spark, tmp_path):
    qm = QueueManager.open(_old_root(tmp_path))
    location = store.queue_location(qm.root, "REQUESTS")
    assert "failure_queue" not in store.open_table(location, None).schema().to_arrow().names

    browsed = qm.browse("REQUESTS")
    # REQUESTS delivers by priority: r2 (priority 7) first.
    assert [p.decode() for p in browsed["payload"].to_pylist()] == ["r2", "r1", "g1", "g2"]
    assert browsed["failure_queue"].to_pylist() == [None] * 4
    assert browsed["reply_to_queue"].to_pylist() == [None, "REPLIES", None, None]
    assert qm.depth("REQUESTS", consumer="audit") == 4

    got = qm.get("REQUESTS", max_messages=2)
    assert [p.decode() for p in got["payload"].to_pylist()] == ["r2", "r1"]
    assert got["correl_id"].to_pylist() == [None, "c1"]

    qm.put("REQUESTS", [{"payload": "new", "failure_queue": "REQUESTS.FAILED"}])
    assert "failure_queue" in store.open_table(location, None).schema().to_arrow().names
    rest = qm.get("REQUESTS", max_messages=10)
    assert [p.decode() for p in rest["payload"].to_pylist()] == ["g1", "g2", "new"]
    assert rest["failure_queue"].to_pylist() == [None, None, "REQUESTS.FAILED"]

    # delta-spark reads old and new files alike: the column is null where it was not written.
    actual = spark.read.format("delta").load(location).select("payload", "failure_queue")
    assert_df_equality(
        actual.orderBy("payload"),
        spark.createDataFrame(
            [(b"g1", None), (b"g2", None), (b"new", "REQUESTS.FAILED"), (b"r1", None), (b"r2", None)],
            "payload binary, failure_queue string",
        ),
        ignore_nullable=True,
    )


def test_a_streaming_get_of_an_old_table_delivers_in_logical_order(spark, tmp_path):
    root = _old_root(tmp_path)
    QueueManager.open(root).put("REQUESTS", [{"payload": "new", "failure_queue": "F"}])
    rows = (
        spark.readStream.format("mq")
        .option("queue", "REQUESTS")
        .option("consumer", "audit")
        .load(root)
        .writeStream.format("memory")
        .queryName("old_table_drain")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    rows.awaitTermination(120)
    actual = spark.sql("select delivery_seq, payload, failure_queue from old_table_drain")
    expected = spark.createDataFrame(
        [(0, b"r2", None), (1, b"r1", None), (2, b"g1", None), (3, b"g2", None), (4, b"new", "F")],
        "delivery_seq long, payload binary, failure_queue string",
    )
    assert_df_equality(actual.orderBy("delivery_seq"), expected, ignore_nullable=True)
