"""Failed messages: explicit backout, retry delay, held groups, moves at the limit, bad input.

Real streaming queries on the shared SparkSession, real Delta tables.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pyarrow as pa
import pytest

import mqspark
from mqspark import MQError, MQValidationError, QueueManager, Reason
from mqspark.engine.backout import BackoutPolicy, failures
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.qmgr import engine

from .support.samples import dead_letters

ROWS = "delivery_seq, payload, backout_count, group_id"


def _wait_listener(spark) -> None:
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(30_000)


def _run(
    spark,
    qm: QueueManager,
    checkpoint,
    handle: Callable[[list[dict], object], None],
    until: Callable[[list[list[dict]]], bool],
    queue: str = "Q",
    consumer: str = "default",
    timeout: float = 90,
) -> list[list[dict]]:
    """Run a get with a foreachBatch consumer until ``until(batches)``; each non-empty batch as rows
    (with the time it was seen). ``handle(rows, df)`` is the consumer's processing."""
    batches: list[list[dict]] = []
    ids: list[int] = []

    def process(df, batch_id: int) -> None:
        rows = [
            {**row.asDict(), "payload": row.payload.decode(), "seen": time.time()}
            for row in df.select("delivery_seq", "payload", "backout_count", "group_id", "queue")
            .orderBy("delivery_seq")
            .collect()
        ]
        if rows:
            handle(rows, df)
            batches.append(rows)
            ids.append(batch_id)

    query = (
        spark.readStream.format("mq")
        .option("queue", queue)
        .option("consumer", consumer)
        .load(qm.root)
        .writeStream.foreachBatch(process)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    deadline = time.monotonic() + timeout
    try:
        while not until(batches) and time.monotonic() < deadline and query.isActive:
            time.sleep(0.1)
        # The last batch counts as consumed once it has completed: stop after its progress.
        while ids and query.isActive and time.monotonic() < deadline:
            if (query.lastProgress or {}).get("batchId", -1) >= ids[-1]:
                break
            time.sleep(0.05)
    finally:
        query.stop()
        _wait_listener(spark)
    assert until(batches), f"timed out with batches {batches}"
    return batches


def _payloads(batches: list[list[dict]]) -> list[list[tuple[str, int]]]:
    return [[(row["payload"], row["backout_count"]) for row in batch] for batch in batches]


def _back_out_once(root: str, payloads: set[str], error: str = "cannot parse", consumer: str = "default"):
    """A consumer that backs out each message of ``payloads`` the first time it sees it."""
    seen: set[str] = set()

    def handle(rows: list[dict], df) -> None:
        bad = [row for row in rows if row["payload"] in payloads and row["payload"] not in seen]
        seen.update(row["payload"] for row in bad)
        if bad:
            assert mqspark.backout(bad, error, root=root, consumer=consumer) == len(bad)

    return handle


def test_backed_out_message_comes_back_after_the_retry_delay(spark, qm, tmp_path):
    qm.define_queue("Q", retry_count=3, retry_delay=2.0)
    qm.put("Q", [{"payload": p} for p in ("m0", "m1", "m2")])
    batches = _run(spark, qm, tmp_path / "ck", _back_out_once(qm.root, {"m1"}), lambda b: sum(len(x) for x in b) >= 4)
    assert _payloads(batches) == [[("m0", 0), ("m1", 0), ("m2", 0)], [("m1", 1)]]
    assert batches[1][0]["seen"] - batches[0][0]["seen"] >= 2.0
    assert qm.depth("Q", consumer="default") == 0


def test_failed_group_item_holds_its_group_but_not_other_messages(spark, qm, tmp_path):
    qm.define_queue("Q", retry_count=3, retry_delay=6.0)
    qm.put(
        "Q",
        [
            {"payload": "g1", "group_id": "G", "msg_seq_number": 1},
            {"payload": "g2", "group_id": "G", "msg_seq_number": 2, "last_in_group": True},
            {"payload": "x"},
        ],
    )
    back_out = _back_out_once(qm.root, {"g1"})

    def handle(rows: list[dict], df) -> None:
        back_out(rows, df)
        if rows[0]["payload"] == "g1" and rows[0]["backout_count"] == 0:
            qm.put("Q", [{"payload": "y"}])

    batches = _run(spark, qm, tmp_path / "ck", handle, lambda b: sum(len(x) for x in b) >= 6)
    # y flows past the held group at once; g1 comes back after the delay, g2 behind it.
    assert _payloads(batches) == [[("g1", 0), ("g2", 0), ("x", 0)], [("y", 0)], [("g1", 1), ("g2", 0)]]
    assert batches[2][0]["seen"] - batches[0][0]["seen"] >= 6.0
    assert qm.depth("Q", consumer="default") == 0


def test_backing_out_again_in_a_replayed_batch_counts_once(spark, qm, tmp_path):
    qm.define_queue("Q", retry_count=5)
    qm.put("Q", [{"payload": "m0"}, {"payload": "m1"}])
    calls = []

    def handle(rows: list[dict], df) -> None:
        calls.append([row["payload"] for row in rows])
        mqspark.backout([rows[1]], "first", root=qm.root)
        mqspark.backout([rows[1]], "again", root=qm.root)

    _run(spark, qm, tmp_path / "ck", handle, lambda b: len(b) >= 1)
    state = ConsumerState(qm.root, "Q")
    failed = failures(state, "default").to_pylist()
    assert [(row["backout_count"], row["error"]) for row in failed] == [(1, "first")]


def test_threshold_moves_the_message_to_the_backout_queue_with_its_header(spark, qm, tmp_path):
    qm.define_queue("BOQ")
    qm.define_queue("Q", backout_threshold=2, backout_queue="BOQ")
    qm.put("Q", [{"payload": "bad", "correl_id": "c-1"}, {"payload": "good"}])

    def handle(rows: list[dict], df) -> None:
        bad = [row for row in rows if row["payload"] == "bad"]
        if bad:
            mqspark.backout(bad, f"parse error {bad[0]['backout_count']}", root=qm.root)

    before = datetime.now(UTC)
    # A move's put lands before its record is finished: wait for the group's depth too.
    batches = _run(spark, qm, tmp_path / "ck", handle, lambda b: qm.depth("BOQ") == 1 and qm.depth("Q", "default") == 0)
    assert _payloads(batches) == [[("bad", 0), ("good", 0)], [("bad", 1)]]
    moved = qm.browse("BOQ").to_pylist()
    assert [(m["payload"], m["correl_id"], m["backout_count"]) for m in moved] == [(b"bad", "c-1", 2)]
    header = moved[0]
    assert (header["dlq_reason"], header["dlq_original_queue"], header["dlq_original_qmgr"]) == (2362, "Q", "QM1")
    assert header["dlq_reason_text"] == (
        "backout count 2 reached the backout threshold 2 of queue Q; last error: parse error 1"
    )
    assert header["dlq_time"] >= before
    assert qm.depth("Q", consumer="default") == 0


def test_used_up_retries_move_the_message_to_the_error_queue(spark, qm, tmp_path):
    qm.define_queue("EQ")
    qm.define_queue("Q", retry_count=1, error_queue="EQ")
    qm.put("Q", [{"payload": "bad"}])

    def handle(rows: list[dict], df) -> None:
        mqspark.backout(rows, "service failed", root=qm.root)

    batches = _run(spark, qm, tmp_path / "ck", handle, lambda b: qm.depth("EQ") == 1)
    assert _payloads(batches) == [[("bad", 0)], [("bad", 1)]]
    moved = qm.browse("EQ").to_pylist()
    assert [(m["payload"], m["backout_count"], m["dlq_reason"]) for m in moved] == [
        (b"bad", 2, int(Reason.MQFB_RETRIES_EXHAUSTED))
    ]
    assert moved[0]["dlq_reason_text"] == (
        "retry count 1 of queue Q used up after 2 failed deliveries; last error: service failed"
    )


def test_nothing_configured_moves_the_message_at_its_fifth_failure(spark, qm, tmp_path):
    """One passing error does not cost a message its place: with no limit set, a message that fails is
    delivered again, and moves to the dead-letter queue at the default delivery limit (5)."""
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "bad"}, {"payload": "good"}])

    def handle(rows: list[dict], df) -> None:
        mqspark.backout([row for row in rows if row["payload"] == "bad"], "still failing", root=qm.root)

    # The move lands before the planner's next state commit records the batch consumed: wait for both.
    batches = _run(
        spark,
        qm,
        tmp_path / "ck",
        handle,
        lambda b: qm.depth(engine(qm).dead_letter_queue) == 1 and qm.depth("Q", consumer="default") == 0,
    )
    assert _payloads(batches) == [[("bad", 0), ("good", 0)], [("bad", 1)], [("bad", 2)], [("bad", 3)], [("bad", 4)]]
    moved = qm.browse(engine(qm).dead_letter_queue).to_pylist()
    assert [(m["payload"], m["backout_count"], m["dlq_reason"], m["dlq_original_queue"]) for m in moved] == [
        (b"bad", 5, int(Reason.MQFB_RETRIES_EXHAUSTED), "Q")
    ]
    assert moved[0]["dlq_reason_text"] == (
        "default delivery limit 5 of queue Q (it sets no limit) used up after 5 failed deliveries; "
        "last error: still failing"
    )
    assert qm.depth("Q", consumer="default") == 0


