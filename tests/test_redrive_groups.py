"""Redrive and consumer groups (spec sections 4 and 5): a copy a group moved to the backout queue goes
back for that group only, exactly once, and a redriven group item is delivered in its group's order.

Python gets on real Delta tables; a failed delivery is a ``syncpoint_get`` whose block raises, and
``backout_threshold`` 1 moves the message at the group's next get. Where the streaming get's state
matters, its planner is called directly, as Spark would (no Spark session).
"""

from __future__ import annotations

import logging
import shutil
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import mqspark
from mqspark import MQValidationError, QueueManager, store
from mqspark.cli.main import main
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.puts import Puts
from mqspark.engine.redrive import REDRIVER
from mqspark.engine.waiting import waiting_messages
from mqspark.model.messages import PRODUCER_FIELDS
from mqspark.model.ranges import NO_RANGES
from mqspark.qmgr import engine

from .support.stream_batches import read_batch

OLD_ROOT = Path(__file__).parent / "fixtures" / "qm-before-failure-queue"


def _fail(qm: QueueManager, consumer: str, queue: str = "Q") -> list[bytes]:
    """One failed delivery of the next message for ``consumer``: its payload."""
    with pytest.raises(RuntimeError), qm.syncpoint_get(queue, consumer=consumer) as messages:
        payloads = messages["payload"].to_pylist()
        raise RuntimeError("cannot process")
    return payloads


def _got(qm: QueueManager, consumer: str, queue: str = "Q", max_messages: int = 10) -> list[tuple]:
    got = qm.get(queue, consumer=consumer, max_messages=max_messages)
    return list(zip(*(got[name].to_pylist() for name in ("payload", "backout_count", "redriven_for")), strict=True))


def _queue(qm: QueueManager, groups: tuple[str, ...]) -> None:
    qm.define_queue("BO")
    qm.define_queue("Q", backout_threshold=1, backout_queue="BO")
    for group in groups:
        qm.declare_consumer("Q", group)


def _header(qm: QueueManager, queue: str = "BO") -> list[tuple]:
    rows = qm.browse(queue, order="physical")
    names = ("payload", "backout_count", "dlq_original_queue", "dlq_consumer_group", "redriven_for")
    return list(zip(*(rows[name].to_pylist() for name in names), strict=True))


def _depths(qm: QueueManager, groups: tuple[str, ...]) -> dict[str | None, int]:
    return {None: qm.depth("Q"), **{group: qm.depth("Q", consumer=group) for group in groups}}


def _g2_failed_by_a(qm: QueueManager) -> None:
    """Group G of three items on Q, for group A alone: g1 got, g2 failed once (moved at A's next get)."""
    _queue(qm, ("A",))
    qm.put(
        "Q", [{"payload": f"g{n}", "group_id": "G", "msg_seq_number": n, "last_in_group": n == 3} for n in (1, 2, 3)]
    )
    assert _got(qm, "A", max_messages=1) == [(b"g1", 0, None)]
    assert _fail(qm, "A") == [b"g2"]


def test_three_groups_failing_a_poison_message_each_get_their_own_copy_back_once(qm):
    groups = ("A", "B", "C", "D")
    _queue(qm, groups)
    qm.put("Q", [{"payload": "m1"}, {"payload": "m2"}])
    for group in ("A", "B", "C"):
        assert _fail(qm, group) == [b"m1"]
        # At the threshold: m1 moves to BO with this group's name, and m2 is delivered.
        assert _got(qm, group) == [(b"m2", 0, None)]
    assert _got(qm, "D") == [(b"m1", 0, None), (b"m2", 0, None)]
    assert _header(qm) == [(b"m1", 1, "Q", group, None) for group in ("A", "B", "C")]
    assert _depths(qm, groups) == {None: 0, "A": 0, "B": 0, "C": 0, "D": 0}

    assert qm.redrive("BO") == {"Q": 3}
    assert qm.depth("BO") == 0
    assert _header(qm, "Q") == [
        (b"m1", 0, None, None, None),
        (b"m2", 0, None, None, None),
        *((b"m1", 0, None, None, group) for group in ("A", "B", "C")),
    ]
    assert _depths(qm, groups) == {None: 3, "A": 1, "B": 1, "C": 1, "D": 0}
    for group in ("A", "B", "C"):
        assert _got(qm, group) == [(b"m1", 0, group)]
        assert _got(qm, group) == []
    assert _got(qm, "D") == []
    assert _depths(qm, groups) == {None: 0, "A": 0, "B": 0, "C": 0, "D": 0}
    assert qm.redrive("BO") == {}


