"""Sessions, the mq batch source and Delta interoperability in both directions."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

import mqspark
from mqspark import store
from mqspark.model.messages import MESSAGE_SCHEMA, QUEUE_TABLE_SCHEMA
from mqspark.spark.browse import batch_rows

from .support.samples import spec_example

EXPIRY = datetime(2036, 1, 2, 3, 4, 5, tzinfo=UTC)


def _put_sample(qm):
    qm.define_queue("ORDERS", default_priority=3)
    qm.put(
        "ORDERS",
        [
            {"payload": "a", "correl_id": "C1", "properties": {"k": "v"}},
            {"payload": b"\x00\x01", "priority": 8, "expiry": EXPIRY},
        ],
    )
    qm.put(
        "ORDERS", [{"payload": f"g{n}", "group_id": "G", "msg_seq_number": n, "last_in_group": n == 2} for n in (1, 2)]
    )


def test_session_has_delta_and_mq(spark):
    assert spark.conf.get("spark.sql.extensions") == "io.delta.sql.DeltaSparkSessionExtension"
    assert spark.conf.get("spark.sql.catalog.spark_catalog") == "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    assert "delta-spark" in spark.conf.get("spark.jars")
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"


def test_spark_read_mq_equals_browse(spark, qm):
    _put_sample(qm)
    actual = spark.read.format("mq").option("queue", "ORDERS").load(qm.root)
    expected = spark.createDataFrame(qm.browse("ORDERS"), schema=actual.schema)
    assert_df_equality(actual, expected)
    assert [r.payload for r in actual.collect()] == [b"\x00\x01", b"a", b"g1", b"g2"]


def test_spark_read_mq_limit(spark, qm):
    _put_sample(qm)
    rows = spark.read.format("mq").option("queue", "ORDERS").option("limit", "2").load(qm.root).collect()
    assert [r.payload for r in rows] == [b"\x00\x01", b"a"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, 'option queue is missing: give the queue to read, as in .option("queue", "ORDERS")'),
        ({"queue": "ORDERS", "order": "sideways"}, "option order must be one of logical, physical; got 'sideways'"),
        ({"queue": "ORDERS", "limit": "-1"}, "option limit must be a whole number >= 0, got '-1'"),
        (
            {"queue": "ORDERS", "maxMessagePerTrigger": "5"},
            'option maxmessagepertrigger is unknown to spark.read or spark.readStream .format("mq"): '
            "did you mean maxMessagesPerTrigger? its options are queue, order,",
        ),
        (
            {"queue": "ORDERS", "consumer": "billing"},
            "option consumer is for the streaming get (spark.readStream); browse does not take it",
        ),
    ],
    ids=["no-queue", "bad-order", "bad-limit", "misspelled", "get-only"],
)
def test_spark_read_mq_bad_options(spark, qm, options, message):
    qm.define_queue("ORDERS")
    with pytest.raises(AnalysisException, match=re.escape(message)):
        spark.read.format("mq").options(**options).load(qm.root).collect()


def test_spark_read_mq_unknown_queue(spark, qm):
    with pytest.raises(AnalysisException) as refused:
        spark.read.format("mq").option("queue", "NOPE").load(qm.root)
    # The MQ line follows Spark's and one frame, not the frames that led to it.
    spark_line, *frame, mq_line, _ = str(refused.value).splitlines()
    assert spark_line.startswith("[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance:")
    assert len(frame) == 2 and frame[0].lstrip().startswith('File "')
    assert mq_line == (
        "mqspark.errors.MQError: MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1"
    )


def test_queue_table_written_by_put_reads_with_delta_spark(spark, qm):
    _put_sample(qm)
    table = spark.read.format("delta").load(store.queue_location(qm.root, "ORDERS"))
    # commit_version stays null until maintenance rewrites a row.
    assert table.schema.fieldNames() == QUEUE_TABLE_SCHEMA.names
    browsed = qm.browse("ORDERS").select(MESSAGE_SCHEMA.names)
    browsed = browsed.append_column("commit_version", pa.nulls(browsed.num_rows, pa.int64()))
    expected = spark.createDataFrame(browsed, schema=table.schema)
    assert_df_equality(table.orderBy("msg_id"), expected.orderBy("msg_id"))
    first = table.where(F.col("correl_id") == "C1").first()
    assert (first.priority, first.properties, first.payload) == (3, {"k": "v"}, bytearray(b"a"))


def test_rows_appended_with_delta_spark_are_browsed(spark, qm):
    _put_sample(qm)
    location = store.queue_location(qm.root, "ORDERS")
    template = spark.read.format("delta").load(location).where("correl_id = 'C1'")
    replaced = {"msg_id": F.lit("from-spark"), "priority": F.lit(9).cast("int"), "payload": F.lit(b"spark")}
    appended = template.select(*[replaced.get(c, F.col(c)).alias(c) for c in template.columns])
    appended.write.format("delta").mode("append").save(location)
    browsed = qm.browse("ORDERS")
    assert browsed["msg_id"].to_pylist()[0] == "from-spark"
    assert browsed["payload"].to_pylist()[0] == b"spark"
    assert qm.depth("ORDERS") == 5


def test_delta_spark_refuses_rows_without_required_fields(spark, qm):
    qm.define_queue("ORDERS")
    location = store.queue_location(qm.root, "ORDERS")
    bad = spark.createDataFrame([("x",)], "msg_id string")
    with pytest.raises(
        Py4JJavaError,
        match=re.escape(
            "[DELTA_MISSING_NOT_NULL_COLUMN_VALUE] Column priority, which has a NOT NULL constraint, is missing"
        ),
    ):
        bad.write.format("delta").mode("append").save(location)
    assert qm.browse("ORDERS").num_rows == 0


@pytest.mark.parametrize(
    ("options", "browse_options"),
    [
        ({}, {}),
        ({"order": "physical"}, {"order": "physical"}),
        ({"completeMessage": "true"}, {"complete_message": True}),
        ({"allMessagesAvailable": "true"}, {"all_messages_available": True}),
        (
            {"groupId": "Y", "msgSeqNumber": "3", "completeMessage": "true"},
            {"group_id": "Y", "msg_seq_number": 3, "complete_message": True},
        ),
        ({"correlId": "REQ-1"}, {"correl_id": "REQ-1"}),
        ({"limit": "3"}, {"limit": 3}),
    ],
    ids=["logical", "physical", "complete-message", "all-available", "group-match", "correl-match", "limit"],
)
def test_spark_read_mq_agrees_with_browse(spark, qm, options, browse_options):
    spec_example(qm)
    qm.put("Q", [{"payload": "C", "correl_id": "REQ-1"}])
    actual = spark.read.format("mq").option("queue", "Q").options(**options).load(qm.root)
    expected = spark.createDataFrame(qm.browse("Q", **browse_options), schema=actual.schema)
    assert_df_equality(actual, expected)
    # Every group lands in one partition, in order.
    assert actual.rdd.getNumPartitions() == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"completeMessage": "yes"}, "option completeMessage must be true or false, got 'yes'"),
        ({"msgSeqNumber": "0", "groupId": "Y"}, "option msgSeqNumber must be a whole number >= 1, got '0'"),
        (
            {"order": "physical", "allMessagesAvailable": "true"},
            "options allMessagesAvailable and completeMessage need order logical",
        ),
    ],
    ids=["bad-flag", "bad-seq", "physical-with-group-option"],
)
def test_spark_read_mq_bad_delivery_options(spark, qm, options, message):
    qm.define_queue("Q")
    with pytest.raises(AnalysisException, match=re.escape(message)):
        spark.read.format("mq").option("queue", "Q").options(**options).load(qm.root)


def test_browse_batches_handed_to_spark_stay_small(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"x" * 1000} for _ in range(50)])
    table = qm.browse("Q")
    rows = batch_rows(table, target_bytes=10_000)
    assert 5 <= rows < 10
    assert max(batch.nbytes for batch in table.to_batches(max_chunksize=rows)) <= 2 * 10_000


def test_brief_shows_the_columns_read_first_and_the_payload_as_one_line_of_text(spark, qm):
    qm.define_queue("Q")
    payloads = [b"hello", "naïve".encode(), b"two\nlines\tand a \\", b"\x00\x01", b"\xff\xfe", b"bell\x07"]
    qm.put("Q", [{"payload": payload, "correl_id": f"c{n}"} for n, payload in enumerate(payloads)])
    view = mqspark.brief(spark.read.format("mq").option("queue", "Q").load(qm.root))
    assert view.columns == [
        "delivery_seq",
        "queue",
        "priority",
        "msg_id",
        "correl_id",
        "group_id",
        "msg_seq_number",
        "backout_count",
        "put_time",
        "payload",
    ]
    rows = view.orderBy("delivery_seq").select("correl_id", "payload").collect()
    assert [tuple(row) for row in rows] == [
        ("c0", "hello"),
        ("c1", "naïve"),
        ("c2", "two\\nlines\\tand a \\\\"),
        ("c3", "0x0001"),
        ("c4", "0xFFFE"),
        ("c5", "0x62656C6C07"),
    ]
