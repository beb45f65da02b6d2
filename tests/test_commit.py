"""The shared commit path under real concurrent commits, injected between its checks and its commit."""

from __future__ import annotations

import os
import re
import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from mqspark import MQError, MQValidationError, store
from mqspark.engine import puts
from mqspark.model.groups import GROUP_COLUMNS
from mqspark.model.messages import MESSAGE_SCHEMA, QUEUE_TABLE_SCHEMA
from mqspark.model.put import prepare_put
from mqspark.qmgr import engine
from mqspark.store.commit import landed
from mqspark.store.log import COMMIT_ID, commit_info
from mqspark.store.tables import listing_raced


def _parquet_files(qm, queue: str) -> list[str]:
    return sorted(f for f in os.listdir(store.queue_location(qm.root, queue)) if f.endswith(".parquet"))


def _rival_put(qm, queue: str) -> None:
    """Another producer's put, committed straight through delta-rs so it does not re-enter the hook."""
    rows = prepare_put(qm.inquire_queue(queue), pa.table({"payload": ["rival"]})).messages
    rows = rows.append_column(QUEUE_TABLE_SCHEMA.field("commit_version"), pa.nulls(rows.num_rows, pa.int64()))
    write_deltalake(store.queue_location(qm.root, queue), rows, mode="append")


@pytest.fixture
def before_commit(monkeypatch) -> list:
    """Actions run just before each real commit attempt, through delta-rs or an appender of mqspark's
    own (a plain put to a local queue), so the attempt meets a real concurrent change."""
    actions: list = []
    real, real_append = store.commit_files, store.Appender.append

    def commit_files(*args, **kwargs):
        for action in list(actions):
            action()
        return real(*args, **kwargs)

    def append(*args, **kwargs):
        for action in list(actions):
            action()
        return real_append(*args, **kwargs)

    monkeypatch.setattr(store, "commit_files", commit_files)
    monkeypatch.setattr(store.Appender, "append", append)
    return actions


def test_alias_retargeted_during_a_put_backs_it_out(qm, before_commit):
    qm.define_queue("Q")
    qm.define_queue("R")
    qm.define_queue("A", type="alias", target_queue="Q")

    def retarget_once():
        before_commit.clear()
        _rival_put(qm, "Q")
        qm.alter_queue("A", target_queue="R")

    before_commit.append(retarget_once)
    with pytest.raises(
        MQError, match=re.escape("MQRC_BACKED_OUT (2003): queue A now resolves to R, not Q; the put is backed out")
    ):
        qm.put("A", [{"payload": "mine"}])
    assert qm.browse("Q")["payload"].to_pylist() == [b"rival"]
    assert qm.depth("R") == 0
    assert len(_parquet_files(qm, "Q")) == 1
    assert _parquet_files(qm, "R") == []


def test_put_that_gives_up_leaves_no_files(qm, before_commit, monkeypatch):
    monkeypatch.setattr(puts, "PUT_ATTEMPTS", 3)
    qm.define_queue("Q")
    before_commit.append(lambda: _rival_put(qm, "Q"))
    with pytest.raises(
        MQError, match=re.escape("MQRC_BACKED_OUT (2003): queue Q: put gave up after 3 conflicting commits")
    ):
        qm.put("Q", [{"payload": "mine"}])
    assert qm.browse("Q")["payload"].to_pylist() == [b"rival"] * 3
    assert len(_parquet_files(qm, "Q")) == 3


def test_commit_put_argument_errors(qm):
    qm.define_queue("Q")
    groups = MESSAGE_SCHEMA.empty_table().select(GROUP_COLUMNS)
    assert engine(qm).puts.commit_put("Q", [], groups) is None
    with pytest.raises(MQValidationError) as refused:
        qm.put("Q", [{"payload": "m"}], producer="p")
    assert str(refused.value) == "queue Q: a put with producer 'p' needs a batch_id"
    assert store.open_table(store.queue_location(qm.root, "Q"), None).version() == 0


