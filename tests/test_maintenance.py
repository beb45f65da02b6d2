"""Depth (CURDEPTH), consumer groups, maintenance and purge, without Spark.

Streaming gets are driven at the planner level, as in ``tests/test_stream_planner.py``: the calls
Spark makes (``initialOffset``, ``latestOffset``, ``partitions``, ``read``), made directly. A batch
counts as consumed once the next ``latestOffset`` starts from its end.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import mqspark
from mqspark import MQError, MQValidationError, QueueManager, Reason, store
from mqspark.cli.main import main
from mqspark.clock import ManualClock
from mqspark.engine.browse import browse_queue
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.leases import MAINTENANCE
from mqspark.engine.maintenance import EXPIRY_GRACE, maintain
from mqspark.engine.ordering import DeliveryOptions
from mqspark.engine.puts import MAINTAIN_AT_FILES
from mqspark.model.messages import MESSAGE_SCHEMA
from mqspark.qmgr import engine
from mqspark.spark.stream import QueueStreamReader

from .support.samples import spec_example
from .support.stream_batches import read_batch

ZERO = timedelta(0)
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


def _drain(reader: QueueStreamReader, start: dict | None = None) -> tuple[list[tuple], dict]:
    """Everything available in one batch, then that batch recorded consumed; returns the rows and the end."""
    start = start or reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    rows = read_batch(reader, start, end)
    assert reader.latestOffset(end, ReadAllAvailable()) == end
    return rows, end


def _payloads(table) -> list[str]:
    return [payload.decode() for payload in table["payload"].to_pylist()]


def _browse(qm: QueueManager, order: str = "logical") -> list[str]:
    return _payloads(qm.browse("Q", order=order))


def _version(qm: QueueManager, queue: str = "Q") -> int:
    return DeltaTable(store.queue_location(qm.root, queue)).version()


def _data_files(qm: QueueManager) -> list[str]:
    """Every Parquet file in the queue's folder, live or not."""
    return sorted(name for name in os.listdir(store.queue_location(qm.root, "Q")) if name.endswith(".parquet"))


def _log(qm: QueueManager) -> list[str]:
    return sorted(os.listdir(Path(store.queue_location(qm.root, "Q")) / "_delta_log"))


def _summary(summary) -> tuple:
    """The deterministic fields of a MaintenanceSummary."""
    return (
        summary.removed_consumed,
        summary.removed_expired,
        summary.rewritten,
        summary.files_before,
        summary.files_after,
    )


def _put_each(qm: QueueManager, payloads: list[str], queue: str = "Q") -> None:
    """One put (one commit, one file) per message."""
    for payload in payloads:
        qm.put(queue, [{"payload": payload}])


# MQ depth (CURDEPTH)


def test_depth_drops_as_the_only_group_consumes_each_batch(qm, new_reader):
    qm.define_queue("Q")
    _put_each(qm, [f"m{i}" for i in range(5)])
    assert qm.depth("Q") == 5
    reader = new_reader()
    start = reader.initialOffset()
    depths, delivered = [], []
    for _ in range(3):
        end = reader.latestOffset(start, ReadMaxRows(2))
        delivered += read_batch(reader, start, end)
        # Planned and read, but not consumed until the next batch is planned.
        depths.append(qm.depth("Q"))
        start = end
    assert reader.latestOffset(start, ReadMaxRows(2)) == start
    depths.append(qm.depth("Q"))
    assert delivered == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "m3"), (4, "m4")]
    assert depths == [5, 3, 1, 0]
    assert qm.depth("Q", consumer="default") == 0
    assert qm.consumers("Q") == ["default"]
    # A group that never read is not counted, and its depth is refused rather than guessed.
    with pytest.raises(MQError, match=re.escape("queue Q has no consumer group 'other'; its groups: default (")):
        qm.depth("Q", consumer="other")


def test_a_batch_planned_before_maintenance_moved_its_messages_reads_them_where_they_lie_now(qm, new_reader):
    qm.define_queue("Q")
    _put_each(qm, [f"m{i}" for i in range(4)])
    reader = new_reader()
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(1))
    assert read_batch(reader, start, first) == [(0, "m0")]
    end = reader.latestOffset(first, ReadMaxRows(2))
    before = store.live_paths(store.open_table(store.queue_location(qm.root, "Q"), None))
    maintain(engine(qm), qm.inquire_queue("Q"), timedelta(0))
    time.sleep(0.01)
    maintain(engine(qm), qm.inquire_queue("Q"), timedelta(0))  # deletes the files the first run removed
    location = store.queue_location(qm.root, "Q")
    after = store.live_paths(store.open_table(location, None))
    assert len(before) == 4 and len(after) == 1 and after[0] not in before
    assert not any(Path(location, path).exists() for path in before)
    assert read_batch(reader, first, end) == [(1, "m1"), (2, "m2")]


def test_maintenance_keeps_a_groups_first_item_while_items_before_its_moved_last_one_wait(qm, new_reader):
    # Found by a chaos run: the first and last items of a group failed and moved together, which
    # consumed the last item before the items between; the group counted as finished, its first item
    # was forgotten, and the items between waited for ever for it.
    qm.define_queue("Q.BACKOUT")
    qm.define_queue("Q", backout_threshold=1, backout_queue="Q.BACKOUT")
    items = [f"g{n}" for n in range(1, 6)]
    qm.put(
        "Q",
        [{"payload": p, "group_id": "G", "msg_seq_number": n, "last_in_group": n == 5} for n, p in enumerate(items, 1)],
    )
    reader = new_reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    delivered = read_batch(reader, start, end)
    assert [payload for _, payload in delivered] == items
    bad = [{"queue": "Q", "delivery_seq": seq} for seq, payload in delivered if payload in ("g1", "g5")]
    assert mqspark.backout(bad, "cannot parse", root=qm.root) == 2
    start, end = end, reader.latestOffset(end, ReadMaxRows(1))  # moves g1 and g5, then plans g2
    assert [payload for _, payload in read_batch(reader, start, end)] == ["g2"]
    for _ in range(2):
        maintain(engine(qm), qm.inquire_queue("Q"), ZERO)
    start, end = end, reader.latestOffset(end, ReadAllAvailable())
    assert [payload for _, payload in read_batch(reader, start, end)] == ["g3", "g4"]
    assert sorted(qm.browse("Q.BACKOUT", order="physical")["payload"].to_pylist()) == [b"g1", b"g5"]