def test_a_group_that_consumed_the_original_gets_no_copy_and_a_new_group_gets_the_original(qm):
    _queue(qm, ("A", "B"))
    qm.put("Q", [{"payload": "m1"}])
    assert _got(qm, "B") == [(b"m1", 0, None)]
    assert _fail(qm, "A") == [b"m1"]
    assert _got(qm, "A") == []
    assert qm.redrive("BO") == {"Q": 1}
    assert _got(qm, "B") == []
    # A group that comes later reads what is still on the queue for every group: the original.
    qm.declare_consumer("Q", "E")
    assert qm.depth("Q", consumer="E") == 1
    assert _got(qm, "E") == [(b"m1", 0, None)]
    assert _got(qm, "A") == [(b"m1", 0, "A")]
    assert _depths(qm, ("A", "B", "E")) == {None: 0, "A": 0, "B": 0, "E": 0}


def test_backlog_and_waiting_messages_per_group_after_a_redrive(qm):
    _queue(qm, ("A", "B"))
    qm.put("Q", [{"payload": "m1"}, {"payload": "m2"}])
    assert _fail(qm, "A") == [b"m1"]
    assert _got(qm, "A", max_messages=1) == [(b"m2", 0, None)]
    assert qm.redrive("BO") == {"Q": 1}
    # B has not read yet: both originals wait for it, the copy does not.
    put_times = qm.browse("Q", order="physical")["put_time"].to_pylist()
    backlogs = [qm.backlog("Q", "A"), qm.backlog("Q", "B"), qm.backlog("Q")]
    assert [(b.depth, b.oldest_put_time) for b in backlogs] == [(1, put_times[2]), (2, put_times[0]), (3, put_times[0])]
    waiting = {
        group: waiting_messages(engine(qm), "Q", group, ["payload"])["payload"].to_pylist() for group in ("A", "B")
    }
    assert waiting == {"A": [b"m1"], "B": [b"m1", b"m2"]}
    groups = ConsumerState(qm.root, "Q").all_groups()
    backlog = engine(qm).group_backlog("Q", groups, datetime.now(UTC), "A", NO_RANGES)
    assert (backlog.count, backlog.depth, backlog.claimable) == (1, 3, 1)
    backlog = engine(qm).group_backlog("Q", groups, datetime.now(UTC), "B", NO_RANGES)
    assert (backlog.count, backlog.depth, backlog.claimable) == (2, 3, 2)


def test_maintenance_removes_a_redriven_copy_once_its_group_consumed_it(qm):
    _queue(qm, ("A", "B"))
    qm.put("Q", [{"payload": "m1"}])
    assert _fail(qm, "A") == [b"m1"]
    assert _got(qm, "A") == []
    assert _got(qm, "B") == [(b"m1", 0, None)]
    assert qm.redrive("BO") == {"Q": 1}
    # The original is consumed by both groups; the copy waits for A alone.
    assert qm.maintain("Q", retention=timedelta(0)).removed_consumed == 1
    assert _header(qm, "Q") == [(b"m1", 0, None, None, "A")]
    assert _got(qm, "A") == [(b"m1", 0, "A")]
    assert qm.maintain("Q", retention=timedelta(0)).removed_consumed == 1
    assert _header(qm, "Q") == []


def test_maintenance_keeps_a_groups_items_while_its_redriven_item_and_later_items_wait(qm):
    _g2_failed_by_a(qm)
    # A get that matches nothing moves g2 at the threshold and leaves g3 waiting: G is in flight.
    assert qm.get("Q", consumer="A", msg_id="no-such-message").num_rows == 0
    assert qm.redrive("BO") == {"Q": 1}
    # The consumed g1 and g2 anchor the group for A while its redriven g2 and g3 wait.
    assert qm.maintain("Q", retention=timedelta(0)).removed_consumed == 0
    assert [row[0] for row in _header(qm, "Q")] == [b"g1", b"g2", b"g3", b"g2"]
    assert _got(qm, "A") == [(b"g2", 0, "A"), (b"g3", 0, None)]
    assert qm.maintain("Q", retention=timedelta(0)).removed_consumed == 4
    assert _header(qm, "Q") == []