def test_put_landing_during_a_delete_keeps_the_queue(qm, monkeypatch):
    qm.define_queue("Q")
    real = store.close_table

    def close_table(table, closed=True):
        # Another producer commits after the delete checked the depth, before it closes the table.
        _rival_put(qm, "Q")
        monkeypatch.setattr(store, "close_table", real)
        return real(table, closed)

    monkeypatch.setattr(store, "close_table", close_table)
    with pytest.raises(
        MQError, match=re.escape("MQRC_Q_NOT_EMPTY (2055): queue Q holds 1 messages; delete with purge to discard them")
    ):
        qm.delete_queue("Q")
    assert [q.name for q in qm.queues()] == ["Q", "SYSTEM.DEAD.LETTER.QUEUE"]
    assert qm.browse("Q")["payload"].to_pylist() == [b"rival"]
    qm.put("Q", [{"payload": "still open"}])
    assert qm.depth("Q") == 2


def test_put_to_a_queue_being_deleted_is_refused(qm):
    qm.define_queue("Q")
    store.close_table(store.open_table(store.queue_location(qm.root, "Q"), None))
    with pytest.raises(MQError, match=re.escape("MQRC_Q_DELETED (2052): queue Q is being deleted")):
        qm.put("Q", [{"payload": "late"}])
    assert _parquet_files(qm, "Q") == []
    qm.delete_queue("Q")
    assert [q.name for q in qm.queues()] == ["SYSTEM.DEAD.LETTER.QUEUE"]


def test_a_log_listing_with_a_gap_is_recognised_and_a_commit_found_by_its_id(qm, tmp_path):
    qm.define_queue("Q")
    for n in range(3):
        qm.put("Q", [{"payload": f"m{n}"}])
    location = store.queue_location(qm.root, "Q")
    table = DeltaTable(location)
    version, uri = table.version(), table.table_uri  # commit_files asks by the table's URI
    mine = commit_info(location, version)[COMMIT_ID]
    assert (
        landed(uri, version, mine),
        landed(uri, version, "another"),
        landed(location, version + 1, mine),
    ) == (
        True,
        False,
        False,
    )
    # A listing that missed an entry, as one racing other processes' commits can: delta-rs's own error.
    copy = tmp_path / "copy"
    shutil.copytree(location, copy)
    (copy / "_delta_log" / f"{version - 1:020d}.json").unlink()
    with pytest.raises(DeltaError) as raised:
        DeltaTable(str(copy))
    assert listing_raced(raised.value), str(raised.value)


def test_a_commit_deletes_no_log_entry_only_maintenance_and_compaction_clean_the_log(tmp_path):
    """delta-rs deletes expired log entries after a commit that checkpoints; two processes doing so at
    once failed the second commit with FileNotFoundError after it landed (a chaos run's gets, once
    the state table's hour of log retention began to expire)."""
    location = str(tmp_path / "t")
    schema = pa.schema([("n", pa.int64())])
    configuration = {"delta.logRetentionDuration": "interval 0 seconds", "delta.checkpointInterval": "5"}
    table = store.create_table(location, schema, None, configuration=configuration)
    for n in range(12):
        file = store.write_data_file(location, pa.table({"n": [n]}, schema=schema).to_batches(), schema)
        assert store.commit_files(table, [file], schema) == n + 1
        table.update_incremental()

    log = os.listdir(f"{location}/_delta_log")
    # delta-rs checkpointed (every fifth commit), and every entry, expired at once, is still there.
    assert sorted(name for name in log if name.endswith(".checkpoint.parquet")) == [
        f"{version:020d}.checkpoint.parquet" for version in (4, 9)
    ]
    assert sorted(name for name in log if name.endswith(".json")) == [f"{version:020d}.json" for version in range(13)]
    assert sorted(DeltaTable(location).to_pyarrow_table()["n"].to_pylist()) == list(range(12))