def test_depth_follows_the_slower_of_two_groups(qm, new_reader):
    qm.define_queue("Q")
    _put_each(qm, [f"m{i}" for i in range(5)])
    fast, slow = new_reader(consumer="fast"), new_reader(consumer="slow")
    rows, _ = _drain(fast)
    assert rows == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "m3"), (4, "m4")]
    start = slow.initialOffset()
    end = slow.latestOffset(start, ReadMaxRows(2))
    assert read_batch(slow, start, end) == [(0, "m0"), (1, "m1")]
    later = slow.latestOffset(end, ReadMaxRows(1))
    assert (qm.depth("Q"), qm.depth("Q", consumer="fast"), qm.depth("Q", consumer="slow")) == (3, 0, 3)
    assert read_batch(slow, end, later) == [(2, "m2")]
    assert slow.latestOffset(later, ReadMaxRows(1)) != later
    assert (qm.depth("Q"), qm.depth("Q", consumer="slow")) == (2, 2)
    assert qm.consumers("Q") == ["fast", "slow"]


def test_a_declared_group_keeps_its_messages_until_it_reads_them(qm, new_reader):
    qm.define_queue("Q")
    qm.declare_consumer("Q", "B")
    state_version = DeltaTable(store.state_location(qm.root, "Q")).version()
    qm.declare_consumer("Q", "B")  # declaring again changes nothing
    assert DeltaTable(store.state_location(qm.root, "Q")).version() == state_version
    assert qm.consumers("Q") == ["B"]
    _put_each(qm, ["m0", "m1", "m2", "m3"])
    rows, _ = _drain(new_reader(consumer="A"))
    assert rows == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "m3")]
    assert (qm.depth("Q"), qm.depth("Q", consumer="A"), qm.depth("Q", consumer="B")) == (4, 0, 4)
    summary = qm.maintain("Q", retention=ZERO)
    # Nothing removed: B waits for all four. The four put files are compacted into one.
    assert _summary(summary) == (0, 0, 4, 4, 1)
    assert _browse(qm) == ["m0", "m1", "m2", "m3"]
    assert qm.depth("Q") == 4
    rows, _ = _drain(new_reader(consumer="B"))
    assert rows == [(0, "m0"), (1, "m1"), (2, "m2"), (3, "m3")]
    assert qm.depth("Q") == 0
    assert _summary(qm.maintain("Q", retention=ZERO)) == (4, 0, 0, 1, 0)
    assert _browse(qm) == []
    assert qm.consumers("Q") == ["A", "B"]


def test_a_group_that_is_not_declared_does_not_keep_messages(qm, new_reader):
    qm.define_queue("Q")
    _put_each(qm, ["m0", "m1"])
    _drain(new_reader(consumer="A"))
    assert qm.depth("Q") == 0
    assert _summary(qm.maintain("Q", retention=ZERO)) == (2, 0, 0, 2, 0)
    # B comes too late: what A consumed was removed.
    qm.put("Q", [{"payload": "m2"}])
    rows, _ = _drain(new_reader(consumer="B"))
    assert rows == [(0, "m2")]


def test_deleting_a_group_releases_its_messages(qm, new_reader):
    qm.define_queue("Q")
    qm.declare_consumer("Q", "B")
    _put_each(qm, ["m0", "m1", "m2"])
    _drain(new_reader(consumer="A"))
    assert qm.depth("Q") == 3
    qm.delete_consumer("Q", "B")
    assert qm.consumers("Q") == ["A"]
    assert qm.depth("Q") == 0
    assert _summary(qm.maintain("Q", retention=ZERO)) == (3, 0, 0, 3, 0)
    assert _browse(qm) == []
    assert DeltaTable(store.queue_location(qm.root, "Q")).to_pyarrow_table().num_rows == 0


def test_deleting_an_unknown_group_is_refused(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "m0"}])
    with pytest.raises(
        MQError, match=re.escape("MQRC_UNKNOWN_OBJECT_NAME (2085): queue Q: consumer group 'nobody' does not exist")
    ) as refused:
        qm.delete_consumer("Q", "nobody")
    assert refused.value.reason == Reason.MQRC_UNKNOWN_OBJECT_NAME
    with pytest.raises(
        MQError, match=re.escape("MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1")
    ):
        qm.delete_consumer("NOPE", "A")
    with pytest.raises(
        MQValidationError,
        match=re.escape("consumer group name '*maintenance' may only use the characters A-Z a-z 0-9 . _ / %"),
    ):
        qm.declare_consumer("Q", MAINTENANCE)
    assert qm.consumers("Q") == []


def test_deleting_a_group_that_is_being_read_is_refused(qm, new_reader):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "m0"}])
    reader = new_reader(consumer="A")
    reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    with pytest.raises(
        MQError,
        match=re.escape(
            "MQRC_OBJECT_IN_USE (2042): queue Q: consumer group 'A' is being read by a running query; stop it first"
        ),
    ) as refused:
        qm.delete_consumer("Q", "A")
    assert refused.value.reason == Reason.MQRC_OBJECT_IN_USE
    assert qm.consumers("Q") == ["A"]
    reader.stop()
    qm.delete_consumer("Q", "A")
    assert qm.consumers("Q") == []
    assert qm.depth("Q") == 1


def test_expired_messages_are_not_counted(tmp_path):
    # Depth and browse judge expiry by the queue manager's clock: the test moves it past the expiry.
    clock = ManualClock()
    qm = QueueManager.create(tmp_path / "qm", "QM1", clock=clock)
    qm.define_queue("Q")
    now = clock.now()
    qm.put(
        "Q",
        [
            {"payload": "gone", "expiry": now - timedelta(seconds=1)},
            {"payload": "soon", "expiry": now + timedelta(seconds=1.5)},
            {"payload": "kept"},
        ],
    )
    assert qm.depth("Q") == 2
    assert qm.backlog("Q").depth == 2
    qm.declare_consumer("Q", "A")
    assert (qm.depth("Q"), qm.depth("Q", consumer="A")) == (2, 2)
    clock.advance(1.6)
    assert (qm.depth("Q"), qm.depth("Q", consumer="A")) == (1, 1)
    assert _browse(qm) == ["kept"]


