"""mqspark's own appends to a local Delta table (mqspark.store.appends): what delta-rs and other
writers read back, how the appender follows other processes' commits, and when it gives up."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from mqspark import store
from mqspark.store.appends import appender_of

SCHEMA = pa.schema([("n", pa.int64())])


def _table(tmp_path, **configuration: str) -> str:
    location = str(tmp_path / "t")
    store.create_table(location, SCHEMA, None, configuration={"delta.checkpointInterval": "5", **configuration})
    return location


def _file(location: str, *values: int) -> store.DataFile:
    file = store.write_data_file(location, pa.table({"n": list(values)}, schema=SCHEMA).to_batches(), SCHEMA)
    assert file is not None
    return file


def _appender(location: str) -> store.Appender:
    appender = appender_of(location, DeltaTable(location))
    assert appender is not None
    return appender


def test_appends_read_back_through_delta_rs_with_their_transactions_and_checkpoints(tmp_path):
    location = _table(tmp_path)
    appender = _appender(location)
    versions = [appender.append([_file(location, n, n + 100)]) for n in range(6)]
    versions.append(appender.append([_file(location, 6)], transaction=("producer", 7), metadata={"k": "v"}))
    assert versions == [1, 2, 3, 4, 5, 6, 7]
    assert (appender.version, appender.live_files, appender.live_rows) == (7, 7, 13)
    table = DeltaTable(location)
    assert table.version() == 7
    assert sorted(table.to_pyarrow_table()["n"].to_pylist()) == sorted([*range(7), *range(100, 106)])
    assert table.transaction_version("producer") == 7
    assert appender.transaction_version("producer") == 7
    assert table.history(1)[0]["k"] == "v"
    # A checkpoint at every fifth version, as delta-rs's own hook writes them; nothing temporary is left.
    log = sorted(os.listdir(f"{location}/_delta_log"))
    assert [name for name in log if "checkpoint" in name] == [f"{5:020d}.checkpoint.parquet", "_last_checkpoint"]
    assert [name for name in log if name.endswith(".tmp")] == []
    assert store.last_checkpoint(location) == 5


def test_an_appender_follows_other_writers_appends_and_rewrites(tmp_path):
    location = _table(tmp_path)
    appender = _appender(location)
    appender.append([_file(location, 1)])
    write_deltalake(location, pa.table({"n": [2, 3]}, schema=SCHEMA), mode="append")
    # A rewrite, as maintenance commits one: every live file removed, one file of the rows added.
    table = DeltaTable(location)
    store.commit_files(table, [_file(location, 1, 2, 3)], SCHEMA, overwrite=True, transaction=("other", 4))
    assert appender.advance()
    assert (appender.version, appender.live_files, appender.live_rows) == (3, 1, 3)
    assert appender.transaction_version("other") == 4
    assert appender.append([_file(location, 4)]) == 4
    assert sorted(DeltaTable(location).to_pyarrow_table()["n"].to_pylist()) == [1, 2, 3, 4]


def test_a_version_taken_meanwhile_fails_the_append_whole_and_the_retry_lands_after_it(tmp_path):
    location = _table(tmp_path)
    appender = _appender(location)
    write_deltalake(location, pa.table({"n": [1]}, schema=SCHEMA), mode="append")
    file = _file(location, 2)
    with pytest.raises(CommitFailedError, match="version 00000000000000000001.json of .* was taken"):
        appender.append([file])
    assert appender.version == 0
    assert [name for name in os.listdir(f"{location}/_delta_log") if name.endswith(".tmp")] == []
    assert DeltaTable(location).to_pyarrow_table()["n"].to_pylist() == [1]
    assert appender.advance()
    assert appender.append([file]) == 2
    assert sorted(DeltaTable(location).to_pyarrow_table()["n"].to_pylist()) == [1, 2]


def test_a_metadata_change_or_a_table_made_anew_asks_for_a_new_appender(tmp_path):
    location = _table(tmp_path)
    appender = _appender(location)
    store.close_table(DeltaTable(location))
    assert not appender.advance()
    closed = _appender(location)
    assert closed.closed
    store.remove_tree(location)
    _table(tmp_path)
    assert not closed.advance()
    assert not _appender(location).closed


def test_tables_it_does_not_append_to_itself(tmp_path):
    constrained = _table(tmp_path)
    DeltaTable(constrained).alter.add_constraint({"positive": "n > 0"}, commit_properties=CommitProperties())
    assert appender_of(constrained, DeltaTable(constrained)) is None
    assert appender_of("az://container/t", DeltaTable(_table(tmp_path / "other"))) is None


def test_entries_cleaned_up_behind_a_newer_checkpoint_ask_for_a_new_appender(tmp_path):
    """A log clean-up after a checkpoint past the appender's version removed the entries it would
    read next: an entry linked at its next version would lie below the checkpoint, unseen."""
    location = _table(tmp_path)
    appender = _appender(location)
    for n in range(6):
        write_deltalake(location, pa.table({"n": [n]}, schema=SCHEMA), mode="append")
    DeltaTable(location).create_checkpoint()
    for version in range(1, 6):
        os.unlink(f"{location}/_delta_log/{version:020d}.json")
    assert not appender.advance()
    fresh = _appender(location)
    assert fresh.append([_file(location, 6)]) == 7
    assert sorted(DeltaTable(location).to_pyarrow_table()["n"].to_pylist()) == list(range(7))
