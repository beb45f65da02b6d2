"""Appending to a Delta table in a local folder with log entries mqspark writes itself.

delta-rs rebuilds its snapshot of a table for every commit and after it, replaying each log entry
since the last checkpoint: about 24 ms of a single-message put went there, while writing the entry
takes well under a millisecond (docs/architecture.md, "The commit path"). An :class:`Appender` keeps
what a put checks (the version, the live files and their rows, the transactions, whether the table
is closed, its columns) and moves it on by reading only the entries written after it. Its commits
add files and nothing else: the entry is written whole to a temporary file, then hard-linked to the
next version's name, which fails when that version exists (put-if-absent, as delta-rs does on a
local file system), and the caller reads the new entries, checks again and retries.

Any entry it cannot follow (a metadata or protocol change, a file without statistics, an entry gone)
makes :meth:`Appender.advance` answer False, and the caller builds a new one from a delta-rs handle.
Only tables whose protocol asks nothing more of an append are taken (:func:`appender_of`). A
checkpoint is written at every ``delta.checkpointInterval``-th version, as delta-rs's own post-commit
hook does, so readers replay few entries.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from mqspark.store.files import DataFile
from mqspark.store.filesystems import is_uri
from mqspark.store.log import COMMIT_ID, LogEntryGone, last_checkpoint, log_actions, log_stamp
from mqspark.store.tables import CLOSED_PROPERTY

_log = logging.getLogger(__name__)

# Writer versions up to 4 ask of an append only what a plain add satisfies: appendOnly and change data
# feed are met by adds, and invariants, check constraints and generated columns are checked absent.
_WRITER_VERSION = 4
_ENGINE = "mqspark"


def appender_of(location: str, table: DeltaTable) -> Appender | None:
    """An :class:`Appender` of the table at ``location`` at ``table``'s version, or None when mqspark
    does not write its log itself: an object store (no put-if-absent through pyarrow), a protocol
    with writer features, constraints, generated columns, invariants, or a live file without a row
    count."""
    if not appends_itself(location, table):
        return None
    metadata = table.metadata()
    actions = pa.table(table.get_add_actions())
    paths = actions.column("path").to_pylist()
    counts = actions.column("num_records").to_pylist()
    if any(count is None for count in counts):
        return None
    version = table.version()
    stamp = log_stamp(location, version)
    if stamp is None:
        return None
    return Appender(
        location,
        version,
        stamp,
        dict(zip(paths, counts, strict=True)),
        closed=metadata.configuration.get(CLOSED_PROPERTY) == "true",
        columns=frozenset(table.schema().to_arrow().names),
        checkpoint_interval=int(metadata.configuration.get("delta.checkpointInterval", "100")),
        base=table,
    )


def appends_itself(location: str, table: DeltaTable) -> bool:
    """Whether mqspark writes the log entries of appends to the table at ``location`` itself (see
    :func:`appender_of`), judged by ``table``'s version."""
    if is_uri(location):
        return False
    protocol = table.protocol()
    schema = table.schema().to_json()
    return not (
        protocol.min_writer_version > _WRITER_VERSION
        or protocol.writer_features
        or any(key.startswith("delta.constraints.") for key in table.metadata().configuration)
        or "delta.generationExpression" in schema
        or "delta.invariants" in schema
    )


def append_files(
    location: str,
    version: int,
    files: list[DataFile],
    *,
    transaction: tuple[str, int] | None = None,
    metadata: dict[str, Any] | None = None,
    checkpoint_interval: int = 100,
) -> int:
    """Commit ``files`` to the table at ``location`` as ``version``, with ``metadata`` in its
    ``commitInfo`` and ``transaction`` (an app id and its version) as a ``txn``, and checkpoint at
    every ``checkpoint_interval``-th version; return ``version``. Raises ``CommitFailedError`` when
    another commit took the version (only for a table :func:`appends_itself` takes)."""
    now = int(time.time() * 1000)
    info = {
        "timestamp": now,
        "operation": "WRITE",
        "operationParameters": {"mode": "Append", "partitionBy": "[]"},
        "engineInfo": _ENGINE,
        "clientVersion": _ENGINE,
        **(metadata or {}),
        COMMIT_ID: uuid.uuid4().hex,
    }
    actions: list[dict[str, Any]] = [{"commitInfo": info}]
    if transaction is not None:
        actions.append({"txn": {"appId": transaction[0], "version": transaction[1], "lastUpdated": now}})
    actions += [{"add": _add_action(file)} for file in files]
    _write_new(_entry(location, version), "\n".join(json.dumps(a) for a in actions).encode() + b"\n")
    # Never behind a newer checkpoint, which readers (and the check above) must keep finding.
    if version % checkpoint_interval == 0 and last_checkpoint(location) < version:
        _checkpoint(location, version)
    return version


def _checkpoint(location: str, version: int) -> None:
    """A checkpoint at ``version`` from a handle loaded at it. The commit has landed, so a checkpoint
    that fails is only left to the next interval, or to maintenance."""
    try:
        DeltaTable(location, version=version).create_checkpoint()
    except Exception as error:  # noqa: BLE001 - see the docstring
        _log.info("checkpoint of %s at version %d not written: %s", location, version, error)


