"""The state table of a queue when it disappears, appears or is rewritten between two looks."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mqspark import MQError, QueueManager, Reason
from mqspark.engine import consumer_groups
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.state_rows import event_rows


def test_a_group_created_after_the_delete_looked_is_not_there_to_delete(qm: QueueManager, monkeypatch) -> None:
    qm.define_queue("Q")
    qm.declare_consumer("Q", "g")
    state = ConsumerState(qm.root, "Q")
    looks = [0]
    real_table = ConsumerState.table

    def none_at_first(self: ConsumerState):  # the delete's first look: no state table yet
        looks[0] += 1
        return None if looks[0] == 1 else real_table(self)

    monkeypatch.setattr(ConsumerState, "table", none_at_first)
    with pytest.raises(MQError, match="consumer group 'g' does not exist") as refused:
        state.delete("g", timedelta(seconds=30))
    assert refused.value.reason == Reason.MQRC_UNKNOWN_OBJECT_NAME


def test_a_compaction_whose_table_went_after_its_commit_is_done(qm: QueueManager, monkeypatch) -> None:
    qm.define_queue("Q")
    qm.declare_consumer("Q", "g")
    state = ConsumerState(qm.root, "Q")
    committed = [False]
    real_table, real_overwrite = ConsumerState.table, ConsumerState._overwrite

    def overwrite(self: ConsumerState, table, rows, operation):
        committed[0] = real_overwrite(self, table, rows, operation)
        return committed[0]

    monkeypatch.setattr(ConsumerState, "_overwrite", overwrite)
    monkeypatch.setattr(ConsumerState, "table", lambda self: None if committed[0] else real_table(self))
    assert state.compact()
    assert committed[0]


def test_a_state_table_deleted_right_after_it_was_created_refuses_the_append(qm: QueueManager, monkeypatch) -> None:
    qm.define_queue("Q")
    state = ConsumerState(qm.root, "Q")
    monkeypatch.setattr(ConsumerState, "table", lambda self: None)
    monkeypatch.setattr(consumer_groups.store, "create_table", lambda *args, **kwargs: None)
    with pytest.raises(MQError, match="queue Q: its state table was deleted") as refused:
        state.append(event_rows("g", "", "declare"))
    assert refused.value.reason == Reason.MQRC_Q_DELETED


LEASE = timedelta(seconds=30)


def test_a_lease_stamped_before_a_release_that_committed_first_still_holds(qm: QueueManager) -> None:
    # A reader's lease record is made before it commits; another reader's release may commit in
    # between. Were the lease kept at its older time, the release would look newest and a third
    # reader would take the group too.
    qm.define_queue("Q")
    state = ConsumerState(qm.root, "Q")
    state.acquire("g", "query-a", LEASE)
    early = event_rows("g", "query-b", "lease")
    state.release("g", "query-a")
    state.append(early)
    holder = state.lease("g", LEASE)
    assert holder is not None and holder.owner == "query-b"
    with pytest.raises(MQError, match="consumer group 'g' is already being read by a running query") as refused:
        ConsumerState(qm.root, "Q").acquire("g", "query-c", LEASE)
    assert refused.value.reason == Reason.MQRC_OBJECT_IN_USE


def test_a_released_lease_is_not_renewed_and_a_release_by_another_owner_changes_nothing(qm: QueueManager) -> None:
    qm.define_queue("Q")
    state = ConsumerState(qm.root, "Q")
    state.acquire("g", "query-a", LEASE)
    state.release("g", "query-b")
    assert state.lease("g", LEASE).owner == "query-a"
    state.release("g", "query-a")
    with pytest.raises(MQError, match="consumer group 'g' was released by query-a") as refused:
        state.renew("g", "query-a", LEASE)
    assert refused.value.reason == Reason.MQRC_OBJECT_IN_USE
    assert state.lease("g", LEASE) is None
    state.acquire("g", "query-b", LEASE)
    with pytest.raises(MQError, match="consumer group 'g' was taken over by query-b"):
        state.renew("g", "query-a", LEASE)


def test_a_compaction_by_another_reader_is_not_a_rewrite_but_a_deleted_group_is(qm: QueueManager) -> None:
    qm.define_queue("Q")
    qm.declare_consumer("Q", "g")
    qm.declare_consumer("Q", "h")
    mine, other = ConsumerState(qm.root, "Q"), ConsumerState(qm.root, "Q")
    before = mine.rows().num_rows
    assert other.compact()
    # The files mine read are gone, but what they said is all there.
    assert (mine.rows().num_rows, mine.groups(), mine.rewrites) == (before, ["g", "h"], 0)
    other.delete("h", timedelta(seconds=30))
    assert (mine.groups(), mine.rewrites) == (["g"], 1)
    # Further behind than it reads the log for: counted as a rewrite.
    other.compact()
    for _ in range(2 * consumer_groups.COMPACT_EVERY + 1):
        other.append(event_rows("g", "", "declare"))
    assert (mine.groups(), mine.rewrites) == (["g"], 2)
