"""Delta tables: opening (re-listing a log that a clean-up changed under us), creating, removing,
closing for a delete, migrating columns, the live files and committed rows, reading a table as a
pyarrow dataset, and trimming history.
"""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from urllib.parse import unquote

import cachetools
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, Field
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from mqspark.errors import MQError
from mqspark.store.files import read_data_part
from mqspark.store.filesystems import filesystem_of
from mqspark.store.layout import StorageOptions
from mqspark.store.log import add_versions, clean_up_log, log_stamp, refreshed

# A table property set on a message table that is being deleted; puts refuse to commit on top of it.
CLOSED_PROPERTY = "mqspark.closed"


def table_exists(location: str, storage_options: StorageOptions) -> bool:
    return DeltaTable.is_deltatable(location, storage_options=storage_options)


# Opening a table lists its log, then reads the newest checkpoint and the entries after it; a log
# clean-up between the two can delete what was listed, and a listing that raced commits of other
# processes can miss an entry (see listing_raced). Listing again finds the newer checkpoint, or every entry.
_OPEN_ATTEMPTS = 5
_LOG_FILE = re.compile(r"_delta_log/(\d{20})\.(?:json|checkpoint\.parquet)")


def log_file_gone(error: Exception) -> int | None:
    """The version of the log entry or checkpoint that ``error`` says was not found, else None."""
    text = str(error)
    match = _LOG_FILE.search(text) if "not found" in text.lower() else None
    return int(match.group(1)) if match else None


def listing_raced(error: Exception) -> bool:
    """Whether ``error`` is delta-rs finding a gap in the log's versions: a directory listing that ran
    while other processes committed can miss an entry written during it and see a later one (ext4
    lists in hash order). The log has no gap; listing again sees every entry."""
    return "Expected contiguous commit files" in str(error)


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
            if (log_file_gone(error) is None and not listing_raced(error)) or attempts == _OPEN_ATTEMPTS:
                raise


def current_handle(
    location: str, storage_options: StorageOptions, kept: tuple[DeltaTable | None, tuple[int, int | None] | None]
) -> tuple[DeltaTable, tuple[int, int | None]] | None:
    """A handle on the table at ``location`` at its latest version, with its version's
    :func:`log_stamp`: ``kept`` (a handle and stamp from an earlier call, the handle perhaps moved on
    by its own commits since) brought up to date while it is still the same table (see
    :func:`refreshed`), else opened afresh; None without a table."""
    fresh = refreshed(location, *kept)
    if fresh is not None:
        return fresh
    table = open_table(location, storage_options)
    return None if table is None else (table, (table.version(), log_stamp(location, table.version())))


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


# As deltalake's own datasets read: each file's needed column chunks fetched together.
_PARQUET = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True))


def table_dataset(table: DeltaTable, paths: list[str] | None = None) -> ds.Dataset:
    """The table's version as a pyarrow dataset of its live files (or of ``paths`` among them), read
    through :func:`filesystem_of`; the tables of a queue manager are not partitioned, so every column
    is in the files.

    Built from the add actions' paths (percent-encoded in the log), not with deltalake's
    ``to_pyarrow_dataset``: that turns every file's statistics into a partition expression, about
    2 ms of CPU per file (116 ms for a queue of 60 files). A filtered scan then reads every file's
    footer to prune by row-group statistics instead, which cost 31 ms there in all.

    Not through deltalake's default filesystem, a Python object, either: a scan leaves buffers of
    its reads for Arrow's I/O threads to free after it returned, and those buffers are Python
    objects, freed under the GIL. A process that exits meanwhile ends that thread inside a C++
    destructor when it asks for the GIL, and aborts ("terminate called without an active exception").
    """
    filesystem, path = filesystem_of(table.table_uri)
    if paths is None:
        paths = pa.table(table.get_add_actions()).column("path").to_pylist()
    paths = [unquote(name) for name in paths]
    return ds.FileSystemDataset.from_paths(
        paths,
        schema=pa.schema(table.schema().to_arrow()),
        format=_PARQUET,
        filesystem=pafs.SubTreeFileSystem(path, filesystem),
    )


def live_counts(table: DeltaTable) -> tuple[int, int]:
    """The number of live data files and of their rows (file statistics, else a scan), from one read
    of the add actions."""
    counts = pa.table(table.get_add_actions()).column("num_records")
    if counts.null_count == 0:
        return len(counts), int(pc.sum(counts).as_py() or 0)
    return len(counts), table_dataset(table).count_rows()


