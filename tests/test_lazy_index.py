"""The pending index read lazily (files and row groups best first, see mqspark.engine.unread) against one read whole:
two consumer groups drain the same queue with the same gets, through puts of later priorities,
groups spanning puts, maintenance between gets and indexes built afresh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqspark import QueueManager, store
from mqspark.engine import browse, planner, unread
from mqspark.engine import get as get_module
from mqspark.engine.pending import PendingMessages
from mqspark.model.ranges import NO_RANGES
from mqspark.store import files

COLUMNS = ["msg_id", "payload", "priority", "group_id", "msg_seq_number", "offset"]
LATER = datetime.now(UTC) + timedelta(days=1)
EARLIER = datetime.now(UTC) - timedelta(hours=1)


@st.composite
def transactions(draw, first: int) -> list[list[dict]]:
    """Puts of plain messages and groups (items spread over several puts), some timed, few overridden."""
    items: list[dict] = []
    for number in range(draw(st.integers(0, 8))):
        plain = {"msg_id": f"P{first + number}", "payload": f"P{first + number}"}
        plain["priority"] = draw(st.sampled_from([0, 4, 9]))
        kind = draw(st.sampled_from(["plain"] * 8 + ["top", "expired", "expires", "delayed", "was-delayed"]))
        if kind == "top":
            plain["top_of_queue"] = True
        elif kind == "expired":
            plain["expiry"] = EARLIER
        elif kind == "expires":
            plain["expiry"] = LATER
        elif kind == "delayed":
            plain["available_at"] = LATER
        elif kind == "was-delayed":
            plain["available_at"] = EARLIER
        items.append(plain)
    for group in range(draw(st.integers(0, 3))):
        group_id, priority = f"G{first + group}", draw(st.sampled_from([0, 4, 9]))
        count = draw(st.integers(1, 4))
        complete = draw(st.booleans())
        for seq in range(1, count + 1):
            items.append(
                {
                    "msg_id": f"G{first + group}.{seq}",
                    "payload": f"G{first + group}.{seq}",
                    "group_id": group_id,
                    "msg_seq_number": seq,
                    "priority": priority,
                    "last_in_group": complete and seq == count,
                }
            )
    shuffled = draw(st.permutations(items))
    cuts = sorted(draw(st.lists(st.integers(0, len(shuffled)), max_size=4)))
    bounds = [0, *cuts, len(shuffled)]
    return [list(shuffled[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


STEPS = st.lists(st.sampled_from(["get"] * 5 + ["put", "maintain", "afresh"]), min_size=4, max_size=14)


@pytest.mark.slow
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    first=transactions(0),
    later=st.tuples(transactions(100), transactions(200), transactions(300)),
    steps=STEPS,
    sizes=st.lists(st.integers(1, 3), min_size=1, max_size=4),
)
def test_gets_on_a_lazily_read_index_deliver_what_gets_on_the_whole_index_do(
    tmp_path_factory: pytest.TempPathFactory,
    first: list[list[dict]],
    later: tuple[list[list[dict]], ...],
    steps: list[str],
    sizes: list[int],
) -> None:
    # Files of more than 3 rows are read row group by row group, of 3 rows each.
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(files, "ROW_GROUP_ROWS", 3)
    monkeypatch.setattr(unread, "SPLIT_ROWS", 3)
    qm = QueueManager.create(tmp_path_factory.mktemp("qm"), "QM1")
    qm.define_queue("Q")
    for group in ("short", "whole"):
        qm.declare_consumer("Q", group)
    for rows in first:
        qm.put("Q", rows)
    waiting = list(later)
    default = planner.HEAD
    try:
        for step, action in enumerate(steps):
            if action == "put" and waiting:
                for rows in waiting.pop(0):
                    qm.put("Q", rows)
            elif action == "maintain":
                qm.maintain("Q")
            elif action == "afresh":
                # A new thread's first get builds its index from the table's snapshot.
                get_module._threads.__dict__.pop("groups", None)
            else:
                size = sizes[step % len(sizes)]
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(browse, "HEAD", 1)
                    browsed = qm.browse("Q", limit=size)
                everything = qm.browse("Q")
                assert browsed.select(COLUMNS).to_pylist() == everything.select(COLUMNS).to_pylist()[:size]
                assert browsed.schema.metadata == everything.schema.metadata
                planner.HEAD = 1
                short = qm.get("Q", "short", max_messages=size)
                planner.HEAD = 10**9
                whole = qm.get("Q", "whole", max_messages=size)
                assert short.select(COLUMNS).to_pylist() == whole.select(COLUMNS).to_pylist(), step
    finally:
        planner.HEAD = default
        monkeypatch.undo()
    assert qm.depth("Q", "short") == qm.depth("Q", "whole")


def test_a_get_reads_only_the_files_its_head_needs(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten puts of ten: a get of one reads the first put's file; a priority-9 put made last is read
    first, and its message overtakes every waiting one."""
    qm = QueueManager.create(tmp_path, "QM1")
    qm.define_queue("Q")
    for put in range(10):
        qm.put("Q", [{"msg_id": f"M{put}.{row}", "payload": b"x"} for row in range(10)])
    read: list[str] = []
    original = store.read_messages

    def counting(location: str, path: str, *args: object, **kwargs: object) -> object:
        read.append(path)
        return original(location, path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "read_messages", counting)
    monkeypatch.setattr(planner, "HEAD", 1)
    assert qm.get("Q", "c", max_messages=1)["msg_id"].to_pylist() == ["M0.0"]
    assert len(read) == 1
    qm.put("Q", [{"msg_id": "urgent", "payload": b"x", "priority": 9}])
    get_module._threads.__dict__.pop("groups", None)
    read.clear()
    assert qm.get("Q", "c", max_messages=2)["msg_id"].to_pylist() == ["urgent", "M0.1"]
    assert len(read) == 2