def test_max_depth_limits_curdepth_not_every_message_ever_put(qm, new_reader):
    qm.define_queue("Q", max_depth=3)
    _put_each(qm, ["m0", "m1", "m2"])
    full = re.escape("MQRC_Q_FULL (2053): queue Q is full (max_depth 3, depth 3, put of 1)")
    with pytest.raises(MQError, match=full) as refused:
        qm.put("Q", [{"payload": "m3"}])
    assert refused.value.reason == Reason.MQRC_Q_FULL
    rows, _ = _drain(new_reader())
    assert rows == [(0, "m0"), (1, "m1"), (2, "m2")]
    assert qm.depth("Q") == 0
    with pytest.raises(
        MQError, match=re.escape("MQRC_Q_FULL (2053): queue Q is full (max_depth 3, depth 0, put of 4)")
    ):
        qm.put("Q", [{"payload": f"x{i}"} for i in range(4)])
    _put_each(qm, ["m3", "m4", "m5"])
    assert qm.depth("Q") == 3
    with pytest.raises(MQError, match=full):
        qm.put("Q", [{"payload": "m6"}])
    # Browse shows what the table holds until maintenance removes what every group consumed.
    assert _browse(qm) == ["m0", "m1", "m2", "m3", "m4", "m5"]
    assert _summary(qm.maintain("Q", retention=ZERO)) == (3, 0, 3, 6, 1)
    assert _browse(qm) == ["m3", "m4", "m5"]
    with pytest.raises(MQError, match=full):
        qm.put("Q", [{"payload": "m6"}])


def test_max_depth_counts_what_a_declared_group_still_waits_for(qm, new_reader):
    qm.define_queue("Q", max_depth=2)
    qm.declare_consumer("Q", "B")
    _put_each(qm, ["m0", "m1"])
    _drain(new_reader(consumer="A"))
    with pytest.raises(
        MQError, match=re.escape("MQRC_Q_FULL (2053): queue Q is full (max_depth 2, depth 2, put of 1)")
    ):
        qm.put("Q", [{"payload": "m2"}])
    qm.delete_consumer("Q", "B")
    qm.put("Q", [{"payload": "m2"}])
    assert qm.depth("Q") == 1


# Maintenance


def _mixed_queue(qm: QueueManager) -> None:
    """A priority queue whose physical and logical orders differ: priorities, a top-of-queue put, an
    insert before a message, and a group."""
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "p0-a"}, {"payload": "p5-a", "priority": 5}])
    target = qm.put("Q", [{"payload": "p0-b"}])[0]
    qm.put("Q", [{"payload": "G1", "group_id": "G", "msg_seq_number": 1}])
    qm.put("Q", [{"payload": "p5-b", "priority": 5}, {"payload": "p0-c"}])
    qm.put("Q", [{"payload": "top", "top_of_queue": True}])
    qm.put("Q", [{"payload": "before-b", "before_msg_id": target}])
    qm.put("Q", [{"payload": "G2", "group_id": "G", "msg_seq_number": 2, "last_in_group": True}])
    qm.put("Q", [{"payload": "p9", "priority": 9}])


def test_maintenance_removes_the_temporary_log_entries_that_killed_commits_left(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "m1"}])
    assert [m.as_py() for m in qm.get("Q", consumer="A")["payload"]] == [b"m1"]
    queue_log = Path(store.queue_location(qm.root, "Q")) / "_delta_log"
    state_log = Path(store.state_location(qm.root, "Q")) / "_delta_log"
    now = time.time()
    ages = {queue_log / "_commit_old.json.tmp": 7200, state_log / "_commit_old.json.tmp": 7200}
    # Younger than a minute: maybe a live commit's, kept even with a retention of 0.
    ages[queue_log / "_commit_young.json.tmp"] = 30
    for path, age in ages.items():
        path.write_text("{}")
        os.utime(path, (now - age, now - age))
    summary = qm.maintain("Q", retention=ZERO)
    assert summary.leftovers_removed == 2
    assert sorted(p.name for p in queue_log.glob("*.tmp")) == ["_commit_young.json.tmp"]
    assert list(state_log.glob("*.tmp")) == []
    qm.put("Q", [{"payload": "m2"}])
    assert [m.as_py() for m in qm.get("Q", consumer="A")["payload"]] == [b"m2"]


def test_a_put_whose_temporary_log_entry_was_removed_writes_it_again(qm, monkeypatch):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "m1"}])
    link, removed = os.link, []

    def removed_first(source, target):
        # As maintenance does to the entry of a process paused past LEFTOVER_AGE between its two steps.
        if not removed:
            os.unlink(source)
            removed.append(source)
        return link(source, target)

    monkeypatch.setattr("mqspark.store.appends.os.link", removed_first)
    qm.put("Q", [{"payload": "m2"}])
    assert len(removed) == 1
    assert [m.as_py() for m in qm.get("Q", max_messages=5)["payload"]] == [b"m1", b"m2"]


def test_maintenance_removes_what_every_group_consumed_and_keeps_the_order(qm, new_reader):
    _mixed_queue(qm)
    logical, physical = _browse(qm), _browse(qm, "physical")
    assert logical == ["p9", "p5-a", "p5-b", "top", "p0-a", "before-b", "p0-b", "G1", "G2", "p0-c"]
    assert physical == ["p9", "p5-a", "p5-b", "top", "p0-a", "before-b", "p0-b", "G1", "p0-c", "G2"]
    fast, slow = new_reader(consumer="fast"), new_reader(consumer="slow")
    fast_start = fast.initialOffset()
    fast_end = fast.latestOffset(fast_start, ReadMaxRows(6))
    assert [p for _, p in read_batch(fast, fast_start, fast_end)] == logical[:6]
    fast_next = fast.latestOffset(fast_end, ReadMaxRows(1))
    slow_start = slow.initialOffset()
    slow_end = slow.latestOffset(slow_start, ReadMaxRows(3))
    assert [p for _, p in read_batch(slow, slow_start, slow_end)] == logical[:3]
    slow_next = slow.latestOffset(slow_end, ReadMaxRows(1))
    # Consumed by both: the first three. In flight: p0-b for fast, top for slow.
    assert (qm.depth("Q"), qm.depth("Q", consumer="fast"), qm.depth("Q", consumer="slow")) == (7, 4, 7)
    summary = qm.maintain("Q", retention=ZERO)
    assert _summary(summary) == (3, 0, 7, 8, 1)
    assert summary.version == _version(qm)
    assert _browse(qm) == logical[3:]
    assert _browse(qm, "physical") == [p for p in physical if p not in logical[:3]]
    assert (qm.depth("Q"), qm.depth("Q", consumer="fast"), qm.depth("Q", consumer="slow")) == (7, 4, 7)
    assert DeltaTable(store.queue_location(qm.root, "Q")).to_pyarrow_table().num_rows == 7
    # Both groups go on where they were, through the moved files.
    assert read_batch(fast, fast_end, fast_next) == [(6, "p0-b")]
    assert read_batch(slow, slow_end, slow_next) == [(3, "top")]
    qm.put("Q", [{"payload": "late"}])
    fast_rows, _ = _drain(fast, fast_next)
    slow_rows, _ = _drain(slow, slow_next)
    assert fast_rows == [(7, "G1"), (8, "G2"), (9, "p0-c"), (10, "late")]
    assert slow_rows == [(4, "p0-a"), (5, "before-b"), (6, "p0-b"), (7, "G1"), (8, "G2"), (9, "p0-c"), (10, "late")]
    assert qm.depth("Q") == 0
    assert _summary(qm.maintain("Q", retention=ZERO)) == (8, 0, 0, 2, 0)