# The live files of recent table versions, which never change; a version's log_stamp tells a table
# made anew at the same location from the one read before. Pollers such as the console ask for the
# same versions again and again, and each answer reads log entries back to the last checkpoint.
# Each kept version is counted as its buffers and about 12 KB of objects besides (measured).
LIVE_FILES_BYTES = 16 * 1024 * 1024
_live_files: cachetools.LRUCache = cachetools.LRUCache(
    LIVE_FILES_BYTES, getsizeof=lambda files: files.nbytes + 12 * 1024
)
# The key of the newest version of each table whose live files were kept: a newer version's read
# takes the versions of the files it shares with it from there (see :func:`add_versions`).
_newest_key: cachetools.LRUCache = cachetools.LRUCache(4096)
_live_files_lock = threading.Lock()


def live_files(table: DeltaTable) -> pa.Table:
    """The data files of ``table``'s version: ``path``, ``size``, ``rows``, and ``version``, the version
    of the commit that added the file, which applies to its rows that carry no ``commit_version``
    (null for files whose every row carries one: maintenance wrote them). From the statistics of a
    queue table's files also ``min_put_seq``, ``max_put_seq``, ``min_commit_version``,
    ``max_commit_version``, ``max_priority``, ``min_put_time`` (rounded down to a millisecond),
    ``any_top`` (a row is ``top_of_queue``), ``min_group_id`` and ``max_group_id``, ``never_expire``
    (no row has an expiry), ``never_delayed`` (no row has an ``available_at``), ``never_grouped`` and
    ``never_before`` (no row has a ``group_id``, a ``before_msg_id``), and ``never_redriven`` (no row
    has a ``redriven_for``); null where a file has no such statistics. A file with statistics but
    none of ``redriven_for`` was written before the column existed: it is ``never_redriven``."""
    version = table.version()
    key = (table.table_uri, version, log_stamp(table.table_uri, version))
    with _live_files_lock:
        files = _live_files.get(key) if key[2] is not None else None
        before = _newest_key.get(key[0]) if files is None else None
        kept = _live_files.get(before) if before is not None and before[1] < version else None
    if files is None:
        files = _read_live_files(table, _known_versions(before, kept))
        if key[2] is not None:
            # A copy: the columns taken from the add actions are slices that keep the whole
            # snapshot's log data alive (about 0.4 MB a version, measured).
            files = files.take(pa.array(range(files.num_rows), pa.int64()))
            with _live_files_lock:
                _live_files[key] = files
                _newest_key[key[0]] = key
    return files


def _known_versions(key: tuple[str, int, int] | None, files: pa.Table | None) -> tuple[int, dict[str, int]] | None:
    """The version of ``key`` (an older version of the same table) and the versions of its live
    ``files``, while its log entry is still the one they were read from (the table was not made
    anew); None otherwise."""
    if key is None or files is None or log_stamp(key[0], key[1]) != key[2]:
        return None
    paths, versions = files["path"].to_pylist(), files["version"].to_pylist()
    return key[1], {path: added for path, added in zip(paths, versions, strict=True) if added is not None}


def _read_live_files(table: DeltaTable, known: tuple[int, dict[str, int]] | None = None) -> pa.Table:
    """:func:`live_files`, from the table's add actions and its log: the entries after ``known``'s
    version, when given (see :func:`add_versions`)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    paths = actions["path"]
    rows = actions["num_records"]

    def stat(name: str, kind: pa.DataType) -> pa.ChunkedArray | pa.Array:
        return actions[name] if name in actions.column_names else pa.nulls(len(paths), kind)

    stamped = pc.fill_null(pc.equal(stat("null_count.commit_version", pa.int64()), 0), False)
    unstamped = paths.filter(pc.invert(stamped)).to_pylist()
    found = add_versions(table.table_uri, unstamped, table.version(), known)
    versions = pa.array([found.get(path) for path in paths.to_pylist()], pa.int64())
    return pa.table(
        {
            "path": paths,
            "size": actions["size_bytes"],
            "rows": rows,
            "version": versions,
            "min_put_seq": stat("min.put_seq", pa.int64()),
            "max_put_seq": stat("max.put_seq", pa.int64()),
            "min_commit_version": stat("min.commit_version", pa.int64()),
            "max_commit_version": stat("max.commit_version", pa.int64()),
            "max_priority": stat("max.priority", pa.int64()).cast(pa.int64()),
            "min_put_time": stat("min.put_time", pa.timestamp("us", tz="UTC")),
            "any_top": stat("max.top_of_queue", pa.bool_()),
            "never_expire": pc.equal(stat("null_count.expiry", pa.int64()), rows),
            "never_delayed": pc.equal(stat("null_count.available_at", pa.int64()), rows),
            "never_grouped": pc.equal(stat("null_count.group_id", pa.int64()), rows),
            "min_group_id": stat("min.group_id", pa.string()),
            "max_group_id": stat("max.group_id", pa.string()),
            "never_before": pc.equal(stat("null_count.before_msg_id", pa.int64()), rows),
            "never_redriven": pc.coalesce(
                pc.equal(stat("null_count.redriven_for", pa.int64()), rows),
                pc.if_else(pc.is_valid(stat("null_count.put_seq", pa.int64())), True, pa.scalar(None, pa.bool_())),
            ),
        }
    )


def live_paths(table: DeltaTable) -> list[str]:
    """The paths (relative to the table) of the data files of ``table``'s version."""
    return pa.table(table.get_add_actions()).column("path").to_pylist()


