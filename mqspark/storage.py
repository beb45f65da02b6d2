"""Where a queue manager's Delta tables live and how they are opened, created and removed.

Layout under a queue manager root (a local directory or an object-store URI)::

    <root>/_qmgr/            catalog: the queue manager and its queue definitions
    <root>/queues/<queue>/   one message table per queue
    <root>/state/<queue>/    the queue's consumer groups (see ``consumers``)
    <root>/maintenance/<queue>/  the queue's maintenance lease

Queue names may hold ``/`` and ``%``; in directory names they become ``~2F`` and ``~25``
(``~`` never occurs in a name, so the mapping is one-to-one and never forms a path).
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Field, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from .errors import MQError, MQValidationError, Reason
from .filesystems import filesystem_of, is_uri

CATALOG_DIR = "_qmgr"
STATE_DIR = "state"
MAINTENANCE_DIR = "maintenance"
FORWARD_DIR = "forward"
MONITOR_DIR = "monitor"
INSTANCES_DIR = "instances"
# A table property set on a message table that is being deleted; puts refuse to commit on top of it.
CLOSED_PROPERTY = "mqspark.closed"
QUEUES_DIR = "queues"

StorageOptions = dict[str, str] | None


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


def maintenance_location(root: str, queue: str) -> str:
    """The table holding the queue's maintenance lease: apart from the state table, whose commits
    several times a second would make taking the lease wait."""
    return f"{root}/{MAINTENANCE_DIR}/{queue_dir_name(queue)}"


def forward_location(root: str, queue: str, consumer: str) -> str:
    """The checkpoint of the forwarding service of ``queue`` in consumer group ``consumer``."""
    return f"{root}/{FORWARD_DIR}/{queue_dir_name(queue)}/{consumer}"


def monitor_location(root: str, queue: str) -> str:
    """The backlog monitor's history of ``queue``: a point per row, every group's."""
    return f"{root}/{MONITOR_DIR}/{queue_dir_name(queue)}"


def table_exists(location: str, storage_options: StorageOptions) -> bool:
    return DeltaTable.is_deltatable(location, storage_options=storage_options)


def reachable(root: str, storage_options: StorageOptions) -> bool:
    """Whether the catalog of the queue manager at ``root`` can be read now."""
    try:
        return table_exists(catalog_location(root), storage_options)
    except Exception:  # noqa: BLE001 - any failure to read the catalog means the root cannot be reached
        return False


# What the stores' clients say when the store did not answer, as opposed to answering "no":
# delta-rs's object_store gives up "after N retries" only on what it may retry (no connection,
# a timeout, a 5xx); pyarrow's Azure and S3 clients say they could not connect.
_UNANSWERED = re.compile(
    r"after \d+ retries|error sending request|connection refused|connection reset|timed out"
    r"|could not connect to server|NETWORK_CONNECTION",
    re.IGNORECASE,
)
_UNANSWERED_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENOTCONN,
        errno.ESTALE,
        errno.EIO,
    }
)


def unanswered(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is the store not answering a request."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and (
            isinstance(seen, ConnectionError | TimeoutError)
            or seen.errno in _UNANSWERED_ERRNOS
            or _UNANSWERED.search(str(seen))
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def broken(error: BaseException, root: str, storage_options: StorageOptions) -> bool:
    """Whether ``error`` broke the connection to the queue manager at ``root``: its store did not
    answer, or its catalog cannot be read right after. Checking only afterwards would miss a store
    that came back in between, once its client had given up."""
    if isinstance(error, MQValidationError):
        return False
    return unanswered(error) or not reachable(root, storage_options)


# The store's words for credentials it refused (Azure's error codes, HTTP 401/403).
_REFUSED = ("401 Unauthorized", "403 Forbidden", "AuthenticationFailed", "AuthorizationFailure", "Invalid Access Key")


def store_error(root: str, error: OSError) -> MQError:
    """The error for a queue manager root whose store refused the credentials (2035) or did not
    answer (2059), with the store's own words (delta-rs's chain of causes, without its markup)."""
    text = re.sub(r"\x1b\[[0-9;]*m|↳", " ", str(error)).split("<?xml")[0]
    code = re.search(r"<Code>(\w+)</Code>", str(error))
    detail = " ".join(text.split()) + (f" ({code.group(1)})" if code else "")
    if any(mark in str(error) for mark in _REFUSED):
        return MQError(
            f"queue manager root {root}: the store refused the credentials: {detail}", Reason.MQRC_NOT_AUTHORIZED
        )
    return MQError(f"queue manager root {root}: the store did not answer: {detail}", Reason.MQRC_Q_MGR_NOT_AVAILABLE)


# Opening a table lists its log, then reads the newest checkpoint and the entries after it; a log
# clean-up between the two can delete what was listed. Listing again finds the newer checkpoint.
_OPEN_ATTEMPTS = 5
_LOG_FILE = re.compile(r"_delta_log/(\d{20})\.(?:json|checkpoint\.parquet)")


def log_file_gone(error: Exception) -> int | None:
    """The version of the log entry or checkpoint that ``error`` says was not found, else None."""
    text = str(error)
    match = _LOG_FILE.search(text) if "not found" in text.lower() else None
    return int(match.group(1)) if match else None


def open_table(location: str, storage_options: StorageOptions) -> DeltaTable | None:
    """The Delta table at ``location``, or None when there is none."""
    attempts = 0
    while True:
        try:
            return DeltaTable(location, storage_options=storage_options)
        except TableNotFoundError:
            return None
        except DeltaError as error:
            attempts += 1
            if log_file_gone(error) is None or attempts == _OPEN_ATTEMPTS:
                raise


def create_table(
    location: str, schema: pa.Schema, storage_options: StorageOptions, configuration: dict[str, str] | None = None
) -> DeltaTable:
    return DeltaTable.create(
        location, schema=schema, mode="error", configuration=configuration, storage_options=storage_options
    )


def remove_tree(location: str) -> None:
    """Delete a table directory and everything below it.

    Object stores are reached with the credentials ``filesystems`` finds for the location.
    """
    filesystem, path = filesystem_of(location)
    if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
        filesystem.delete_dir(path)


def live_counts(table: DeltaTable) -> tuple[int, int]:
    """The number of live data files and of their rows (file statistics, else a scan), from one read
    of the add actions."""
    counts = pa.table(table.get_add_actions()).column("num_records")
    if counts.null_count == 0:
        return len(counts), int(pc.sum(counts).as_py() or 0)
    return len(counts), table.to_pyarrow_dataset().count_rows()


def live_files(table: DeltaTable) -> pa.Table:
    """The data files of ``table``'s version: ``path``, ``size``, ``rows``, and ``version``, the version
    of the commit that added the file, which applies to its rows that carry no ``commit_version``
    (null for files whose every row carries one: maintenance wrote them). From the statistics of a
    queue table's files also ``min_put_seq``, ``max_put_seq`` and ``never_expire`` (no row has an
    expiry); null where a file has no statistics."""
    actions = pa.table(table.get_add_actions(flatten=True))
    paths = actions["path"]
    rows = actions["num_records"]

    def stat(name: str, kind: pa.DataType) -> pa.ChunkedArray | pa.Array:
        return actions[name] if name in actions.column_names else pa.nulls(len(paths), kind)

    stamped = pc.fill_null(pc.equal(stat("null_count.commit_version", pa.int64()), 0), False)
    unstamped = paths.filter(pc.invert(stamped)).to_pylist()
    found = add_versions(table.table_uri, unstamped, table.version())
    versions = pa.array([found.get(path) for path in paths.to_pylist()], pa.int64())
    return pa.table(
        {
            "path": paths,
            "size": actions["size_bytes"],
            "rows": rows,
            "version": versions,
            "min_put_seq": stat("min.put_seq", pa.int64()),
            "max_put_seq": stat("max.put_seq", pa.int64()),
            "never_expire": pc.equal(stat("null_count.expiry", pa.int64()), rows),
        }
    )


def live_paths(table: DeltaTable) -> list[str]:
    """The paths (relative to the table) of the data files of ``table``'s version."""
    return pa.table(table.get_add_actions()).column("path").to_pylist()