def test_a_later_put_read_at_once_waits_behind_unread_files(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index reads a new put's file as it comes, before older files it has not read: their
    messages still go first."""
    qm = QueueManager.create(tmp_path, "QM1")
    qm.define_queue("Q")
    for put in range(3):
        qm.put("Q", [{"msg_id": f"M{put}.{row}", "payload": b"x"} for row in range(4)])
    monkeypatch.setattr(planner, "HEAD", 1)
    assert qm.get("Q", "c", max_messages=1)["msg_id"].to_pylist() == ["M0.0"]
    qm.put("Q", [{"msg_id": f"N.{row}", "payload": b"x"} for row in range(4)])
    delivered = [qm.get("Q", "c", max_messages=1)["msg_id"][0].as_py() for _ in range(15)]
    assert delivered == [f"M{put}.{row}" for put in range(3) for row in range(4)][1:] + [f"N.{row}" for row in range(4)]


def test_a_message_named_in_an_unread_row_group_of_a_file_partly_read_is_read(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan or a failure names a message by identity: the part holding it is read, even when the
    index already read other row groups of its file (they share its origin)."""
    monkeypatch.setattr(files, "ROW_GROUP_ROWS", 3)
    monkeypatch.setattr(unread, "SPLIT_ROWS", 3)
    qm = QueueManager.create(tmp_path, "QM1")
    qm.define_queue("Q")
    qm.put("Q", [{"msg_id": f"M{row}", "payload": b"x"} for row in range(9)])
    location = store.queue_location(qm.root, "Q")
    pending = PendingMessages(location)
    pending.load(NO_RANGES, lanes="priority")
    assert pending.ensure(1, datetime.now(UTC))
    assert pending.rows["put_seq"].to_pylist() == [0, 1, 2]
    named = pa.table({"origin": [pending.origins[0]], "row": [7], "count": [1]}, schema=NO_RANGES.schema)
    file, row = pending.locate(pending.range_keys(named))
    assert (file.tolist(), row.tolist()) == ([0], [7])
    assert sorted(pending.rows["put_seq"].to_pylist()) == [0, 1, 2, 6, 7, 8]
