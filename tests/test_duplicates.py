"""Duplicate detection (a queue's ``duplicate_window``): a put whose msg_id landed within the window
is acknowledged and not stored again, at the commit, across processes and across a producer's
SIGKILL and restart; moves keep their msg_ids and are never dropped."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import pytest
from deltalake import DeltaTable

from mqspark import MQError, QueueManager, Reason, store
from mqspark.engine.duplicates import LandedIds, PendingPut
from mqspark.engine.maintenance import Maintenance
from mqspark.model.definitions import QueueDefinition
from mqspark.model.groups import group_items
from mqspark.model.messages import QUEUE_TABLE_SCHEMA
from mqspark.model.put import prepare_put, rows_to_table
from mqspark.qmgr import engine

CONTEXT = multiprocessing.get_context("spawn")
PATIENCE = 120


def _msg_ids(qm: QueueManager, queue: str = "Q") -> list[str]:
    return qm.browse(queue)["msg_id"].to_pylist()


def test_a_msg_id_put_again_within_the_window_is_acknowledged_and_stored_once(qm: QueueManager) -> None:
    qm.define_queue("Q", duplicate_window=60)
    assert qm.put("Q", [{"msg_id": "A", "payload": "first"}]) == ["A"]
    assert qm.put("Q", [{"msg_id": "A", "payload": "again"}]) == ["A"]
    # In one put with a new message: the new one is stored, the duplicate acknowledged.
    assert qm.put("Q", [{"msg_id": "A", "payload": "third"}, {"msg_id": "B", "payload": "new"}]) == ["A", "B"]
    # Twice in one put: the first is stored.
    assert qm.put("Q", [{"msg_id": "C", "payload": "c1"}, {"msg_id": "C", "payload": "c2"}]) == ["C", "C"]
    browsed = qm.browse("Q")
    assert browsed["msg_id"].to_pylist() == ["A", "B", "C"]
    assert [bytes(p) for p in browsed["payload"].to_pylist()] == [b"first", b"new", b"c1"]
    assert qm.depth("Q") == 3


def test_without_a_window_a_msg_id_put_twice_is_stored_twice(qm: QueueManager) -> None:
    qm.define_queue("Q")
    qm.put("Q", [{"msg_id": "A", "payload": "first"}])
    qm.put("Q", [{"msg_id": "A", "payload": "again"}])
    assert _msg_ids(qm) == ["A", "A"]


def test_another_process_s_queue_manager_finds_what_landed_and_a_new_one_reads_it_from_the_files(
    qm: QueueManager,
) -> None:
    qm.define_queue("Q", duplicate_window=60)
    qm.put("Q", [{"msg_id": "A", "payload": "first"}])
    other = QueueManager.open(qm.root)
    other.put("Q", [{"msg_id": "B", "payload": "b"}])
    # Each knows what the other put: read from the live files at the commit.
    assert qm.put("Q", [{"msg_id": "B", "payload": "b again"}]) == ["B"]
    assert other.put("Q", [{"msg_id": "A", "payload": "a again"}]) == ["A"]
    assert QueueManager.open(qm.root).put("Q", [{"msg_id": "A", "payload": "a once more"}]) == ["A"]
    assert _msg_ids(qm) == ["A", "B"]


def test_a_msg_id_is_stored_again_once_its_put_left_the_window(clocked_qm: QueueManager, clock) -> None:
    clocked_qm.define_queue("Q", duplicate_window=30)
    clocked_qm.put("Q", [{"msg_id": "A", "payload": "first"}])
    clock.advance(29)
    clocked_qm.put("Q", [{"msg_id": "A", "payload": "within"}])
    clock.advance(2)
    clocked_qm.put("Q", [{"msg_id": "A", "payload": "after"}])
    assert [bytes(p) for p in clocked_qm.browse("Q")["payload"].to_pylist()] == [b"first", b"after"]


def test_maintenance_keeps_a_consumed_message_while_its_put_is_within_the_window(
    clocked_qm: QueueManager, clock
) -> None:
    clocked_qm.define_queue("Q", duplicate_window=30)
    clocked_qm.put("Q", [{"msg_id": "A", "payload": "first"}])
    assert clocked_qm.get("Q")["msg_id"].to_pylist() == ["A"]
    summary = clocked_qm.maintain("Q", retention=timedelta(0))
    assert summary.removed_consumed == 0
    # A fresh queue manager reads the landed ids from the live files: the consumed message is one.
    assert QueueManager.open(clocked_qm.root, clock=clock).put("Q", [{"msg_id": "A", "payload": "again"}]) == ["A"]
    assert clocked_qm.get("Q").num_rows == 0
    clock.advance(31)
    assert clocked_qm.maintain("Q", retention=timedelta(0)).removed_consumed == 1
    clocked_qm.put("Q", [{"msg_id": "A", "payload": "later"}])
    assert [bytes(p) for p in clocked_qm.get("Q")["payload"].to_pylist()] == [b"later"]


def test_a_file_of_many_messages_counts_while_its_puts_lie_within_the_window(clocked_qm: QueueManager, clock) -> None:
    clocked_qm.define_queue("Q", duplicate_window=30)
    clocked_qm.put("Q", [{"msg_id": f"m{n}", "payload": "x"} for n in range(25_000)])
    clock.advance(10)
    assert QueueManager.open(clocked_qm.root, clock=clock).put("Q", [{"msg_id": "m24999", "payload": "y"}]) == [
        "m24999"
    ]
    assert clocked_qm.depth("Q") == 25_000
    clock.advance(21)
    QueueManager.open(clocked_qm.root, clock=clock).put("Q", [{"msg_id": "m24999", "payload": "z"}])
    assert clocked_qm.depth("Q") == 25_001


def _file(location: str, msg_id: str, put_time: datetime) -> store.DataFile:
    rows = prepare_put(QueueDefinition("Q"), rows_to_table("Q", [{"msg_id": msg_id, "payload": "x"}]), now=put_time)
    file = store.write_data_file(location, rows.messages.to_batches(), QUEUE_TABLE_SCHEMA)
    assert file is not None
    return file


def _duplicate(landed: LandedIds, live: list[store.DataFile], now: datetime) -> bool:
    """Whether a put of msg_id A at ``now`` is a duplicate where ``live`` are the live files."""
    put = PendingPut([_file(landed.location, "A", now)], group_items(QUEUE_TABLE_SCHEMA.empty_table()))
    landed.drop_duplicates(put, {f.path: 1 for f in live}, now, 60)
    return put.files == []


def test_a_msg_id_counts_while_any_live_file_holds_it(tmp_path: Path) -> None:
    """The same msg_id in two live files (a message and its redriven copy): it stays a duplicate
    until the last of them is no longer live, whichever goes first."""
    now = datetime.now(UTC)
    older, newer = _file(str(tmp_path), "A", now - timedelta(seconds=10)), _file(str(tmp_path), "A", now)
    for kept in (newer, older):
        landed = LandedIds(str(tmp_path))
        assert _duplicate(landed, [older, newer], now)
        assert _duplicate(landed, [kept], now)
        assert not _duplicate(landed, [], now)


def test_a_msg_id_whose_first_file_left_the_window_counts_by_a_newer_file(tmp_path: Path) -> None:
    t0 = datetime.now(UTC)
    first, copy = _file(str(tmp_path), "A", t0), _file(str(tmp_path), "A", t0 + timedelta(seconds=64))
    landed = LandedIds(str(tmp_path))
    assert _duplicate(landed, [first], t0 + timedelta(seconds=1))
    assert not _duplicate(landed, [first], t0 + timedelta(seconds=65))  # its put left the window
    assert _duplicate(landed, [first, copy], t0 + timedelta(seconds=65))
    # The first file goes (maintenance removed the message): the copy still holds A.
    assert _duplicate(landed, [copy], t0 + timedelta(seconds=66))


def test_segments_and_group_messages_put_again_are_acknowledged_not_refused(qm: QueueManager) -> None:
    qm.define_queue("Q", duplicate_window=60, max_message_length=4)
    segmented = [{"msg_id": "S", "payload": "abcdefghij"}]
    group = [
        {"msg_id": "G1", "payload": "g1", "group_id": "G", "msg_seq_number": 1},
        {"msg_id": "G2", "payload": "g2", "group_id": "G", "msg_seq_number": 2, "last_in_group": True},
    ]
    for _ in range(2):
        assert qm.put("Q", segmented, segmentation=True) == ["S"]
        # Without duplicate detection, the second put of msg_seq_number 1 would fail with 2250.
        assert qm.put("Q", group) == ["G1", "G2"]
    browsed = qm.browse("Q")
    assert list(zip(browsed["msg_id"].to_pylist(), browsed["offset"].to_pylist(), strict=True)) == [
        ("S", 0),
        ("S", 4),
        ("S", 8),
        ("G1", 0),
        ("G2", 0),
    ]


def test_a_group_message_put_again_with_a_new_one_stores_only_the_new_one(qm: QueueManager) -> None:
    qm.define_queue("Q", duplicate_window=60)
    qm.put("Q", [{"msg_id": "G1", "payload": "g1", "group_id": "G", "msg_seq_number": 1}])
    qm.put(
        "Q",
        [
            {"msg_id": "G1", "payload": "g1", "group_id": "G", "msg_seq_number": 1},
            {"msg_id": "G2", "payload": "g2", "group_id": "G", "msg_seq_number": 2, "last_in_group": True},
        ],
    )
    assert _msg_ids(qm) == ["G1", "G2"]
    assert [bytes(p) for p in qm.get("Q", max_messages=5)["payload"].to_pylist()] == [b"g1", b"g2"]


def test_a_spark_batch_put_stores_only_the_msg_ids_not_landed_within_the_window(spark, qm: QueueManager) -> None:
    qm.define_queue("Q", duplicate_window=600, delivery_sequence="fifo")
    qm.put("Q", [{"msg_id": "m1", "payload": "put before"}, {"msg_id": "m3", "payload": "put before"}])
    rows = [(f"m{i % 6}", f"batch {i}") for i in range(12)]  # m0-m5, then each again
    # Three tasks, each its own file: m0-m3, m4 m5 m0 m1, m2-m5 (a file of duplicates only).
    given = spark.createDataFrame(spark.sparkContext.parallelize(rows, 3), "msg_id string, payload string")
    given.write.format("mq").option("queue", "Q").mode("append").save(qm.root)
    browsed = qm.browse("Q")
    payloads = [bytes(p).decode() for p in browsed["payload"].to_pylist()]
    assert list(zip(browsed["msg_id"].to_pylist(), payloads, strict=True)) == [
        ("m1", "put before"),
        ("m3", "put before"),
        ("m0", "batch 0"),
        ("m2", "batch 2"),
        ("m4", "batch 4"),
        ("m5", "batch 5"),
    ]


def test_a_put_refused_after_its_duplicates_were_dropped_leaves_no_file(qm: QueueManager) -> None:
    qm.define_queue("Q", duplicate_window=60, max_depth=1)
    qm.put("Q", [{"msg_id": "A", "payload": "a"}])
    with pytest.raises(MQError) as full:
        qm.put("Q", [{"msg_id": "A", "payload": "a"}, {"msg_id": "B", "payload": "b"}], producer="p", batch_id=1)
    assert full.value.reason == Reason.MQRC_Q_FULL
    folder = Path(store.queue_location(qm.root, "Q"))
    assert len(list(folder.glob("*.parquet"))) == len(DeltaTable(str(folder)).file_uris()) == 1


def test_a_put_whose_commit_loses_to_the_same_msg_id_checks_again_and_drops_it(qm: QueueManager, monkeypatch) -> None:
    qm.define_queue("Q", duplicate_window=60)
    other = QueueManager.open(qm.root)
    real = store.Appender.append
    # With a producer's transaction: not gathered with this process's plain put, which waits inside.
    rivals = [lambda: other.put("Q", [{"msg_id": "A", "payload": "the other's"}], producer="rival", batch_id=1)]

    def append(*args, **kwargs):
        while rivals:  # once, just before this process's first commit: it then loses the version
            rivals.pop()()
        return real(*args, **kwargs)

    monkeypatch.setattr(store.Appender, "append", append)
    assert qm.put("Q", [{"msg_id": "A", "payload": "mine"}]) == ["A"]
    assert [bytes(p) for p in qm.browse("Q")["payload"].to_pylist()] == [b"the other's"]


def test_a_message_placed_before_another_is_acknowledged_after_that_one_was_removed(
    clocked_qm: QueueManager, clock
) -> None:
    clocked_qm.define_queue("Q", duplicate_window=60)
    clocked_qm.put("Q", [{"msg_id": "T", "payload": "target"}])
    clock.advance(61)
    clocked_qm.put("Q", [{"msg_id": "X", "payload": "first", "before_msg_id": "T"}])
    assert clocked_qm.get("Q", max_messages=2)["msg_id"].to_pylist() == ["X", "T"]
    assert clocked_qm.maintain("Q", retention=timedelta(0)).removed_consumed == 1  # T; X is within the window
    # Put again with a new message: the targets are taken again from what is left, or the absence of
    # the dropped message's target would refuse the put with 2033.
    again = [{"msg_id": "X", "payload": "again", "before_msg_id": "T"}, {"msg_id": "Y", "payload": "new"}]
    assert clocked_qm.put("Q", again) == ["X", "Y"]
    assert clocked_qm.get("Q", max_messages=5)["msg_id"].to_pylist() == ["Y"]


def test_a_long_running_maintenance_reads_the_window_altered_since_it_started(qm: QueueManager) -> None:
    qm.define_queue("Q")
    queues = engine(qm)
    background = Maintenance(queues, partial(queues.resolve, "Q"))
    qm.alter_queue("Q", duplicate_window=60)
    qm.put("Q", [{"msg_id": "A", "payload": "first"}])
    assert qm.get("Q")["msg_id"].to_pylist() == ["A"]
    assert background.start_if_due(timedelta(0))
    background._thread.join(60)
    assert background.last.removed_consumed == 0
    assert qm.put("Q", [{"msg_id": "A", "payload": "again"}]) == ["A"]
    assert qm.get("Q").num_rows == 0


def test_a_redriven_message_keeps_its_msg_id_and_comes_back_within_the_window(qm: QueueManager) -> None:
    qm.define_queue("Q.BACKOUT")
    qm.define_queue("Q", duplicate_window=600, backout_queue="Q.BACKOUT", backout_threshold=1)
    qm.put("Q", [{"msg_id": "A", "payload": "poison"}])
    with pytest.raises(RuntimeError), qm.syncpoint_get("Q"):
        raise RuntimeError("could not parse")
    assert qm.get("Q").num_rows == 0  # the next get moves it to the backout queue
    assert _msg_ids(qm, "Q.BACKOUT") == ["A"]
    assert qm.redrive("Q.BACKOUT") == {"Q": 1}
    assert qm.get("Q")["msg_id"].to_pylist() == ["A"]


def test_a_purge_forgets_what_it_removed(qm: QueueManager) -> None:
    qm.define_queue("Q", duplicate_window=60)
    qm.put("Q", [{"msg_id": "A", "payload": "first"}])
    assert qm.purge("Q") == 1
    qm.put("Q", [{"msg_id": "A", "payload": "after the purge"}])
    assert [bytes(p) for p in qm.browse("Q")["payload"].to_pylist()] == [b"after the purge"]


def test_altering_the_window_applies_to_the_next_put(qm: QueueManager) -> None:
    qm.define_queue("Q")
    qm.put("Q", [{"msg_id": "A", "payload": "first"}])
    qm.alter_queue("Q", duplicate_window=60)
    qm.put("Q", [{"msg_id": "A", "payload": "again"}])
    qm.alter_queue("Q", duplicate_window=0)
    qm.put("Q", [{"msg_id": "A", "payload": "off"}])
    assert [bytes(p) for p in qm.browse("Q")["payload"].to_pylist()] == [b"first", b"off"]


def _resuming_producer(root: str, name: str, log: str) -> None:
    """Put ``name-0``, ``name-1``, ... one at a time, each with its name as msg_id, logging each whose
    put returned; started again, it goes on from the first not logged, which may have landed."""
    qm = QueueManager.open(root)
    done = [line for line in Path(log).read_text().splitlines() if line.startswith(f"{name}-")]
    with open(log, "a") as out:
        for number in range(len(done), 10_000):
            msg_id = f"{name}-{number}"
            assert qm.put("Q", [{"msg_id": msg_id, "payload": msg_id}]) == [msg_id]
            out.write(f"{msg_id}\n")
            out.flush()


@pytest.mark.slow
def test_producers_restarted_after_sigkill_put_their_in_doubt_message_again_and_each_is_stored_once(
    qm: QueueManager, tmp_path: Path
) -> None:
    """Three producers put one message at a time (sharing commits through the staged puts); one at
    a time is SIGKILLed at whatever moment its put is in and started again, and puts its in-doubt
    message again with the same msg_id."""
    qm.define_queue("Q", duplicate_window=600)
    location = store.queue_location(qm.root, "Q")
    rng = random.Random(20261205)
    log = tmp_path / "returned.log"
    log.touch()
    running: dict[str, multiprocessing.Process] = {}

    def start(name: str) -> None:
        running[name] = CONTEXT.Process(target=_resuming_producer, args=(qm.root, name, str(log)))
        running[name].start()

    for name in ("P0", "P1", "P2"):
        start(name)
    try:
        for _ in range(20):
            target = store.newest_version(location) + rng.randint(2, 8)
            _wait_for(lambda target=target: store.newest_version(location) >= target, "puts going on")
            name = rng.choice(sorted(running))
            os.kill(running[name].pid, signal.SIGKILL)
            running[name].join(30)
            start(name)
        _wait_for(lambda: store.newest_version(location) >= target + 5, "puts after the last restart")
    finally:
        for process in running.values():
            process.kill()
            process.join(30)
    qm.maintain("Q")  # commits what the killed ones staged
    stored = _msg_ids(qm)
    assert [msg_id for msg_id, count in Counter(stored).items() if count > 1] == []
    returned = Counter(line.rsplit("-", 1)[0] for line in log.read_text().splitlines())
    for name in ("P0", "P1", "P2"):
        numbers = sorted(int(m.rsplit("-", 1)[1]) for m in stored if m.startswith(f"{name}-"))
        # Nothing lost, nothing twice: every message up to the last returned, and perhaps the one
        # in doubt when the producer was stopped for good.
        assert numbers == list(range(len(numbers))), name
        assert len(numbers) - returned[name] in (0, 1), (name, len(numbers), returned[name])


def _wait_for(condition, what: str, timeout: float = PATIENCE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.01)