def add_versions(location: str, paths: list[str], newest: int) -> dict[str, int]:
    """The version of the commit that added each of ``paths``, read from the log entries from
    ``newest`` back to the last checkpoint, and further while a path is not found. Maintenance
    stamps every file it leaves behind before it cleans up log entries, so the files that need this
    were added since the last maintenance, whose entries are still there. Every entry read is
    checked (see :func:`log_entry`), so a recent edit behind mqspark's back fails loudly."""
    wanted = set(paths)
    found: dict[str, int] = {}
    version = newest
    checkpoint = last_checkpoint(location)
    while (wanted or version > checkpoint) and version >= 0:
        for path in log_entry(location, version).added:
            if path in wanted:
                found[path] = version
                wanted.discard(path)
        version -= 1
    return found


def last_checkpoint(location: str) -> int:
    """The version of the table's last checkpoint, -1 when it has none."""
    filesystem, base = filesystem_of(location)
    try:
        with filesystem.open_input_stream(f"{base}/_delta_log/_last_checkpoint") as stream:
            return int(json.loads(stream.read())["version"])
    except FileNotFoundError:
        return -1


def read_committed(table: DeltaTable, columns: list[str], schema: pa.Schema, version: int | None = None) -> pa.Table:
    """Every message of the table's version (or of ``version``), with the version of the put that
    committed it as ``commit_version``, in no particular order."""
    if version is not None and version != table.version():
        table = DeltaTable(table.table_uri, version=version, storage_options=_options(table))
    files = live_files(table)
    pieces = []
    for path, file_version in zip(files["path"].to_pylist(), files["version"].to_pylist(), strict=True):
        # Files written by other engines (delta-spark) may type columns a little differently.
        data = read_messages(table.table_uri, path, file_version, columns)
        pieces.append(data.select(columns).cast(schema).append_column("commit_version", data["commit_version"]))
    if not pieces:
        return schema.empty_table().append_column("commit_version", pa.array([], pa.int64()))
    return pa.concat_tables(pieces)


