"""The code blocks of the README run as they are written, against a real queue manager and Spark
session, and do what the text around them says."""

from __future__ import annotations

import mqspark

from .support.docs import block_under, run_block

README = "README.md"


def test_the_failed_messages_example_backs_out_what_it_rejects_and_writes_the_rest(spark, qm, tmp_path):
    """The README's first failed-messages example: a foreachBatch that backs out the messages it
    rejects and writes the others to Delta (it once failed on every batch: ``subtract`` cannot
    compare the ``properties`` map)."""
    qm.define_queue("ORDERS.BACKOUT")
    qm.define_queue("ORDERS", backout_threshold=1, backout_queue="ORDERS.BACKOUT")
    rejected = b"x" * 1001
    qm.put("ORDERS", [{"payload": "order 1"}, {"payload": rejected}, {"payload": "order 2"}])
    out, ck = str(tmp_path / "billed"), str(tmp_path / "checkpoint")
    block = block_under(README, "Failed messages: backout, retry, error and dead-letter queues")
    run_block(block, README, {"spark": spark, "mqspark": mqspark, "root": qm.root, "out": out, "ck": ck})
    (query,) = spark.streams.active
    try:
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    written = spark.read.format("delta").load(out).orderBy("delivery_seq").collect()
    assert [bytes(row.payload) for row in written] == [b"order 1", b"order 2"]
    moved = qm.browse("ORDERS.BACKOUT")
    assert moved["payload"].to_pylist() == [rejected]
    assert moved["dlq_original_queue"].to_pylist() == ["ORDERS"]
    assert qm.depth("ORDERS", consumer="billing") == 0