def test_maintenance_removes_a_finished_groups_items_while_its_redriven_item_waits(qm):
    _g2_failed_by_a(qm)
    assert _got(qm, "A") == [(b"g3", 0, None)]
    assert qm.redrive("BO") == {"Q": 1}
    # Every item G's producer put is consumed: the copy is a new put and needs none of them to anchor it.
    assert qm.maintain("Q", retention=timedelta(0)).removed_consumed == 3
    assert _header(qm, "Q") == [(b"g2", 0, None, None, "A")]
    assert _got(qm, "A") == [(b"g2", 0, "A")]
    assert qm.maintain("Q", retention=timedelta(0)).removed_consumed == 1
    assert _header(qm, "Q") == []


def test_redriven_items_of_one_group_keep_their_order_whichever_goes_back_first(qm):
    _queue(qm, ("A", "B"))
    ids = qm.put(
        "Q", [{"payload": f"g{n}", "group_id": "G", "msg_seq_number": n, "last_in_group": n == 4} for n in (1, 2, 3, 4)]
    )
    assert _got(qm, "A", max_messages=1) == [(b"g1", 0, None)]
    assert _fail(qm, "A") == [b"g2"]
    assert _got(qm, "A", max_messages=1) == [(b"g3", 0, None)]
    assert _fail(qm, "A") == [b"g4"]
    assert _got(qm, "A") == []
    assert [row[0] for row in _header(qm)] == [b"g2", b"g4"]
    assert qm.redrive("BO", msg_ids=[ids[3]]) == {"Q": 1}
    assert qm.redrive("BO", msg_ids=[ids[1]]) == {"Q": 1}
    got = qm.get("Q", consumer="A", max_messages=10)
    assert list(zip(got["payload"].to_pylist(), got["group_id"].to_pylist(), strict=True)) == [
        (b"g2", "G"),
        (b"g4", "G"),
    ]
    assert _got(qm, "B") == [(b"g1", 0, None), (b"g2", 0, None), (b"g3", 0, None), (b"g4", 0, None)]


def test_a_redriven_item_goes_before_the_items_of_its_group_still_waiting(qm):
    _g2_failed_by_a(qm)
    # A get that matches nothing still moves g2 at the threshold, and leaves g3 waiting.
    assert qm.get("Q", consumer="A", msg_id="no-such-message").num_rows == 0
    assert [row[0] for row in _header(qm)] == [b"g2"]
    assert qm.redrive("BO") == {"Q": 1}
    assert _got(qm, "A") == [(b"g2", 0, "A"), (b"g3", 0, None)]


_GROUP_AND_X = [
    {"payload": "g1", "group_id": "G", "msg_seq_number": 1},
    {"payload": "g2", "group_id": "G", "msg_seq_number": 2, "last_in_group": True},
    {"payload": "x", "correl_id": "cx"},
]


def _fail_all_by_get(qm: QueueManager, new_reader) -> None:
    """g1, g2 and x fail once in one Python get, and the next get moves them to BO."""
    with pytest.raises(RuntimeError), qm.syncpoint_get("Q", max_messages=3) as messages:
        assert messages["payload"].to_pylist() == [b"g1", b"g2", b"x"]
        raise RuntimeError("down")
    assert qm.get("Q", max_messages=5).num_rows == 0


def _fail_all_by_stream(qm: QueueManager, new_reader) -> None:
    """g1, g2 and x fail once in a streaming batch (``mqspark.backout`` in foreachBatch, as the Spark
    round-trip test does), and planning the next batch moves them to BO."""
    reader = new_reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    delivered = read_batch(reader, start, end)
    assert delivered == [(0, "g1"), (1, "g2"), (2, "x")]
    assert mqspark.backout([{"queue": "Q", "delivery_seq": seq} for seq, _ in delivered], "down", root=qm.root) == 3
    assert reader.latestOffset(end, ReadAllAvailable()) == end
    reader.stop()


def _get_kept(qm: QueueManager, new_reader) -> list[tuple]:
    return _got(qm, "default")


def _get_fresh(qm: QueueManager, new_reader) -> list[tuple]:
    # Another thread keeps no index of its own: its get reads the queue afresh.
    with ThreadPoolExecutor(1) as other:
        return other.submit(_got, qm, "default").result()


def _stream(qm: QueueManager, new_reader) -> list[tuple]:
    reader = new_reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    rows = [row for part in reader.partitions(start, end) for batch in reader.read(part) for row in batch.to_pylist()]
    reader.commit(end)
    return [(row["payload"], row["backout_count"], row["redriven_for"]) for row in rows]


