"""Maintenance: what keeps a queue small (``qm.maintain``, ``mqspark maintain``), and purge (CLEAR QLOCAL).

Purge removes every live message in one commit, under the same lease, and is refused while a query
of any consumer group holds its lease. Messages put after its commit stay.

One maintenance run of a queue, under the queue's maintenance lease (at most one at a time: two
overlapping compactions would duplicate every row):

1. **Removes messages** that every counted consumer group has consumed (a copy redriven for one
   group: once that group consumed it, or is no longer counted), and messages expired for
   longer than :data:`EXPIRY_GRACE`. Messages of a plan not yet consumed (a batch that a replay may
   still deliver) are never removed, nor messages put within the queue's ``duplicate_window``
   (:mod:`mqspark.engine.duplicates` reads their msg_ids from the live files).
2. **Rewrites files**: a file whose messages are all removed is dropped; a file with some removed
   messages, a file a put wrote, and small files are rewritten into files of up to
   :data:`TARGET_FILE_BYTES`. Rewritten rows carry their ``commit_version``, so physical order and
   each message's identity (its origin and row) stay what they were. All of it is one commit at
   exactly the version after the one read, so a concurrent put or another maintenance makes it
   re-read, and a rewrite of files that are gone is given up.
3. **Keeps the log and storage bounded**: a checkpoint at that commit, log entries older than the
   retention cleaned up, and removed files vacuumed once older than the retention (time travel
   reaches back that far).
4. **Compacts the state table**, dropping the consumed ranges of messages no longer in the queue.
5. **Expires idle consumer groups**: a group with nothing recorded (no read, no lease renewal) for
   the queue's ``consumer_group_expiry`` is deleted. It counted in this run's removal, so the
   messages only it consumed are gone and never come back; the messages that waited only for it
   are released, and the next run removes what the other groups consumed. A group whose query
   starts meanwhile holds its lease, and is kept.

Every file a put wrote is rewritten by the next run, so once a run is done the files whose rows carry
no ``commit_version`` were all added after it, and their log entries are kept: the version that
added them is still known.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from mqspark import store
from mqspark.engine import depth, staged_puts
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.heartbeat import Heartbeat
from mqspark.engine.leases import MAINTENANCE
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import QueueDefinition
from mqspark.model.groups import finished_items
from mqspark.model.messages import QUEUE_TABLE_SCHEMA

# Removed files and log entries stay this long by default, for time travel and for readers still
# on an older version.
DEFAULT_RETENTION = timedelta(hours=1)
# An expired message is removed once it has been expired this long, so that a batch planned just
# before it expired is recorded (and protected) before maintenance decides.
EXPIRY_GRACE = timedelta(minutes=5)
# Rewritten messages go into files of up to this many bytes; files under a quarter of it are merged.
TARGET_FILE_BYTES = 128 * 1024 * 1024
LEASE_TIMEOUT = timedelta(seconds=30)
# A temporary log entry older than the retention and this is a killed commit's leftover: a live one
# lasts under a second, and one whose process was paused longer is written again (store.appends).
LEFTOVER_AGE = timedelta(minutes=1)
_ATTEMPTS = 100
_log = logging.getLogger("mqspark.engine.maintenance")


@dataclass(frozen=True)
class MaintenanceSummary:
    """What one maintenance run of a queue did."""

    queue: str
    version: int | None
    """The version of the maintenance commit; None when no file needed a change."""
    expired_groups: tuple[str, ...]
    """The consumer groups deleted for having nothing recorded for ``consumer_group_expiry``."""
    removed_consumed: int
    removed_expired: int
    rewritten: int
    """Messages kept and moved into new files."""
    files_before: int
    files_after: int
    log_entries_removed: int
    files_vacuumed: int
    leftovers_removed: int
    """Temporary log entries left by processes killed inside a commit (see store.appends)."""
    seconds: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def check_retention(retention: object) -> timedelta:
    if not isinstance(retention, timedelta):
        raise MQValidationError(f"retention must be a timedelta, got {type(retention).__name__} {retention!r}")
    if retention < timedelta(0):
        raise MQValidationError(f"retention must be 0 or more, got {retention.total_seconds():g} seconds")
    return retention


def maintain(
    qm: store.QueueManagerRoot, definition: QueueDefinition, retention: timedelta, now: datetime | None = None
) -> MaintenanceSummary:
    """Run maintenance on local queue ``definition`` (see the module docstring)."""
    started = time.monotonic()
    now = now or datetime.now(UTC)
    queue = definition.name
    with _Lease(qm, queue):
        location = store.queue_location(qm.root, queue)
        table = _prepared_table(location, qm.storage_options, retention)
        state = ConsumerState(qm.root, queue, qm.storage_options)
        read_version = table.version()
        rewritten_reads = _RewrittenReads(table)
        window = definition.duplicate_window
        extra = [*GROUP_FIELDS, "put_time"] if window else list(GROUP_FIELDS)
        files, messages = depth.live_messages(table, extra, rewritten_reads.reads)
        groups = state.all_groups()
        consumed_by_all = np.zeros(messages.num_rows, dtype=bool)
        if groups.groups:
            consumed_by_all[:] = True
            for name in groups.groups:
                # A copy redriven for another group is not for this one: consumed, as far as it goes.
                consumed_by_all &= depth.consumed_by(messages, groups.consumed[name]) | ~depth.meant_for(messages, name)
            # A group's consumed items anchor its place in logical order until the group is finished.
            consumed_by_all &= _finished_or_ungrouped(messages, consumed_by_all)
        expired = depth.expired(messages, now - EXPIRY_GRACE)
        removed = (consumed_by_all | expired) & ~depth.consumed_by(messages, groups.in_flight)
        if window:
            # Duplicate detection reads the msg_ids put within the window from the live files.
            removed &= ~_put_within(messages, now - timedelta(seconds=window))
        file = messages["file"].to_numpy()
        plan = _rewrite_plan(files, file, removed)
        version = None
        moved = np.isin(file, plan.rewritten) & ~removed
        if len(plan.dropped) or len(plan.rewritten):
            kept = _kept_rows(location, files, plan.rewritten, file, removed, rewritten_reads.whole)
            written = _write(location, kept, files)
            changed = files["path"].to_numpy(zero_copy_only=False)[np.concatenate([plan.dropped, plan.rewritten])]
            version = _commit(location, qm.storage_options, changed.tolist(), written)
        # Log entries may go only when no live file still needs its add version from them: every file a
        # put wrote was rewritten, or there was none.
        unstamped = pc.any(pc.is_valid(files["version"])).as_py()
        # A staged put claimed by a holder is settled by the log: the entries stay while one is unsettled.
        settled = store.is_uri(location) or staged_puts.settle_claims(location)
        clean_before = read_version if (version is not None or not unstamped) and settled else None
        cleaned, vacuumed = _tidy(location, qm.storage_options, version, clean_before, now, retention)
        older_than = (now - max(retention, LEFTOVER_AGE)).timestamp()
        leftovers = sum(store.remove_leftovers(where, older_than) for where in (location, state.location))
        leftovers += store.remove_staged_leftovers(location, older_than)
        if not store.is_uri(state.location):
            leftovers += store.remove_get_leftovers(state.location, older_than)
        if version is None:
            removed[:] = False
            moved[:] = False
        state.compact(live=pc.unique(messages["origin"].filter(pa.array(~removed))), seen_version=read_version)
        # After the removal, which still counts the idle groups: what only they consumed goes now and
        # never comes back (a redriver's moved messages); what they alone wait for is released next run.
        expired_groups = _expire_idle_groups(state, timedelta(seconds=definition.consumer_group_expiry), now)
        return MaintenanceSummary(
            queue=queue,
            version=version,
            expired_groups=expired_groups,
            removed_consumed=int((removed & consumed_by_all).sum()),
            removed_expired=int((removed & ~consumed_by_all).sum()),
            rewritten=int(moved.sum()),
            files_before=files.num_rows,
            files_after=len(store.live_paths(_queue_table(location, qm.storage_options))),
            log_entries_removed=cleaned,
            files_vacuumed=vacuumed,
            leftovers_removed=leftovers,
            seconds=round(time.monotonic() - started, 3),
        )


def _expire_idle_groups(state: ConsumerState, expiry: timedelta, now: datetime) -> tuple[str, ...]:
    """Delete the groups idle for longer than ``expiry``; those found active when deleted are kept."""
    expired = []
    for consumer, newest in state.idle_groups(expiry, now).items():
        try:
            state.delete(consumer, LEASE_TIMEOUT)
        except MQError as error:
            if error.reason not in (Reason.MQRC_OBJECT_IN_USE, Reason.MQRC_UNKNOWN_OBJECT_NAME):
                raise
            continue  # a query of the group took its lease meanwhile, or the group was deleted
        _log.warning(
            "queue %s: consumer group %r expired: nothing recorded for it since %s (consumer_group_expiry %g s); "
            "the messages that waited only for it are released",
            state.queue,
            consumer,
            newest.isoformat(timespec="seconds"),
            expiry.total_seconds(),
        )
        expired.append(consumer)
    return tuple(expired)


def purge(qm: store.QueueManagerRoot, queue: str, lease_timeout: timedelta) -> int:
    """Remove every live message of local queue ``queue`` in one commit (see :meth:`QueueManager.purge`)."""
    state = ConsumerState(qm.root, queue, qm.storage_options)
    for group in state.groups():
        if state.lease(group, lease_timeout) is not None:
            raise MQError(
                f"queue {queue}: consumer group {group!r} is reading it; stop its query before purging",
                Reason.MQRC_OBJECT_IN_USE,
            )
    location = store.queue_location(qm.root, queue)
    with _Lease(qm, queue):
        removed: list[int] = []

        def prepare(attempt: int) -> Callable[[], int]:
            table = _queue_table(location, qm.storage_options)
            files = store.live_files(table)
            removed[:] = [int(pc.sum(files["rows"]).as_py() or 0)]
            return lambda: store.commit_files(
                table,
                [],
                QUEUE_TABLE_SCHEMA,
                removed=files["path"].to_pylist(),
                metadata={"mqspark.operation": "purge"},
            )

        store.commit_until_landed(
            location, [], prepare, _ATTEMPTS, f"queue {queue}: purge gave up after {_ATTEMPTS} conflicts"
        )
        return removed[0]


# The columns that say where a message's group ends.
GROUP_FIELDS = ("group_id", "last_in_group", "segmented", "last_segment")


def _put_within(messages: pa.Table, since: datetime) -> np.ndarray:
    """Which messages were put at ``since`` or later."""
    return pc.greater_equal(messages["put_time"], pa.scalar(since, messages["put_time"].type)).to_numpy(
        zero_copy_only=False
    )


def _finished_or_ungrouped(messages: pa.Table, consumed: np.ndarray) -> np.ndarray:
    """Which messages are in no group, or consumed items of a finished group (see
    :func:`mqspark.model.groups.finished_items`)."""
    grouped = pc.is_valid(messages["group_id"]).to_numpy(zero_copy_only=False)
    return ~grouped | finished_items(messages, consumed)


class Maintenance:
    """Maintenance runs a long-lived service (a streaming get's planner) starts now and then, each in a
    background thread, with the default retention. A run that finds another one going is skipped."""

    def __init__(self, qm: store.QueueManagerRoot, definition: Callable[[], QueueDefinition]) -> None:
        self.qm = qm
        # Read again for each run: an attribute altered since (duplicate_window) counts.
        self.definition = definition
        self.queue = definition().name
        self.started = time.monotonic()
        self.last: MaintenanceSummary | Exception | None = None
        self._thread: threading.Thread | None = None

    def start_if_due(self, interval: timedelta) -> bool:
        """Start a run when ``interval`` has passed since the last one started (or since this object was
        made) and none is running; True when one was started."""
        if self._thread is not None and self._thread.is_alive():
            return False
        if time.monotonic() - self.started < interval.total_seconds():
            return False
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"mqspark-maintain-{self.queue}", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        try:
            self.last = maintain(self.qm, self.definition(), DEFAULT_RETENTION)
        except MQError as error:
            self.last = error
            if error.reason != Reason.MQRC_OBJECT_IN_USE:
                _log.warning("maintenance of queue %s failed: %s", self.queue, error)
        except Exception as error:  # noqa: BLE001 - a failed run must not stop the service; the next one retries
            self.last = error
            _log.warning("maintenance of queue %s failed: %s", self.queue, error)


class _Lease:
    """The queue's maintenance lease, renewed while a run lasts; refused (2042) while another run holds it."""

    def __init__(self, qm: store.QueueManagerRoot, queue: str) -> None:
        location = store.maintenance_location(qm.root, queue)
        self.state = ConsumerState(qm.root, queue, qm.storage_options, location)
        self.queue = queue
        self.owner = uuid.uuid4().hex

    def __enter__(self) -> _Lease:
        try:
            self.state.acquire(MAINTENANCE, self.owner, LEASE_TIMEOUT)
        except MQError as error:
            if error.reason != Reason.MQRC_OBJECT_IN_USE:
                raise
            raise MQError(
                f"queue {self.queue}: maintenance is already running (another process holds its lease)",
                Reason.MQRC_OBJECT_IN_USE,
            ) from None
        self.heartbeat = Heartbeat(self.state, MAINTENANCE, self.owner, LEASE_TIMEOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.heartbeat.stop()
        self.state.release(MAINTENANCE, self.owner)


def _queue_table(location: str, storage_options: store.StorageOptions) -> DeltaTable:
    """The queue table at ``location`` at its latest version; it is there while its queue is defined."""
    table = store.open_table(location, storage_options)
    if table is None:
        raise MQError(f"no message table at {location} (its queue was deleted)", Reason.MQRC_UNKNOWN_OBJECT_NAME)
    return table


# What every message table has, set when it is created and by maintenance on a table of an earlier
# mqspark. Log entries say which version added a file a put wrote: only maintenance may clean them
# up. A checkpoint every 20 versions keeps each put's log replay short (docs/architecture.md).
MESSAGE_TABLE_PROPERTIES = {
    "delta.enableExpiredLogCleanup": "false",
    "delta.checkpointInterval": "20",
}


def _prepared_table(location: str, storage_options: store.StorageOptions, retention: timedelta) -> DeltaTable:
    """The queue table, its properties set for ``retention`` and for log clean-up by maintenance only."""
    table = _queue_table(location, storage_options)
    seconds = int(retention.total_seconds())
    wanted = {
        **MESSAGE_TABLE_PROPERTIES,
        "delta.logRetentionDuration": f"interval {seconds} seconds",
        "delta.deletedFileRetentionDuration": f"interval {seconds} seconds",
    }
    return _queue_table(location, storage_options) if store.set_properties(table, wanted) else table


@dataclass(frozen=True)
class _RewritePlan:
    """File numbers (into the live files) to drop, and to rewrite."""

    dropped: np.ndarray
    rewritten: np.ndarray


def _rewrite_plan(files: pa.Table, file: np.ndarray, removed: np.ndarray) -> _RewritePlan:
    """Which files go (every message removed) and which are rewritten (some removed, written by a put,
    or small while there is another small file to merge with)."""
    count = len(files)
    rows = files["rows"].to_numpy()
    gone = np.bincount(file[removed], minlength=count)
    drop = gone == rows
    rewrite = ~drop & ((gone > 0) | _rewritten_whatever_goes(files))
    return _RewritePlan(np.flatnonzero(drop), np.flatnonzero(rewrite))


def _rewritten_whatever_goes(files: pa.Table) -> np.ndarray:
    """Which live ``files`` a run rewrites unless all their messages go: files a put wrote (their rows
    carry no commit_version), and small files while there is another small one to merge with."""
    stamped = pc.is_null(files["version"]).to_numpy(zero_copy_only=False)
    small = files["size"].to_numpy() < TARGET_FILE_BYTES // 4
    return ~stamped | (small & (small.sum() > 1))


class _RewrittenReads:
    """The files a run rewrites whatever it removes, each read whole once: the identities of their
    messages (``depth.live_messages``) and their kept rows come from that one read. Reading each
    twice was two thirds of a run over 256 files of one message."""

    def __init__(self, table: DeltaTable) -> None:
        files = store.live_files(table)
        chosen = np.flatnonzero(_rewritten_whatever_goes(files)) if files.num_rows else np.zeros(0, np.int64)
        paths, versions = files["path"].to_pylist(), files["version"].to_pylist()
        self.whole: dict[str, pa.Table] = {}
        self.reads: dict[tuple, pa.Table] = {}
        for number in chosen:
            path, version = paths[number], versions[number]
            data = store.read_messages(table.table_uri, path, version, QUEUE_TABLE_SCHEMA.names)
            self.whole[path] = data
            self.reads[depth.read_key(table.table_uri, path, version, list(GROUP_FIELDS))] = data


def _kept_rows(
    location: str,
    files: pa.Table,
    rewritten: np.ndarray,
    file: np.ndarray,
    removed: np.ndarray,
    whole: dict[str, pa.Table],
) -> pa.Table:
    """The kept messages of the rewritten files, whole (from ``whole``, the files read whole already,
    or read), with their commit_version, in physical order."""
    if not len(rewritten):
        return QUEUE_TABLE_SCHEMA.empty_table()
    paths = files["path"].to_pylist()
    versions = files["version"].to_pylist()
    pieces = []
    for number in rewritten:
        data = whole.get(paths[number])
        if data is None:
            data = store.read_messages(location, paths[number], versions[number], QUEUE_TABLE_SCHEMA.names)
        pieces.append(data.filter(pa.array(~removed[file == number])))
    kept = pa.concat_tables(pieces).select(QUEUE_TABLE_SCHEMA.names).cast(QUEUE_TABLE_SCHEMA)
    return kept.sort_by([("commit_version", "ascending"), ("put_seq", "ascending")])


def _write(location: str, kept: pa.Table, files: pa.Table) -> list[store.DataFile]:
    """``kept`` in files of about :data:`TARGET_FILE_BYTES` (judged by the live files' bytes per row)."""
    if kept.num_rows == 0:
        return []
    per_row = max(1, int(pc.sum(files["size"]).as_py() // max(1, int(pc.sum(files["rows"]).as_py()))))
    rows_per_file = max(1, TARGET_FILE_BYTES // per_row)
    written = []
    for start in range(0, kept.num_rows, rows_per_file):
        part = kept.slice(start, rows_per_file)
        data = store.write_data_file(location, part.to_batches(), QUEUE_TABLE_SCHEMA)
        assert data is not None, "every part has rows"
        written.append(data)
    return written


def _commit(
    location: str, storage_options: store.StorageOptions, removed: list[str], written: list[store.DataFile]
) -> int | None:
    """Commit the rewrite at exactly the version after the one it checks; a concurrent commit makes it
    check again that every file it removes is still live, and give up (deleting its files) if not."""

    def prepare(attempt: int) -> Callable[[], int] | None:
        table = _queue_table(location, storage_options)
        if not set(removed) <= set(store.live_paths(table)):
            return None
        return lambda: store.commit_files(
            table,
            written,
            QUEUE_TABLE_SCHEMA,
            removed=removed,
            metadata={"mqspark.operation": "maintain", "mqspark.files_removed": len(removed)},
        )

    return store.commit_until_landed(
        location, written, prepare, _ATTEMPTS, f"maintenance of {location} gave up after {_ATTEMPTS} conflicts"
    )


def _tidy(
    location: str,
    storage_options: store.StorageOptions,
    version: int | None,
    clean_before: int | None,
    now: datetime,
    retention: timedelta,
) -> tuple[int, int]:
    """Delete the files that maintenance and purge commits older than ``retention`` removed, clean up
    the log entries before version ``clean_before`` older than the retention (None: keep them all)
    with the files the entries that go removed, and checkpoint at the maintenance commit
    ``version``. Returns the log entries and files removed."""
    vacuumed = store.delete_removed_files(location, now - retention)
    table = _queue_table(location, storage_options)
    cleaned = 0
    if clean_before is not None:
        table.load_as_version(clean_before)
        cleaned, more = store.clean_up_log(table, retention)
        vacuumed += more
    if version is not None:
        table.load_as_version(version)
        table.create_checkpoint()
    return cleaned, vacuumed
