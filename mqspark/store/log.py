"""The Delta log: reading one entry (which files a version added and removed), the versions that
added the live files, checkpoints, and cleaning up expired entries and the files they removed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import unquote

import pyarrow.fs as pafs
from deltalake import DeltaTable

from mqspark.errors import MQError
from mqspark.store.filesystems import filesystem_of


def add_versions(
    location: str, paths: list[str], newest: int, known: tuple[int, dict[str, int]] | None = None
) -> dict[str, int]:
    """The version of the commit that added each of ``paths``, read from the log entries from
    ``newest`` back to the last checkpoint, and further while a path is not found. Maintenance
    stamps every file it leaves behind before it cleans up log entries, so the files that need this
    were added since the last maintenance, whose entries are still there. Every entry read is
    checked (see :func:`log_entry`), so a recent edit behind mqspark's back fails loudly.

    ``known`` (an older version of the same table and the versions found for its files) stands for
    its entry and those before it: they were read and checked for it, and log entries never change,
    so the entries after it and the last checkpoint are read (and further while a path is not found)."""
    since, before = last_checkpoint(location), {}
    if known is not None:
        since, before = max(since, known[0]), known[1]
    found = {path: before[path] for path in paths if path in before}
    wanted = set(paths) - found.keys()
    version = newest
    while (wanted or version > since) and version >= 0:
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


def newest_version(location: str, known: int = -1) -> int:
    """The newest version in the log of the local table at ``location`` (-1: none), from its entries'
    names only. Given ``known``, a version that exists, it costs one file lookup when nothing changed."""
    if known < 0:
        try:
            names = os.listdir(os.path.join(location, "_delta_log"))
        except FileNotFoundError:
            names = []
        known = max((int(name[:20]) for name in names if name.endswith(".json") and name[:20].isdigit()), default=-1)
    while version_exists(location, known + 1):
        known += 1
    return known


def log_stamp(location: str, version: int) -> int | None:
    """When commit ``version``'s log entry was written (ns), None when there is none. With
    :func:`version_exists` of the next version, two file lookups tell a table unchanged since
    ``version`` from one that moved on or was made anew, where updating a handle lists the log."""
    filesystem, path = _log_path(location, version)
    info = filesystem.get_file_info(path)
    return info.mtime_ns if info.type == pafs.FileType.File else None


def refreshed(
    location: str, table: DeltaTable | None, stamp: tuple[int, int | None] | None
) -> tuple[DeltaTable, tuple[int, int | None]] | None:
    """``table`` at the latest version, with the version and :func:`log_stamp` of its current entry,
    when it is still the table whose entry ``stamp[0]`` was written at ``stamp[1]`` (not deleted,
    nor made anew); None when it must be opened afresh. The handle may have moved past ``stamp[0]``
    by its own commits. Two file lookups when nothing changed, where updating the handle lists the log."""
    if table is None or stamp is None or stamp[1] is None or log_stamp(location, stamp[0]) != stamp[1]:
        return None
    if version_exists(location, table.version() + 1):
        try:
            table.update_incremental()
        except Exception:  # noqa: BLE001 - deleted, or deleted and made again meanwhile
            return None
    current = log_stamp(location, table.version())
    return (table, (table.version(), current)) if current is not None else None


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


def log_actions(location: str, version: int) -> list[dict]:
    """The actions of commit ``version``'s log entry; raises :class:`LogEntryGone` when it is not there."""
    filesystem, path = _log_path(location, version)
    try:
        with filesystem.open_input_stream(path) as stream:
            lines = stream.read().decode().splitlines()
    except FileNotFoundError:
        raise LogEntryGone(
            f"table {location}: log entry of version {version} is gone (log clean-up?); "
            "the physical order of its messages cannot be rebuilt"
        ) from None
    return [json.loads(line) for line in lines if line.strip()]


def _operation(actions: list[dict]) -> str | None:
    return next((a["commitInfo"].get("mqspark.operation") for a in actions if "commitInfo" in a), None)


# The commitInfo key of the id each commit of mqspark carries (see :func:`mqspark.store.commit.commit_files`).
COMMIT_ID = "mqspark.commit"


def commit_info(location: str, version: int) -> dict:
    """The ``commitInfo`` of commit ``version``; raises :class:`LogEntryGone` when its entry is not there."""
    return next((a["commitInfo"] for a in log_actions(location, version) if "commitInfo" in a), {})


def commit_operations(location: str, first: int, last: int) -> list[str | None]:
    """The ``mqspark.operation`` of each commit from version ``first`` to ``last``; raises
    :class:`LogEntryGone` when one of their log entries was cleaned up."""
    return [_operation(log_actions(location, version)) for version in range(first, last + 1)]


def log_entry(location: str, version: int) -> LogEntry:
    """The data files commit ``version`` added and removed, read straight from its log entry, the only
    place that says which version added a file.

    Files rewritten without changing data (``dataChange: false``) are left out. A commit that removed
    data other than by mqspark's maintenance or purge, or used deletion vectors, means the queue table
    was edited behind mqspark's back, so it fails loudly.
    """
    actions = log_actions(location, version)
    operation = _operation(actions)
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