def _options(table: DeltaTable) -> StorageOptions:
    return getattr(table, "_storage_options", None)


def read_messages(location: str, path: str, version: int | None, columns: list[str]) -> pa.Table:
    """``columns`` of one data file with ``commit_version``, filled in from the file's add ``version``
    where the rows carry none (rows a put wrote)."""
    names = [name for name in columns if name != "commit_version"]
    data = read_data_file(location, path, [*names, "commit_version"])
    stamps = data["commit_version"].cast(pa.int64())
    data = data.drop_columns(["commit_version"])
    if version is not None:
        stamps = pc.fill_null(stamps, pa.scalar(version, pa.int64()))
    elif stamps.null_count:
        raise MQError(f"table {location}: file {path} has rows without a commit version and no known add version")
    return data.append_column("commit_version", stamps)


def _log_path(location: str, version: int) -> tuple[pafs.FileSystem, str]:
    filesystem, base = filesystem_of(location)
    return filesystem, f"{base}/_delta_log/{version:020d}.json"


def delete_removed_files(location: str, older_than: datetime) -> int:
    """Delete the data files that mqspark's maintenance or purge commits removed, for the commits whose
    log entries were written before ``older_than``; returns how many files were deleted.

    Only files such a commit names are deleted, never a file a put has written but not committed yet.
    Run it before the log clean-up that drops those entries.
    """
    cutoff = older_than.timestamp()
    versions = [version for version, mtime in _log_entry_times(location).items() if mtime < cutoff]
    return _delete_files_removed_by(location, [log_entry(location, version) for version in versions])


