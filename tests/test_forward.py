"""The forwarding service: replies correlated to their requests, failures to the failure queue,
retries, undeliverable replies to the dead-letter queue, and bad input. Real streaming queries on the
shared SparkSession, real Delta tables."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from chispa import assert_df_equality

import mqspark
from mqspark import MQError, MQValidationError, Reason
from mqspark.engine.state_compaction import compact_rows
from mqspark.engine.state_rows import STATE_SCHEMA

from .support.service_functions import fails_on_bad, returns_a_number, slow_on_slow, upper

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def _drain(query) -> list:
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return query.recentProgress


def _replies(spark, qm, queue: str = "REPLIES"):
    return spark.read.format("mq").option("queue", queue).load(qm.root)


def test_a_thousand_requests_get_a_thousand_correlated_replies(spark, qm):
    qm.define_queue("REQUESTS")
    qm.define_queue("REPLIES")
    requests = [
        {
            "payload": f"request {i}",
            "reply_to_queue": "REPLIES",
            "priority": i % 10,
            **({"correl_id": f"c{i}"} if i % 2 else {}),
        }
        for i in range(1000)
    ]
    msg_ids = qm.put("REQUESTS", requests)
    qm.put("REQUESTS", [{"payload": "no reply wanted"}])
    progress = _drain(mqspark.forward(spark, qm.root, "REQUESTS", upper, exit_when_empty=True))

    expected = spark.createDataFrame(
        [
            (request.get("correl_id", msg_id), f"REQUEST {i}".encode(), i % 10, "0")
            for i, (request, msg_id) in enumerate(zip(requests, msg_ids, strict=True))
        ],
        "correl_id string, payload binary, priority int, return_code string",
    )
    replies = _replies(spark, qm)
    actual = replies.select(
        "correl_id", "payload", "priority", replies.properties["mqspark.return_code"].alias("return_code")
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
    assert qm.depth("REQUESTS", consumer="forward") == 0
    observed = [p.observedMetrics["forward"] for p in progress if "forward" in p.observedMetrics]
    assert sum(row["requests"] for row in observed) == 1001
    assert sum(row["without_reply_queue"] for row in observed) == 1


def test_a_request_that_always_fails_goes_to_its_failure_queue_with_the_error(spark, qm):
    qm.define_queue("REQUESTS", retry_count=1, retry_delay=0)
    qm.define_queue("REQUESTS.FAILED")
    qm.define_queue("REPLIES")
    qm.put(
        "REQUESTS",
        [
            {"payload": "bad", "correl_id": "r1", "reply_to_queue": "REPLIES", "failure_queue": "REQUESTS.FAILED"},
            {"payload": "good", "correl_id": "r2", "reply_to_queue": "REPLIES"},
        ],
    )
    _drain(mqspark.forward(spark, qm.root, "REQUESTS", fails_on_bad, exit_when_empty=True))
    failed = qm.browse("REQUESTS.FAILED")
    assert failed["payload"].to_pylist() == [b"bad"]
    assert failed["correl_id"].to_pylist() == ["r1"]
    assert failed["backout_count"].to_pylist() == [2]
    assert failed["dlq_reason"].to_pylist() == [int(Reason.MQFB_RETRIES_EXHAUSTED)]
    assert failed["dlq_reason_text"][0].as_py() == (
        "retry count 1 of queue REQUESTS used up after 2 failed deliveries; "
        "last error: ServiceError: no stock for item 7 (return code 7)"
    )
    replies = qm.browse("REPLIES")
    assert (replies["correl_id"].to_pylist(), replies["payload"].to_pylist()) == (["r2"], [b"ok"])
    assert qm.depth("REQUESTS", consumer="forward") == 0


class FailsOnce:
    """Fails the first call for each payload, then succeeds; remembers calls in a file, because the
    service runs in Spark's Python workers."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __call__(self, message: dict) -> bytes:
        with open(self.path, "a+", encoding="utf-8") as calls:
            calls.seek(0)
            seen = calls.read().splitlines()
            key = message["payload"].decode()
            calls.write(key + "\n")
        if key not in seen:
            raise RuntimeError(f"first call for {key} fails")
        return message["payload"] + b" done"


def test_a_request_that_fails_once_then_succeeds_gets_one_reply(spark, qm, tmp_path):
    qm.define_queue("REQUESTS", retry_count=2, retry_delay=0)
    qm.define_queue("REPLIES")
    qm.put("REQUESTS", [{"payload": "order", "correl_id": "o1", "reply_to_queue": "REPLIES"}])
    _drain(mqspark.forward(spark, qm.root, "REQUESTS", FailsOnce(tmp_path / "calls"), exit_when_empty=True))
    replies = qm.browse("REPLIES")
    assert (replies["correl_id"].to_pylist(), replies["payload"].to_pylist()) == (["o1"], [b"order done"])
    assert (tmp_path / "calls").read_text().splitlines() == ["order", "order"]
    assert qm.depth("REQUESTS", consumer="forward") == 0
    assert qm.depth(DLQ) == 0


