"""The state table of a queue when it disappears, or appears, between two looks of one operation."""

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

    def overwrite(self: ConsumerState, table, rows):
        committed[0] = real_overwrite(self, table, rows)
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