def _log_entry_times(location: str) -> dict[int, float]:
    """Each commit entry's version and the time it was written."""
    filesystem, base = filesystem_of(location)
    listing = filesystem.get_file_info(pafs.FileSelector(f"{base}/_delta_log"))
    return {
        int(info.path.rsplit("/", 1)[-1].split(".")[0]): info.mtime.timestamp()
        for info in listing
        if info.path.endswith(".json") and info.mtime is not None
    }


def _delete_files_removed_by(location: str, entries: Iterable[LogEntry]) -> int:
    """Delete the files the maintenance or purge commits among ``entries`` removed that are still there."""
    filesystem, base = filesystem_of(location)
    deleted = 0
    for entry in entries:
        for path in entry.removed if entry.rewrites else []:
            if filesystem.get_file_info(f"{base}/{path}").type == pafs.FileType.File:
                filesystem.delete_file(f"{base}/{path}")
                deleted += 1
    return deleted


# A file a small table's writer wrote is committed within moments; vacuum never deletes younger ones.
_VACUUM_FLOOR_SECONDS = 600


def trim_history(table: DeltaTable, keep_from: int, retention_seconds: int) -> tuple[int, int]:
    """Bound the history of a small table rewritten in place (a cluster repository): checkpoint at
    version ``keep_from``, clean up the log entries before it that are older than the retention, and
    vacuum files removed longer ago than the retention (at least ten minutes, so a file written for
    a commit still under way is never deleted). Versions from ``keep_from`` on stay readable.
    Returns the log entries and files removed."""
    location = table.table_uri
    set_properties(
        table,
        {
            "delta.logRetentionDuration": f"interval {retention_seconds} seconds",
            "delta.deletedFileRetentionDuration": f"interval {max(retention_seconds, _VACUUM_FLOOR_SECONDS)} seconds",
        },
    )
    options = _options(table)
    cleaned, _ = clean_up_log(DeltaTable(location, version=keep_from, storage_options=options))
    return cleaned, len(DeltaTable(location, storage_options=options).vacuum(dry_run=False, full=True))


def set_properties(table: DeltaTable, wanted: dict[str, str]) -> bool:
    """Set the table properties ``wanted`` in one commit, unless they are set already; True when set."""
    if all(table.metadata().configuration.get(key) == value for key, value in wanted.items()):
        return False
    table.alter.set_table_properties(wanted)
    return True


# Log clean-up judges an entry's age by its own clock, a moment after the vacuum before it did: an
# entry that comes of age in between is read first, so the files it removed go with it.
_COMING_OF_AGE_SECONDS = 60


def clean_up_log(table: DeltaTable, retention: timedelta | None = None) -> tuple[int, int]:
    """Checkpoint at ``table``'s version and clean up the log entries before it that are older than the
    table's log retention (as that version sets it). With ``retention`` (the log retention), the files
    removed by the maintenance or purge commits among the entries that go are deleted too, so none is
    left behind unnamed. Returns how many entries and files went."""
    table.create_checkpoint()
    location = table.table_uri
    before = _log_entry_times(location)
    expiring: dict[int, LogEntry] = {}
    if retention is not None:
        soon = time.time() - retention.total_seconds() + _COMING_OF_AGE_SECONDS
        expiring = {v: log_entry(location, v) for v, mtime in before.items() if v < table.version() and mtime < soon}
    table.cleanup_metadata()
    after = _log_entry_times(location)
    deleted = _delete_files_removed_by(location, [entry for version, entry in expiring.items() if version not in after])
    return len(before) - len(after), deleted


def log_entry_count(location: str) -> int:
    """How many commit entries (``.json``) the table's log holds."""
    filesystem, base = filesystem_of(location)
    listing = filesystem.get_file_info(pafs.FileSelector(f"{base}/_delta_log"))
    return sum(1 for info in listing if info.path.endswith(".json"))


def version_exists(location: str, version: int) -> bool:
    """Whether commit ``version`` of the table exists: one file lookup, cheap enough for idle polling."""
    filesystem, path = _log_path(location, version)
    return filesystem.get_file_info(path).type == pafs.FileType.File


