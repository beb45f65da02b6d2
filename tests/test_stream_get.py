"""The streaming get: logical order across micro-batches, admission control, consumer groups, replay.

Real streaming queries on the shared SparkSession, real Delta tables. The expected order always
comes from the reference model (tests/support/reference_model.py) over the queue's committed rows.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.errors import AnalysisException, StreamingQueryException

from mqspark import QueueManager, store
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.maintenance import DEFAULT_RETENTION, maintain
from mqspark.model.messages import MESSAGE_SCHEMA
from mqspark.qmgr import engine
from mqspark.spark import plain

from .support import reference_model
from .support.samples import spec_example

COLUMNS = "delivery_seq long, msg_id string, group_id string, msg_seq_number int, offset long, payload string"


def _reference(qm, queue: str = "Q", **options) -> list[tuple]:
    """(msg_id, offset, payload) of every message in the reference model's order."""
    table = DeltaTable(store.queue_location(qm.root, queue))
    rows = store.read_committed(table, MESSAGE_SCHEMA.names, MESSAGE_SCHEMA).to_pylist()
    sequence = qm.inquire_queue(queue).delivery_sequence
    delivered = reference_model.delivered(rows, sequence, datetime.now(UTC), **options)
    return [(row["msg_id"], row["offset"], row["payload"].decode()) for row in delivered]


def _orders(folder: Path, files: int) -> None:
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


def _put_orders(spark, source: Path, checkpoint: Path, root: str):
    """The streaming put of the order files in ``source`` into queue Q, a file per micro-batch."""
    return (
        spark.readStream.schema("payload string, group_id string, msg_seq_number int, last_in_group boolean")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("mq")
        .option("queue", "Q")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(root)
    )


def _expected_df(spark, expected: list[tuple]):
    rows = [(seq, msg_id, offset, payload) for seq, (msg_id, offset, payload) in enumerate(expected)]
    return spark.createDataFrame(rows, "delivery_seq long, msg_id string, offset long, payload string")


