"""Python put (QueueManager.put), depth and browse in physical order (spec sections 2, 3, 4 and 9)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from mqspark import MQError, MQValidationError, QueueManager, Reason, store
from mqspark.model.messages import MESSAGE_SCHEMA, STAMPED_NULL_FIELDS

from .support.error_checks import refused, unchanged

FIELDS = (
    "msg_id, correl_id, priority, group_id, msg_seq_number, offset, last_in_group, segmented, last_segment, "
    "payload, properties, reply_to_queue, reply_to_qmgr, failure_queue, expiry, available_at, backout_count, "
    "top_of_queue, before_msg_id"
)


def stored(qm: QueueManager, queue: str) -> pa.Table:
    """The queue table's rows in physical (commit, put_seq) order, as stored: no delivery rules applied."""
    table = store.open_table(store.queue_location(qm.root, queue), None)
    rows = store.read_committed(table, MESSAGE_SCHEMA.names, MESSAGE_SCHEMA)
    return rows.sort_by([("commit_version", "ascending"), ("put_seq", "ascending")]).drop_columns(["commit_version"])


def queue_with_message(qm: QueueManager, name: str = "Q", **attributes: Any) -> None:
    """Define ``name`` and put one message on it, so a refused put has something to leave alone."""
    qm.define_queue(name, **attributes)
    qm.put(name, [{"payload": "one", "msg_id": "FIRST"}])


def ids_of(qm: QueueManager, queue: str) -> list[str]:
    return qm.browse(queue, order="physical")["msg_id"].to_pylist()


def segments_of(qm: QueueManager, queue: str) -> list[tuple[Any, ...]]:
    columns = [
        "msg_id",
        "group_id",
        "msg_seq_number",
        "offset",
        "segmented",
        "last_segment",
        "last_in_group",
        "payload",
    ]
    return [tuple(row[c] for c in columns) for row in qm.browse(queue).select(columns).to_pylist()]


