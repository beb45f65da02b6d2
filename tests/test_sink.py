"""Batch and streaming puts from Spark: exact rows, one commit per batch, exactly once, clear errors."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import functions as F

from mqspark import store

GIVEN = (
    "msg_id string, correl_id string, priority int, group_id string, msg_seq_number int, "
    "last_in_group boolean, payload string, properties map<string,string>, expiry timestamp"
)
EXPIRY = datetime(2030, 1, 1, tzinfo=UTC)
STREAM_SCHEMA = "payload string, group_id string, msg_seq_number int, last_in_group boolean"


def _rows() -> list[tuple]:
    return [
        ("m1", "c1", 5, None, None, None, "first", {"k": "v"}, EXPIRY),
        ("m2", None, None, "G", 1, False, "g1", None, None),
        ("m3", None, None, "G", 2, True, "g2", None, None),
        ("m4", "c4", 9, None, None, None, "", {}, None),
    ]


def _table_state(qm, queue: str) -> tuple[int, list[str]]:
    """The queue table's Delta version and the data files in its folder (committed or not)."""
    location = store.queue_location(qm.root, queue)
    return DeltaTable(location).version(), sorted(f for f in os.listdir(location) if f.endswith(".parquet"))


def _queue_table(spark, qm, queue: str):
    return spark.read.format("delta").load(store.queue_location(qm.root, queue))