def test_many_small_puts_are_compacted_into_one_file_in_the_same_order(qm):
    qm.define_queue("Q", delivery_sequence="fifo")
    payloads = [f"m{i:02d}" for i in range(30)]
    for i, payload in enumerate(payloads):
        qm.put("Q", [{"payload": payload, "priority": i % 10}])
    logical, physical = _browse(qm), _browse(qm, "physical")
    assert logical == physical == payloads
    version = _version(qm)
    summary = qm.maintain("Q", retention=ZERO)
    assert _summary(summary) == (0, 0, 30, 30, 1)
    # One commit sets the retention properties, one rewrites the files.
    assert summary.version == version + 2 == _version(qm)
    assert len(DeltaTable(store.queue_location(qm.root, "Q")).file_uris()) == 1
    assert _browse(qm) == _browse(qm, "physical") == payloads
    # Put after maintenance: behind the compacted messages, whose put versions are older.
    qm.put("Q", [{"payload": "after"}])
    assert _browse(qm, "physical") == [*payloads, "after"]
    # A stamped file alone needs no rewrite; the new put's file is rewritten and merged with it.
    assert _summary(qm.maintain("Q", retention=ZERO)) == (0, 0, 31, 2, 1)
    assert _browse(qm, "physical") == [*payloads, "after"]
    assert _summary(qm.maintain("Q", retention=ZERO)) == (0, 0, 0, 1, 1)
    assert qm.maintain("Q", retention=ZERO).version is None


def _group_in_flight(qm: QueueManager, new_reader, root: str, maintained: bool, restart: bool) -> list[tuple]:
    """The spec example read with batches of 2: A and Y1 consumed, Y2 planned; maintenance runs (or
    not); then the planned batch is replayed and the rest read, by the same reader or a new one."""
    reader = new_reader(root=root)
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(2))
    delivered = read_batch(reader, start, first)
    second = reader.latestOffset(first, ReadMaxRows(2))
    if maintained:
        # A goes; Y1 stays while group Y is in flight: it anchors the group's place in logical order.
        assert _summary(qm.maintain("Q", retention=ZERO)) == (1, 0, 7, 8, 1)
    if restart:
        reader.stop()
        reader = new_reader(root=root)
        reader.initialOffset()
    delivered += read_batch(reader, first, second)
    rows, _ = _drain(reader, second)
    return delivered + rows


@pytest.mark.parametrize("restart", [False, True], ids=["same-reader", "restarted"])
def test_a_group_whose_first_items_were_removed_is_still_delivered_in_its_place(qm, tmp_path, new_reader, restart):
    reference = QueueManager.create(tmp_path / "reference", "QM1")
    spec_example(reference)
    spec_example(qm)
    expected = _group_in_flight(reference, new_reader, reference.root, maintained=False, restart=restart)
    assert expected == [
        (0, "A"),
        (1, "Y1"),
        (2, "Y2"),
        (3, "Y3-1:"),
        (4, "Y3-2"),
        (5, "Z1"),
        (6, "Z2"),
        (7, "B"),
    ]
    assert _group_in_flight(qm, new_reader, qm.root, maintained=True, restart=restart) == expected
    assert qm.depth("Q") == 0


@pytest.mark.parametrize("runs", [1, 2], ids=["one-run", "two-runs"])
def test_a_batch_planned_before_maintenance_is_replayed_exactly_after_it(qm, new_reader, runs):
    qm.define_queue("Q")
    _put_each(qm, [f"m{i}" for i in range(8)])
    reader = new_reader()
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(3))
    second = reader.latestOffset(first, ReadMaxRows(3))
    planned = read_batch(reader, first, second)
    assert planned == [(3, "m3"), (4, "m4"), (5, "m5")]
    # m0-m2 are consumed; m3-m5 are in a plan not yet consumed, so they stay.
    assert _summary(qm.maintain("Q", retention=ZERO)) == (3, 0, 5, 8, 1)
    for _ in range(runs - 1):
        # The second run deletes the files the first one removed.
        summary = qm.maintain("Q", retention=ZERO)
        assert (_summary(summary), summary.files_vacuumed) == ((0, 0, 0, 1, 1), 8)
    assert read_batch(reader, first, second) == planned
    reader.stop()
    restarted = new_reader()
    restarted.initialOffset()
    assert read_batch(restarted, first, second) == planned
    rows, _ = _drain(restarted, second)
    assert rows == [(6, "m6"), (7, "m7")]


def test_a_running_reader_goes_on_after_maintenance_cleaned_up_the_log_behind_it(qm, new_reader):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "m0"}])
    reader = new_reader()
    rows, end = _drain(reader)
    assert rows == [(0, "m0")]
    # Put while the reader is idle; maintenance cleans up the log entry of that put (version 2).
    qm.put("Q", [{"payload": "m1"}])
    assert _summary(qm.maintain("Q", retention=ZERO)) == (1, 0, 1, 2, 1)
    assert not store.version_exists(store.queue_location(qm.root, "Q"), 2)
    qm.put("Q", [{"payload": "m2"}])
    rows, _ = _drain(reader, end)
    assert rows == [(1, "m1"), (2, "m2")]
    assert qm.depth("Q") == 0


def test_expired_messages_are_removed_only_after_the_grace_period(qm):
    assert timedelta(minutes=5) == EXPIRY_GRACE  # as documented
    qm.define_queue("Q")
    expiry = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    qm.put("Q", [{"payload": "gone", "expiry": expiry}])
    qm.put("Q", [{"payload": "kept"}])
    assert qm.depth("Q") == 1
    summary = maintain(engine(qm), qm.inquire_queue("Q"), ZERO, now=expiry + EXPIRY_GRACE - timedelta(microseconds=1))
    assert _summary(summary) == (0, 0, 2, 2, 1)
    assert DeltaTable(store.queue_location(qm.root, "Q")).to_pyarrow_table().num_rows == 2
    summary = maintain(engine(qm), qm.inquire_queue("Q"), ZERO, now=expiry + EXPIRY_GRACE)
    assert _summary(summary) == (0, 1, 1, 1, 1)
    assert _payloads(DeltaTable(store.queue_location(qm.root, "Q")).to_pyarrow_table()) == ["kept"]
    assert _browse(qm) == ["kept"]
    assert qm.depth("Q") == 1