def is_generated_id(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{32}", value) is not None


# Put and browse


def test_put_list_of_dicts_returns_msg_ids_in_browse_order(qm: QueueManager) -> None:
    qm.define_queue("Q")
    first = qm.put("Q", [{"payload": b"a"}, {"payload": "b"}, {"payload": b"c"}])
    second = qm.put("Q", [{"payload": b"d"}])
    assert all(is_generated_id(i) for i in first + second)
    assert len(set(first + second)) == 4
    browsed = qm.browse("Q", order="physical")
    assert browsed["msg_id"].to_pylist() == first + second
    assert browsed["payload"].to_pylist() == [b"a", b"b", b"c", b"d"]
    assert browsed["put_seq"].to_pylist() == [0, 1, 2, 0]


def test_put_arrow_table(qm: QueueManager) -> None:
    qm.define_queue("Q")
    data = pa.table(
        {
            "payload": pa.array(["a", "b"], pa.large_string()),
            "correl_id": pa.array(["C1", None], pa.large_string()),
            "priority": pa.array([3, 4], pa.int8()),
            "backout_count": pa.array([None, 2], pa.int64()),
        }
    )
    ids = qm.put("Q", data)
    browsed = qm.browse("Q").select(["msg_id", "payload", "correl_id", "priority", "backout_count"]).to_pylist()
    assert [row.pop("msg_id") for row in browsed] == list(reversed(ids))
    assert browsed == [
        {"payload": b"b", "correl_id": None, "priority": 4, "backout_count": 2},
        {"payload": b"a", "correl_id": "C1", "priority": 3, "backout_count": 0},
    ]


def test_given_msg_ids_are_kept(qm: QueueManager) -> None:
    qm.define_queue("Q")
    ids = qm.put("Q", [{"payload": "a", "msg_id": "ID-A"}, {"payload": "b"}, {"payload": "c", "msg_id": "ID-C"}])
    assert ids[0] == "ID-A" and ids[2] == "ID-C" and is_generated_id(ids[1])
    assert ids_of(qm, "Q") == ids


def test_empty_put_writes_nothing(qm: QueueManager) -> None:
    queue_with_message(qm)
    with unchanged(qm):
        assert qm.put("Q", []) == []
        assert qm.put("Q", pa.table({"payload": pa.array([], pa.binary())})) == []


# Outside the dead-letter queue a message has no dead-letter header.
# Neither redriven nor dead-lettered: what only mqspark stamps is null.
NULL_STAMPS = dict.fromkeys(STAMPED_NULL_FIELDS)


def test_defaults_are_filled(qm: QueueManager) -> None:
    qm.define_queue("Q", default_priority=4)
    before = datetime.now(UTC)
    [msg_id] = qm.put("Q", [{"payload": "héllo"}])
    after = datetime.now(UTC)
    [row] = stored(qm, "Q").to_pylist()
    put_time = row.pop("put_time")
    assert before <= put_time <= after
    assert put_time.utcoffset() == timedelta(0)
    assert row == {
        "msg_id": msg_id,
        "correl_id": None,
        "priority": 4,
        "group_id": None,
        "msg_seq_number": 1,
        "offset": 0,
        "last_in_group": False,
        "segmented": False,
        "last_segment": False,
        "payload": "héllo".encode(),
        "properties": None,
        "reply_to_queue": None,
        "reply_to_qmgr": None,
        "failure_queue": None,
        "expiry": None,
        "available_at": None,
        "backout_count": 0,
        "top_of_queue": False,
        "before_msg_id": None,
        "put_seq": 0,
        **NULL_STAMPS,
    }


def test_given_priority_overrides_default(qm: QueueManager) -> None:
    qm.define_queue("Q", default_priority=4)
    qm.put("Q", [{"payload": "a", "priority": 0}, {"payload": "b", "priority": None}])
    assert qm.browse("Q")["priority"].to_pylist() == [4, 0]


FULL_ROWS = [
    {
        "msg_id": "M-1",
        "correl_id": "C-1",
        "priority": 6,
        "group_id": "G-1",
        "msg_seq_number": 2,
        "offset": 0,
        "last_in_group": True,
        "segmented": False,
        "last_segment": False,
        "payload": b"\x00\xffbin",
        "properties": {"k1": "v1", "k2": "", "k3": "ü"},
        "reply_to_queue": "REPLY.Q",
        "reply_to_qmgr": "QM2",
        "failure_queue": "FAILED.Q",
        "expiry": datetime(2031, 2, 3, 4, 5, 6, 789012, tzinfo=UTC),
        "available_at": datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        "backout_count": 3,
        "top_of_queue": False,
        "before_msg_id": None,
    },
    {
        "msg_id": "M-2",
        "correl_id": "C-2",
        "priority": 6,
        "group_id": "G-2",
        "msg_seq_number": 1,
        "offset": 8,
        "last_in_group": True,
        "segmented": True,
        "last_segment": True,
        "payload": b"tail",
        "properties": {},
        "reply_to_queue": "R/2",
        "reply_to_qmgr": "QM3",
        "failure_queue": None,
        "expiry": datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
        "available_at": datetime(1970, 1, 1, tzinfo=UTC),
        "backout_count": 0,
        "top_of_queue": False,
        "before_msg_id": None,
    },
]


def as_arrow(rows: list[dict[str, Any]]) -> pa.Table:
    schema = pa.schema([MESSAGE_SCHEMA.field(name).with_nullable(True) for name in rows[0]])
    return pa.Table.from_pylist([{**row, "properties": list(row["properties"].items())} for row in rows], schema)


@pytest.mark.parametrize("as_table", [False, True], ids=["dicts", "arrow"])
def test_every_field_round_trips(qm: QueueManager, as_table: bool) -> None:
    qm.define_queue("Q")
    assert qm.put("Q", as_arrow(FULL_ROWS) if as_table else FULL_ROWS) == ["M-1", "M-2"]
    browsed = stored(qm, "Q").drop_columns(["put_time"]).to_pylist()
    assert browsed == [
        {**row, "properties": list(row["properties"].items()), "put_seq": seq, **NULL_STAMPS}
        for seq, row in enumerate(FULL_ROWS)
    ]
    for row in browsed:
        assert row["expiry"].utcoffset() == row["available_at"].utcoffset() == timedelta(0)


def test_naive_datetimes_are_utc(qm: QueueManager) -> None:
    qm.define_queue("Q", delivery_sequence="fifo")
    naive = datetime(2030, 6, 1, 12, 30, 15, 250)
    qm.put("Q", [{"payload": "a", "expiry": naive, "available_at": naive}])
    qm.put(
        "Q",
        pa.table(
            {
                "payload": ["b"],
                "expiry": pa.array([naive], pa.timestamp("us")),
                "available_at": pa.array([naive], pa.timestamp("ms")),
            }
        ),
    )
    rows = stored(qm, "Q").select(["expiry", "available_at"]).to_pylist()
    assert rows == [
        {"expiry": naive.replace(tzinfo=UTC), "available_at": naive.replace(tzinfo=UTC)},
        {"expiry": naive.replace(tzinfo=UTC), "available_at": datetime(2030, 6, 1, 12, 30, 15, tzinfo=UTC)},
    ]


def test_other_time_zones_are_converted_to_utc(qm: QueueManager) -> None:
    qm.define_queue("Q", delivery_sequence="fifo")
    plus_two = datetime(2030, 6, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    qm.put("Q", [{"payload": "a", "expiry": plus_two}])
    qm.put("Q", pa.table({"payload": ["b"], "expiry": pa.array([plus_two], pa.timestamp("us", tz="+02:00"))}))
    expiries = stored(qm, "Q")["expiry"].to_pylist()
    assert expiries == [datetime(2030, 6, 1, 12, 0, tzinfo=UTC)] * 2
    assert [e.utcoffset() for e in expiries] == [timedelta(0)] * 2


# Physical order

PUTS = [
    [{"msg_id": "A", "priority": 1}, {"msg_id": "B", "priority": 5}, {"msg_id": "C", "priority": 1}],
    [{"msg_id": "D", "priority": 5}, {"msg_id": "E", "priority": 9}, {"msg_id": "F", "priority": 1}],
    [{"msg_id": "G", "priority": 5}],
]


@pytest.mark.parametrize(
    ("delivery_sequence", "expected"),
    [("priority", ["E", "B", "D", "G", "A", "C", "F"]), ("fifo", ["A", "B", "C", "D", "E", "F", "G"])],
)
def test_physical_order(qm: QueueManager, delivery_sequence: str, expected: list[str]) -> None:
    qm.define_queue("Q", delivery_sequence=delivery_sequence)
    for rows in PUTS:
        qm.put("Q", [{**row, "payload": row["msg_id"]} for row in rows])
    assert ids_of(qm, "Q") == expected
    assert qm.browse("Q")["payload"].to_pylist() == [i.encode() for i in expected]


def test_physical_order_follows_alias_target_delivery_sequence(qm: QueueManager) -> None:
    qm.define_queue("Q", delivery_sequence="fifo")
    qm.define_queue("A", type="alias", target_queue="Q", delivery_sequence="priority")
    qm.put("A", [{"payload": "low", "msg_id": "LOW", "priority": 0}, {"payload": "hi", "msg_id": "HI", "priority": 9}])
    assert ids_of(qm, "A") == ["LOW", "HI"]


def test_browse_changes_nothing(qm: QueueManager) -> None:
    queue_with_message(qm)
    with unchanged(qm):
        assert ids_of(qm, "Q") == ["FIRST"]
        assert ids_of(qm, "Q") == ["FIRST"]


# Groups and segments


def test_group_across_two_puts(qm: QueueManager) -> None:
    qm.define_queue("Q")
    qm.put(
        "Q",
        [
            {"payload": "g1", "group_id": "G", "msg_seq_number": 1},
            {"payload": "x"},
            {"payload": "g2", "group_id": "G", "msg_seq_number": 2},
        ],
    )
    qm.put("Q", [{"payload": "g3", "group_id": "G", "msg_seq_number": 3, "last_in_group": True}])
    columns = ["payload", "group_id", "msg_seq_number", "last_in_group"]
    assert [tuple(r.values()) for r in qm.browse("Q", "physical").select(columns).to_pylist()] == [
        (b"g1", "G", 1, False),
        (b"x", None, 1, False),
        (b"g2", "G", 2, False),
        (b"g3", "G", 3, True),
    ]


def test_group_gap_filled_by_later_put(qm: QueueManager) -> None:
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "g3", "group_id": "G", "msg_seq_number": 3, "last_in_group": True}])
    qm.put(
        "Q",
        [
            {"payload": "g1", "group_id": "G", "msg_seq_number": 1},
            {"payload": "g2", "group_id": "G", "msg_seq_number": 2},
        ],
    )
    assert qm.browse("Q", "physical")["msg_seq_number"].to_pylist() == [3, 1, 2]
    assert qm.browse("Q")["msg_seq_number"].to_pylist() == [1, 2, 3]