@pytest.mark.parametrize(
    ("attributes", "counts"),
    [
        # MQ only: the backout queue at the threshold.
        ({"backout_threshold": 3, "backout_queue": "BOQ"}, {1: None, 2: None, 3: "BOQ"}),
        # MQ's threshold without a backout queue: the dead-letter queue.
        ({"backout_threshold": 2}, {1: None, 2: "SYSTEM.DEAD.LETTER.QUEUE"}),
        # Tuxedo only: after retry_count retries, the error queue.
        ({"retry_count": 2, "error_queue": "EQ"}, {2: None, 3: "EQ"}),
        # Both: the first limit reached wins...
        ({"backout_threshold": 4, "backout_queue": "BOQ", "retry_count": 1, "error_queue": "EQ"}, {2: "EQ"}),
        # ... and at a tie, MQ's backout queue.
        ({"backout_threshold": 2, "backout_queue": "BOQ", "retry_count": 1, "error_queue": "EQ"}, {2: "BOQ"}),
        # Nothing configured: the dead-letter queue at the default delivery limit.
        ({}, {4: None, 5: "SYSTEM.DEAD.LETTER.QUEUE"}),
        # Tuxedo's retry count 0, set with an error queue: no retry.
        ({"error_queue": "EQ"}, {1: "EQ"}),
        # MQ's threshold alone: the default limit is not in force.
        ({"backout_threshold": 8}, {7: None, 8: "SYSTEM.DEAD.LETTER.QUEUE"}),
    ],
)
def test_where_mq_and_tuxedo_rules_meet(qm, attributes, counts):
    for name in ("BOQ", "EQ"):
        qm.define_queue(name)
    qm.define_queue("Q", **attributes)
    policy = BackoutPolicy.of(engine(qm), qm.inquire_queue("Q"))
    for count, queue in counts.items():
        destination = policy.destination(count, None)
        assert (destination.queue if destination else None) == queue