def test_expired_messages_in_a_plan_not_yet_consumed_are_kept(qm, new_reader):
    qm.define_queue("Q")
    now = datetime.now(UTC)
    qm.put(
        "Q",
        [
            {"payload": "gone", "expiry": now - timedelta(minutes=1)},
            {"payload": "soon", "expiry": now + timedelta(minutes=1)},
            {"payload": "kept"},
        ],
    )
    reader = new_reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert read_batch(reader, start, end) == [(0, "soon"), (1, "kept")]
    # An hour later every message but "kept" has been expired for long, yet the plan still holds them.
    # (A retention longer than that hour, so that this run deletes no file.)
    later, retention = now + timedelta(hours=1), timedelta(hours=2)
    assert _summary(maintain(engine(qm), qm.inquire_queue("Q"), retention, now=later)) == (0, 0, 3, 1, 1)
    assert read_batch(reader, start, end) == [(0, "soon"), (1, "kept")]
    reader.stop()
    restarted = new_reader()
    restarted.initialOffset()
    assert read_batch(restarted, start, end) == [(0, "soon"), (1, "kept")]
    assert restarted.latestOffset(end, ReadAllAvailable()) == end
    # Consumed (the expired one discarded by the batch): all three go.
    assert _summary(maintain(engine(qm), qm.inquire_queue("Q"), retention, now=later)) == (3, 0, 0, 1, 0)
    assert _browse(qm) == []


def test_maintenance_sets_the_checkpoint_interval_on_a_queue_table_of_an_earlier_mqspark(qm):
    qm.define_queue("Q")
    location = store.queue_location(qm.root, "Q")
    # Before the interval was set at creation, a queue table had Delta's default of 100.
    DeltaTable(location).alter.set_table_properties({"delta.checkpointInterval": "100"})
    _put_each(qm, ["m0", "m1"])
    qm.maintain("Q", retention=ZERO)
    assert DeltaTable(location).metadata().configuration["delta.checkpointInterval"] == "20"
    assert _browse(qm) == ["m0", "m1"]


def test_maintenance_checkpoints_cleans_up_the_log_and_vacuums_on_the_next_run(qm, new_reader):
    qm.define_queue("Q")
    _put_each(qm, [f"m{i}" for i in range(6)])
    start = (reader := new_reader()).initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(4))
    planned = reader.latestOffset(end, ReadMaxRows(4))
    # Versions: 0 create, 1-6 puts, 7 retention properties, 8 maintenance.
    summary = qm.maintain("Q", retention=ZERO)
    assert (_summary(summary), summary.version, summary.log_entries_removed, summary.files_vacuumed) == (
        (4, 0, 2, 6, 1),
        8,
        7,
        0,
    )
    assert _log(qm) == [
        "00000000000000000007.checkpoint.parquet",
        "00000000000000000007.json",
        "00000000000000000008.checkpoint.parquet",
        "00000000000000000008.json",
        "_last_checkpoint",
    ]
    configuration = DeltaTable(store.queue_location(qm.root, "Q")).metadata().configuration
    assert {key: configuration.get(key) for key in sorted(configuration) if key.startswith("delta.")} == {
        "delta.checkpointInterval": "20",
        "delta.deletedFileRetentionDuration": "interval 0 seconds",
        "delta.enableChangeDataFeed": "true",
        "delta.enableExpiredLogCleanup": "false",
        "delta.logRetentionDuration": "interval 0 seconds",
    }
    # The six put files stay until a later run: a reader on version 7 may still read them.
    assert len(_data_files(qm)) == 7
    summary = qm.maintain("Q", retention=ZERO)
    assert (_summary(summary), summary.version, summary.log_entries_removed, summary.files_vacuumed) == (
        (0, 0, 0, 1, 1),
        None,
        1,
        6,
    )
    assert len(_data_files(qm)) == 1
    assert [name for name in _log(qm) if name.endswith(".json")] == ["00000000000000000008.json"]
    assert "00000000000000000008.checkpoint.parquet" in _log(qm)
    # The table reads the same with delta-rs alone, and a restarted query replays its planned batch.
    assert _payloads(DeltaTable(store.queue_location(qm.root, "Q")).to_pyarrow_table()) == ["m4", "m5"]
    reader.stop()
    restarted = new_reader()
    restarted.initialOffset()
    assert read_batch(restarted, end, planned) == [(4, "m4"), (5, "m5")]
    assert restarted.latestOffset(planned, ReadMaxRows(4)) == planned
    assert qm.depth("Q") == 0


def test_a_long_retention_keeps_removed_files_and_log_entries(qm, new_reader):
    qm.define_queue("Q")
    _put_each(qm, ["m0", "m1"])
    _drain(new_reader())
    first = qm.maintain("Q")
    second = qm.maintain("Q")
    assert (_summary(first), first.log_entries_removed, first.files_vacuumed) == ((2, 0, 0, 2, 0), 0, 0)
    assert (_summary(second), second.log_entries_removed, second.files_vacuumed) == ((0, 0, 0, 0, 0), 0, 0)
    assert len(_data_files(qm)) == 2
    assert [name for name in _log(qm) if name.endswith(".json")] == [f"{v:020d}.json" for v in range(5)]
    configuration = DeltaTable(store.queue_location(qm.root, "Q")).metadata().configuration
    assert configuration["delta.logRetentionDuration"] == "interval 3600 seconds"