def test_segmentation_of_ungrouped_message(qm: QueueManager) -> None:
    qm.define_queue("Q", max_message_length=4)
    qm.put("Q", [{"payload": "0123456789", "msg_id": "M"}, {"payload": "abcd", "msg_id": "SHORT"}], segmentation=True)
    rows = segments_of(qm, "Q")
    group_id = rows[0][1]
    assert is_generated_id(group_id)
    assert rows == [
        ("M", group_id, 1, 0, True, False, True, b"0123"),
        ("M", group_id, 1, 4, True, False, True, b"4567"),
        ("M", group_id, 1, 8, True, True, True, b"89"),
        ("SHORT", None, 1, 0, False, False, False, b"abcd"),
    ]
    assert b"".join(row[-1] for row in rows[:3]) == b"0123456789"


def test_segmentation_of_grouped_messages(qm: QueueManager) -> None:
    qm.define_queue("Q", max_message_length=4)
    qm.put(
        "Q",
        [
            {"payload": "0123456789", "msg_id": "M1", "group_id": "G", "msg_seq_number": 1, "priority": 3},
            {
                "payload": "abcdef",
                "msg_id": "M2",
                "group_id": "G",
                "msg_seq_number": 2,
                "last_in_group": True,
                "priority": 3,
            },
        ],
        segmentation=True,
    )
    assert segments_of(qm, "Q") == [
        ("M1", "G", 1, 0, True, False, False, b"0123"),
        ("M1", "G", 1, 4, True, False, False, b"4567"),
        ("M1", "G", 1, 8, True, True, False, b"89"),
        ("M2", "G", 2, 0, True, False, True, b"abcd"),
        ("M2", "G", 2, 4, True, True, True, b"ef"),
    ]
    assert qm.browse("Q")["priority"].to_pylist() == [3] * 5