def _write_json_batch(folder, name: str, rows: list[dict]) -> None:
    """One input file, which the file source reads as one micro-batch; files are read in name order."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    # The file source orders files by modification time; files written in the same instant tie.
    moment = 1_700_000_000 + int(name)
    os.utime(path, (moment, moment))


def _stream(spark, source, qm, checkpoint, queue: str = "Q", **options):
    reader = spark.readStream.schema(STREAM_SCHEMA)
    query = (
        reader.option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("mq")
        .option("queue", queue)
        .option("checkpointLocation", str(checkpoint))
        .options(**options)
        .trigger(availableNow=True)
        .start(qm.root)
    )
    query.awaitTermination()
    return query


def test_batch_put_lands_exactly_the_input_rows(spark, qm):
    qm.define_queue("Q", default_priority=3)
    given = spark.createDataFrame(_rows(), GIVEN)
    given.write.format("mq").option("queue", "Q").mode("append").save(qm.root)

    stored = _queue_table(spark, qm, "Q").select(given.columns).withColumn("payload", F.col("payload").cast("string"))
    expected = given.fillna({"priority": 3, "msg_seq_number": 1, "last_in_group": False})
    assert_df_equality(stored.orderBy("msg_id"), expected.orderBy("msg_id"), ignore_nullable=True)
    assert DeltaTable(store.queue_location(qm.root, "Q")).version() == 1


def test_batch_put_is_one_commit_in_partition_order(spark, qm):
    qm.define_queue("Q", delivery_sequence="fifo")
    spark.range(40).repartition(4).selectExpr("cast(id as string) as payload").sortWithinPartitions(
        "payload"
    ).write.format("mq").option("queue", "Q").mode("append").save(qm.root)
    assert DeltaTable(store.queue_location(qm.root, "Q")).version() == 1
    browsed = qm.browse("Q")
    put_seq = browsed["put_seq"].to_pylist()
    assert put_seq == sorted(put_seq) and len(set(put_seq)) == 40
    assert sorted(int(p) for p in browsed["payload"].to_pylist()) == list(range(40))


def test_streaming_put_lands_exactly_the_input_rows(spark, qm, tmp_path):
    qm.define_queue("Q")
    source = tmp_path / "in"
    _write_json_batch(source, "0", [{"payload": f"a{n}"} for n in range(5)])
    _write_json_batch(
        source,
        "1",
        [{"payload": f"b{n}", "group_id": "G", "msg_seq_number": n + 1, "last_in_group": n == 2} for n in range(3)],
    )
    query = _stream(spark, source, qm, tmp_path / "ckpt")
    assert query.exception() is None
    given = spark.read.schema(STREAM_SCHEMA).json(str(source))
    stored = _queue_table(spark, qm, "Q").select(given.columns).withColumn("payload", F.col("payload").cast("string"))
    expected = given.fillna({"msg_seq_number": 1, "last_in_group": False})
    assert_df_equality(stored, expected, ignore_row_order=True, ignore_nullable=True)
    browsed = qm.browse("Q")
    assert browsed["payload"].to_pylist() == [f"a{n}".encode() for n in range(5)] + [f"b{n}".encode() for n in range(3)]
    assert browsed["msg_seq_number"].to_pylist() == [1] * 5 + [1, 2, 3]
    table = DeltaTable(store.queue_location(qm.root, "Q"))
    assert table.version() == 2
    assert table.transaction_version(str(query.id)) == 1


def test_a_named_streaming_put_lands_its_rows(spark, qm, tmp_path):
    """Spark hands a streaming write its query's name as an option (Declarative Pipelines name every
    flow's query): the sink takes it as Spark's own, not as an unknown option."""
    qm.define_queue("Q")
    source = tmp_path / "in"
    _write_json_batch(source, "0", [{"payload": f"a{n}"} for n in range(3)])
    query = (
        spark.readStream.schema(STREAM_SCHEMA)
        .json(str(source))
        .writeStream.format("mq")
        .queryName("named_put")
        .option("queue", "Q")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start(qm.root)
    )
    query.awaitTermination()
    assert query.exception() is None
    assert qm.browse("Q")["payload"].to_pylist() == [b"a0", b"a1", b"a2"]


def test_group_spans_micro_batches_and_restarts(spark, qm, tmp_path):
    qm.define_queue("Q")
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _write_json_batch(source, "0", [{"payload": "x1", "group_id": "G", "msg_seq_number": 1}])
    _write_json_batch(source, "1", [{"payload": "x2", "group_id": "G", "msg_seq_number": 2}])
    _stream(spark, source, qm, checkpoint)
    _write_json_batch(source, "2", [{"payload": "x3", "group_id": "G", "msg_seq_number": 3, "last_in_group": True}])
    _stream(spark, source, qm, checkpoint)
    browsed = qm.browse("Q")
    assert browsed["payload"].to_pylist() == [b"x1", b"x2", b"x3"]
    assert browsed["last_in_group"].to_pylist() == [False, False, True]
    assert DeltaTable(store.queue_location(qm.root, "Q")).version() == 3


def test_replayed_batch_commits_nothing_twice(spark, qm, tmp_path):
    qm.define_queue("Q")
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for n in range(3):
        _write_json_batch(source, str(n), [{"payload": f"p{n}"}])
    _stream(spark, source, qm, checkpoint)
    version = DeltaTable(store.queue_location(qm.root, "Q")).version()
    # Forget that batch 2 finished: on restart Spark runs it again with the same offsets.
    os.remove(checkpoint / "commits" / "2")
    os.remove(checkpoint / "commits" / ".2.crc")
    _stream(spark, source, qm, checkpoint)
    assert (checkpoint / "commits" / "2").exists()
    assert DeltaTable(store.queue_location(qm.root, "Q")).version() == version
    assert qm.browse("Q")["payload"].to_pylist() == [b"p0", b"p1", b"p2"]
    assert _table_state(qm, "Q")[1] == sorted(
        os.path.basename(path) for path in DeltaTable(store.queue_location(qm.root, "Q")).file_uris()
    )


def test_explicit_producer_id_survives_a_new_checkpoint(spark, qm, tmp_path):
    qm.define_queue("Q")
    source = tmp_path / "in"
    _write_json_batch(source, "0", [{"payload": "once"}])
    _stream(spark, source, qm, tmp_path / "ckpt1", producerId="loader")
    # A new checkpoint restarts batch ids at 0: the same producer's batch 0 is recognised.
    _stream(spark, source, qm, tmp_path / "ckpt2", producerId="loader")
    assert qm.browse("Q")["payload"].to_pylist() == [b"once"]
    assert DeltaTable(store.queue_location(qm.root, "Q")).transaction_version("loader") == 0


def test_empty_batch_commits_nothing(spark, qm, tmp_path):
    qm.define_queue("Q")
    source = tmp_path / "in"
    source.mkdir()
    (source / "0.json").write_text("")
    query = _stream(spark, source, qm, tmp_path / "ckpt")
    assert query.exception() is None
    assert DeltaTable(store.queue_location(qm.root, "Q")).version() == 0
    assert _table_state(qm, "Q") == (0, [])


def test_segmentation_keeps_the_pieces_together(spark, qm, tmp_path):
    qm.define_queue("Q", max_message_length=4)
    spark.createDataFrame([("0123456789",), ("ab",)], "payload string").write.format("mq").option("queue", "Q").option(
        "segmentation", "allowed"
    ).mode("append").save(qm.root)
    browsed = qm.browse("Q")
    assert DeltaTable(store.queue_location(qm.root, "Q")).version() == 1
    segments = browsed.filter(browsed["segmented"]).to_pylist()
    assert [(s["payload"], s["offset"], s["last_segment"]) for s in segments] == [
        (b"0123", 0, False),
        (b"4567", 4, False),
        (b"89", 8, True),
    ]
    assert len({s["group_id"] for s in segments}) == 1 and len({s["msg_id"] for s in segments}) == 1


# Errors: each names the queue, the field or option and the value, and leaves the table as it was.


def _fails_batch(spark, qm, rows, schema, message, **options):
    before = _table_state(qm, "Q")
    with pytest.raises(Exception, match=re.escape(message)):
        spark.createDataFrame(rows, schema).write.format("mq").option("queue", "Q").options(**options).mode(
            "append"
        ).save(qm.root)
    assert _table_state(qm, "Q") == before


@pytest.mark.parametrize(
    ("rows", "schema", "message"),
    [
        (
            [("a", 1), ("x", 10)],
            "payload string, priority int",
            "MQRC_PRIORITY_ERROR (2050): queue Q: field priority has value 10 in message 1: must be 0-9",
        ),
        (
            [("a", None), ("x", "G")],
            "payload string, group_id string",
            "MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field msg_seq_number has value None in message 1: "
            "is missing for a message in group G",
        ),
        (
            [("a",), ("toolong",)],
            "payload string",
            "MQRC_MSG_TOO_BIG_FOR_Q (2030): queue Q: field payload of message 1 is 7 bytes, longer than "
            "max_message_length 5 (segmentation not allowed)",
        ),
    ],
    ids=["priority-10", "group-without-seq", "too-long"],
)
def test_bad_row_fails_the_whole_batch(spark, qm, rows, schema, message):
    qm.define_queue("Q", max_message_length=5)
    qm.put("Q", [{"payload": "old"}])
    # One partition, so the good row and the bad one are in the same task.
    before = _table_state(qm, "Q")
    with pytest.raises(Exception, match=re.escape(message)):
        spark.createDataFrame(rows, schema).coalesce(1).write.format("mq").option("queue", "Q").mode("append").save(
            qm.root
        )
    assert _table_state(qm, "Q") == before


def test_duplicate_seq_across_tasks_fails_the_batch(spark, qm):
    qm.define_queue("Q")
    before = _table_state(qm, "Q")
    rows = spark.createDataFrame([("a", "G", 1), ("b", "G", 1)], "payload string, group_id string, msg_seq_number int")
    with pytest.raises(
        Exception,
        match=re.escape(
            "MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field msg_seq_number: group G has msg_seq_number 1 twice"
        ),
    ):
        rows.repartition(2).write.format("mq").option("queue", "Q").mode("append").save(qm.root)
    assert _table_state(qm, "Q") == before


def test_duplicate_seq_against_committed_fails_the_batch(spark, qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "a", "group_id": "G", "msg_seq_number": 1}])
    _fails_batch(
        spark,
        qm,
        [("b", "G", 1)],
        "payload string, group_id string, msg_seq_number int",
        "MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field msg_seq_number: group G has msg_seq_number 1 twice",
    )


def test_queue_full_fails_the_batch(spark, qm):
    qm.define_queue("Q", max_depth=3)
    qm.put("Q", [{"payload": "a"}])
    _fails_batch(
        spark,
        qm,
        [("b",), ("c",), ("d",)],
        "payload string",
        "MQRC_Q_FULL (2053): queue Q is full (max_depth 3, depth 1, put of 3)",
    )


@pytest.mark.parametrize(
    ("schema", "rows", "options", "message"),
    [
        ("payload int", [(1,)], {}, "queue Q: field payload has type int32, expected binary"),
        ("payload string, colour string", [("x", "red")], {}, "queue Q: unknown field 'colour'; fields are msg_id"),
        ("priority int", [(1,)], {}, "queue Q: field payload is required"),
        (
            "payload string",
            [("x",)],
            {"segmentation": "sometimes"},
            "option segmentation must be one of allowed, not_allowed; got 'sometimes'",
        ),
        (
            "payload string",
            [("x",)],
            {"cluster": "C1"},
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue manager QM1 is not a member of cluster C1",
        ),
        ("payload string", [("x",)], {"producerId": " "}, "option producerId must not be blank"),
        (
            "payload string",
            [("x",)],
            {"segmentaton": "allowed"},
            'option segmentaton is unknown to df.write or df.writeStream .format("mq"): did you mean segmentation? '
            "its options are queue, segmentation, producerId, cluster, bind, qmgr, reconnect, reconnectTimeout",
        ),
        (
            "payload string",
            [("x",)],
            {"consumer": "billing"},
            "option consumer is unknown to df.write or df.writeStream",
        ),
    ],
    ids=[
        "payload-int",
        "unknown-column",
        "no-payload",
        "bad-segmentation",
        "cluster",
        "blank-producer",
        "misspelled",
        "get-option",
    ],
)
def test_bad_input_or_options_fail_before_any_task(spark, qm, schema, rows, options, message):
    qm.define_queue("Q")
    before = _table_state(qm, "Q")
    with pytest.raises(AnalysisException, match=re.escape(message)):
        spark.createDataFrame(rows, schema).write.format("mq").option("queue", "Q").options(**options).mode(
            "append"
        ).save(qm.root)
    assert _table_state(qm, "Q") == before


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        ("NOPE", "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1"),
        ("SHUT", "MQRC_PUT_INHIBITED (2051): queue SHUT is put-inhibited"),
    ],
)
def test_unknown_or_inhibited_queue_fails_at_start(spark, qm, tmp_path, queue, message):
    qm.define_queue("SHUT", put_inhibited=True)
    source = tmp_path / "in"
    _write_json_batch(source, "0", [{"payload": "x"}])
    query = (
        spark.readStream.schema("payload string")
        .json(str(source))
        .writeStream.format("mq")
        .option("queue", queue)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start(qm.root)
    )
    # Spark asks for the stream writer when it plans the first micro-batch, not at start().
    with pytest.raises(StreamingQueryException, match=re.escape(message)):
        query.awaitTermination()
    assert _table_state(qm, "SHUT") == (0, [])


def test_overwrite_is_refused(spark, qm):
    qm.define_queue("Q")
    with pytest.raises(
        AnalysisException, match=re.escape('the mq sink only appends: use mode("append"), not overwrite')
    ):
        spark.createDataFrame([("x",)], "payload string").write.format("mq").option("queue", "Q").mode(
            "overwrite"
        ).save(qm.root)


def test_streaming_bad_row_stops_the_query_and_writes_nothing(spark, qm, tmp_path):
    qm.define_queue("Q")
    source = tmp_path / "in"
    _write_json_batch(source, "0", [{"payload": "fine"}])
    _write_json_batch(source, "1", [{"payload": "bad", "group_id": "G"}])
    reader = spark.readStream.schema("payload string, group_id string").option("maxFilesPerTrigger", 1)
    query = (
        reader.json(str(source))
        .writeStream.format("mq")
        .option("queue", "Q")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start(qm.root)
    )
    with pytest.raises(
        Exception,
        match=re.escape("MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field msg_seq_number has value None in message 0"),
    ):
        query.awaitTermination()
    assert qm.browse("Q")["payload"].to_pylist() == [b"fine"]
    assert _table_state(qm, "Q") == (
        1,
        [os.path.basename(p) for p in DeltaTable(store.queue_location(qm.root, "Q")).file_uris()],
    )


def test_reply_and_failure_queues_are_put_from_spark(spark, qm):
    qm.define_queue("Q")
    spark.createDataFrame(
        [("request", "REPLIES", "QM2", "REQUESTS.FAILED"), ("note", None, None, None)],
        "payload string, reply_to_queue string, reply_to_qmgr string, failure_queue string",
    ).write.format("mq").option("queue", "Q").mode("append").save(qm.root)
    actual = _queue_table(spark, qm, "Q").select("payload", "reply_to_queue", "reply_to_qmgr", "failure_queue")
    expected = spark.createDataFrame(
        [(b"note", None, None, None), (b"request", "REPLIES", "QM2", "REQUESTS.FAILED")],
        "payload binary, reply_to_queue string, reply_to_qmgr string, failure_queue string",
    )
    assert_df_equality(actual.orderBy("payload"), expected, ignore_nullable=True)


def test_a_root_without_a_queue_manager_is_2085_for_a_write_as_for_a_read(spark, tmp_path):
    root = str(tmp_path / "nothing-here")
    message = re.escape(f"MQRC_UNKNOWN_OBJECT_NAME (2085): no queue manager at {root}")
    with pytest.raises(AnalysisException, match=message):
        spark.createDataFrame([("x",)], "payload string").write.format("mq").option("queue", "Q").mode("append").save(
            root
        )
    with pytest.raises(AnalysisException, match=message):
        spark.read.format("mq").option("queue", "Q").load(root)
    assert not os.path.exists(root)