def test_backing_out_rows_not_in_the_batch_is_refused_and_records_nothing(spark, qm, tmp_path):
    qm.define_queue("Q", retry_count=3)
    qm.put("Q", [{"payload": "m0"}])
    errors = []

    def handle(rows: list[dict], df) -> None:
        with pytest.raises(MQValidationError) as refused:
            mqspark.backout([{"queue": "Q", "delivery_seq": 0}, {"queue": "Q", "delivery_seq": 7}], "x", root=qm.root)
        errors.append(str(refused.value))

    _run(spark, qm, tmp_path / "ck", handle, lambda b: len(b) >= 1)
    assert errors == [
        "backout: queue Q: delivery_seq 7 not in the batch consumer group 'default' is processing; "
        "nothing was backed out"
    ]
    assert failures(ConsumerState(qm.root, "Q"), "default").num_rows == 0
    assert qm.depth("Q", consumer="default") == 0


def test_backout_outside_a_batch_is_refused(qm):
    qm.define_queue("Q")
    with pytest.raises(
        MQValidationError,
        match=re.escape(
            "backout: queue Q: delivery_seq 0 not in the batch consumer group 'default' is processing; "
            "nothing was backed out"
        ),
    ):
        mqspark.backout(pa.table({"queue": ["Q"], "delivery_seq": [0]}), "x", root=qm.root)
    with pytest.raises(MQValidationError, match=re.escape("backout: error must be a non-empty text, got ''")):
        mqspark.backout([{"queue": "Q", "delivery_seq": 0}], "", root=qm.root)
    with pytest.raises(
        MQValidationError, match=re.escape("backout: rows lack the column(s) delivery_seq of delivered messages")
    ):
        mqspark.backout([{"queue": "Q"}], "x", root=qm.root)
    with pytest.raises(MQError, match="MQRC_UNKNOWN_OBJECT_NAME"):
        mqspark.backout([{"queue": "NOPE", "delivery_seq": 0}], "x", root=qm.root)