def test_a_reply_to_an_unknown_queue_goes_to_the_dead_letter_queue_with_its_header(spark, qm):
    qm.define_queue("REQUESTS")
    qm.put("REQUESTS", [{"payload": "lost", "correl_id": "x1", "reply_to_queue": "NOWHERE"}])
    _drain(mqspark.forward(spark, qm.root, "REQUESTS", upper, exit_when_empty=True))
    dead = qm.browse(DLQ)
    assert dead["payload"].to_pylist() == [b"LOST"]
    assert dead["correl_id"].to_pylist() == ["x1"]
    assert dead["dlq_reason"].to_pylist() == [int(Reason.MQRC_UNKNOWN_OBJECT_NAME)]
    assert dead["dlq_original_queue"].to_pylist() == ["NOWHERE"]
    assert dead["dlq_original_qmgr"].to_pylist() == ["QM1"]
    assert dead["dlq_reason_text"][0].as_py() == (
        "reply not put: MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOWHERE is not defined in queue manager QM1"
    )


def test_a_service_that_returns_neither_bytes_nor_str_fails_the_request_with_a_clear_text(spark, qm):
    qm.define_queue("REQUESTS")
    qm.put("REQUESTS", [{"payload": "q", "reply_to_queue": "REQUESTS"}])
    _drain(mqspark.forward(spark, qm.root, "REQUESTS", returns_a_number, exit_when_empty=True))
    dead = qm.browse(DLQ)
    assert dead["payload"].to_pylist() == [b"q"]
    assert dead["dlq_reason_text"][0].as_py().endswith("last error: the service returned int, not bytes or str")


@pytest.mark.parametrize(
    "service, options, text",
    [
        (
            "no_such_module:handle",
            {},
            "forward: service 'no_such_module:handle' cannot be imported: No module named 'no_such_module'",
        ),
        ("os:sep", {}, "forward: service 'os:sep' is not callable"),
        ("upper", {}, "forward: service 'upper' must be given as module:function"),
        (
            upper,
            {"maxMessagesPerTriger": 5},
            "forward: queue REQUESTS: unknown option(s) maxMessagesPerTriger; options are maxMessagesPerTrigger, "
            "maxBytesPerTrigger, leaseTimeout, maintenanceInterval, instance, reconnect, reconnectTimeout",
        ),
        (upper, {"idle_interval": -1}, "forward: idle_interval must be a number of seconds >= 0, got -1"),
    ],
)
def test_bad_forward_arguments_are_refused_at_start(spark, qm, service, options, text):
    qm.define_queue("REQUESTS")
    with pytest.raises(MQValidationError) as refused:
        mqspark.forward(spark, qm.root, "REQUESTS", service, **options)
    assert str(refused.value) == text
    assert spark.streams.active == []


def test_request_gets_its_reply_raises_on_a_failure_record_and_times_out(spark, qm):
    qm.define_queue("REQUESTS")
    qm.define_queue("REPLIES")
    query = mqspark.forward(spark, qm.root, "REQUESTS", fails_on_bad, idle_interval=0.2)
    try:
        reply = mqspark.request(qm, "REQUESTS", "ping", reply_to="REPLIES", timeout=120)
        assert reply["payload"].to_pylist() == [b"ok"]
        assert reply["properties"].to_pylist() == [[("mqspark.return_code", "0")]]
        with pytest.raises(MQError) as failed:
            mqspark.request(qm, "REQUESTS", "bad", reply_to="REPLIES", timeout=120)
        # Nothing set on the queue: the service is called five times, then the requester hears.
        assert failed.value.reason == Reason.MQFB_RETRIES_EXHAUSTED
        assert re.fullmatch(
            r"MQFB_RETRIES_EXHAUSTED \(65536\): request [0-9a-f]{32} to queue REQUESTS failed: default delivery "
            r"limit 5 of queue REQUESTS \(it sets no limit\) used up after 5 failed deliveries; last error: "
            r"ServiceError: no stock for item 7 \(return code 7\)",
            str(failed.value),
        )
    finally:
        query.stop()
    with pytest.raises(MQError) as late:
        mqspark.request(qm, "REQUESTS", "nobody listens", reply_to="REPLIES", timeout=0.5)
    assert re.fullmatch(
        r"MQRC_NO_MSG_AVAILABLE \(2033\): request [0-9a-f]{32} to queue REQUESTS: no reply on queue REPLIES "
        r"within 0.5 s",
        str(late.value),
    )


