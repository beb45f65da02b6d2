"""The state table of a queue when it disappears, appears or is rewritten between two looks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from chaos.faults import Control, build
from mqspark import MQError, QueueManager, Reason
from mqspark.engine import state_compaction, state_table
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.state_rows import event_rows
from mqspark.engine.state_table import StateTable


def test_a_group_created_after_the_delete_looked_is_not_there_to_delete(qm: QueueManager, monkeypatch) -> None:
    qm.define_queue("Q")
    qm.declare_consumer("Q", "g")
    state = ConsumerState(qm.root, "Q")
    looks = [0]
    real_table = StateTable.table

    def none_at_first(self: StateTable):  # the delete's first look: no state table yet
        looks[0] += 1
        return None if looks[0] == 1 else real_table(self)

    monkeypatch.setattr(StateTable, "table", none_at_first)
    with pytest.raises(MQError, match="consumer group 'g' does not exist") as refused:
        state.delete("g", timedelta(seconds=30))
    assert refused.value.reason == Reason.MQRC_UNKNOWN_OBJECT_NAME


def test_a_compaction_whose_table_went_after_its_commit_is_done(qm: QueueManager, monkeypatch) -> None:
    qm.define_queue("Q")
    qm.declare_consumer("Q", "g")
    state = ConsumerState(qm.root, "Q")
    committed = [False]
    real_table, real_overwrite = StateTable.table, StateTable.overwrite

    def overwrite(self: StateTable, table, rows, operation):
        committed[0] = real_overwrite(self, table, rows, operation)
        return committed[0]

    monkeypatch.setattr(StateTable, "overwrite", overwrite)
    monkeypatch.setattr(StateTable, "table", lambda self: None if committed[0] else real_table(self))
    assert state.compact()
    assert committed[0]


def test_a_state_table_deleted_right_after_it_was_created_refuses_the_append(qm: QueueManager, monkeypatch) -> None:
    qm.define_queue("Q")
    state = ConsumerState(qm.root, "Q")
    monkeypatch.setattr(StateTable, "table", lambda self: None)
    monkeypatch.setattr(state_table.store, "create_table", lambda *args, **kwargs: None)
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
    for _ in range(2 * state_table.COMPACT_EVERY + 1):
        other.append(event_rows("g", "", "declare"))
    assert (mine.groups(), mine.rewrites) == (["g"], 2)


def _age(paths: list[Path], seconds: float) -> None:
    """Make files look written ``seconds`` ago: the clean-up judges their age by the store's times."""
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


# Records ``count`` declarations on queue Q's state table, compacting as a getter does.
RECORD = """
import sys
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.state_rows import event_rows
state = ConsumerState(sys.argv[1], "Q")
for _ in range(int(sys.argv[2])):
    state.append(event_rows("g", "", "declare"))
"""


def test_a_compaction_keeps_the_state_tables_log_and_files_to_what_readers_may_still_need(
    qm: QueueManager, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(state_compaction, "TRIM_EVERY", 1)
    qm.define_queue("Q")
    state = ConsumerState(qm.root, "Q")
    # Recorded and compacted by a process whose clock runs behind by more than the files' retention:
    # what its compactions removed was removed that long ago.
    behind = state_table.STATE_FILE_RETENTION.total_seconds() + 120
    control = Control(tmp_path / "behind.control")
    control.set(skew=-behind)
    subprocess.run(
        [sys.executable, "-c", RECORD, str(qm.root), str(3 * state_table.COMPACT_EVERY)],
        env={**os.environ, **control.environment(build(tmp_path))},
        check=True,
    )
    location = Path(state.location)
    old_entries = sorted((location / "_delta_log").glob("*.json"))
    checkpoints = sorted((location / "_delta_log").glob("*.checkpoint.parquet"))
    live = {Path(uri).name for uri in DeltaTable(state.location).file_uris()}
    removed = [path for path in location.glob("*.parquet") if path.name not in live]
    assert len(old_entries) > 2 * state_table.COMPACT_EVERY and len(checkpoints) >= 2 and removed
    # The store stamped the files with its own clock: as old as that process thought.
    _age([*old_entries, *checkpoints, *removed], behind)
    state.append(event_rows("h", "", "declare"))
    assert state.compact()
    # What reads the versions since the newest checkpoint that old stays (time travel within the
    # retention, as in Delta); nothing older, and no file removed that long ago.
    newest_old_checkpoint = int(checkpoints[-1].name.split(".")[0])
    kept = [int(path.name.split(".")[0]) for path in old_entries if path.exists()]
    assert kept == list(range(newest_old_checkpoint, len(old_entries)))
    assert [path.name for path in removed if path.exists()] == []
    assert state.groups() == ["g", "h"]
    # Read afresh, the table holds all it said.
    assert ConsumerState(qm.root, "Q").groups() == ["g", "h"]


def test_a_state_commit_that_landed_is_not_reported_failed_when_the_compaction_after_it_fails(
    qm: QueueManager, monkeypatch
) -> None:
    qm.define_queue("Q")
    state = ConsumerState(qm.root, "Q")
    state.append(event_rows("g", "", "declare"))

    def fails(*args, **kwargs):
        # What a chaos run saw: delta-rs's vacuum lost its own log record to a concurrent commit.
        raise CommitFailedError("Commit failed: a concurrent transaction deleted data this operation read.")

    monkeypatch.setattr(state_compaction.store, "trim_history", fails)
    monkeypatch.setattr(state_compaction, "TRIM_EVERY", 1)
    for number in range(2 * state_table.COMPACT_EVERY):
        state.append(event_rows(f"g{number}", "", "declare"))
    assert ConsumerState(qm.root, "Q").groups() == sorted(["g", *(f"g{n}" for n in range(40))])
    # The compactions themselves went through: the table holds a few files, not one per record.
    assert len(DeltaTable(state.location).file_uris()) < state_table.COMPACT_EVERY


def test_a_queue_defined_again_past_the_old_state_tables_versions_is_read_afresh(qm: QueueManager) -> None:
    """Another connection's state table view was far past the version its handle was last moved to;
    the queue deleted and defined again, with more state versions than that, is a new table to it."""
    other = QueueManager.open(qm.root)
    qm.define_queue("Q")
    qm.declare_consumer("Q", "g")
    for n in range(3):
        qm.put("Q", [{"payload": f"old{n}"}])
    assert [p for _ in range(3) for p in other.get("Q", consumer="g", max_messages=1)["payload"].to_pylist()] == [
        b"old0",
        b"old1",
        b"old2",
    ]
    qm.delete_queue("Q", purge=True)
    qm.define_queue("Q")
    qm.declare_consumer("Q", "g")
    for n in range(8):
        qm.put("Q", [{"payload": f"new{n}"}])
    assert qm.get("Q", consumer="g", max_messages=2)["payload"].to_pylist() == [b"new0", b"new1"]
    assert other.get("Q", consumer="g", max_messages=100)["payload"].to_pylist() == [
        f"new{n}".encode() for n in range(2, 8)
    ]