class LogEntryGone(MQError):
    """A log entry a reader needs was cleaned up: maintenance stamped the files it added since, so a
    newer snapshot reads without it."""


@dataclass(frozen=True)
class LogEntry:
    """What one commit of a queue table did to its files."""

    version: int
    added: list[str]
    sizes: list[int]
    removed: list[str]
    operation: str | None

    @property
    def rewrites(self) -> bool:
        """A commit of maintenance or purge: it removes files, and its files hold no new messages."""
        return self.operation in REWRITE_OPERATIONS


# The commitInfo value (key ``mqspark.operation``) of commits that remove or rewrite messages.
REWRITE_OPERATIONS = ("maintain", "purge")


def log_entry(location: str, version: int) -> LogEntry:
    """The data files commit ``version`` added and removed, read straight from its log entry, the only
    place that says which version added a file.

    Files rewritten without changing data (``dataChange: false``) are left out. A commit that removed
    data other than by mqspark's maintenance or purge, or used deletion vectors, means the queue table
    was edited behind mqspark's back, so it fails loudly.
    """
    filesystem, path = _log_path(location, version)
    try:
        with filesystem.open_input_stream(path) as stream:
            lines = stream.read().decode().splitlines()
    except FileNotFoundError:
        raise LogEntryGone(
            f"table {location}: log entry of version {version} is gone (log clean-up?); "
            "the physical order of its messages cannot be rebuilt"
        ) from None
    actions = [json.loads(line) for line in lines if line.strip()]
    operation = next(
        (a["commitInfo"].get("mqspark.operation") for a in actions if "commitInfo" in a),
        None,
    )
    added, sizes, removed = [], [], []
    for action in actions:
        if "remove" in action and action["remove"].get("dataChange", True):
            if operation not in REWRITE_OPERATIONS:
                raise MQError(f"table {location}: version {version} removed data; queue tables are append-only")
            removed.append(unquote(action["remove"]["path"]))
        if "add" in action:
            add = action["add"]
            if add.get("deletionVector"):
                raise MQError(f"table {location}: version {version} added a deletion vector, which mqspark cannot read")
            if add.get("dataChange", True):
                added.append(unquote(add["path"]))
                sizes.append(int(add["size"]))
    return LogEntry(version, added, sizes, removed, operation)


def read_data_file(location: str, path: str, columns: list[str] | None = None) -> pa.Table:
    """One data file of the table at ``location`` (``path`` relative to it), as written; ``columns``
    the file lacks (written before the table had them) come back as nulls, as Delta reads them.

    Read with ``ParquetFile``: ``pq.read_table`` builds a dataset for every file. ``pre_buffer``
    fetches the wanted column chunks in few requests, as ``pq.read_table`` does (object stores).
    """
    filesystem, base = filesystem_of(location)
    with filesystem.open_input_file(f"{base}/{path}") as handle:
        parquet = pq.ParquetFile(handle, pre_buffer=True)
        present = _present(parquet, columns)
        return _with_nulls(parquet.read(columns=present, use_threads=False), columns)


def read_data_rows(location: str, path: str, start: int, stop: int, columns: list[str] | None = None) -> pa.Table:
    """Rows ``start`` to ``stop`` (exclusive) of one data file, reading only the row groups holding
    them; missing ``columns`` as in :func:`read_data_file`."""
    filesystem, base = filesystem_of(location)
    with filesystem.open_input_file(f"{base}/{path}") as handle:
        parquet = pq.ParquetFile(handle)
        ends = np.cumsum([parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)])
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(ends, stop - 1, side="right"))
        present = _present(parquet, columns)
        data = parquet.read_row_groups(list(range(first, last + 1)), columns=present, use_threads=False)
    skipped = int(ends[first - 1]) if first else 0
    return _with_nulls(data.slice(start - skipped, stop - start), columns)