def test_each_segmented_message_gets_its_own_group(qm: QueueManager) -> None:
    qm.define_queue("Q", max_message_length=2)
    qm.put("Q", [{"payload": "abc"}, {"payload": "xyz"}], segmentation=True)
    rows = segments_of(qm, "Q")
    assert [row[1] for row in rows] == [rows[0][1]] * 2 + [rows[2][1]] * 2
    assert rows[0][1] != rows[2][1]
    assert [(row[2], row[3], row[5], row[7]) for row in rows] == [
        (1, 0, False, b"ab"),
        (1, 2, True, b"c"),
        (1, 0, False, b"xy"),
        (1, 2, True, b"z"),
    ]


def test_payload_of_exactly_max_length_is_not_segmented(qm: QueueManager) -> None:
    qm.define_queue("Q", max_message_length=4)
    qm.put("Q", [{"payload": "abcd", "msg_id": "A"}])
    qm.put("Q", [{"payload": "efgh", "msg_id": "B"}], segmentation=True)
    assert segments_of(qm, "Q") == [
        ("A", None, 1, 0, False, False, False, b"abcd"),
        ("B", None, 1, 0, False, False, False, b"efgh"),
    ]


def test_segmented_put_returns_one_msg_id_per_message(qm: QueueManager) -> None:
    qm.define_queue("Q", max_message_length=4)
    ids = qm.put("Q", [{"payload": "0123456789", "msg_id": "M"}, {"payload": "x"}], segmentation=True)
    assert ids == ["M", ids_of(qm, "Q")[-1]]


# Depth


def test_depth_counts_messages(qm: QueueManager) -> None:
    qm.define_queue("Q")
    assert qm.depth("Q") == 0
    qm.put("Q", [{"payload": "a"}, {"payload": "b"}, {"payload": "c"}])
    assert qm.depth("Q") == 3
    qm.put("Q", [{"payload": "d"}])
    assert qm.depth("Q") == 4
    assert QueueManager.open(qm.root).depth("Q") == 4


def test_depth_of_alias_is_target_depth(qm: QueueManager) -> None:
    qm.define_queue("Q")
    qm.define_queue("A", type="alias", target_queue="Q")
    qm.put("Q", [{"payload": "a"}])
    qm.put("A", [{"payload": "b"}])
    assert qm.depth("A") == qm.depth("Q") == 2


def test_put_up_to_max_depth_is_accepted(qm: QueueManager) -> None:
    queue_with_message(qm, max_depth=3)
    qm.put("Q", [{"payload": "b"}, {"payload": "c"}])
    assert qm.depth("Q") == 3


def test_unknown_queue_depth_is_refused(qm: QueueManager) -> None:
    with refused(
        MQError,
        "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1",
        Reason.MQRC_UNKNOWN_OBJECT_NAME,
    ):
        qm.depth("NOPE")


# Put errors: each leaves every table as it was.