def test_the_state_table_stays_small_after_many_batches_and_maintenance(qm, new_reader):
    qm.define_queue("Q")
    _put_each(qm, [f"m{i}" for i in range(40)])
    # A lease of an hour: no renewal adds a state commit however slowly the 31 batches run.
    reader = new_reader(leaseTimeout="3600")
    start = reader.initialOffset()
    delivered = []
    for _ in range(31):
        end = reader.latestOffset(start, ReadMaxRows(1))
        delivered += read_batch(reader, start, end)
        start = end
    assert delivered == [(i, f"m{i}") for i in range(31)]
    state = DeltaTable(store.state_location(qm.root, "Q"))
    events = Counter(state.to_pyarrow_table()["event"].to_pylist())
    # Compacted at version 20 (COMPACT_EVERY): checkpoint rows, the lease, and the 13 plans and 12
    # consumption records of the batches since.
    assert (state.version(), events["lease"], events["plan"], events["consumed"]) == (33, 1, 13, 12)
    assert events["checkpoint"] > 0
    assert _summary(qm.maintain("Q", retention=ZERO)) == (30, 0, 10, 40, 1)
    rows = DeltaTable(store.state_location(qm.root, "Q")).to_pyarrow_table().to_pylist()
    mine = sorted(row["event"] for row in rows if row["consumer"] == "default")
    # The bound: the group's lease, its plan in flight, and at most one checkpoint row of its position.
    assert len(mine) <= 3
    assert mine.count("lease") == 1 and mine.count("plan") == 1
    # The maintenance lease is kept apart, in a table of its own.
    assert {row["consumer"] for row in rows} == {"default"}
    lease = DeltaTable(store.maintenance_location(qm.root, "Q")).to_pyarrow_table()
    assert sorted(zip(lease["consumer"].to_pylist(), lease["event"].to_pylist(), strict=True)) == [
        (MAINTENANCE, "lease"),
        (MAINTENANCE, "release"),
    ]
    assert ConsumerState(qm.root, "Q").last_position("default") == (31, 31)
    assert qm.depth("Q") == 10
    rows, _ = _drain(reader, start)
    assert rows == [(i, f"m{i}") for i in range(31, 40)]


def test_a_group_keeps_its_position_when_maintenance_removes_everything_it_consumed(qm, tmp_path, new_reader):
    qm.define_queue("Q")
    _put_each(qm, [f"m{i}" for i in range(3)])
    reader = new_reader()
    start = reader.initialOffset()
    for _ in range(3):
        end = reader.latestOffset(start, ReadMaxRows(1))
        start = end
    assert reader.latestOffset(start, ReadMaxRows(1)) == start
    state = ConsumerState(qm.root, "Q")
    assert state.last_position("default") == (3, 3)
    assert _summary(qm.maintain("Q", retention=ZERO)) == (3, 0, 0, 3, 0)
    assert state.last_position("default") == (3, 3)
    reader.stop()
    qm.put("Q", [{"payload": "new"}])
    restarted = new_reader()
    initial = restarted.initialOffset()
    assert (initial["seq"], initial["delivered"]) == (3, 3)
    rows, _ = _drain(restarted)
    assert rows == [(3, "new")]


def test_spark_free_reads_agree_with_the_live_messages(qm, new_reader):
    qm.define_queue("Q")
    qm.declare_consumer("Q", "B")
    _put_each(qm, [f"m{i}" for i in range(5)])
    start = (a := new_reader(consumer="A")).initialOffset()
    a.latestOffset(a.latestOffset(start, ReadMaxRows(4)), ReadMaxRows(4))
    start = (b := new_reader(consumer="B")).initialOffset()
    b.latestOffset(b.latestOffset(start, ReadMaxRows(2)), ReadMaxRows(2))
    assert _summary(qm.maintain("Q", retention=ZERO)) == (2, 0, 3, 5, 1)
    table = DeltaTable(store.queue_location(qm.root, "Q")).to_pyarrow_table()
    assert table.num_rows == 3
    assert sorted(_payloads(table)) == ["m2", "m3", "m4"]
    assert table["commit_version"].null_count == 0
    assert qm.depth("Q") == 3


def test_only_one_maintenance_runs_at_a_time(qm):
    qm.define_queue("Q")
    _put_each(qm, ["m0", "m1"])
    version = _version(qm)
    state = ConsumerState(qm.root, "Q", location=store.maintenance_location(qm.root, "Q"))
    state.acquire(MAINTENANCE, "someone", timedelta(seconds=30))
    in_use = re.escape(
        "MQRC_OBJECT_IN_USE (2042): queue Q: maintenance is already running (another process holds its lease)"
    )
    with pytest.raises(MQError, match=in_use) as refused:
        qm.maintain("Q", retention=ZERO)
    assert refused.value.reason == Reason.MQRC_OBJECT_IN_USE
    with pytest.raises(MQError, match=in_use):
        qm.purge("Q")
    assert _version(qm) == version
    assert _browse(qm) == ["m0", "m1"]
    # The maintenance lease is no consumer group: it keeps no messages.
    assert qm.consumers("Q") == []
    assert qm.depth("Q") == 2
    state.release(MAINTENANCE, "someone")
    assert _summary(qm.maintain("Q", retention=ZERO)) == (0, 0, 2, 2, 1)


# Purge


def test_purge_removes_every_message_for_every_group(qm, new_reader):
    qm.define_queue("Q")
    qm.declare_consumer("Q", "B")
    qm.put("Q", [{"payload": "m0"}, {"payload": "m1"}])
    qm.put("Q", [{"payload": "G1", "group_id": "G", "msg_seq_number": 1}])
    qm.put("Q", [{"payload": "m2", "expiry": datetime.now(UTC) + timedelta(hours=1)}])
    assert qm.depth("Q") == 4
    assert qm.purge("Q") == 4
    assert (qm.depth("Q"), qm.depth("Q", consumer="B")) == (0, 0)
    assert _browse(qm) == []
    assert DeltaTable(store.queue_location(qm.root, "Q")).to_pyarrow_table().num_rows == 0
    assert qm.purge("Q") == 0
    # Later messages are delivered, to every group; the group rules start afresh.
    qm.put(
        "Q",
        [{"payload": "after"}, {"payload": "G1 again", "group_id": "G", "msg_seq_number": 1, "last_in_group": True}],
    )
    assert _drain(new_reader(consumer="A"))[0] == [(0, "after"), (1, "G1 again")]
    assert _drain(new_reader(consumer="B"))[0] == [(0, "after"), (1, "G1 again")]
    assert qm.consumers("Q") == ["A", "B"]


def test_purge_is_refused_for_an_alias_while_a_group_reads_and_for_an_unknown_queue(qm, new_reader):
    qm.define_queue("Q")
    qm.define_queue("AL", type="alias", target_queue="Q")
    qm.put("Q", [{"payload": "m0"}])
    version = _version(qm)
    with pytest.raises(
        MQValidationError, match=re.escape("queue AL is an alias queue (target Q); purge its target instead")
    ):
        qm.purge("AL")
    with pytest.raises(
        MQError, match=re.escape("MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1")
    ):
        qm.purge("NOPE")
    reader = new_reader(consumer="A")
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    with pytest.raises(
        MQError,
        match=re.escape(
            "MQRC_OBJECT_IN_USE (2042): queue Q: consumer group 'A' is reading it; stop its query before purging"
        ),
    ) as refused:
        qm.purge("Q")
    assert refused.value.reason == Reason.MQRC_OBJECT_IN_USE
    assert _version(qm) == version
    assert read_batch(reader, reader.initialOffset(), end) == [(0, "m0")]
    reader.stop()
    assert qm.purge("Q") == 1
    # Maintenance of an alias maintains its target.
    assert qm.maintain("AL", retention=ZERO).queue == "Q"