def _present(parquet: pq.ParquetFile, columns: list[str] | None) -> list[str] | None:
    if columns is None:
        return None
    names = set(parquet.schema_arrow.names)
    return [name for name in columns if name in names]


def _with_nulls(data: pa.Table, columns: list[str] | None) -> pa.Table:
    """``data`` with the ``columns`` it lacks added as nulls, in the order of ``columns``."""
    if columns is None or len(columns) == data.num_columns:
        return data
    return pa.table({name: data[name] if name in data.column_names else pa.nulls(data.num_rows) for name in columns})


def add_missing_columns(table: DeltaTable, schema: pa.Schema) -> bool:
    """Add the nullable columns of ``schema`` that ``table``'s schema lacks, in one metadata commit
    (a table created by an earlier mqspark); True when it did. Old files read those as nulls."""
    names = set(table.schema().to_arrow().names)
    missing = [field for field in schema if field.name not in names]
    if not missing:
        return False
    table.alter.add_columns(
        [Field.from_arrow(field) for field in missing],
        commit_properties=CommitProperties(custom_metadata={"mqspark.operation": "add columns"}),
    )
    return True


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
    filesystem, base = filesystem_of(location)
    name = f"part-{uuid.uuid4()}.snappy.parquet"
    batches = (_conform(batch, schema) for batch in batches)
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


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with the nullable columns of ``schema`` it lacks added as nulls."""
    if batch.schema.names == schema.names:
        return batch
    columns = [
        batch.column(field.name) if field.name in batch.schema.names else pa.nulls(batch.num_rows, field.type)
        for field in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def remove_data_files(location: str, files: Iterable[DataFile]) -> None:
    """Delete written files that will never be committed."""
    filesystem, base = filesystem_of(location)
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
    removed: Iterable[str] = (),
) -> int:
    """Append ``files`` (and remove the live files at paths ``removed``) in one commit at exactly the
    version after ``table``'s, and return that version.

    No automatic retry: the caller's checks were made against ``table``'s version, so a concurrent
    commit raises ``CommitFailedError`` and the caller re-reads, re-checks and tries again.
    ``app_id``/``app_version`` record a Delta ``txn`` so a replayed transaction can be recognised.
    """
    transactions = [Transaction(app_id, app_version)] if app_id is not None else None
    now = int(time.time() * 1000)
    removals = [RemoveAction(path, True, now) for path in removed]
    version = table.version() + 1
    try:
        table.create_write_transaction(
            [*removals, *(file.add_action() for file in files)],
            mode="append",
            schema=schema,
            commit_properties=CommitProperties(
                max_commit_retries=0, app_transactions=transactions, custom_metadata=metadata
            ),
        )
    except DeltaError as error:
        if not read_back_failed(error, table.table_uri, version, _options(table)):
            raise
    return version


def read_back_failed(error: DeltaError, location: str, version: int, storage_options: StorageOptions) -> bool:
    """Whether ``error`` is delta-rs failing to read the log back after committing ``version``.

    delta-rs reads the log back after writing a commit, to update the snapshot: the commit's own
    entry, or the newest checkpoint and the entries after it. Maintenance running in between (a
    checkpoint at a later version, then a clean-up of older entries and checkpoints) can remove
    them first. A file of the commit's own version is never read before it is written, so its
    absence means the commit landed; for an older file, the table must have reached ``version``. (A
    commit that lost to another raises ``CommitFailedError`` instead.)
    """
    gone = log_file_gone(error)
    if gone is None or gone > version:
        return False
    if gone == version:
        return True
    table = open_table(location, storage_options)
    return table is not None and table.version() >= version


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
    Files stay when a commit failed in an unknown way (it may have landed), and when the table could
    not be read (a reconnect commits them after all, see :mod:`mqspark.connection`).
    """
    committing = False
    try:
        for attempt in range(attempts):
            try:
                commit = prepare(attempt)
            except LogEntryGone:
                # Maintenance committed after the version read and cleaned up behind it: read again.
                continue
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
    except BaseException as error:
        if not committing and isinstance(error, MQError):
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
