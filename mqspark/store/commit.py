"""Committing data files to a Delta table: one commit, its read-back judged landed or not, and the
optimistic loop that re-checks and retries after a conflicting commit.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import RemoveAction

from mqspark.errors import MQError, Reason
from mqspark.store.files import DataFile, remove_data_files
from mqspark.store.layout import StorageOptions
from mqspark.store.log import COMMIT_ID, LogEntryGone, commit_info
from mqspark.store.tables import listing_raced, log_file_gone, open_table, table_options

# After a commit, delta-rs checkpoints now and then and, by default, deletes the log entries older
# than the log retention. Two processes doing so at once delete the same entries, and the second
# fails with FileNotFoundError after its commit landed: a put or a get reported failed though it
# happened (a chaos run's getters and maintenance failed so once the state table's log, kept an
# hour, began to expire). The log is cleaned up by maintenance and by state compaction only.
POST_COMMIT = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


def commit_files(
    table: DeltaTable,
    files: list[DataFile],
    schema: pa.Schema,
    *,
    transaction: tuple[str, int] | None = None,
    metadata: dict[str, Any] | None = None,
    removed: Iterable[str] = (),
    overwrite: bool = False,
) -> int:
    """Append ``files`` (and remove the live files at paths ``removed``; with ``overwrite``, every live
    file) in one commit at exactly the version after ``table``'s, and return that version.

    No automatic retry: the caller's checks were made against ``table``'s version, so a concurrent
    commit raises ``CommitFailedError`` and the caller re-reads, re-checks and tries again.
    ``metadata`` (JSON values) is added to the commit's ``commitInfo``. ``transaction`` (an app id
    and its version) records a Delta ``txn`` so a replayed transaction
    can be recognised.
    """
    transactions = [Transaction(*transaction)] if transaction is not None else None
    now = int(time.time() * 1000)
    removals = [RemoveAction(path, True, now) for path in removed]
    version = table.version() + 1
    # Names this commit, so that a commit whose outcome a log listing hid can be found (see below).
    commit_id = uuid.uuid4().hex
    try:
        table.create_write_transaction(
            [*removals, *(file.add_action() for file in files)],
            mode="overwrite" if overwrite else "append",
            schema=schema,
            commit_properties=CommitProperties(
                max_commit_retries=0,
                app_transactions=transactions,
                custom_metadata={**(metadata or {}), COMMIT_ID: commit_id},
            ),
            post_commithook_properties=POST_COMMIT,
        )
    except DeltaError as error:
        if listing_raced(error):
            if not landed(table.table_uri, version, commit_id):
                raise CommitFailedError(f"a log listing raced other commits: {error}") from error
        elif not read_back_failed(error, table.table_uri, version, table_options(table)):
            raise
    return version


def landed(location: str, version: int, commit_id: str) -> bool:
    """Whether the commit named ``commit_id`` is the table's ``version`` (read straight from its log
    entry, which no listing hides)."""
    try:
        return commit_info(location, version).get(COMMIT_ID) == commit_id
    except LogEntryGone:
        return False


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
    not be read (a reconnect commits them after all, see :mod:`mqspark.reconnect`).
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
