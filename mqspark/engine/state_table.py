"""The state table of one queue as a handle: ``<root>/state/<queue>``, a small Delta table whose rows
are those of :mod:`mqspark.engine.state_rows`.

This module owns opening and creating the table, its settings (how long old log entries and removed
files are kept), its rows read incrementally (only the data files added since the last look), the
pinned look a planning step asks all its questions of, the answers derived from the rows until they
change, the count of rewrites, and the two raw commits: an append at exactly the version its check
saw, and an overwrite. What is appended, and when, is :mod:`mqspark.engine.state_commit`'s; the
compaction that overwrites it is :mod:`mqspark.engine.state_compaction`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from mqspark import store
from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.engine.state_rows import STATE_SCHEMA, EventKind
from mqspark.errors import MQError, Reason

# Old log entries are kept this long for readers still on an older version: a reader whose entries
# went opens the table afresh, and a commit is made at exactly the next version or not at all. Every
# look lists the log, and the getters of a busy queue commit several times a second: kept an hour,
# the log had 15,000 entries and a get took twice as long.
STATE_RETENTION = timedelta(minutes=2)
# The commitInfo key naming the plans a state commit records consumed.
CONSUMED_KEY = "mqspark.consumed"
# Removed files are kept longer: a reader may be reading the files of the version it looked at, and
# a file written for a commit still under way must not look like one left behind.
STATE_FILE_RETENTION = store.VACUUM_FLOOR
STATE_TABLE_CONFIGURATION = {
    "delta.logRetentionDuration": f"interval {int(STATE_RETENTION.total_seconds())} seconds",
    "delta.deletedFileRetentionDuration": f"interval {int(STATE_FILE_RETENTION.total_seconds())} seconds",
}
# Compaction runs when the table has grown this many versions since the last one: a commit costs
# more with each file the table holds (see :mod:`mqspark.engine.state_compaction`).
COMPACT_EVERY = 20
# How many times a commit is tried before it gives up.
ATTEMPTS = 100
_Derived = TypeVar("_Derived")
# How many log entries a reader reads at most to tell compactions from other rewrites.
_COMPACTIONS_READ = 2 * COMPACT_EVERY
# The ``mqspark.operation`` of a commit deleting a consumer group: unlike a compaction, it takes back
# what the group consumed.
DELETE_OPERATION = "delete group"


class StateTable:
    """The state table of one queue. Open it with the queue manager root and the (local) queue name.

    The table is opened once and brought up to date incrementally, and so are its rows: only the
    data files added since the last look are read. One instance per thread.
    """

    def __init__(
        self,
        root: str,
        queue: str,
        storage_options: store.StorageOptions = None,
        location: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.root = root
        # What stamps records and judges leases and locks: tests move one by hand.
        self.clock = clock
        self.queue = queue
        self.location = location or store.state_location(root, queue)
        self.storage_options = storage_options
        # A delta-rs handle, and for a local table a view that follows its log without delta-rs
        # (version and live files); ``_seen`` is the version of the last look, where the view is.
        self._table: DeltaTable | None = None
        self._view: store.Appender | None = None
        # When the log entry of the handle's version was written: tells the table deleted and made
        # anew from the one the handle was moved on in, however far the view moved on since.
        self._handle_stamp: int | None = None
        self._seen: int | None = None
        # The rows of each live data file read so far, and of the whole table at ``_rows_version``.
        self._files: dict[str, pa.Table] = {}
        self._rows = STATE_SCHEMA.empty_table()
        self._rows_version = -1
        self._pinned = self._current = False
        # How many times rows seen before went (a compaction, a group deleted) or the table was
        # opened anew (deleted and created again): what was derived from them may be out of date.
        self.rewrites = 0
        # Answers derived from the rows (see :meth:`derived`), and the rows they were derived from.
        self._derived: dict[tuple, Any] = {}
        self._derived_from: tuple[int, int] = (-1, -1)

    def version(self) -> int | None:
        """The table's latest version, None when there is none (yet, or any more). Inside
        :meth:`pinned`, the version of the first look, until this instance commits."""
        return self._seen if self._look() else None

    def table(self) -> DeltaTable | None:
        """A delta-rs handle on the table at :meth:`version`, None without a table (for a rewrite)."""
        if not self._look():
            return None
        assert self._table is not None and self._seen is not None
        if self._table.version() != self._seen:
            self._table.load_as_version(self._seen)
            self._handle_stamp = store.log_stamp(self.location, self._seen)
        return self._table

    def _look(self) -> bool:
        """Look at the table unless the pinned look holds; False when there is no table. A local
        table's look reads only the log entries written since the last one (see
        :class:`mqspark.store.Appender`); the delta-rs handle is then moved on only when asked for."""
        if not (self._pinned and self._current and self._seen is not None):
            if self._view is not None and self._view.advance():
                self._seen = self._view.version
            else:
                self._seen = self._handle_look()
            self._current = self._pinned
        return self._seen is not None

    def _handle_look(self) -> int | None:
        """The latest version through the delta-rs handle, opened afresh when the table was deleted or
        made anew; and a new view of a local table. None without a table."""
        self._view = None
        stamp = None if self._table is None else store.log_stamp(self.location, self._table.version())
        if stamp is not None and stamp != self._handle_stamp:
            # The entry of the handle's version was written again: the table was deleted and made anew,
            # however far past that version the new one is. (An entry gone is judged below.)
            self._table = None
            self.rewrites += 1
        if self._table is not None:
            seen = self._table.version()
            try:
                # Two file lookups, where updating the handle lists the whole log.
                if store.version_exists(self.location, seen + 1) or not store.version_exists(self.location, seen):
                    self._table.update_incremental()
                # A table deleted with its queue may have no newer entry, and no error says so.
                if self._table.version() > seen or store.version_exists(self.location, seen):
                    return self._viewed(self._table)
            except Exception:  # noqa: BLE001 - deleted with its queue, or recreated: open it afresh
                pass
            self._table = None
            self.rewrites += 1
        self._table = store.open_table(self.location, self.storage_options)
        # A table opened anew may be a new table at a version the rows were kept for.
        self._rows_version = -1
        return None if self._table is None else self._viewed(self._table)

    def _viewed(self, table: DeltaTable) -> int:
        self._handle_stamp = store.log_stamp(self.location, table.version())
        self._view = store.appender_of(self.location, table)
        return table.version()

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Answer the questions asked inside from one look at the table, taken again after this
        instance's own commits: a planning step asks several questions of the same version, and each
        look lists the table's log."""
        outer = self._pinned
        self._pinned, self._current = True, self._current and outer
        try:
            yield
        finally:
            self._pinned = outer
            self._current = self._current and outer

    def look_again(self) -> None:
        """Make the next question look at the table again, inside :meth:`pinned` too (a commit moved it on)."""
        self._current = False

    def created(self) -> None:
        """Create the table when there is none yet. A look inside :meth:`pinned` holds only once
        there is a table: without one, every question would look again and might see commits the
        earlier answers did not."""
        if self._look():
            return
        try:
            store.create_table(
                self.location, STATE_SCHEMA, self.storage_options, configuration=STATE_TABLE_CONFIGURATION
            )
        except Exception:
            # Another consumer created it first.
            if not self._look():
                raise
        if not self._look():
            # Deleted with its queue right after it was created.
            raise MQError(f"queue {self.queue}: its state table was deleted", Reason.MQRC_Q_DELETED)

    def rows(self) -> pa.Table:
        """Every row of the table at its latest version, in no particular order (none without a table).

        Between compactions the table only grows by appends, so only the files added since the last
        call are read; a planner asks several questions of the same version per micro-batch."""
        version = self.version()
        if version is None:
            self._files, self._rows, self._rows_version = {}, STATE_SCHEMA.empty_table(), -1
            return self._rows
        if version != self._rows_version:
            files = {}
            paths = self._view.live_paths if self._view is not None else store.live_paths(self._handle())
            for path in paths:
                known = self._files.get(path)
                if known is None:
                    known = store.cast_to(store.read_data_file(self.location, path), STATE_SCHEMA)
                files[path] = known
            if not self._files.keys() <= files.keys() and not self._compacted_since(self._rows_version, version):
                self.rewrites += 1
            self._files = files
            self._rows = (
                pa.concat_tables(list(files.values())).combine_chunks() if files else STATE_SCHEMA.empty_table()
            )
            self._rows_version = version
        return self._rows

    def _compacted_since(self, seen: int, version: int) -> bool:
        """Whether every rewrite after version ``seen`` up to ``version`` was a compaction, which
        changes how the rows say things but not what they say."""
        if seen < 0 or version - seen > _COMPACTIONS_READ:
            return False
        try:
            operations = store.commit_operations(self.location, seen + 1, version)
        except store.LogEntryGone:
            return False
        return DELETE_OPERATION not in operations

    def derived(self, key: tuple, compute: Callable[[], _Derived]) -> _Derived:
        """``compute()``, kept until the rows change: for questions a step asks more than once."""
        self.rows()
        seen = (self._rows_version, self.rewrites)
        if seen != self._derived_from:
            self._derived, self._derived_from = {}, seen
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]

    def append(self, rows: pa.Table, check: Callable[[int], None]) -> int | None:
        """Append ``rows`` (in the table's schema) in one commit at exactly the version that
        ``check(attempt)`` passed on (it raises to refuse; attempt 0 checks the look it is given,
        a later one a new look); the version it landed at, None when there was nothing to commit."""
        # One batch: each batch a Parquet writer takes costs about a millisecond on its own.
        file = store.write_data_file(self.location, rows.combine_chunks().to_batches(), STATE_SCHEMA)
        if file is None:
            return None
        # Named in the commit, so that a shared get's plan can be found landed (mqspark.engine.shared_gets).
        consumed = rows.filter(pc.equal(rows["event"], EventKind.CONSUMED))["plan_id"]
        metadata = {CONSUMED_KEY: pc.unique(consumed).to_pylist()} if len(consumed) else None

        def prepare(attempt: int) -> Callable[[], int]:
            if attempt:
                self._current = False
            # The checks and the commit see one version: a look in between would move the table on.
            with self.pinned():
                self.created()
                check(attempt)
                view, version = self._view, self._seen
            if view is not None and version is not None:
                interval = view.checkpoint_interval
                return lambda: store.append_files(
                    self.location, version + 1, [file], metadata=metadata, checkpoint_interval=interval
                )
            table = self._handle()
            return lambda: store.commit_files(table, [file], STATE_SCHEMA, metadata=metadata)

        version = store.commit_until_landed(
            self.location,
            [file],
            prepare,
            ATTEMPTS,
            f"queue {self.queue}: state commit gave up after {ATTEMPTS} conflicts",
        )
        self._current = False
        # The file holds exactly these rows: the next look need not read it back.
        self._files[file.path] = store.cast_to(rows, STATE_SCHEMA)
        return version

    def _handle(self) -> DeltaTable:
        """The delta-rs handle at the look's version, when there is no view (it is moved on by it)."""
        assert self._table is not None
        return self._table

    def overwrite(self, table: DeltaTable, rows: pa.Table, operation: str) -> bool:
        """Replace the table's rows in one commit (recorded as ``operation``) at exactly the version
        after ``table``'s; False when a concurrent commit got in first."""
        file = store.write_data_file(self.location, store.cast_to(rows, STATE_SCHEMA).to_batches(), STATE_SCHEMA)
        self._current = False
        try:
            store.commit_files(
                table,
                [file] if file is not None else [],
                STATE_SCHEMA,
                metadata={"mqspark.operation": operation},
                overwrite=True,
            )
        except CommitFailedError:
            if file is not None:
                store.remove_data_files(self.location, [file])
            return False
        return True