def test_a_batch_in_flight_whose_messages_were_purged_delivers_what_is_left(qm, new_reader):
    qm.define_queue("Q")
    _put_each(qm, ["m0", "m1", "m2"])
    crashed = new_reader()
    start = crashed.initialOffset()
    end = crashed.latestOffset(start, ReadMaxRows(2))
    crashed.stop()
    assert qm.purge("Q") == 3
    qm.put("Q", [{"payload": "after"}])
    restarted = new_reader()
    restarted.initialOffset()
    assert read_batch(restarted, start, end) == []
    rows, _ = _drain(restarted, end)
    assert rows == [(2, "after")]
    assert qm.depth("Q") == 0


# Bad input changes nothing


@pytest.mark.parametrize(
    ("retention", "text"),
    [
        (timedelta(seconds=-1), "retention must be 0 or more, got -1 seconds"),
        (3600, "retention must be a timedelta, got int 3600"),
        ("1h", "retention must be a timedelta, got str '1h'"),
        (None, "retention must be a timedelta, got NoneType None"),
    ],
)
def test_a_bad_retention_is_refused_and_changes_nothing(qm, new_reader, retention, text):
    qm.define_queue("Q")
    _put_each(qm, ["m0", "m1"])
    _drain(new_reader())
    version = _version(qm)
    state_version = DeltaTable(store.state_location(qm.root, "Q")).version()
    with pytest.raises(MQValidationError, match=f"^{re.escape(text)}$"):
        qm.maintain("Q", retention=retention)
    assert _version(qm) == version
    assert DeltaTable(store.state_location(qm.root, "Q")).version() == state_version
    assert len(_data_files(qm)) == 2


def test_maintenance_of_an_unknown_queue_is_refused(qm):
    with pytest.raises(
        MQError, match=re.escape("MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1")
    ) as refused:
        qm.maintain("NOPE", retention=ZERO)
    assert refused.value.reason == Reason.MQRC_UNKNOWN_OBJECT_NAME
    assert not os.path.exists(store.state_location(qm.root, "NOPE"))


# The command line


