"""The live files of a queue table's version, read from the log entries after the version read before."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from mqspark import store
from mqspark.store import log, tables

from .support.calls import record_calls


def test_a_newer_versions_live_files_read_only_the_entries_after_the_version_kept(qm, monkeypatch):
    qm.define_queue("Q")
    location = store.queue_location(qm.root, "Q")
    read = record_calls(monkeypatch, log, "log_entry", 1)
    for n in range(3):
        qm.put("Q", [{"payload": f"m{n}".encode()}])
    table = store.open_table(location, None)
    first = table.version()
    kept = store.live_files(table)
    assert read == list(range(first, -1, -1))  # no checkpoint yet: back to the first entry

    for n in range(2):
        qm.put("Q", [{"payload": f"n{n}".encode()}])
    table = store.open_table(location, None)
    read.clear()
    newer = store.live_files(table)
    assert read == [first + 2, first + 1]
    # What the versions found this way say is what reading the whole log says.
    assert newer.to_pydict() == tables._read_live_files(table).to_pydict()
    assert sorted(newer["version"].to_pylist()) == sorted([*kept["version"].to_pylist(), first + 1, first + 2])


def test_a_queue_made_anew_reads_its_whole_log_not_the_versions_kept_for_the_one_before(qm, monkeypatch):
    qm.define_queue("Q")
    location = store.queue_location(qm.root, "Q")
    for n in range(2):
        qm.put("Q", [{"payload": f"old{n}".encode()}])
    store.live_files(store.open_table(location, None))
    qm.delete_queue("Q", purge=True)
    qm.define_queue("Q")
    for n in range(4):
        qm.put("Q", [{"payload": f"new{n}".encode()}])
    read = record_calls(monkeypatch, log, "log_entry", 1)
    table = store.open_table(location, None)
    files = store.live_files(table)
    # Every entry of the new table is read and checked, its first (which added no file) too.
    assert read == list(range(table.version(), -1, -1))
    assert files.to_pydict() == tables._read_live_files(table).to_pydict()


def test_a_tables_dataset_reads_its_live_files_only_with_their_paths_decoded(tmp_path):
    # mqspark's tables are not partitioned, but the log's paths are URIs: a partition value with a
    # space and a percent sign is written to a folder "p=a%20b%25c", which the log encodes once more.
    location = str(tmp_path / "t")
    write_deltalake(location, pa.table({"n": [1, 2], "p": ["a b%c", "plain"]}), partition_by=["p"])
    write_deltalake(location, pa.table({"n": [3], "p": ["plain"]}), partition_by=["p"], mode="append")
    table = DeltaTable(location)
    table.delete("n = 2")
    table = DeltaTable(location)
    assert sorted(store.table_dataset(table).to_table(columns=["n"])["n"].to_pylist()) == [1, 3]
    assert store.table_dataset(table).to_table(columns=["n"], filter=pc.field("n") < 3)["n"].to_pylist() == [1]


def test_a_handle_moved_on_by_its_own_commits_is_kept_and_a_table_made_anew_is_opened_afresh(qm, monkeypatch):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"first"}])  # the queue manager now holds a handle on Q's table
    opened = record_calls(monkeypatch, tables, "open_table", 0)
    location = store.queue_location(qm.root, "Q")
    for n in range(3):
        qm.define_queue(f"R{n}")  # the catalog's handle commits each change itself
        qm.put("Q", [{"payload": f"m{n}".encode()}])
    assert [path for path in opened if path == location or path == store.catalog_location(qm.root)] == []

    qm.delete_queue("Q", purge=True)
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"anew"}])
    assert location in opened
    assert [p.decode() for p in qm.browse("Q")["payload"].to_pylist()] == ["anew"]