def test_a_backout_queue_deleted_since_it_was_named_sends_to_the_dead_letter_queue(spark, qm, tmp_path):
    qm.define_queue("BOQ")
    qm.define_queue("Q", backout_threshold=1, backout_queue="BOQ")
    qm.delete_queue("BOQ")
    qm.put("Q", [{"payload": "bad"}])

    def handle(rows: list[dict], df) -> None:
        mqspark.backout(rows, "broken", root=qm.root)

    _run(
        spark,
        qm,
        tmp_path / "ck",
        handle,
        lambda b: qm.depth(engine(qm).dead_letter_queue) == 1 and qm.depth("Q", "default") == 0,
    )
    moved = qm.browse(engine(qm).dead_letter_queue).to_pylist()
    assert [(m["payload"], m["dlq_reason"], m["dlq_reason_text"]) for m in moved] == [
        (
            b"bad",
            2362,
            "backout count 1 reached the backout threshold 1 of queue Q; last error: broken; not moved to "
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue BOQ is not defined in queue manager QM1",
        )
    ]
    assert qm.depth("Q", consumer="default") == 0


def test_redrive_round_trip_moves_back_once_in_order_with_the_count_reset(spark, qm, tmp_path):
    qm.define_queue("BOQ")
    qm.define_queue("Q", backout_threshold=1, backout_queue="BOQ")
    qm.put(
        "Q",
        [
            {"payload": "g1", "group_id": "G", "msg_seq_number": 1},
            {"payload": "g2", "group_id": "G", "msg_seq_number": 2, "last_in_group": True},
            {"payload": "x", "correl_id": "cx"},
        ],
    )

    def handle(rows: list[dict], df) -> None:
        mqspark.backout([row for row in rows if row["backout_count"] == 0], "down", root=qm.root)

    # The moves finished (not only their puts): the group's depth is 0 once they did.
    _run(spark, qm, tmp_path / "ck", handle, lambda b: qm.depth("BOQ") == 3 and qm.depth("Q", "default") == 0)
    assert [m["payload"] for m in qm.browse("BOQ").to_pylist()] == [b"g1", b"g2", b"x"]
    # Only x first, by correl_id.
    assert qm.redrive("BOQ", correl_ids=["cx"]) == {"Q": 1}
    # Group G's originals are still in Q (consumed, not yet removed): its copies go back for the group
    # that moved them, which the group rules do not refuse; a second redrive finds nothing.
    assert qm.redrive("BOQ") == {"Q": 2}
    assert qm.redrive("BOQ") == {}
    assert qm.depth("BOQ") == 0
    batches = _run(spark, qm, tmp_path / "ck2", lambda rows, df: None, lambda b: sum(len(x) for x in b) >= 3)
    assert _payloads(batches) == [[("x", 0), ("g1", 0), ("g2", 0)]]
    assert [row["group_id"] for row in batches[0]] == [None, "G", "G"]
    assert qm.depth("Q", consumer="default") == 0


