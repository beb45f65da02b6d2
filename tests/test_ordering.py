"""The ordering engine against the reference model of spec section 4, and the spec's own example."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqspark import MQValidationError, QueueDefinition, store
from mqspark.engine.ordering import DeliveryOptions, deliver
from mqspark.model.messages import MESSAGE_SCHEMA
from mqspark.model.put import prepare_put, rows_to_table

from .support import reference_model
from .support.samples import spec_example

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
FIELDS = (
    "msg_id",
    "payload",
    "priority",
    "group_id",
    "msg_seq_number",
    "offset",
    "segmented",
    "last_segment",
    "top_of_queue",
    "before_msg_id",
)
OPTION_SETS = [
    ("physical", False, False),
    ("logical", False, False),
    ("logical", True, False),
    ("logical", False, True),
    ("logical", True, True),
]


@st.composite
def puts(draw) -> list[list[dict]]:
    """Random puts of ungrouped messages, groups and segmented messages, some incomplete or timed."""
    items: list[dict] = []
    for number in range(draw(st.integers(0, 5))):
        # Some msg_ids repeat: MQ does not require them to be unique.
        msg_id = f"P{draw(st.integers(0, 2)) if draw(st.integers(0, 3)) == 0 else number}"
        plain = {"msg_id": msg_id, "payload": f"P{number}", "priority": draw(st.sampled_from([0, 4, 9]))}
        if draw(st.integers(0, 4)) == 0:
            plain["top_of_queue"] = True
        items.append(plain)
    for number in range(draw(st.integers(0, 4))):
        # Tuxedo's "before msg_id": kept only when the target was committed by an earlier put (below).
        items.append(
            {
                "msg_id": f"I{number}",
                "payload": f"I{number}",
                "priority": draw(st.sampled_from([0, 4, 9])),
                "before_msg_id": f"P{draw(st.integers(0, 4))}",
            }
        )
    for group in range(draw(st.integers(0, 4))):
        group_id, priority = f"G{group}", draw(st.sampled_from([0, 4, 9]))
        messages = draw(st.integers(1, 3))
        flags_last = draw(st.booleans())
        for seq in range(1, messages + 1):
            item = {
                "group_id": group_id,
                "msg_seq_number": seq,
                "priority": priority,
                "last_in_group": flags_last and seq == messages,
            }
            segments = draw(st.integers(0, 3))
            if segments == 0:
                items.append({**item, "payload": f"{group_id}.{seq}"})
            offset = 0
            for segment in range(segments):
                payload = chr(ord("a") + segment) * draw(st.integers(1, 3))
                items.append(
                    {
                        **item,
                        "payload": payload,
                        "segmented": True,
                        "offset": offset,
                        "last_segment": segment == segments - 1,
                    }
                )
                offset += len(payload)
    for item in items:
        timing = draw(st.sampled_from(["none"] * 6 + ["expired", "later", "expires-later", "was-delayed"]))
        if timing == "expired":
            item["expiry"] = NOW - HOUR
        elif timing == "expires-later":
            item["expiry"] = NOW + HOUR
        elif timing == "later":
            item["available_at"] = NOW + HOUR
        elif timing == "was-delayed":
            item["available_at"] = NOW - HOUR
    kept = [item for item in items if draw(st.integers(0, 6)) > 0]
    shuffled = draw(st.permutations(kept))
    cuts = sorted(draw(st.lists(st.integers(0, len(shuffled)), max_size=6)))
    bounds = [0, *cuts, len(shuffled)]
    transactions = [list(shuffled[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    committed: set[str] = set()
    for rows in transactions:
        for index, row in enumerate(rows):
            if row.get("before_msg_id") not in (None, *committed):
                rows[index] = {key: value for key, value in row.items() if key != "before_msg_id"}
        committed |= {row["msg_id"] for row in rows if row.get("msg_id", "").startswith("P")}
    return transactions


def _committed(queue: QueueDefinition, transactions: list[list[dict]]) -> pa.Table:
    """The rows these puts commit, with the commit version each would get, without any Delta I/O."""
    tables = []
    for version, rows in enumerate(transactions, start=1):
        messages = prepare_put(queue, rows_to_table(queue.name, rows)).messages
        tables.append(
            messages.append_column("commit_version", pa.repeat(pa.scalar(version, pa.int64()), len(messages)))
        )
    return (
        pa.concat_tables(tables)
        if tables
        else MESSAGE_SCHEMA.empty_table().append_column("commit_version", pa.array([], pa.int64()))
    )


def _fields(rows: list[dict]) -> list[tuple]:
    return [tuple(row[name] for name in FIELDS) for row in rows]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transactions=puts(), delivery_sequence=st.sampled_from(["priority", "fifo"]))
def test_engine_matches_reference_model(transactions, delivery_sequence):
    queue = QueueDefinition.build("Q", delivery_sequence=delivery_sequence)
    committed = _committed(queue, transactions)
    rows = committed.to_pylist()
    for order, all_available, complete in OPTION_SETS:
        options = DeliveryOptions(order, all_available, complete)
        delivery = deliver(committed, delivery_sequence, options, NOW)
        expected = reference_model.delivered(rows, delivery_sequence, NOW, order, all_available, complete)
        assert _fields(delivery.messages.to_pylist()) == _fields(expected), (order, all_available, complete)
        assert delivery.expired == reference_model.expired_count(rows, NOW)


@contextmanager
def _head(messages: int) -> Iterator[None]:
    """Browses order heads of at least ``messages`` messages meanwhile."""
    from mqspark.engine import browse

    default = browse.HEAD
    browse.HEAD = messages
    try:
        yield
    finally:
        browse.HEAD = default


@pytest.mark.slow
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(transactions=puts())
def test_browse_matches_reference_model_through_delta(tmp_path_factory, transactions):
    from mqspark import QueueManager

    qm = QueueManager.create(tmp_path_factory.mktemp("qm"), "QM1")
    qm.define_queue("Q")
    for rows in transactions:
        qm.put("Q", rows)
    table = store.open_table(store.queue_location(qm.root, "Q"), None)
    rows = store.read_committed(table, MESSAGE_SCHEMA.names, MESSAGE_SCHEMA).to_pylist()
    for order, all_available, complete in OPTION_SETS:
        browsed = qm.browse("Q", order, all_messages_available=all_available, complete_message=complete, now=NOW)
        expected = reference_model.delivered(rows, "priority", NOW, order, all_available, complete)
        assert _fields(browsed.to_pylist()) == _fields(expected)
        assert browsed["delivery_seq"].to_pylist() == list(range(len(expected)))
        assert browsed.schema.metadata[b"mqspark.expired"] == str(reference_model.expired_count(rows, NOW)).encode()
        # A browse with a limit orders a head of one message first, and longer ones until it holds them.
        for limit in (0, 1, 3):
            with _head(1):
                first = qm.browse(
                    "Q", order, all_messages_available=all_available, complete_message=complete, limit=limit, now=NOW
                )
            assert _fields(first.to_pylist()) == _fields(expected[:limit]), (order, all_available, complete, limit)
            assert first.schema.metadata[b"mqspark.expired"] == browsed.schema.metadata[b"mqspark.expired"]


def test_spec_example_logical_order(qm):
    spec_example(qm)
    assert qm.browse("Q", "physical")["payload"].to_pylist() == [
        b"A",
        b"Y1",
        b"Z2",
        b"Y2",
        b"Y3-1:",
        b"Y3-2",
        b"Z1",
        b"B",
    ]
    assert qm.browse("Q")["payload"].to_pylist() == [b"A", b"Y1", b"Y2", b"Y3-1:", b"Y3-2", b"Z1", b"Z2", b"B"]
    whole = qm.browse("Q", complete_message=True)
    assert whole["payload"].to_pylist() == [b"A", b"Y1", b"Y2", b"Y3-1:Y3-2", b"Z1", b"Z2", b"B"]
    assert whole["delivery_seq"].to_pylist() == list(range(7))


def test_group_without_first_item_waits_and_others_flow_past(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "A"}, {"payload": "G2", "group_id": "G", "msg_seq_number": 2, "last_in_group": True}])
    qm.put("Q", [{"payload": "B"}])
    assert qm.browse("Q")["payload"].to_pylist() == [b"A", b"B"]
    qm.put("Q", [{"payload": "G1", "group_id": "G", "msg_seq_number": 1}])
    assert qm.browse("Q")["payload"].to_pylist() == [b"A", b"B", b"G1", b"G2"]


def test_item_waits_for_the_one_before_it_unless_all_are_wanted(qm):
    qm.define_queue("Q")
    group = {"group_id": "G"}
    qm.put("Q", [{**group, "payload": "1", "msg_seq_number": 1}, {**group, "payload": "3", "msg_seq_number": 3}])
    qm.put("Q", [{"payload": "after"}])
    assert qm.browse("Q")["payload"].to_pylist() == [b"1", b"after"]
    assert qm.browse("Q", all_messages_available=True)["payload"].to_pylist() == [b"after"]
    qm.put(
        "Q",
        [
            {**group, "payload": "2", "msg_seq_number": 2},
            {**group, "payload": "4", "msg_seq_number": 4, "last_in_group": True},
        ],
    )
    assert qm.browse("Q", all_messages_available=True)["payload"].to_pylist() == [b"1", b"2", b"3", b"4", b"after"]


def test_group_sorts_by_its_first_items_priority(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "low", "priority": 1}])
    qm.put("Q", [{"payload": "G1", "priority": 8, "group_id": "G", "msg_seq_number": 1}])
    qm.put("Q", [{"payload": "G2", "priority": 2, "group_id": "G", "msg_seq_number": 2, "last_in_group": True}])
    qm.put("Q", [{"payload": "mid", "priority": 5}])
    assert qm.browse("Q")["payload"].to_pylist() == [b"G1", b"G2", b"mid", b"low"]
    assert qm.browse("Q", "physical")["payload"].to_pylist() == [b"G1", b"mid", b"G2", b"low"]


def test_expired_messages_are_discarded_and_counted(qm):
    qm.define_queue("Q")
    qm.put(
        "Q",
        [
            {"payload": "old", "expiry": NOW - HOUR},
            {"payload": "fresh", "expiry": NOW + HOUR},
            {"payload": "later", "available_at": NOW + HOUR},
            {"payload": "plain"},
        ],
    )
    browsed = qm.browse("Q", now=NOW)
    assert browsed["payload"].to_pylist() == [b"fresh", b"plain"]
    assert browsed.schema.metadata[b"mqspark.expired"] == b"1"
    assert qm.browse("Q", now=NOW + 2 * HOUR)["payload"].to_pylist() == [b"later", b"plain"]


def test_match_selectors(qm):
    spec_example(qm)
    qm.put("Q", [{"payload": "C", "correl_id": "REQ-1"}])
    assert qm.browse("Q", group_id="Y")["payload"].to_pylist() == [b"Y1", b"Y2", b"Y3-1:", b"Y3-2"]
    assert qm.browse("Q", group_id="Y", msg_seq_number=3, complete_message=True)["payload"].to_pylist() == [
        b"Y3-1:Y3-2"
    ]
    assert qm.browse("Q", correl_id="REQ-1")["payload"].to_pylist() == [b"C"]
    msg_id = qm.browse("Q")["msg_id"][1].as_py()
    assert qm.browse("Q", msg_id=msg_id)["payload"].to_pylist() == [b"Y1"]
    assert qm.browse("Q", msg_id="nope").num_rows == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"order": "random"}, "option order must be one of logical, physical; got 'random'"),
        (
            {"order": "physical", "complete_message": True},
            "options allMessagesAvailable and completeMessage need order logical",
        ),
        ({"msg_seq_number": 2}, "option msgSeqNumber (2) needs groupId"),
        ({"limit": -1}, "option limit must be a whole number >= 0, got -1"),
    ],
    ids=["bad-order", "physical-with-complete", "seq-without-group", "negative-limit"],
)
def test_bad_browse_options(qm, kwargs, message):
    qm.define_queue("Q")
    with pytest.raises(MQValidationError, match=re.escape(message)):
        qm.browse("Q", **kwargs)


def test_browse_changes_nothing(qm):
    spec_example(qm)
    location = store.queue_location(qm.root, "Q")
    version = store.open_table(location, None).version()
    for options in ({}, {"complete_message": True}, {"all_messages_available": True}):
        qm.browse("Q", **options)
    assert store.open_table(location, None).version() == version
    assert qm.depth("Q") == 8


def test_top_of_queue_goes_ahead_of_its_priority_latest_first(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "a"}, {"payload": "hi", "priority": 9}])
    qm.put("Q", [{"payload": "top1", "top_of_queue": True}, {"payload": "top2", "top_of_queue": True}])
    qm.put("Q", [{"payload": "top3", "top_of_queue": True}, {"payload": "b"}])
    assert qm.browse("Q")["payload"].to_pylist() == [b"hi", b"top3", b"top1", b"top2", b"a", b"b"]


def test_before_msg_id_places_a_message_just_before_another(qm):
    qm.define_queue("Q", delivery_sequence="fifo")
    qm.put("Q", [{"payload": "a", "msg_id": "A"}, {"payload": "b", "msg_id": "B"}])
    qm.put("Q", [{"payload": "x", "before_msg_id": "B"}])
    qm.put("Q", [{"payload": "y", "before_msg_id": "B"}])
    assert qm.browse("Q")["payload"].to_pylist() == [b"a", b"x", b"y", b"b"]


def test_before_msg_id_of_an_expired_message_keeps_its_own_place(qm):
    qm.define_queue("Q", delivery_sequence="fifo")
    qm.put("Q", [{"payload": "a"}, {"payload": "old", "msg_id": "OLD", "expiry": NOW + HOUR}])
    qm.put("Q", [{"payload": "x", "before_msg_id": "OLD"}])
    assert qm.browse("Q", now=NOW)["payload"].to_pylist() == [b"a", b"x", b"old"]
    assert qm.browse("Q", now=NOW + 2 * HOUR)["payload"].to_pylist() == [b"a", b"x"]


@pytest.mark.parametrize(
    ("row", "message", "reason"),
    [
        (
            {"payload": "x", "before_msg_id": "NOPE"},
            "MQRC_NO_MSG_AVAILABLE (2033): queue Q: field before_msg_id names NOPE, which is not on the queue",
            2033,
        ),
        (
            {"payload": "x", "before_msg_id": "G1"},
            "queue Q: field before_msg_id names G1, which is in a group or was itself placed before another message",
            None,
        ),
        (
            {"payload": "x", "top_of_queue": True, "group_id": "G", "msg_seq_number": 2},
            "MQRC_GROUP_ID_ERROR (2258): queue Q: field top_of_queue has value True in message 0: "
            "is only for messages outside groups",
            2258,
        ),
        (
            {"payload": "x", "top_of_queue": True, "before_msg_id": "A"},
            "queue Q: field top_of_queue has value True in message 0: cannot go with before_msg_id",
            None,
        ),
        (
            {"payload": "0123456789", "top_of_queue": True, "msg_id": "LONG"},
            "MQRC_SEGMENTATION_NOT_ALLOWED (2443): queue Q: field top_of_queue: message LONG is longer than "
            "max_message_length 4 and a message placed by top_of_queue cannot be segmented",
            2443,
        ),
    ],
    ids=["unknown-target", "grouped-target", "top-in-group", "top-and-before", "top-segmented"],
)
def test_bad_ordering_overrides(qm, row, message, reason):
    from mqspark import MQError

    qm.define_queue("Q", max_message_length=4)
    qm.put(
        "Q", [{"payload": "a", "msg_id": "A"}, {"payload": "g", "msg_id": "G1", "group_id": "G", "msg_seq_number": 1}]
    )
    version = store.open_table(store.queue_location(qm.root, "Q"), None).version()
    with pytest.raises(MQError, match=re.escape(message)) as raised:
        qm.put("Q", [row], segmentation=True)
    assert (raised.value.reason or None) == reason
    assert store.open_table(store.queue_location(qm.root, "Q"), None).version() == version


def test_before_msg_id_ignores_a_namesake_put_with_it(qm):
    qm.define_queue("Q", delivery_sequence="fifo")
    qm.put("Q", [{"payload": "old", "msg_id": "X", "expiry": NOW + HOUR}])
    qm.put("Q", [{"payload": "namesake", "msg_id": "X"}, {"payload": "ins", "before_msg_id": "X"}])
    assert qm.browse("Q", now=NOW)["payload"].to_pylist() == [b"ins", b"old", b"namesake"]
    # Once the message it was put before has expired, it keeps its own place.
    assert qm.browse("Q", now=NOW + 2 * HOUR)["payload"].to_pylist() == [b"namesake", b"ins"]


@pytest.mark.slow
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    transactions=puts(),
    delivery_sequence=st.sampled_from(["priority", "fifo"]),
    head=st.integers(1, 12),
)
def test_a_head_orders_a_prefix_of_the_whole_order(transactions, delivery_sequence, head):
    """Ordering only the first messages in physical order (and the groups they touch) gives a prefix
    of the whole order, and the whole order once the head holds every message."""
    queue = QueueDefinition.build("Q", delivery_sequence=delivery_sequence)
    committed = _committed(queue, transactions)
    for order, all_available, complete in OPTION_SETS:
        options = DeliveryOptions(order, all_available, complete)
        whole = deliver(committed, delivery_sequence, options, NOW).messages.to_pylist()
        part = deliver(committed, delivery_sequence, options, NOW, head=head)
        rows = part.messages.to_pylist()
        assert _fields(rows[: part.exact]) == _fields(whole[: part.exact]), (order, all_available, complete)
        everything = deliver(committed, delivery_sequence, options, NOW, head=committed.num_rows)
        assert everything.exact == len(whole)
        assert _fields(everything.messages.to_pylist()) == _fields(whole)


@pytest.mark.slow
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(transactions=puts(), sizes=st.lists(st.integers(1, 4), min_size=1, max_size=6))
def test_gets_planned_on_a_short_head_deliver_what_gets_planned_on_the_whole_queue_do(
    tmp_path_factory, transactions, sizes
):
    """Two groups drain the same queue with the same gets, one planning on heads of a few messages
    (growing when a head held too few), the other on the whole queue: each get gives the same
    messages."""
    from mqspark import QueueManager
    from mqspark.engine import planner

    qm = QueueManager.create(tmp_path_factory.mktemp("qm"), "QM1")
    qm.define_queue("Q")
    for rows in transactions:
        qm.put("Q", rows)
    columns = ["msg_id", "payload", "group_id", "msg_seq_number", "offset"]
    default = planner.HEAD
    try:
        for step in range(12):
            size = sizes[step % len(sizes)]
            planner.HEAD = 1
            short = qm.get("Q", "short", max_messages=size)
            planner.HEAD = 10**9
            whole = qm.get("Q", "whole", max_messages=size)
            assert short.select(columns).to_pylist() == whole.select(columns).to_pylist(), step
            if whole.num_rows == 0:
                break
    finally:
        planner.HEAD = default