@pytest.mark.parametrize("fail", [_fail_all_by_get, _fail_all_by_stream])
@pytest.mark.parametrize("deliver", [_get_kept, _get_fresh, _stream])
def test_a_finished_groups_copies_go_where_they_were_put_whatever_the_index_held(qm, new_reader, fail, deliver):
    # A redriven copy is a new put, and MQ places a group at its first item's put: G's copies went
    # back after x's copy, so x goes first. The consumed originals anchor nothing once G is finished;
    # an index that dropped them before the copies came (a get's kept index) and one read afresh
    # with both (a new streaming query) used to disagree: g1, g2, x from the latter.
    _queue(qm, ())
    qm.put("Q", _GROUP_AND_X)
    fail(qm, new_reader)
    assert _header(qm) == [(payload, 1, "Q", "default", None) for payload in (b"g1", b"g2", b"x")]
    assert qm.redrive("BO", correl_ids=["cx"]) == {"Q": 1}
    assert qm.redrive("BO") == {"Q": 2}
    assert _header(qm, "Q") == [
        *((payload, 0, None, None, None) for payload in (b"g1", b"g2", b"x")),
        *((payload, 0, None, None, "default") for payload in (b"x", b"g1", b"g2")),
    ]
    assert deliver(qm, new_reader) == [(b"x", 0, "default"), (b"g1", 0, "default"), (b"g2", 0, "default")]
    assert qm.depth("Q", consumer="default") == 0
    assert qm.maintain("Q", retention=timedelta(0)).removed_consumed == 6


def test_a_queue_table_of_an_earlier_version_redrives_for_its_group(tmp_path):
    root = tmp_path / "qm"
    shutil.copytree(OLD_ROOT, root)
    qm = QueueManager.open(str(root))
    location = store.queue_location(qm.root, "REQUESTS")
    assert "redriven_for" not in store.open_table(location, None).schema().to_arrow().names
    qm.define_queue("BO")
    qm.alter_queue("REQUESTS", backout_threshold=1, backout_queue="BO")
    qm.declare_consumer("REQUESTS", "billing")
    assert qm.depth("REQUESTS", consumer="audit") == 4
    assert _fail(qm, "audit", "REQUESTS") == [b"r2"]
    assert _got(qm, "audit", "REQUESTS", max_messages=1) == [(b"r1", 0, None)]
    assert _header(qm) == [(b"r2", 1, "REQUESTS", "audit", None)]
    assert qm.redrive("BO") == {"REQUESTS": 1}
    # The put back added the column; the files written before read it as null (every group).
    assert "redriven_for" in store.open_table(location, None).schema().to_arrow().names
    assert {group: qm.depth("REQUESTS", consumer=group) for group in ("audit", "billing")} == {
        "audit": 3,
        "billing": 4,
    }
    assert _got(qm, "audit", "REQUESTS") == [(b"r2", 0, "audit"), (b"g1", 0, None), (b"g2", 0, None)]
    assert _got(qm, "billing", "REQUESTS") == [(b"r2", 0, None), (b"r1", 0, None), (b"g1", 0, None), (b"g2", 0, None)]
    assert qm.depth("REQUESTS") == 0


def test_a_copy_whose_group_was_deleted_stays_until_a_group_of_that_name_is_back(qm, caplog, capsys):
    _queue(qm, ("A", "B"))
    qm.put("Q", [{"payload": "m1"}])
    assert _fail(qm, "A") == [b"m1"]
    assert _got(qm, "A") == []
    assert _got(qm, "B") == [(b"m1", 0, None)]
    qm.delete_consumer("Q", "A")
    with caplog.at_level(logging.WARNING, logger="mqspark"):
        assert qm.redrive("BO") == {}
    assert [record.getMessage() for record in caplog.records] == [
        "redrive: queue BO: 1 message(s) stay: consumer group 'A' of queue Q, which moved them, no longer exists"
    ]
    assert main(["--root", qm.root, "redrive", "BO", "--json"]) == 0
    assert capsys.readouterr() == (
        "[]\n",
        "mqspark: warning: redrive: queue BO: 1 message(s) stay: consumer group 'A' of queue Q, which moved them, "
        "no longer exists\n",
    )
    assert _header(qm) == [(b"m1", 1, "Q", "A", None)]
    # Only B counted: maintenance removes the original it consumed; a group A declared anew gets the copy.
    assert qm.maintain("Q", retention=timedelta(0)).removed_consumed == 1
    qm.declare_consumer("Q", "A")
    assert qm.redrive("BO") == {"Q": 1}
    assert _got(qm, "A") == [(b"m1", 0, "A")]
    assert _got(qm, "B") == []