GROUP = {"payload": "g", "group_id": "G"}
PUT_ERRORS = [
    pytest.param(
        [{"payload": "ok"}, {"payload": "bad", "priority": 10}],
        "MQRC_PRIORITY_ERROR (2050): queue Q: field priority has value 10 in message 1: must be 0-9",
        Reason.MQRC_PRIORITY_ERROR,
        id="priority-10",
    ),
    pytest.param(
        [{"payload": "bad", "priority": -1}],
        "MQRC_PRIORITY_ERROR (2050): queue Q: field priority has value -1 in message 0: must be 0-9",
        Reason.MQRC_PRIORITY_ERROR,
        id="priority-minus-1",
    ),
    pytest.param(
        [{"payload": "bad", "priority": 2**40}],
        "MQRC_PRIORITY_ERROR (2050): queue Q: field priority has value 1099511627776 in message 0, out of range",
        Reason.MQRC_PRIORITY_ERROR,
        id="priority-beyond-int32",
    ),
    pytest.param(
        [{**GROUP, "msg_seq_number": 1}, GROUP],
        "MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field msg_seq_number has value None in message 1: "
        "is missing for a message in group G",
        Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        id="group-without-msg_seq_number",
    ),
    pytest.param(
        [{"payload": "x", "msg_seq_number": 2}],
        "MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field msg_seq_number has value 2 in message 0: "
        "is given without group_id",
        Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        id="msg_seq_number-without-group",
    ),
    pytest.param(
        [{**GROUP, "msg_seq_number": 0}],
        "MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field msg_seq_number has value 0 in message 0: must be 1 or more",
        Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        id="msg_seq_number-0",
    ),
    pytest.param(
        [{**GROUP, "msg_seq_number": 1}, {**GROUP, "msg_seq_number": 2}, {**GROUP, "msg_seq_number": 1}],
        "MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field msg_seq_number: group G has msg_seq_number 1 twice",
        Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        id="duplicate-msg_seq_number",
    ),
    pytest.param(
        [{**GROUP, "msg_seq_number": 1, "last_in_group": True}, {**GROUP, "msg_seq_number": 2}],
        "MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field msg_seq_number: group G has msg_seq_number 2 "
        "after its last message 1",
        Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        id="msg_seq_number-after-last",
    ),
    pytest.param(
        [{**GROUP, "msg_seq_number": 1, "last_in_group": True}, {**GROUP, "msg_seq_number": 2, "last_in_group": True}],
        "MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field last_in_group: group G has more than one last message",
        Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        id="two-last-in-group",
    ),
    pytest.param(
        [{**GROUP, "msg_seq_number": 1, "priority": 5}, {**GROUP, "msg_seq_number": 2, "priority": 1}],
        "MQRC_PRIORITY_ERROR (2050): queue Q: field priority: group G mixes priorities 1 and 5",
        Reason.MQRC_PRIORITY_ERROR,
        id="mixed-priorities-in-group",
    ),
    pytest.param(
        [{**GROUP, "msg_seq_number": 1}, {**GROUP, "msg_seq_number": 2, "priority": 4}],
        "MQRC_PRIORITY_ERROR (2050): queue Q: field priority: group G mixes priorities 0 and 4",
        Reason.MQRC_PRIORITY_ERROR,
        id="default-and-given-priority-in-group",
    ),
    pytest.param(
        [{"payload": "x", "last_in_group": True}],
        "MQRC_GROUP_ID_ERROR (2258): queue Q: field last_in_group has value True in message 0: is set without group_id",
        Reason.MQRC_GROUP_ID_ERROR,
        id="last_in_group-without-group",
    ),
    pytest.param(
        [{"payload": "x", "group_id": ""}],
        "MQRC_GROUP_ID_ERROR (2258): queue Q: field group_id has value '' in message 0: must not be empty",
        Reason.MQRC_GROUP_ID_ERROR,
        id="empty-group_id",
    ),
    pytest.param(
        [{"payload": "x", "segmented": True}],
        "MQRC_GROUP_ID_ERROR (2258): queue Q: field segmented has value True in message 0: is set without group_id "
        "(segments of one message share a group_id)",
        Reason.MQRC_GROUP_ID_ERROR,
        id="segmented-without-group",
    ),
    pytest.param(
        [{"payload": "x", "offset": 4}],
        "MQRC_OFFSET_ERROR (2251): queue Q: field offset has value 4 in message 0: "
        "must be 0 for a message that is not a segment",
        Reason.MQRC_OFFSET_ERROR,
        id="offset-without-segmented",
    ),
    pytest.param(
        [{"payload": "x", "last_segment": True}],
        "MQRC_OFFSET_ERROR (2251): queue Q: field last_segment has value True in message 0: "
        "is set on a message that is not a segment",
        Reason.MQRC_OFFSET_ERROR,
        id="last_segment-without-segmented",
    ),
    pytest.param(
        [{"payload": "ok"}, {"payload": 5}],
        "queue Q: field payload has value 5 in message 1, which is not binary",
        None,
        id="payload-int",
    ),
    pytest.param(
        [{"payload": "x", "colour": "red"}],
        f"queue Q: unknown field 'colour' in message 0; fields are {FIELDS}",
        None,
        id="unknown-field",
    ),
    pytest.param(
        [{"payload": "x"}, {"correl_id": "c"}],
        "queue Q: field payload is null in message 1",
        None,
        id="payload-missing-in-one-row",
    ),
    pytest.param([{"correl_id": "c"}], "queue Q: field payload is required", None, id="payload-missing"),
    pytest.param([{"payload": None}], "queue Q: field payload is null in message 0", None, id="payload-null"),
    pytest.param(
        [{"payload": "x", "properties": {"k": 1}}],
        "queue Q: field properties has value [('k', 1)] in message 0, which is not map<string, string>",
        None,
        id="properties-not-text",
    ),
    pytest.param(
        [{"payload": "x", "expiry": "2030-01-01"}],
        "queue Q: field expiry has value '2030-01-01' in message 0, which is not timestamp[us, tz=UTC]",
        None,
        id="expiry-text",
    ),
    pytest.param(
        ["payload"], "queue Q: message 0 must be a dict of fields, got str 'payload'", None, id="row-not-a-dict"
    ),
]