def _cli(capsys, qm: QueueManager, *args: str):
    assert main(["--root", qm.root, *args, "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return json.loads(captured.out)


def test_cli_maintain_purge_consumer_and_depth(qm, capsys, new_reader):
    qm.define_queue("Q")
    assert _cli(capsys, qm, "consumer", "declare", "Q", "B") == [{"queue": "Q", "consumer": "B"}]
    _put_each(qm, ["m0", "m1", "m2"])
    reader = new_reader(consumer="A")
    _drain(reader)
    assert _cli(capsys, qm, "consumer", "list", "Q") == [
        {"queue": "Q", "consumer": "A"},
        {"queue": "Q", "consumer": "B"},
    ]
    assert [(r["consumer"], r["depth"]) for r in _cli(capsys, qm, "depth", "Q")] == [(None, 3), ("A", 0), ("B", 3)]
    [summary] = _cli(capsys, qm, "maintain", "Q", "--retention", "0")
    assert {key: summary[key] for key in summary if key != "seconds"} == {
        "queue": "Q",
        "version": 5,
        "expired_groups": [],
        "removed_consumed": 0,
        "removed_expired": 0,
        "rewritten": 3,
        "files_before": 3,
        "files_after": 1,
        "log_entries_removed": 4,
        "files_vacuumed": 0,
        "leftovers_removed": 0,
    }
    assert isinstance(summary["seconds"], float)
    assert _cli(capsys, qm, "consumer", "delete", "Q", "B") == [{"queue": "Q", "consumer": "A"}]
    no_failures = dict.fromkeys(("backout_queue", "backed_out", "error_queue", "errors", "dead_letters"))
    no_health = dict.fromkeys(("status", "claimable_age_s", "rate_per_s", "held_by"))
    lease = ConsumerState(qm.root, "Q", engine(qm).storage_options).lease("A", timedelta(seconds=30))
    # Nothing waits for A: its status is OK, whoever holds its lease (the drained reader, until it lapses).
    a_health = {**no_health, "status": "OK", "held_by": None if lease is None else lease.owner}
    assert _cli(capsys, qm, "depth") == [
        {
            "queue": "Q",
            "consumer": None,
            "depth": 0,
            "oldest_age_s": None,
            **no_health,
            **no_failures,
            "dead_letters": 0,
        },
        {"queue": "Q", "consumer": "A", "depth": 0, "oldest_age_s": None, **a_health, **no_failures},
        {"queue": DLQ, "consumer": None, "depth": 0, "oldest_age_s": None, **no_health, **no_failures},
    ]
    # Every local queue when none is named.
    summaries = _cli(capsys, qm, "maintain", "--retention", "0s")
    assert [(s["queue"], s["removed_consumed"], s["files_after"], s["files_vacuumed"]) for s in summaries] == [
        ("Q", 3, 0, 3),
        (DLQ, 0, 0, 0),
    ]
    qm.put("Q", [{"payload": "x"}, {"payload": "y"}])
    assert main(["--root", qm.root, "purge", "Q", "--json"]) == 1
    assert capsys.readouterr().err == (
        "mqspark: error: MQRC_OBJECT_IN_USE (2042): queue Q: consumer group 'A' is reading it; "
        "stop its query before purging\n"
    )
    reader.stop()
    assert _cli(capsys, qm, "purge", "Q") == {"queue": "Q", "purged": 2}
    assert _browse(qm) == []


def test_cli_refuses_bad_retentions_and_unknown_groups(qm, capsys):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "m0"}])
    version = _version(qm)
    with pytest.raises(SystemExit) as exited:
        main(["--root", qm.root, "maintain", "Q", "--retention", "5x"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "mqspark maintain: error: argument --retention: a duration is seconds, or a number with s, m, h or d; got '5x'"
    )
    for given in (["--retention", "-5"], ["--retention=-5m"]):
        assert main(["--root", qm.root, "maintain", "Q", *given]) == 1
        captured = capsys.readouterr()
        seconds = 300 if given[-1].endswith("m") else 5
        assert (captured.out, captured.err) == (
            "",
            f"mqspark: error: retention must be 0 or more, got -{seconds} seconds\n",
        )
    assert _version(qm) == version
    assert main(["--root", qm.root, "consumer", "delete", "Q", "nobody"]) == 1
    assert capsys.readouterr().err == (
        "mqspark: error: MQRC_UNKNOWN_OBJECT_NAME (2085): queue Q: consumer group 'nobody' does not exist\n"
    )
    assert main(["--root", qm.root, "purge", "NOPE"]) == 1
    assert capsys.readouterr().err == (
        "mqspark: error: MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1\n"
    )


@pytest.mark.slow  # MAINTAIN_AT_FILES (256) puts, one by one
def test_a_put_that_leaves_many_files_compacts_them(qm):
    qm.define_queue("Q")
    payloads = [f"m{i}" for i in range(MAINTAIN_AT_FILES)]
    for payload in payloads[:-1]:
        qm.put("Q", [{"payload": payload}])
    assert len(DeltaTable(store.queue_location(qm.root, "Q")).file_uris()) == MAINTAIN_AT_FILES - 1
    # The put that makes MAINTAIN_AT_FILES files runs maintenance: nothing is consumed, all is merged.
    qm.put("Q", [{"payload": payloads[-1]}])
    assert len(DeltaTable(store.queue_location(qm.root, "Q")).file_uris()) == 1
    assert _browse(qm) == _browse(qm, "physical") == payloads
    assert qm.depth("Q") == MAINTAIN_AT_FILES


def test_a_snapshot_older_than_a_log_clean_up_is_read_again_newer(qm):
    qm.define_queue("Q")
    _put_each(qm, ["a", "b"])
    location = store.queue_location(qm.root, "Q")
    before = DeltaTable(location)
    ConsumerState(qm.root, "Q").declare("keeper")
    assert _summary(qm.maintain("Q", retention=ZERO)) == (0, 0, 2, 2, 1)
    # The old snapshot's put files need their add versions, whose log entries are gone now.
    with pytest.raises(store.LogEntryGone, match=r"log entry of version \d+ is gone \(log clean-up\?\)"):
        store.read_committed(before, MESSAGE_SCHEMA.names, MESSAGE_SCHEMA)
    # A queue manager that opened the table before the clean-up reads the newer snapshot instead.
    assert _browse(qm) == ["a", "b"]
    assert qm.depth("Q") == 2
    qm.put("Q", [{"payload": "c"}])
    assert _browse(qm) == ["a", "b", "c"]


def test_a_browse_whose_files_maintenance_deleted_meanwhile_reads_a_newer_snapshot(qm, monkeypatch):
    """Between ordering the index and reading the rows it returns, maintenance (retention 0, run
    twice) rewrites the queue's files and deletes the old ones: the browse reads again, newer."""
    from mqspark.engine.pending import PendingMessages

    qm.define_queue("Q")
    _put_each(qm, ["a", "b", "c"])
    read_columns = PendingMessages.read_columns
    runs = []

    def maintained_first(self, rows, columns):
        if not runs:
            runs.append([qm.maintain("Q", retention=ZERO).files_vacuumed for _ in range(2)])
        return read_columns(self, rows, columns)

    monkeypatch.setattr(PendingMessages, "read_columns", maintained_first)
    assert _payloads(qm.browse("Q", limit=2)) == ["a", "b"]
    # The second run deleted the three put files the first one replaced.
    assert runs == [[0, 3]]
    # At a fixed version the browse cannot read again: it says why.
    _put_each(qm, ["d", "e"])
    before = _version(qm)
    runs.clear()
    with pytest.raises(store.LogEntryGone, match=rf"a data file of version {before} was deleted"):
        browse_queue(engine(qm), "Q", DeliveryOptions(), version=before)
    # The first run merged the file of a-c and the two new put files; the second deleted all three.
    assert runs == [[0, 3]]


@pytest.mark.parametrize("retention, vacuumed", [(None, 0), (timedelta(hours=1), 2)])
def test_log_clean_up_deletes_the_files_removed_by_the_entries_it_drops(qm, new_reader, retention, vacuumed):
    """An entry that comes of age after the run's vacuum looked at it, but before the log clean-up
    does, would leave the files it removed behind, named nowhere; told the retention, the clean-up
    deletes them with the entry."""
    qm.define_queue("Q")
    _put_each(qm, ["a", "b"])
    _drain(new_reader())
    # Versions: 0 create, 1-2 puts, 3 retention properties, 4 maintenance (removes the two put files).
    assert qm.maintain("Q").version == 4
    qm.put("Q", [{"payload": "c"}])
    location = store.queue_location(qm.root, "Q")
    two_hours_ago = time.time() - 7200
    for entry in (Path(location) / "_delta_log").glob("0000000000000000000[0-4].*"):
        os.utime(entry, (two_hours_ago, two_hours_ago))
    assert len(_data_files(qm)) == 3
    assert store.clean_up_log(DeltaTable(location, version=5), retention) == (5, vacuumed)
    assert len(_data_files(qm)) == 3 - vacuumed
    assert _browse(qm) == ["c"]


# What delta-rs said when maintenance's log clean-up removed a log file it had listed (seen in a soak run).
GONE_CHECKPOINT = (
    "Kernel error: Arrow error: External: Object at location {log}/00000000000000000000.checkpoint.parquet "
    "not found: No such file or directory (os error 2)"
)
GONE_ENTRY = "Kernel error: File not found: {log}/{version:020d}.json"


@pytest.mark.parametrize(
    ("text", "version", "landed"),
    [
        (GONE_CHECKPOINT, 1, True),  # an older checkpoint, and the table reached the commit's version
        (GONE_CHECKPOINT, 5, False),  # an older checkpoint, but the table never reached version 5
        (GONE_ENTRY, 5, True),  # the commit's own entry: only ever read after it was written
        ("Kernel error: Generic delta kernel error: something else", 1, False),
    ],
)
def test_a_commit_whose_log_read_back_failed_counts_as_landed_only_when_it_did(qm, text, version, landed):
    """delta-rs reads the log back after a commit; a clean-up running then can delete what it reads."""
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"a"}])
    location = store.queue_location(qm.root, "Q")
    error = DeltaError(text.format(log=f"{location}/_delta_log", version=version))
    assert DeltaTable(location).version() == 1
    assert store.read_back_failed(error, location, version, None) is landed