def read_committed(table: DeltaTable, columns: list[str], schema: pa.Schema, version: int | None = None) -> pa.Table:
    """Every message of the table's version (or of ``version``), with the version of the put that
    committed it as ``commit_version``, in no particular order."""
    if version is not None and version != table.version():
        table = DeltaTable(table.table_uri, version=version, storage_options=table_options(table))
    files = live_files(table)
    pieces = []
    for path, file_version in zip(files["path"].to_pylist(), files["version"].to_pylist(), strict=True):
        # Files written by other engines (delta-spark) may type columns a little differently.
        data = read_messages(table.table_uri, path, file_version, columns)
        pieces.append(data.select(columns).cast(schema).append_column("commit_version", data["commit_version"]))
    if not pieces:
        return schema.empty_table().append_column("commit_version", pa.array([], pa.int64()))
    return pa.concat_tables(pieces)


def table_options(table: DeltaTable) -> StorageOptions:
    return getattr(table, "_storage_options", None)


def read_messages(
    location: str, path: str, version: int | None, columns: list[str], rows: tuple[int, int] | None = None
) -> pa.Table:
    """``columns`` of one data file (its ``rows`` start to stop, when given) with ``commit_version``,
    filled in from the file's add ``version`` where the rows carry none (rows a put wrote)."""
    names = [name for name in columns if name != "commit_version"]
    data = read_data_part(location, path, rows, [*names, "commit_version"])
    stamps = data["commit_version"].cast(pa.int64())
    data = data.drop_columns(["commit_version"])
    if version is not None:
        stamps = pc.fill_null(stamps, pa.scalar(version, pa.int64()))
    elif stamps.null_count:
        raise MQError(f"table {location}: file {path} has rows without a commit version and no known add version")
    return data.append_column("commit_version", stamps)


# A file a small table's writer wrote is committed within moments; vacuum never deletes younger ones.
VACUUM_FLOOR = timedelta(minutes=10)


def trim_history(table: DeltaTable, keep_from: int, retention_seconds: int) -> tuple[int, int]:
    """Bound the history of a small table rewritten in place (a cluster repository, a queue's state
    table): checkpoint at version ``keep_from``, clean up the log entries before it that are older
    than the retention, and vacuum files no version references that were written longer ago than the
    retention (at least :data:`VACUUM_FLOOR`, so a file written for a commit still under way is never
    deleted). Versions from ``keep_from`` on stay readable.
    Returns the log entries and files removed."""
    location = table.table_uri
    files_seconds = max(retention_seconds, int(VACUUM_FLOOR.total_seconds()))
    set_properties(
        table,
        {
            "delta.logRetentionDuration": f"interval {retention_seconds} seconds",
            "delta.deletedFileRetentionDuration": f"interval {files_seconds} seconds",
        },
    )
    options = table_options(table)
    cleaned, _ = clean_up_log(DeltaTable(location, version=keep_from, storage_options=options))
    latest = open_table(location, options)
    if latest is None:
        return cleaned, 0
    try:
        return cleaned, len(latest.vacuum(dry_run=False, full=True))
    except CommitFailedError:
        # delta-rs records a vacuum in the log after deleting; a concurrent commit got that version.
        return cleaned, 0


def set_properties(table: DeltaTable, wanted: dict[str, str]) -> bool:
    """Set the table properties ``wanted`` in one commit, unless they are set already; True when set."""
    if all(table.metadata().configuration.get(key) == value for key, value in wanted.items()):
        return False
    table.alter.set_table_properties(wanted)
    return True


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