@pytest.mark.parametrize(("rows", "text", "reason"), PUT_ERRORS)
def test_put_refused(qm: QueueManager, rows: list[Any], text: str, reason: Reason | None) -> None:
    queue_with_message(qm)
    with unchanged(qm), refused(MQValidationError, text, reason):
        qm.put("Q", rows)


TABLE_ERRORS = [
    pytest.param(
        pa.table({"payload": [1, 2]}), "queue Q: field payload has type int64, expected binary", None, id="payload-int"
    ),
    pytest.param(
        pa.table({"payload": ["x"], "colour": ["red"]}),
        f"queue Q: unknown field 'colour'; fields are {FIELDS}",
        None,
        id="unknown-field",
    ),
    pytest.param(pa.table({"correl_id": ["c"]}), "queue Q: field payload is required", None, id="payload-missing"),
    pytest.param(
        pa.table({"payload": pa.array([b"x", None])}),
        "queue Q: field payload is null in message 1",
        None,
        id="payload-null",
    ),
    pytest.param(
        pa.table({"payload": ["x"], "priority": pa.array([10], pa.int8())}),
        "MQRC_PRIORITY_ERROR (2050): queue Q: field priority has value 10 in message 0: must be 0-9",
        Reason.MQRC_PRIORITY_ERROR,
        id="priority-10",
    ),
    pytest.param(
        pa.table({"payload": ["x"], "priority": pa.array([2**40])}),
        "MQRC_PRIORITY_ERROR (2050): queue Q: field priority has value 1099511627776 in message 0, out of range",
        Reason.MQRC_PRIORITY_ERROR,
        id="priority-beyond-int32",
    ),
    pytest.param(
        pa.table({"payload": ["x"], "expiry": ["2030-01-01"]}),
        "queue Q: field expiry has type string, expected timestamp[us, tz=UTC]",
        None,
        id="expiry-text",
    ),
]


@pytest.mark.parametrize(("data", "text", "reason"), TABLE_ERRORS)
def test_put_table_refused(qm: QueueManager, data: pa.Table, text: str, reason: Reason | None) -> None:
    queue_with_message(qm)
    with unchanged(qm), refused(MQValidationError, text, reason):
        qm.put("Q", data)


COMMITTED_GROUP_ERRORS = [
    pytest.param(
        [{**GROUP, "msg_seq_number": 1}],
        [{**GROUP, "msg_seq_number": 1}],
        "field msg_seq_number: group G has msg_seq_number 1 twice",
        id="duplicate-msg_seq_number",
    ),
    pytest.param(
        [{**GROUP, "msg_seq_number": 1}, {**GROUP, "msg_seq_number": 2, "last_in_group": True}],
        [{**GROUP, "msg_seq_number": 3}],
        "field msg_seq_number: group G has msg_seq_number 3 after its last message 2",
        id="msg_seq_number-after-last",
    ),
    pytest.param(
        [{**GROUP, "msg_seq_number": 1}, {**GROUP, "msg_seq_number": 3}],
        [{**GROUP, "msg_seq_number": 2, "last_in_group": True}],
        "field msg_seq_number: group G has msg_seq_number 3 after its last message 2",
        id="last-before-committed",
    ),
    pytest.param(
        [{**GROUP, "msg_seq_number": 1, "last_in_group": True}],
        [{**GROUP, "msg_seq_number": 2, "last_in_group": True}],
        "field last_in_group: group G has more than one last message",
        id="second-last-in-group",
    ),
]


@pytest.mark.parametrize(("committed", "rows", "text"), COMMITTED_GROUP_ERRORS)
def test_put_refused_against_committed_group(
    qm: QueueManager, committed: list[dict[str, Any]], rows: list[dict[str, Any]], text: str
) -> None:
    qm.define_queue("Q")
    qm.put("Q", committed)
    with (
        unchanged(qm),
        refused(
            MQValidationError, f"MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: {text}", Reason.MQRC_MSG_SEQ_NUMBER_ERROR
        ),
    ):
        qm.put("Q", [{"payload": "ok"}, *rows])