def test_a_vectorised_service_replies_to_each_request_of_the_batch(spark, qm):
    qm.define_queue("REQUESTS")
    qm.define_queue("REPLIES")
    qm.put("REQUESTS", [{"payload": f"v{i}", "correl_id": f"c{i}", "reply_to_queue": "REPLIES"} for i in range(5)])
    service = "tests.support.service_functions:upper_all"
    _drain(mqspark.forward(spark, qm.root, "REQUESTS", service, vectorized=True, exit_when_empty=True))
    expected = spark.createDataFrame(
        [(f"c{i}", f"V{i}".encode()) for i in range(5)], "correl_id string, payload binary"
    )
    actual = _replies(spark, qm).select("correl_id", "payload")
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_a_call_over_its_time_limit_fails_its_request(spark, qm):
    qm.define_queue("REQUESTS")
    qm.define_queue("REPLIES")
    qm.put(
        "REQUESTS",
        [
            {"payload": "slow", "reply_to_queue": "REPLIES"},
            {"payload": "quick", "correl_id": "q", "reply_to_queue": "REPLIES"},
        ],
    )
    _drain(mqspark.forward(spark, qm.root, "REQUESTS", slow_on_slow, call_timeout=1, exit_when_empty=True))
    assert qm.browse("REPLIES")["correl_id"].to_pylist() == ["q"]
    dead = qm.browse(DLQ)
    assert dead["payload"].to_pylist() == [b"slow"]
    assert (
        dead["dlq_reason_text"][0]
        .as_py()
        .endswith("last error: ServiceError: the call ran over its time limit of 1 s (return code 0)")
    )


def test_compaction_keeps_a_reply_record_until_every_request_of_its_range_is_consumed():
    """Reply records are ranges of requests; a batch given up after its replies landed delivers
    them again in smaller batches, so part of a range may be consumed before the rest."""
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def rows(*given: dict) -> pa.Table:
        base = {"consumer": "forward", "owner": "o", "at": now}
        return pa.Table.from_pylist([{**base, **row} for row in given], schema=STATE_SCHEMA)

    state = rows(
        {"event": "plan", "plan_id": "p1", "seq": 1, "origin": "v0", "row": 0, "count": 2, "delivery_seq": 0},
        {"event": "consumed", "plan_id": "p1", "seq": 1},
        {"event": "reply", "plan_id": "p0", "seq": 0, "target": "T", "origin": "v0", "row": 0, "count": 4},
        {"event": "reply", "plan_id": "p0", "seq": 1, "target": "T", "origin": "v0", "row": 0, "count": 2},
        {"event": "reply", "plan_id": "p0", "seq": 2, "target": "T", "origin": "v0", "row": 1, "count": 2},
    )
    kept = compact_rows(state)
    replies = kept.filter(pc.equal(kept["event"], "reply")).select(["seq", "row", "count"]).to_pylist()
    assert replies == [{"seq": 0, "row": 0, "count": 4}, {"seq": 2, "row": 1, "count": 2}]


def test_a_reply_record_made_after_its_cancellation_stands():
    """A replay puts its replies with the plan's txn version again: the record of an attempt whose
    put did not land is cancelled, and the record of the next attempt of the same plan must count
    (else a later batch calls the service again and the request gets a second reply)."""
    from mqspark.engine.state_rows import reply_rows
    from mqspark.services.forward import live_reply_records

    entry = ("plan-1", 4, '["QM1", "REPLIES"]')
    ranges = pa.table({"origin": ["1:0"], "row": pa.array([28], pa.int64()), "count": pa.array([7], pa.int64())})
    columns = ["event", "plan_id", "seq", "target", "at", "origin", "row", "count"]

    def record(event: str, second: int) -> pa.Table:
        rows = reply_rows("forward", "owner", event, entry, ranges).select(columns)
        at = pa.array([datetime(2026, 11, 27, 2, 12, second, tzinfo=UTC)], rows.schema.field("at").type)
        return rows.set_column(columns.index("at"), rows.schema.field("at"), at)

    first, cancelled, second = record("reply", 1), record("unreplied", 2), record("reply", 3)
    live = [
        (found, mine["at"].to_pylist())
        for found, mine in live_reply_records(pa.concat_tables([first, cancelled, second]))
    ]
    assert live == [(entry, second["at"].to_pylist())]
    assert list(live_reply_records(pa.concat_tables([first, cancelled]))) == []