def test_redrive_refuses_bad_selectors_and_changes_nothing(qm):
    qm.define_queue("Q")
    dead_letters(qm, engine(qm).dead_letter_queue, [{"payload": "a", "fields": {}, "reason": 2362}])
    with pytest.raises(
        MQValidationError,
        match=re.escape("redrive: queue SYSTEM.DEAD.LETTER.QUEUE: msg_ids must be a non-empty list, got 'abc'"),
    ):
        qm.redrive(engine(qm).dead_letter_queue, msg_ids="abc")
    with pytest.raises(MQError, match=re.escape("MQRC_UNKNOWN_OBJECT_NAME (2085)")):
        qm.redrive("NOPE")
    assert qm.depth(engine(qm).dead_letter_queue) == 1
    assert qm.redrive(engine(qm).dead_letter_queue, reasons=[2053]) == {}
    assert qm.redrive(engine(qm).dead_letter_queue, reasons=[2362]) == {"Q": 1}
    assert [m["payload"] for m in qm.browse("Q").to_pylist()] == [b"a"]
    assert qm.browse("Q").to_pylist()[0]["dlq_reason"] is None


def test_cli_redrive_selects_by_msg_id_and_reports_what_moved(qm, capsys):
    import json

    from mqspark.cli.main import main

    qm.define_queue("Q")
    dead_letters(
        qm,
        engine(qm).dead_letter_queue,
        [{"payload": p, "fields": {"msg_id": p}, "reason": 2362} for p in ("a", "b")],
    )
    assert main(["--root", qm.root, "redrive", engine(qm).dead_letter_queue, "--msg-id", "b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"queue": engine(qm).dead_letter_queue, "to": "Q", "messages": 1}]
    assert [m["payload"] for m in qm.browse("Q").to_pylist()] == [b"b"]
    assert main(["--root", qm.root, "redrive", "NOPE", "--json"]) == 1
    assert capsys.readouterr().err == (
        "mqspark: error: MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1\n"
    )
    with pytest.raises(SystemExit) as usage:
        main(["--root", qm.root, "redrive", engine(qm).dead_letter_queue, "--reason", "x"])
    assert usage.value.code == 2
    assert "argument --reason: invalid int value: 'x'" in capsys.readouterr().err


def test_a_redriven_message_goes_back_only_to_the_consumer_group_that_failed_it(qm):
    qm.define_queue("BO")
    qm.define_queue("Q", backout_threshold=1, backout_queue="BO")
    for group in ("A", "B"):
        qm.declare_consumer("Q", group)
    qm.put("Q", [{"payload": b"m1"}])
    with pytest.raises(RuntimeError), qm.syncpoint_get("Q", consumer="A"):
        raise RuntimeError("A cannot process m1")
    assert qm.get("Q", consumer="B")["payload"].to_pylist() == [b"m1"]
    assert qm.get("Q", consumer="A").num_rows == 0  # at the threshold: moved to BO
    assert qm.browse("BO")["payload"].to_pylist() == [b"m1"]
    assert qm.redrive("BO") == {"Q": 1}
    assert qm.get("Q", consumer="A")["payload"].to_pylist() == [b"m1"]
    assert qm.get("Q", consumer="B").num_rows == 0


def test_a_redriven_group_item_is_delivered_after_its_groups_earlier_items(qm):
    qm.define_queue("BO")
    qm.define_queue("Q", backout_threshold=1, backout_queue="BO")
    qm.put(
        "Q", [{"payload": f"g{n}", "group_id": "G", "msg_seq_number": n, "last_in_group": n == 3} for n in (1, 2, 3)]
    )
    assert qm.get("Q")["payload"].to_pylist() == [b"g1"]
    with pytest.raises(RuntimeError), qm.syncpoint_get("Q"):
        raise RuntimeError("g2 cannot be processed")
    assert qm.get("Q", max_messages=5)["payload"].to_pylist() == [b"g3"]  # g2 moved at the threshold
    assert qm.redrive("BO") == {"Q": 1}
    assert qm.get("Q")["payload"].to_pylist() == [b"g2"]