def test_a_committed_group_item_is_found_among_files_of_other_groups_and_plain_messages(qm: QueueManager) -> None:
    """A put reads only the files whose group_id statistics may hold its groups: the file holding G's
    first item lies among files of groups named below, between and above it, and of no group."""
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "a", "group_id": "A", "msg_seq_number": 1}])
    qm.put("Q", [{**GROUP, "msg_seq_number": 1}, {"payload": "plain"}])
    for name in ("F", "H", "Z"):
        qm.put("Q", [{"payload": name, "group_id": name, "msg_seq_number": 1}])
        qm.put("Q", [{"payload": "plain"}])
    qm.put(
        "Q",
        [
            {"payload": "B", "group_id": "B", "msg_seq_number": 1},
            {"payload": "Y", "group_id": "Y", "msg_seq_number": 1},
        ],
    )
    with (
        unchanged(qm),
        refused(
            MQValidationError,
            "MQRC_MSG_SEQ_NUMBER_ERROR (2250): queue Q: field msg_seq_number: group G has msg_seq_number 1 twice",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        ),
    ):
        qm.put("Q", [{**GROUP, "msg_seq_number": 1}])
    qm.put("Q", [{**GROUP, "msg_seq_number": 2, "last_in_group": True}])
    assert qm.depth("Q") == 12


def test_group_of_other_queue_does_not_conflict(qm: QueueManager) -> None:
    qm.define_queue("Q1")
    qm.define_queue("Q2")
    qm.put("Q1", [{**GROUP, "msg_seq_number": 1, "last_in_group": True}])
    qm.put("Q2", [{**GROUP, "msg_seq_number": 1, "last_in_group": True}])
    assert (qm.depth("Q1"), qm.depth("Q2")) == (1, 1)


def test_put_inhibited_is_refused(qm: QueueManager) -> None:
    queue_with_message(qm)
    qm.alter_queue("Q", put_inhibited=True)
    with (
        unchanged(qm),
        refused(MQError, "MQRC_PUT_INHIBITED (2051): queue Q is put-inhibited", Reason.MQRC_PUT_INHIBITED),
    ):
        qm.put("Q", [{"payload": "x"}])


def test_put_via_put_inhibited_alias_is_refused(qm: QueueManager) -> None:
    queue_with_message(qm)
    qm.define_queue("A", type="alias", target_queue="Q", put_inhibited=True)
    with (
        unchanged(qm),
        refused(MQError, "MQRC_PUT_INHIBITED (2051): queue A is put-inhibited", Reason.MQRC_PUT_INHIBITED),
    ):
        qm.put("A", [{"payload": "x"}])
    assert qm.put("Q", [{"payload": "direct", "msg_id": "D"}]) == ["D"]


def test_put_via_alias_of_put_inhibited_queue_is_refused(qm: QueueManager) -> None:
    queue_with_message(qm)
    qm.define_queue("A", type="alias", target_queue="Q")
    qm.alter_queue("Q", put_inhibited=True)
    with (
        unchanged(qm),
        refused(MQError, "MQRC_PUT_INHIBITED (2051): queue Q is put-inhibited", Reason.MQRC_PUT_INHIBITED),
    ):
        qm.put("A", [{"payload": "x"}])


def test_put_after_put_inhibit_is_lifted(qm: QueueManager) -> None:
    qm.define_queue("Q", put_inhibited=True)
    qm.alter_queue("Q", put_inhibited=False)
    assert qm.put("Q", [{"payload": "x", "msg_id": "X"}]) == ["X"]


def test_put_to_full_queue_is_refused(qm: QueueManager) -> None:
    queue_with_message(qm, max_depth=1)
    with (
        unchanged(qm),
        refused(MQError, "MQRC_Q_FULL (2053): queue Q is full (max_depth 1, depth 1, put of 1)", Reason.MQRC_Q_FULL),
    ):
        qm.put("Q", [{"payload": "x"}])


def test_put_exceeding_max_depth_partially_writes_nothing(qm: QueueManager) -> None:
    queue_with_message(qm, max_depth=3)
    with (
        unchanged(qm),
        refused(MQError, "MQRC_Q_FULL (2053): queue Q is full (max_depth 3, depth 1, put of 3)", Reason.MQRC_Q_FULL),
    ):
        qm.put("Q", [{"payload": "a"}, {"payload": "b"}, {"payload": "c"}])


def test_put_to_queue_with_max_depth_0_is_refused(qm: QueueManager) -> None:
    qm.define_queue("Q", max_depth=0)
    with (
        unchanged(qm),
        refused(MQError, "MQRC_Q_FULL (2053): queue Q is full (max_depth 0, depth 0, put of 1)", Reason.MQRC_Q_FULL),
    ):
        qm.put("Q", [{"payload": "a"}])


