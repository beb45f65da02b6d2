"""How consumer groups come to exist and go: a question about a group the queue does not have is
refused, a reader that starts a new group beside others says so, and maintenance expires a group
with nothing recorded for the queue's ``consumer_group_expiry``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from mqspark import MQError, MQValidationError, Reason
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.maintenance import DEFAULT_RETENTION, maintain
from mqspark.engine.waiting import waiting_messages
from mqspark.qmgr import engine

LEASE = timedelta(seconds=30)


def _unknown(queue: str, consumer: str, groups: str) -> str:
    return re.escape(
        f"MQRC_UNKNOWN_OBJECT_NAME (2085): queue {queue} has no consumer group {consumer!r}; its groups: {groups} "
        "(a group exists once declared, or once it first reads)"
    )


def test_depth_backlog_and_waiting_of_a_group_the_queue_does_not_have_are_refused_and_create_nothing(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "a"}, {"payload": "b"}])
    for ask in (
        lambda: qm.depth("Q", consumer="biling"),
        lambda: qm.backlog("Q", consumer="biling"),
        lambda: qm.backlog("Q", consumer="biling", oldest=False),
        lambda: waiting_messages(engine(qm), "Q", "biling"),
    ):
        with pytest.raises(MQError, match=_unknown("Q", "biling", "none")) as refused:
            ask()
        assert refused.value.reason == Reason.MQRC_UNKNOWN_OBJECT_NAME
    qm.declare_consumer("Q", "billing")
    qm.get("Q", "audit")
    with pytest.raises(MQError, match=_unknown("Q", "biling", "audit, billing")):
        qm.depth("Q", consumer="biling")
    assert qm.consumers("Q") == ["audit", "billing"]
    assert (qm.depth("Q", consumer="billing"), qm.depth("Q", consumer="audit"), qm.depth("Q")) == (2, 1, 2)


def test_a_get_that_starts_a_group_beside_others_warns_once_and_a_declared_one_does_not(qm, caplog):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"m{n}"} for n in range(3)])
    qm.get("Q", "billing")
    with caplog.at_level("WARNING", logger="mqspark.engine.planner"):
        assert qm.get("Q", "biling")["payload"].to_pylist() == [b"m0"]
        assert qm.get("Q", "biling")["payload"].to_pylist() == [b"m1"]
        qm.declare_consumer("Q", "audit")
        qm.get("Q", "audit")
    assert [record.getMessage() for record in caplog.records] == [
        "queue Q: consumer group 'biling' is new: it reads every message still on the queue, and messages wait for "
        "it from now on; the queue's groups were billing (declare a group first to create it on purpose)"
    ]


def test_maintenance_expires_a_group_with_nothing_recorded_and_keeps_one_whose_lease_is_held(qm, caplog):
    qm.define_queue("Q", consumer_group_expiry=3600)
    qm.put("Q", [{"payload": f"m{n}"} for n in range(4)])
    assert qm.get("Q", "billing", max_messages=4).num_rows == 4
    assert qm.get("Q", "typo").num_rows == 1  # a misspelt group, which holds the other three
    before_compaction = datetime.now(UTC)
    first = qm.maintain("Q")
    assert (first.expired_groups, first.removed_consumed) == ((), 1)
    # Compaction keeps each group's newest record time: it does not make an idle group look active.
    state = ConsumerState(qm.root, "Q")
    later = datetime.now(UTC) + timedelta(seconds=3601)
    idle = state.idle_groups(timedelta(seconds=3600), later)
    assert sorted(idle) == ["billing", "typo"] and idle["typo"] < before_compaction
    # Billing's query runs (its lease is held): idle by the clock of this run, yet kept.
    state.acquire("billing", "query-1", LEASE)
    caplog.clear()
    with caplog.at_level("WARNING", logger="mqspark.engine.maintenance"):
        second = maintain(engine(qm), qm.inquire_queue("Q"), DEFAULT_RETENTION, now=later)
    assert (second.expired_groups, second.removed_consumed) == (("typo",), 0)
    assert qm.consumers("Q") == ["billing"]
    # The three messages waited only for typo: released, and removed by the next run.
    assert (qm.depth("Q"), qm.browse("Q").num_rows) == (0, 3)
    assert qm.maintain("Q").removed_consumed == 3
    assert qm.browse("Q").num_rows == 0
    assert [record.getMessage() for record in caplog.records] == [
        f"queue Q: consumer group 'typo' expired: nothing recorded for it since "
        f"{idle['typo'].isoformat(timespec='seconds')} (consumer_group_expiry 3600 s); the messages that waited "
        "only for it are released"
    ]


def test_what_an_expired_group_alone_consumed_is_removed_with_it_and_never_comes_back(qm):
    """A queue whose only group expires (a redriver, say): the messages it consumed are removed in the
    same run, so a group that comes later does not get them again."""
    qm.define_queue("Q", consumer_group_expiry=60)
    qm.put("Q", [{"payload": f"m{n}"} for n in range(3)])
    assert qm.get("Q", "solo", max_messages=2).num_rows == 2
    later = datetime.now(UTC) + timedelta(seconds=61)
    summary = maintain(engine(qm), qm.inquire_queue("Q"), DEFAULT_RETENTION, now=later)
    assert (summary.expired_groups, summary.removed_consumed, qm.consumers("Q")) == (("solo",), 2, [])
    assert qm.get("Q", "newcomer", max_messages=5)["payload"].to_pylist() == [b"m2"]


def test_a_group_recorded_within_its_expiry_is_kept(qm):
    qm.define_queue("Q", consumer_group_expiry=3600)
    qm.put("Q", [{"payload": "a"}])
    qm.declare_consumer("Q", "billing")
    summary = maintain(
        engine(qm), qm.inquire_queue("Q"), DEFAULT_RETENTION, now=datetime.now(UTC) + timedelta(seconds=3500)
    )
    assert (summary.expired_groups, qm.consumers("Q"), qm.depth("Q", consumer="billing")) == ((), ["billing"], 1)


@pytest.mark.parametrize("value", [0, -5, float("inf"), "7d"])
def test_consumer_group_expiry_must_be_a_positive_number_of_seconds(qm, value):
    with pytest.raises(
        MQValidationError,
        match=re.escape(f"queue Q: attribute consumer_group_expiry must be a number of seconds > 0, got {value!r}"),
    ):
        qm.define_queue("Q", consumer_group_expiry=value)
    assert [q.name for q in qm.queues()] == ["SYSTEM.DEAD.LETTER.QUEUE"]
