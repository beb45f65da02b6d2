"""Reconnection of the streaming get and the sink against real outages of the queue manager root
(see tests/support/outages.py), with real streaming queries. Checkpoints live apart from the root."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime

import pytest
from deltalake import DeltaTable
from pyspark.errors import AnalysisException, StreamingQueryException

from mqspark import store
from mqspark.model.messages import MESSAGE_SCHEMA

from .support import reference_model
from .support.outages import break_root, outage, restore_root

OUTAGE = 3.0


def _fill(qm) -> list[tuple]:
    """Queue Q with groups spread over three puts; (msg_id, payload) in logical order."""
    qm.define_queue("Q", delivery_sequence="fifo")
    for put in range(3):
        rows = [{"payload": f"u{put}-{n}"} for n in range(3)]
        rows += [
            {"payload": f"g{put}-{n}", "group_id": f"G{put}", "msg_seq_number": n, "last_in_group": n == 3}
            for n in (1, 2, 3)
        ]
        qm.put("Q", rows)
    table = DeltaTable(store.queue_location(qm.root, "Q"))
    rows = store.read_committed(table, MESSAGE_SCHEMA.names, MESSAGE_SCHEMA).to_pylist()
    delivered = reference_model.delivered(rows, "fifo", datetime.now(UTC))
    return [(row["msg_id"], row["payload"].decode()) for row in delivered]


def _start_get(spark, qm, checkpoint, batches: dict, columns: tuple[str, ...] = ("msg_id", "payload"), **options):
    """A streaming get of queue Q that keeps each micro-batch's ``columns`` (payload last, decoded)
    in ``batches`` by batch id."""

    def collect(df, batch_id: int) -> None:
        rows = df.orderBy("delivery_seq").select(*columns).collect()
        if rows:
            # A batch replayed after a failure has the same id and the same rows.
            batches[batch_id] = [(*r[:-1], r[-1].decode()) for r in rows]

    return (
        spark.readStream.format("mq")
        .option("queue", "Q")
        .option("maxMessagesPerTrigger", "4")
        .options(**options)
        .load(qm.root)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def _wait(condition, query, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert query.isActive, f"the query ended: {query.exception()}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _delivered(batches: dict) -> list[tuple]:
    return [row for batch_id in sorted(batches) for row in batches[batch_id]]


def test_streaming_get_with_reconnect_yes_rides_out_an_outage(spark, qm, tmp_path):
    expected = _fill(qm)
    batches: dict[int, list] = {}
    query = _start_get(spark, qm, tmp_path / "ck", batches, reconnect="yes", reconnectTimeout="120")
    try:
        _wait(lambda: len(batches) >= 1, query)
        with outage(qm.root, OUTAGE):
            time.sleep(OUTAGE / 2)
            during = len(batches)
        _wait(lambda: len(_delivered(batches)) >= len(expected), query)
        # The last batch counts as consumed once the next one is planned.
        _wait(lambda: qm.depth("Q", consumer="default") == 0, query)
        assert query.exception() is None
        assert query.isActive
    finally:
        query.stop()
    assert during < len(expected) / 4
    assert _delivered(batches) == expected


@pytest.mark.parametrize(
    ("mode", "default", "why"),
    [("no", "no", "reconnect is no"), ("yes", "disabled", "reconnection is disabled on the queue manager")],
    ids=["no", "disabled-overrides-yes"],
)
def test_streaming_get_that_may_not_reconnect_fails_with_2009_and_a_restart_resumes_exactly(
    spark, qm, tmp_path, mode, default, why
):
    expected = _fill(qm)
    qm.alter_qmgr(default_reconnect=default)
    batches: dict[int, list] = {}
    query = _start_get(spark, qm, tmp_path / "ck", batches, reconnect=mode)
    try:
        _wait(lambda: len(batches) >= 1, query)
        break_root(qm.root)
        try:
            with pytest.raises(StreamingQueryException) as caught:
                query.awaitTermination(120)
        finally:
            restore_root(qm.root)
    finally:
        query.stop()
    assert re.search(
        rf"MQRC_CONNECTION_BROKEN \(2009\): streaming get of queue Q \((planning|partitions|read|commit)\): "
        rf"queue manager QM1 at {re.escape(qm.root)} cannot be reached \(.*\); {why}",
        str(caught.value),
    ), str(caught.value)
    again = _start_get(spark, qm, tmp_path / "ck", batches, reconnect=mode)
    try:
        _wait(lambda: len(_delivered(batches)) >= len(expected), again)
    finally:
        again.stop()
    assert _delivered(batches) == expected


def _input(tmp_path, files: int) -> list[str]:
    source = tmp_path / "input"
    source.mkdir()
    payloads = []
    for f in range(files):
        rows = [{"payload": f"f{f}-{n}"} for n in range(4)]
        payloads += [row["payload"] for row in rows]
        (source / f"part-{f:03d}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return payloads


def _start_put(spark, qm, tmp_path, **options):
    return (
        spark.readStream.schema("payload string")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "input"))
        .writeStream.format("mq")
        .option("queue", "Q")
        .options(**options)
        .option("checkpointLocation", str(tmp_path / "put"))
        .trigger(availableNow=True)
        .start(qm.root)
    )


def test_streaming_put_with_reconnect_qmgr_rides_out_an_outage_and_commits_each_batch_once(spark, qm, tmp_path):
    qm.define_queue("Q", delivery_sequence="fifo")
    payloads = _input(tmp_path, 8)
    query = _start_put(spark, qm, tmp_path, reconnect="qmgr", reconnectTimeout="120")
    try:
        _wait(lambda: qm.depth("Q") > 0, query)
        with outage(qm.root, OUTAGE):
            pass
        query.awaitTermination(180)
        assert query.exception() is None
    finally:
        query.stop()
    browsed = qm.browse("Q")
    assert sorted(browsed["payload"].to_pylist()) == sorted(p.encode() for p in payloads)
    assert len(set(browsed["msg_id"].to_pylist())) == len(payloads)


def test_streaming_put_with_reconnect_no_fails_with_2009(spark, qm, tmp_path):
    qm.define_queue("Q")
    _input(tmp_path, 40)
    query = _start_put(spark, qm, tmp_path, reconnect="no")
    try:
        _wait(lambda: qm.depth("Q") > 0, query)
        break_root(qm.root)
        try:
            with pytest.raises(StreamingQueryException) as caught:
                query.awaitTermination(120)
        finally:
            restore_root(qm.root)
    finally:
        query.stop()
    assert re.search(
        rf"MQRC_CONNECTION_BROKEN \(2009\): put to queue Q: (queue manager QM1|the queue manager) at "
        rf"{re.escape(qm.root)} cannot be reached \(.*\); reconnect is no",
        str(caught.value),
    ), str(caught.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"reconnect": "disabled"}, "option reconnect must be one of no, yes, qmgr; got 'disabled'"),
        ({"reconnectTimeout": "soon"}, "option reconnectTimeout must be a whole number >= 0, got 'soon'"),
    ],
    ids=["mode", "timeout"],
)
def test_bad_reconnect_options_fail_at_load_and_at_save(spark, qm, options, message):
    qm.define_queue("Q")
    with pytest.raises(AnalysisException, match=re.escape(message)):
        spark.readStream.format("mq").options(queue="Q", **options).load(qm.root)
    with pytest.raises(AnalysisException, match=re.escape(message)):
        spark.createDataFrame([("x",)], "payload string").write.format("mq").options(queue="Q", **options).mode(
            "append"
        ).save(qm.root)
    assert qm.depth("Q") == 0