def _wait_listener(spark) -> None:
    """Listener events are asynchronous: let the listener see every query end before checking."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(30_000)


def _reader(spark, qm, queue: str = "Q", **options):
    return spark.readStream.format("mq").option("queue", queue).options(**options).load(qm.root)


def _drain(
    spark, qm, checkpoint, queue: str = "Q", fail_at: int | None = None, into: list | None = None, **options
) -> list[list[tuple]]:
    """Run an availableNow get to its end; each micro-batch as a list of (delivery_seq, msg_id, offset, payload)."""
    batches: list[list[tuple]] = [] if into is None else into

    def collect(df, batch_id: int) -> None:
        rows = df.orderBy("delivery_seq").select("delivery_seq", "msg_id", "offset", "payload").collect()
        batch = [(r.delivery_seq, r.msg_id, r.offset, r.payload.decode()) for r in rows]
        batches.append(batch)
        if fail_at is not None and batch_id == fail_at:
            raise RuntimeError(f"processing of batch {batch_id} failed")

    query = (
        _reader(spark, qm, queue, **options)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        _wait_listener(spark)
    return batches


def _payloads(batches: list[list[tuple]]) -> list[list[str]]:
    return [[row[3] for row in batch] for batch in batches if batch]


def _flat(batches: list[list[tuple]]) -> list[tuple]:
    return [row for batch in batches for row in batch]


def _spec_queue_with_priorities(qm) -> None:
    spec_example(qm)
    qm.put("Q", [{"payload": "P9", "priority": 9}, {"payload": "P3", "priority": 3}])


def test_drain_in_logical_order_higher_priorities_fill_batches_first(spark, qm, tmp_path):
    _spec_queue_with_priorities(qm)
    batches = _drain(spark, qm, tmp_path / "ck", maxMessagesPerTrigger="2")

    # The later, higher-priority messages come first; a batch never ends inside Y3's segments.
    assert _payloads(batches) == [["P9", "P3"], ["A", "Y1"], ["Y2"], ["Y3-1:", "Y3-2"], ["Z1", "Z2"], ["B"]]
    actual = spark.createDataFrame(_flat(batches), "delivery_seq long, msg_id string, offset long, payload string")
    assert_df_equality(actual, _expected_df(spark, _reference(qm)))
    assert qm.depth("Q", consumer="default") == 0
    # The only consumer group has drained the queue: MQ's CURDEPTH drops to 0.
    assert qm.depth("Q") == 0


def test_complete_message_joins_segments_and_counts_them_once(spark, qm, tmp_path):
    _spec_queue_with_priorities(qm)
    batches = _drain(spark, qm, tmp_path / "ck", maxMessagesPerTrigger="2", completeMessage="true")

    assert _payloads(batches) == [["P9", "P3"], ["A", "Y1"], ["Y2", "Y3-1:Y3-2"], ["Z1", "Z2"], ["B"]]
    assert [row[0] for row in _flat(batches)] == list(range(9))
    assert [row[1:] for row in _flat(batches)] == _reference(qm, complete_message=True)
    assert qm.depth("Q", consumer="default") == 0


def test_all_messages_available_keeps_a_group_in_one_batch(spark, qm, tmp_path):
    _spec_queue_with_priorities(qm)
    qm.put("Q", [{"payload": "W1", "group_id": "W", "msg_seq_number": 1}])
    batches = _drain(spark, qm, tmp_path / "ck", maxMessagesPerTrigger="2", allMessagesAvailable="true")

    # Group Y (4 rows) exceeds the limit: it goes whole, alone. W never completes, so it waits.
    assert _payloads(batches) == [["P9", "P3"], ["A"], ["Y1", "Y2", "Y3-1:", "Y3-2"], ["Z1", "Z2"], ["B"]]
    assert [row[1:] for row in _flat(batches)] == _reference(qm, all_messages_available=True)
    assert qm.depth("Q", consumer="default") == 1


def test_max_bytes_per_trigger_limits_payload_bytes(spark, qm, tmp_path):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "x" * 10} for _ in range(5)])
    batches = _drain(spark, qm, tmp_path / "ck", maxBytesPerTrigger="25")
    assert [len(batch) for batch in batches if batch] == [2, 2, 1]


def test_two_consumer_groups_each_get_every_message(spark, qm, tmp_path):
    _spec_queue_with_priorities(qm)
    first = _drain(spark, qm, tmp_path / "a", consumer="a")
    second = _drain(spark, qm, tmp_path / "b", consumer="b", maxMessagesPerTrigger="3")

    expected = _reference(qm)
    assert [row[1:] for row in _flat(first)] == expected
    assert [row[1:] for row in _flat(second)] == expected
    qm.put("Q", [{"payload": "late"}])
    # CURDEPTH counts what waits for at least one group: only the late message.
    assert (qm.depth("Q", consumer="a"), qm.depth("Q", consumer="b"), qm.depth("Q")) == (1, 1, 1)
    assert qm.consumers("Q") == ["a", "b"]


def test_a_new_query_of_a_group_gets_only_what_the_group_has_not_consumed(spark, qm, tmp_path):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "one"}, {"payload": "two"}])
    assert _payloads(_drain(spark, qm, tmp_path / "first")) == [["one", "two"]]
    qm.put("Q", [{"payload": "three"}])
    # Another checkpoint, same group: delivery_seq carries on.
    batches = _drain(spark, qm, tmp_path / "second")
    assert [(row[0], row[3]) for row in _flat(batches)] == [(2, "three")]
    assert _payloads(_drain(spark, qm, tmp_path / "third")) == []


@pytest.mark.parametrize("gone", ["deleted", "expired"])
def test_a_query_restarted_from_the_checkpoint_of_a_group_gone_since_is_refused(spark, qm, tmp_path, gone):
    qm.define_queue("Q", consumer_group_expiry=60)
    qm.declare_consumer("Q", "B")  # holds the messages A consumes
    qm.put("Q", [{"payload": "one"}, {"payload": "two"}])
    assert _payloads(_drain(spark, qm, tmp_path / "ck", consumer="A")) == [["one", "two"]]
    if gone == "deleted":
        qm.delete_consumer("Q", "A")
    else:
        ConsumerState(qm.root, "Q").acquire("B", "query-of-B", timedelta(seconds=30))  # B's query runs
        later = datetime.now(UTC) + timedelta(seconds=61)
        assert maintain(engine(qm), qm.inquire_queue("Q"), DEFAULT_RETENTION, now=later).expired_groups == ("A",)
    qm.put("Q", [{"payload": "three"}])
    # Going on would deliver one and two again into what the checkpoint's sink already holds.
    batches: list[list[tuple]] = []
    with pytest.raises(
        StreamingQueryException,
        match=re.escape(
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue Q: consumer group 'A' has no record of the batches this "
            "query's checkpoint says it consumed (up to batch plan 1): the group was deleted, or expired after "
            "60 s without a read (consumer_group_expiry), and going on would deliver those messages again; "
            "start the query with a new checkpointLocation to read the group from the start"
        ),
    ):
        _drain(spark, qm, tmp_path / "ck", consumer="A", into=batches)
    assert (batches, qm.consumers("Q")) == ([], ["B"])
    # A new checkpoint reads the group from the start.
    assert _payloads(_drain(spark, qm, tmp_path / "new", consumer="A")) == [["one", "two", "three"]]


def test_group_spanning_batches_resumes_at_the_next_item_after_a_failed_batch(spark, qm, tmp_path):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"G{n}", "group_id": "G", "msg_seq_number": n} for n in (1, 2, 3)])
    qm.put("Q", [{"payload": "X"}])
    qm.put("Q", [{"payload": f"G{n}", "group_id": "G", "msg_seq_number": n, "last_in_group": n == 5} for n in (4, 5)])
    checkpoint = tmp_path / "ck"

    failed: list[list[tuple]] = []
    with pytest.raises(StreamingQueryException, match="processing of batch 1 failed"):
        _drain(spark, qm, checkpoint, maxMessagesPerTrigger="2", fail_at=1, into=failed)
    assert _payloads(failed) == [["G1", "G2"], ["G3", "G4"]]
    assert qm.depth("Q", consumer="default") == 4
    restarted = _drain(spark, qm, checkpoint, maxMessagesPerTrigger="2")

    # Batch 0 was consumed; batch 1 is replayed with exactly the rows it had, then the group goes on.
    assert restarted[0] == failed[1]
    assert _payloads(restarted) == [["G3", "G4"], ["G5", "X"]]
    assert [row[1:] for row in _flat(failed[:1] + restarted)] == _reference(qm)
    assert qm.depth("Q", consumer="default") == 0
    offsets = json.loads((checkpoint / "offsets" / "1").read_text().splitlines()[-1])
    assert offsets["seq"] == 2


def test_second_query_in_the_same_group_is_refused_while_the_first_runs(spark, qm, tmp_path):
    qm.define_queue("Q")
    qm.declare_consumer("Q", "default")  # its depth is asked before its query first reads
    qm.put("Q", [{"payload": "one"}])

    def start(name: str):
        return (
            _reader(spark, qm, leaseTimeout="60")
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(processingTime="0 seconds")
            .start()
        )

    first = start("first")
    deadline = time.monotonic() + 60
    while qm.depth("Q", consumer="default") and time.monotonic() < deadline:
        time.sleep(0.2)
    second = start("second")
    with pytest.raises(StreamingQueryException) as refused:
        second.awaitTermination(60)
    assert (
        "MQRC_OBJECT_IN_USE (2042): queue Q: consumer group 'default' is already being read by a running query"
        in str(refused.value)
    )
    assert first.isActive

    first.stop()
    _wait_listener(spark)
    qm.put("Q", [{"payload": "two"}])
    assert _payloads(_drain(spark, qm, tmp_path / "third")) == [["two"]]


def test_expiry_and_available_at_while_streaming(spark, qm, tmp_path):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "expires", "expiry": datetime.now(UTC) + timedelta(seconds=1)}])
    time.sleep(1.2)
    seen: list[tuple[float, int, list[str]]] = []

    def collect(df, batch_id: int) -> None:
        payloads = [r.payload.decode() for r in df.orderBy("delivery_seq").collect()]
        if payloads:
            seen.append((time.time(), batch_id, payloads))

    query = (
        _reader(spark, qm)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    deadline = time.monotonic() + 90
    # Once the query runs (its start-up time varies with the machine's load), the delayed message is put.
    while query.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.1)
    now = datetime.now(UTC)
    qm.put("Q", [{"payload": "later", "available_at": now + timedelta(seconds=4)}, {"payload": "now"}])
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    # A batch is consumed once it completes, not when foreachBatch has run: stop after its progress.
    while seen and (query.lastProgress or {}).get("batchId", -1) < seen[-1][1] and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()
    _wait_listener(spark)

    # "now" flows past "later", which is not there yet; "expires" is discarded, never delivered.
    assert [payloads for _, _, payloads in seen] == [["now"], ["later"]]
    assert seen[1][0] >= (now + timedelta(seconds=4)).timestamp()
    assert qm.depth("Q", consumer="default") == 0


def test_streaming_put_and_get_together_deliver_every_message_once_in_order(spark, qm, tmp_path):
    qm.define_queue("Q", delivery_sequence="fifo")
    source = tmp_path / "input"
    _orders(source, 6)
    output = tmp_path / "out"
    consumer = (
        _reader(spark, qm, consumer="e2e", maxMessagesPerTrigger="4")
        .writeStream.format("delta")
        .option("checkpointLocation", str(tmp_path / "get"))
        .trigger(processingTime="0 seconds")
        .start(str(output))
    )
    producer = _put_orders(spark, source, tmp_path / "put", qm.root)
    producer.awaitTermination()
    deadline = time.monotonic() + 90
    while qm.depth("Q", consumer="e2e") and time.monotonic() < deadline:
        time.sleep(0.2)
    consumer.stop()
    _wait_listener(spark)

    delivered = spark.read.format("delta").load(str(output)).select("delivery_seq", "msg_id", "offset", "payload")
    delivered = delivered.selectExpr("delivery_seq", "msg_id", "offset", "cast(payload as string) as payload")
    assert_df_equality(delivered.orderBy("delivery_seq"), _expected_df(spark, _reference(qm)))
    assert qm.depth("Q", consumer="e2e") == 0
    assert qm.depth("Q") == 0


def test_get_from_an_alias_reads_its_target(spark, qm, tmp_path):
    qm.define_queue("Q")
    qm.define_queue("ALIAS", type="alias", target_queue="Q")
    qm.put("Q", [{"payload": "one"}])
    batches = _drain(spark, qm, tmp_path / "ck", queue="ALIAS")
    assert _payloads(batches) == [["one"]]
    assert qm.depth("ALIAS", consumer="default") == 0


def test_get_inhibited_queue_stops_the_query(spark, qm, tmp_path):
    qm.define_queue("Q", get_inhibited=True)
    qm.put("Q", [{"payload": "one"}])
    with pytest.raises(
        StreamingQueryException, match=re.escape("MQRC_GET_INHIBITED (2016): queue Q is get-inhibited")
    ) as stopped:
        _drain(spark, qm, tmp_path / "ck")
    # Of mqspark's frames, only the one that raises the MQ line is shown (pyspark's own stay).
    frames = [line for line in str(stopped.value).splitlines() if line.lstrip().startswith('File "')]
    (mine,) = [frame for frame in frames if "pyspark" not in frame]
    assert mine.startswith(f'  File "{plain.__file__}", line ') and mine.endswith(", in raising_plainly"), mine
    # Refused before it read: no group came to exist, and the message waits.
    assert (qm.consumers("Q"), qm.depth("Q")) == ([], 1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"maxMessagesPerTrigger": "0"}, "option maxMessagesPerTrigger must be a whole number >= 1, got '0'"),
        ({"maxBytesPerTrigger": "lots"}, "option maxBytesPerTrigger must be a whole number >= 1, got 'lots'"),
        ({"leaseTimeout": "-5"}, "option leaseTimeout must be a whole number >= 1, got '-5'"),
        ({"consumer": "a b"}, "consumer group name 'a b' may only use the characters A-Z a-z 0-9 . _ / %"),
        ({"queue": "NOPE"}, "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1"),
        ({"instance": " "}, "option instance must be an instance id of 1-200 characters, got ' '"),
        (
            {"segmentaton": "allowed"},
            'option segmentaton is unknown to spark.read or spark.readStream .format("mq"): its options are queue,',
        ),
        ({"leaseTimeOut": "5", "consumr": "x"}, "option consumr is unknown to spark.read or spark.readStream"),
    ],
    ids=["max-messages", "max-bytes", "lease", "consumer", "unknown-queue", "instance", "unknown", "misspelled"],
)
def test_bad_stream_options_fail_at_load(spark, qm, options, message):
    qm.define_queue("Q")
    with pytest.raises(AnalysisException, match=re.escape(message)):
        spark.readStream.format("mq").options(**{"queue": "Q", **options}).load(qm.root)


def test_browse_options_are_refused_by_the_streaming_get(spark, qm, tmp_path):
    qm.define_queue("Q")
    with pytest.raises(
        StreamingQueryException,
        match=re.escape("option msgId is for browse (spark.read); the streaming get does not take it"),
    ):
        _drain(spark, qm, tmp_path / "ck", msgId="abc")


def test_depth_and_oldest_age_per_consumer_group(spark, qm, tmp_path):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "one"}])
    _drain(spark, qm, tmp_path / "ck", consumer="fast")
    put_at = datetime.now(UTC)
    qm.put("Q", [{"payload": "two"}])

    fast = qm.backlog("Q", consumer="fast")
    assert (fast.queue, fast.consumer, fast.depth) == ("Q", "fast", 1)
    assert put_at <= fast.oldest_put_time <= datetime.now(UTC)
    # CURDEPTH: only "two" waits for a counted group; a group declared that never read counts the whole queue.
    everything = qm.backlog("Q")
    assert everything.depth == 1 and everything.oldest_put_time == fast.oldest_put_time
    qm.declare_consumer("Q", "never")
    never = qm.backlog("Q", consumer="never")
    assert never.depth == 2 and never.oldest_put_time < fast.oldest_put_time
    QueueManager.open(qm.root).delete_queue("Q", purge=True)
    assert not os.path.exists(store.state_location(qm.root, "Q"))