class Appender:
    """What an append to one table checks, kept at the table's latest version by reading its new log
    entries, and the append itself. Not for concurrent use by threads."""

    def __init__(
        self,
        location: str,
        version: int,
        stamp: int,
        rows: dict[str, int],
        *,
        closed: bool,
        columns: frozenset[str],
        checkpoint_interval: int,
        base: DeltaTable,
    ) -> None:
        self.location = location
        self.version = version
        self.closed = closed
        self.columns = columns
        self._stamp = stamp
        self._rows = rows
        self._total = sum(rows.values())
        self._transactions: dict[str, int] = {}
        self._interval = checkpoint_interval
        # The handle it was built from knows the transactions up to then; it may be moved on since,
        # and transaction versions only grow, so it never answers lower than the table did.
        self._base = base

    @property
    def live_files(self) -> int:
        return len(self._rows)

    @property
    def live_rows(self) -> int:
        return self._total

    @property
    def live_paths(self) -> list[str]:
        return list(self._rows)

    @property
    def live_rows_by_path(self) -> Mapping[str, int]:
        """The rows of each live file, by its path (a read-only view, moved on with the appender)."""
        return MappingProxyType(self._rows)

    @property
    def checkpoint_interval(self) -> int:
        return self._interval

    def transaction_version(self, app_id: str) -> int | None:
        """The last version of application ``app_id``'s transactions (Delta ``txn``), None: none."""
        known = [v for v in (self._transactions.get(app_id), self._base.transaction_version(app_id)) if v is not None]
        return max(known, default=None)

    def advance(self) -> bool:
        """Read the entries after :attr:`version` into this state; False when one asks for a new
        :class:`Appender` (see the module's docstring), or the table was deleted or made anew."""
        if log_stamp(self.location, self.version) != self._stamp:
            return False
        while True:
            try:
                actions = log_actions(self.location, self.version + 1)
            except LogEntryGone:
                # No newer entry, unless a log clean-up removed it after a checkpoint past this version:
                # an entry linked there would lie below the checkpoint, where readers never look.
                return last_checkpoint(self.location) <= self.version
            if not self._apply(actions):
                return False
            self.version += 1
            stamp = log_stamp(self.location, self.version)
            if stamp is None:
                return False
            self._stamp = stamp

    def _apply(self, actions: list[dict[str, Any]]) -> bool:
        for action in actions:
            if "metaData" in action or "protocol" in action:
                return False
            if "add" in action:
                stats = json.loads(action["add"].get("stats") or "{}")
                if "numRecords" not in stats or action["add"].get("deletionVector"):
                    return False
                self._add(unquote(action["add"]["path"]), int(stats["numRecords"]))
            elif "remove" in action:
                self._total -= self._rows.pop(unquote(action["remove"]["path"]), 0)
            elif "txn" in action:
                self._transactions[action["txn"]["appId"]] = int(action["txn"]["version"])
        return True

    def _add(self, path: str, rows: int) -> None:
        self._total += rows - self._rows.get(path, 0)
        self._rows[path] = rows

    def append(
        self,
        files: list[DataFile],
        *,
        transaction: tuple[str, int] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> int:
        """Commit ``files`` as the version after :attr:`version`, with ``metadata`` in its ``commitInfo``
        and ``transaction`` (an app id and its version) as a ``txn``; return that version. Raises
        ``CommitFailedError`` when another commit took the version: the caller advances, checks again
        and retries."""
        version = append_files(
            self.location,
            self.version + 1,
            files,
            transaction=transaction,
            metadata=metadata,
            checkpoint_interval=self._interval,
        )
        self.version = version
        # -1: deleted at once; the next advance builds anew.
        self._stamp = log_stamp(self.location, version) or -1
        for file in files:
            self._add(file.path, file.rows)
        if transaction is not None:
            self._transactions[transaction[0]] = transaction[1]
        return version


def _add_action(file: DataFile) -> dict[str, Any]:
    return {
        "path": quote(file.path),
        "partitionValues": {},
        "size": file.size,
        "modificationTime": file.modification_time,
        "dataChange": True,
        "stats": file.stats,
    }


def _entry(location: str, version: int) -> str:
    return os.path.join(location, "_delta_log", f"{version:020d}.json")


_TEMPORARY_PREFIX, _TEMPORARY_SUFFIX = "_commit_", ".json.tmp"


def remove_leftovers(location: str, older_than: float) -> int:
    """Delete the temporary log entries that processes killed inside a commit left in the log of the
    local table at ``location``, last changed before ``older_than`` (a POSIX time: a live commit's
    lasts well under a second); how many went."""
    log = os.path.join(location, "_delta_log")
    if is_uri(location) or not os.path.isdir(log):
        return 0
    removed = 0
    for entry in os.scandir(log):
        if entry.name.startswith(_TEMPORARY_PREFIX) and entry.name.endswith(_TEMPORARY_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                if entry.stat().st_mtime < older_than:
                    os.unlink(entry.path)
                    removed += 1
    return removed


def _write_new(path: str, data: bytes) -> None:
    """Write ``path`` whole, or raise ``CommitFailedError`` when it exists: a temporary file beside it,
    hard-linked to its name (a link never replaces a file)."""
    folder = os.path.dirname(path)
    temporary = os.path.join(folder, f"{_TEMPORARY_PREFIX}{uuid.uuid4().hex}{_TEMPORARY_SUFFIX}")
    with open(temporary, "xb") as out:
        out.write(data)
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise CommitFailedError(f"version {os.path.basename(path)} of {os.path.dirname(folder)} was taken") from None
    except FileNotFoundError:
        # This process was paused so long that maintenance took its temporary entry for a leftover.
        raise CommitFailedError(f"the temporary entry for {path} was removed: write it again") from None
    finally:
        # The commit landed or not already: a leftover is only untidy (maintenance removes it).
        with contextlib.suppress(OSError):
            os.unlink(temporary)
