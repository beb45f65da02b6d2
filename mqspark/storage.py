"""Where a queue manager's Delta tables live and how they are opened, created and removed.

Layout under a queue manager root (a local directory or an object-store URI)::

    <root>/_qmgr/            catalog: the queue manager and its queue definitions
    <root>/queues/<queue>/   one message table per queue (append-only)

Queue names may hold ``/`` and ``%``; in directory names they become ``~2F`` and ``~25``
(``~`` never occurs in a name, so the mapping is one-to-one and never forms a path).
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction

from .errors import MQError, Reason

CATALOG_DIR = "_qmgr"
STATE_DIR = "state"
# A table property set on a message table that is being deleted; puts refuse to commit on top of it.
CLOSED_PROPERTY = "mqspark.closed"
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


def state_location(root: str, queue: str) -> str:
    return f"{root}/{STATE_DIR}/{queue_dir_name(queue)}"


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


def _filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    if is_uri(location):
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), location


def remove_tree(location: str) -> None:
    """Delete a table directory and everything below it.

    Object stores are reached through pyarrow's filesystems, which take credentials from the environment.
    """
    filesystem, path = _filesystem(location)
    if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
        filesystem.delete_dir(path)


def row_count(table: DeltaTable) -> int:
    """Exact number of rows: file statistics when every file has them, else a scan."""
    counts = pa.table(table.get_add_actions()).column("num_records")
    if counts.null_count == 0:
        return int(pc.sum(counts).as_py() or 0)
    return table.to_pyarrow_dataset().count_rows()


def read_committed(table: DeltaTable, columns: list[str], schema: pa.Schema, version: int | None = None) -> pa.Table:
    """Every row committed up to ``version`` (default: the table's), with its version as ``commit_version``.

    Read through the change data feed, which knows each row's commit version. Queue tables only
    ever get inserts in normal operation; any other change means the table was edited behind
    mqspark's back, so it fails loudly instead of guessing.
    """
    feed = pa.table(table.load_cdf(ending_version=table.version() if version is None else version))
    changes = pc.unique(feed["_change_type"]).to_pylist()
    if set(changes) - {"insert"}:
        raise MQError(
            f"table {table.table_uri} has {sorted(set(changes) - {'insert'})} changes; queue tables are append-only"
        )
    versions = feed["_commit_version"].cast(pa.int64())
    return feed.select(columns).cast(schema).append_column("commit_version", versions)


def _log_entry(location: str, version: int) -> tuple[pafs.FileSystem, str]:
    filesystem, base = _filesystem(location)
    return filesystem, f"{base}/_delta_log/{version:020d}.json"


def version_exists(location: str, version: int) -> bool:
    """Whether commit ``version`` of the table exists: one file lookup, cheap enough for idle polling."""
    filesystem, path = _log_entry(location, version)
    return filesystem.get_file_info(path).type == pafs.FileType.File


def files_added(location: str, version: int) -> list[tuple[str, int]]:
    """The data files (paths relative to the table, and sizes in bytes) that commit ``version`` added
    with new rows.

    Read straight from the commit's log entry, the only place that says which version added a file.
    Files rewritten without changing data (``dataChange: false``, as compaction writes) are left out:
    their rows were already read from the files they came from. A commit that removed data, or used
    deletion vectors, means the queue table was edited behind mqspark's back, so it fails loudly.
    """
    filesystem, path = _log_entry(location, version)
    try:
        with filesystem.open_input_stream(path) as stream:
            lines = stream.read().decode().splitlines()
    except FileNotFoundError:
        raise MQError(
            f"table {location}: log entry of version {version} is gone (log clean-up?); "
            "the physical order of its messages cannot be rebuilt"
        ) from None
    added = []
    for line in lines:
        action = json.loads(line) if line.strip() else {}
        if "remove" in action and action["remove"].get("dataChange", True):
            raise MQError(f"table {location}: version {version} removed data; queue tables are append-only")
        if "add" in action:
            add = action["add"]
            if add.get("deletionVector"):
                raise MQError(f"table {location}: version {version} added a deletion vector, which mqspark cannot read")
            if add.get("dataChange", True):
                added.append((unquote(add["path"]), int(add["size"])))
    return added


def read_data_file(location: str, path: str, columns: list[str] | None = None) -> pa.Table:
    """One data file of the table at ``location`` (``path`` relative to it), as written."""
    filesystem, base = _filesystem(location)
    return pq.read_table(f"{base}/{path}", columns=columns, filesystem=filesystem, use_threads=False)


def read_data_rows(location: str, path: str, start: int, stop: int, columns: list[str] | None = None) -> pa.Table:
    """Rows ``start`` to ``stop`` (exclusive) of one data file, reading only the row groups holding them."""
    filesystem, base = _filesystem(location)
    with filesystem.open_input_file(f"{base}/{path}") as handle:
        parquet = pq.ParquetFile(handle)
        ends = np.cumsum([parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)])
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(ends, stop - 1, side="right"))
        data = parquet.read_row_groups(list(range(first, last + 1)), columns=columns, use_threads=False)
    skipped = int(ends[first - 1]) if first else 0
    return data.slice(start - skipped, stop - start)


@dataclass(frozen=True)
class DataFile:
    """A Parquet file written into a table's folder but not yet committed; plain data, so it pickles."""

    path: str
    size: int
    modification_time: int
    rows: int
    stats: str

    def add_action(self) -> AddAction:
        return AddAction(self.path, self.size, {}, self.modification_time, True, self.stats)


class _Stats:
    """Delta file statistics: row count, null counts, and exact min/max of integer and string columns.

    Timestamps get no min/max: Delta keeps them at millisecond precision, and a truncated max could
    make a reader skip a file that holds a matching row.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.rows = 0
        self.nulls = {f.name: 0 for f in schema if not pa.types.is_map(f.type)}
        self.bounded = [f.name for f in schema if pa.types.is_integer(f.type) or pa.types.is_string(f.type)]
        self.minimum: dict[str, object] = {}
        self.maximum: dict[str, object] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        for name in self.nulls:
            self.nulls[name] += batch.column(name).null_count
        for name in self.bounded:
            low, high = pc.min_max(batch.column(name)).values()
            if low.is_valid:
                low, high = low.as_py(), high.as_py()
                self.minimum[name] = min(low, self.minimum.get(name, low))
                self.maximum[name] = max(high, self.maximum.get(name, high))

    def to_json(self) -> str:
        return json.dumps(
            {"numRecords": self.rows, "minValues": self.minimum, "maxValues": self.maximum, "nullCount": self.nulls}
        )


def write_data_file(location: str, batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> DataFile | None:
    """Write ``batches`` as one Parquet file in the table folder at ``location``; None when there are no rows."""
    filesystem, base = _filesystem(location)
    name = f"part-{uuid.uuid4()}.snappy.parquet"
    stats = _Stats(schema)
    writer = None
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if writer is None:
                writer = pq.ParquetWriter(f"{base}/{name}", schema, filesystem=filesystem, compression="snappy")
            writer.write_batch(batch)
            stats.add(batch)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        return None
    size = filesystem.get_file_info(f"{base}/{name}").size
    return DataFile(name, size, int(time.time() * 1000), stats.rows, stats.to_json())


def remove_data_files(location: str, files: Iterable[DataFile]) -> None:
    """Delete written files that will never be committed."""
    filesystem, base = _filesystem(location)
    for file in files:
        # Spark may abort a batch whose commit already removed its files.
        if filesystem.get_file_info(f"{base}/{file.path}").type != pafs.FileType.NotFound:
            filesystem.delete_file(f"{base}/{file.path}")


def commit_files(
    table: DeltaTable,
    files: list[DataFile],
    schema: pa.Schema,
    *,
    app_id: str | None = None,
    app_version: int | None = None,
    metadata: dict[str, str] | None = None,
) -> int:
    """Append ``files`` in one commit at exactly the version after ``table``'s, and return that version.

    No automatic retry: the caller's checks were made against ``table``'s version, so a concurrent
    commit raises ``CommitFailedError`` and the caller re-reads, re-checks and tries again.
    ``app_id``/``app_version`` record a Delta ``txn`` so a replayed transaction can be recognised.
    """
    transactions = [Transaction(app_id, app_version)] if app_id is not None else None
    table.create_write_transaction(
        [file.add_action() for file in files],
        mode="append",
        schema=schema,
        commit_properties=CommitProperties(
            max_commit_retries=0, app_transactions=transactions, custom_metadata=metadata
        ),
    )
    return table.version() + 1


def commit_until_landed(
    location: str,
    files: list[DataFile],
    prepare: Callable[[int], Callable[[], int] | None],
    attempts: int,
    giving_up: str,
) -> int | None:
    """Commit written ``files`` with optimistic retries, and delete them when they never will be.

    ``prepare(attempt)`` reads the table, checks what must hold, and returns the commit to make
    (a call of :func:`commit_files` on the table it checked), or None when nothing is to be
    committed. A commit that loses to a concurrent one (``CommitFailedError``) is prepared again.
    Files stay when a commit failed in an unknown way: it may have landed.
    """
    committing = False
    try:
        for attempt in range(attempts):
            commit = prepare(attempt)
            if commit is None:
                remove_data_files(location, files)
                return None
            committing = True
            try:
                return commit()
            except CommitFailedError:
                committing = False
                time.sleep(random.uniform(0.001, 0.01) * min(attempt + 1, 10))
        raise MQError(giving_up, Reason.MQRC_BACKED_OUT)
    except BaseException:
        if not committing:
            remove_data_files(location, files)
        raise


def close_table(table: DeltaTable, closed: bool = True) -> None:
    """Mark a message table closed (or open again), in a commit at exactly the version after ``table``'s.

    Raises ``CommitFailedError`` when another commit got in first, so the caller re-checks.
    """
    table.alter.set_table_properties(
        {CLOSED_PROPERTY: str(closed).lower()},
        raise_if_not_exists=False,
        commit_properties=CommitProperties(max_commit_retries=0),
    )


def is_closed(table: DeltaTable) -> bool:
    return table.metadata().configuration.get(CLOSED_PROPERTY) == "true"
