"""Where a queue manager's Delta tables live and how they are opened, created and removed.

Layout under a queue manager root (a local directory or an object-store URI)::

    <root>/_qmgr/            catalog: the queue manager and its queue definitions
    <root>/queues/<queue>/   one message table per queue (append-only)

Queue names may hold ``/`` and ``%``; in directory names they become ``~2F`` and ``~25``
(``~`` never occurs in a name, so the mapping is one-to-one and never forms a path).
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from .errors import MQError

CATALOG_DIR = "_qmgr"
QUEUES_DIR = "queues"

StorageOptions = dict[str, str] | None


def is_uri(location: str) -> bool:
    """True for object-store URIs (``s3://``, ``abfss://``...), false for local paths."""
    return len(urlparse(location).scheme) > 1


def normalize_root(root: str | os.PathLike) -> str:
    """A root as delta-rs wants it: URIs unchanged, local paths absolute."""
    location = os.fspath(root)
    return location.rstrip("/") if is_uri(location) else os.path.abspath(location)


def queue_dir_name(queue: str) -> str:
    return queue.replace("%", "~25").replace("/", "~2F")


def catalog_location(root: str) -> str:
    return f"{root}/{CATALOG_DIR}"


def queue_location(root: str, queue: str) -> str:
    return f"{root}/{QUEUES_DIR}/{queue_dir_name(queue)}"


def table_exists(location: str, storage_options: StorageOptions) -> bool:
    return DeltaTable.is_deltatable(location, storage_options=storage_options)


def open_table(location: str, storage_options: StorageOptions) -> DeltaTable | None:
    """The Delta table at ``location``, or None when there is none."""
    try:
        return DeltaTable(location, storage_options=storage_options)
    except TableNotFoundError:
        return None


def create_table(
    location: str, schema: pa.Schema, storage_options: StorageOptions, configuration: dict[str, str] | None = None
) -> DeltaTable:
    return DeltaTable.create(
        location, schema=schema, mode="error", configuration=configuration, storage_options=storage_options
    )


def remove_tree(location: str) -> None:
    """Delete a table directory and everything below it.

    Object stores are reached through pyarrow's filesystems, which take credentials from the environment.
    """
    if is_uri(location):
        filesystem, path = pafs.FileSystem.from_uri(location)
    else:
        filesystem, path = pafs.LocalFileSystem(), location
    if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
        filesystem.delete_dir(path)


def row_count(table: DeltaTable) -> int:
    """Exact number of rows: file statistics when every file has them, else a scan."""
    counts = pa.table(table.get_add_actions()).column("num_records")
    if counts.null_count == 0:
        return int(pc.sum(counts).as_py() or 0)
    return table.to_pyarrow_dataset().count_rows()


def read_committed(table: DeltaTable, columns: list[str], schema: pa.Schema) -> pa.Table:
    """Every committed row with the version that committed it, as ``commit_version``.

    Read through the change data feed, which knows each row's commit version. Queue tables only
    ever get inserts in normal operation; any other change means the table was edited behind
    mqspark's back, so it fails loudly instead of guessing.
    """
    feed = pa.table(table.load_cdf())
    changes = pc.unique(feed["_change_type"]).to_pylist()
    if set(changes) - {"insert"}:
        raise MQError(
            f"table {table.table_uri} has {sorted(set(changes) - {'insert'})} changes; queue tables are append-only"
        )
    versions = feed["_commit_version"].cast(pa.int64())
    return feed.select(columns).cast(schema).append_column("commit_version", versions)