def test_put_via_alias_to_full_queue_is_refused(qm: QueueManager) -> None:
    queue_with_message(qm, max_depth=1)
    qm.define_queue("A", type="alias", target_queue="Q", max_depth=100)
    with (
        unchanged(qm),
        refused(MQError, "MQRC_Q_FULL (2053): queue Q is full (max_depth 1, depth 1, put of 1)", Reason.MQRC_Q_FULL),
    ):
        qm.put("A", [{"payload": "x"}])


def test_message_too_long_without_segmentation_is_refused(qm: QueueManager) -> None:
    queue_with_message(qm, max_message_length=5)
    with (
        unchanged(qm),
        refused(
            MQValidationError,
            "MQRC_MSG_TOO_BIG_FOR_Q (2030): queue Q: field payload of message 1 is 6 bytes, longer than "
            "max_message_length 5 (segmentation not allowed)",
            Reason.MQRC_MSG_TOO_BIG_FOR_Q,
        ),
    ):
        qm.put("Q", [{"payload": "12345"}, {"payload": "123456"}])


@pytest.mark.parametrize("normal_first", [False, True], ids=["segment-only", "after-a-long-message"])
def test_producer_segment_longer_than_max_is_refused_with_segmentation(qm: QueueManager, normal_first: bool) -> None:
    queue_with_message(qm, max_message_length=4)
    segment = {
        "payload": "abcdefg",
        "group_id": "H",
        "msg_seq_number": 1,
        "segmented": True,
        "offset": 10,
        "last_segment": True,
    }
    rows = [{"payload": "0123456789"}, segment] if normal_first else [segment]
    with (
        unchanged(qm),
        refused(
            MQValidationError,
            f"MQRC_MSG_TOO_BIG_FOR_Q (2030): queue Q: field payload of message {len(rows) - 1} is 7 bytes, longer than "
            "max_message_length 4",
            Reason.MQRC_MSG_TOO_BIG_FOR_Q,
        ),
    ):
        qm.put("Q", rows, segmentation=True)


def test_put_to_unknown_queue_is_refused(qm: QueueManager) -> None:
    with (
        unchanged(qm),
        refused(
            MQError,
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ),
    ):
        qm.put("NOPE", [{"payload": "x"}])
    assert not (Path(qm.root) / "queues" / "NOPE").exists()


def test_put_to_bad_queue_name_is_refused(qm: QueueManager) -> None:
    with (
        unchanged(qm),
        refused(MQValidationError, "queue name '../_qmgr' must not be a path (no '..', no leading '/', not '.')"),
    ):
        qm.put("../_qmgr", [{"payload": "x"}])


SEGMENT = {"group_id": "G", "msg_seq_number": 1, "segmented": True}


@pytest.mark.parametrize(
    ("committed", "put", "text", "reason"),
    [
        (
            [{**GROUP, "msg_seq_number": 1, "payload": "whole"}],
            [{**SEGMENT, "payload": "seg", "offset": 5, "last_segment": True}],
            "queue Q: group G: message 1 is both a whole message and segments",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        ),
        (
            [{**SEGMENT, "payload": "ab", "offset": 0, "last_segment": True}],
            [{**SEGMENT, "payload": "cd", "offset": 2, "last_segment": True}],
            "queue Q: group G: message 1 has more than one last segment",
            Reason.MQRC_OFFSET_ERROR,
        ),
        (
            [{**SEGMENT, "payload": "ab", "offset": 0, "last_segment": True}],
            [{**SEGMENT, "payload": "cd", "offset": 2}],
            "queue Q: group G: message 1 has a segment at offset 2 after its last segment at offset 0",
            Reason.MQRC_OFFSET_ERROR,
        ),
        (
            [{**SEGMENT, "payload": "ab", "offset": 0}],
            [{**SEGMENT, "payload": "cd", "offset": 2, "last_segment": True, "last_in_group": True}],
            "queue Q: group G: message 1 has segments that disagree on last_in_group",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        ),
    ],
    ids=["whole-and-segments", "two-last-segments", "segment-after-last", "last-in-group-disagrees"],
)
def test_segments_of_one_message_must_agree(qm: QueueManager, committed, put, text, reason) -> None:
    qm.define_queue("Q")
    qm.put("Q", committed)
    with unchanged(qm), refused(MQValidationError, f"{reason.name} ({reason.value}): {text}", reason):
        qm.put("Q", put)
    # The same items in a single put are refused the same way.
    qm.define_queue("Q2")
    with refused(MQValidationError, f"{reason.name} ({reason.value}): {text.replace('queue Q:', 'queue Q2:')}", reason):
        qm.put("Q2", committed + put)