def test_a_copy_redriven_for_a_group_deleted_since_waits_for_nobody(qm):
    _queue(qm, ("A", "B"))
    qm.put("Q", [{"payload": "m1"}])
    assert _fail(qm, "A") == [b"m1"]
    assert _got(qm, "A") == []
    assert qm.redrive("BO") == {"Q": 1}
    qm.delete_consumer("Q", "A")
    assert _depths(qm, ("B",)) == {None: 1, "B": 1}
    assert _got(qm, "B") == [(b"m1", 0, None)]
    assert _depths(qm, ("B",)) == {None: 0, "B": 0}
    assert qm.maintain("Q", retention=timedelta(0)).removed_consumed == 2
    assert _header(qm, "Q") == []


@pytest.mark.parametrize("field", ["redriven_for", "dlq_consumer_group"])
def test_a_producer_cannot_address_a_message_to_a_group(qm, field):
    qm.define_queue("Q")
    with pytest.raises(MQValidationError) as refused:
        qm.put("Q", [{"payload": "x", field: "A"}])
    assert str(refused.value) == (
        f"queue Q: unknown field {field!r} in message 0; fields are {', '.join(PRODUCER_FIELDS)}"
    )
    assert qm.depth("Q") == 0


def _fail_once(monkeypatch, target: object, name: str, when) -> list[str]:
    """Make ``target.name`` raise once, when ``when(*args)`` holds: the redrive stops there, as it would at an error."""
    original = getattr(target, name)
    crashed: list[str] = []

    def crashing(*args, **kwargs):
        if not crashed and when(*args):
            crashed.append(name)
            raise RuntimeError(f"interrupted in {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, crashing)
    return crashed


def _is_redrive_consumed(state: ConsumerState, rows: pa.Table, *_: object) -> bool:
    events = rows.to_pydict()
    return state.queue == "BO" and events["consumer"] == [REDRIVER] and events["event"] == ["consumed"]


# The next redrive finishes the interrupted one whatever it selects, even nothing.
@pytest.mark.parametrize("selector", [{}, {"msg_ids": ["no such message"]}], ids=["all", "nothing"])
def test_a_redrive_interrupted_after_its_put_landed_is_finished_by_the_next_once(qm, monkeypatch, selector):
    _queue(qm, ("A", "B"))
    qm.put("Q", [{"payload": "m1"}])
    assert _fail(qm, "A") == [b"m1"]
    assert _got(qm, "A") == []
    crashed = _fail_once(monkeypatch, ConsumerState, "append", _is_redrive_consumed)
    with pytest.raises(RuntimeError, match="interrupted in append"):
        qm.redrive("BO")
    assert crashed == ["append"]
    assert [row[4] for row in _header(qm, "Q")] == [None, "A"]
    # The next redrive finishes the move without putting it again; nothing else is chosen.
    assert qm.redrive("BO", **selector) == {}
    assert qm.depth("BO") == 0
    assert [row[4] for row in _header(qm, "Q")] == [None, "A"]
    assert _got(qm, "A") == [(b"m1", 0, "A")]
    assert _got(qm, "B") == [(b"m1", 0, None)]


def test_a_redrive_interrupted_before_its_put_is_put_once_by_the_next(qm, monkeypatch):
    _queue(qm, ("A",))
    qm.put("Q", [{"payload": "m1"}])
    assert _fail(qm, "A") == [b"m1"]
    assert _got(qm, "A") == []
    crashed = _fail_once(monkeypatch, Puts, "commit_put", lambda _puts, queue, *_: queue == "Q")
    with pytest.raises(RuntimeError, match="interrupted in commit_put"):
        qm.redrive("BO")
    assert crashed == ["commit_put"]
    assert [row[4] for row in _header(qm, "Q")] == [None]
    assert qm.redrive("BO") == {}
    assert [row[4] for row in _header(qm, "Q")] == [None, "A"]
    assert qm.depth("BO") == 0
    assert _got(qm, "A") == [(b"m1", 0, "A")]


def test_what_redrive_took_stays_taken_after_the_backout_queues_state_is_compacted(qm):
    """Redrive only moves messages: its group has no plans, and compaction once dropped its finished
    moves with nothing to fold them into, so the next redrive moved every copy again (chaos run)."""
    _queue(qm, ("A",))
    qm.put("Q", [{"payload": "m1"}])
    assert _fail(qm, "A") == [b"m1"]
    assert _got(qm, "A") == []  # m1 moves at A's next get
    assert qm.redrive("BO") == {"Q": 1}

    assert ConsumerState(qm.root, "BO", engine(qm).storage_options).compact()

    assert qm.depth("BO") == 0
    assert qm.redrive("BO") == {}
    assert _got(qm, "A") == [(b"m1", 0, "A")]
