"""Appends to a queue's state table (:class:`StateWriter`): rows commit at exactly the version their
check passed on, and a commit that lost to a concurrent one is tried again. Lease and release
records are stamped in the order they commit, so a group's newest lease record by time is the last
committed. After a commit the table is compacted when due (:mod:`mqspark.engine.state_compaction`).
A commit whose decision no longer holds raises :class:`Stale`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.engine.state_compaction import Compaction
from mqspark.engine.state_rows import LEASE_EVENTS, STATE_SCHEMA
from mqspark.engine.state_table import ATTEMPTS, StateTable
from mqspark.errors import MQError, Reason
from mqspark.model.messages import TIMESTAMP


class Stale(MQError):
    """What a commit was decided on changed before it landed: decide again on a fresh look."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, Reason.MQRC_BACKED_OUT)


class _OutOfOrder(MQError):
    """A lease record would commit with a time older than one committed since it was stamped."""


class StateWriter:
    """The appends of one state table handle, and the compaction that follows them."""

    def __init__(self, table: StateTable, compaction: Compaction) -> None:
        self._table = table
        self._compaction = compaction

    def append(self, rows: pa.Table, check: Callable[[], None] | None = None) -> None:
        """Append rows; concurrent appends of other processes are fine, so conflicts just retry. With
        ``check``, only once it passes (it raises to refuse), at exactly the version it checked."""
        self.commit(store.cast_to(rows, STATE_SCHEMA), check)

    def commit(self, rows: pa.Table, check: Callable[[], None] | None) -> None:
        """Append ``rows`` (in the table's schema) once ``check`` passes, at exactly the version it was
        checked against. Lease and release records are stamped later than every such record of their
        groups in the table, so the newest by time is the last committed (see :meth:`_stamped`)."""
        for _ in range(ATTEMPTS):
            try:
                # One look for the stamp and the first check: were it stale, the commit at the version
                # after it fails, and the next attempt looks again.
                with self._table.pinned():
                    self._commit_stamped(rows, check)
                return
            except _OutOfOrder:
                continue
        raise MQError(
            f"queue {self._table.queue}: state commit gave up after {ATTEMPTS} conflicts", Reason.MQRC_BACKED_OUT
        )

    def _commit_stamped(self, rows: pa.Table, check: Callable[[], None] | None) -> None:
        self._table.created()
        rows, stamp = self._stamped(rows)
        consumers = pc.unique(rows["consumer"])

        def checked(attempt: int) -> None:
            if check is not None:
                check()
            # The first attempt checks the look the stamp was taken from; a later one looks anew.
            if attempt and stamp is not None and self._newest_lease_record(consumers) >= stamp:
                # A lease record committed after this one was stamped: stamp it again.
                raise _OutOfOrder(f"queue {self._table.queue}: a lease record was stamped out of order")

        self._compaction.after_commit(self._table.append(rows, checked))

    def _stamped(self, rows: pa.Table) -> tuple[pa.Table, datetime | None]:
        """``rows`` with their lease and release records stamped now, or just after the newest such
        record of their groups when that is later (another process's clock may run ahead), and the
        stamp; (rows, None) when they hold none.

        A group's holder is its newest lease record by time, but a record is stamped before it
        commits: a lease taken with a stamp older than a release committed meanwhile would look
        released, and a second reader would take the group too."""
        leases = pc.is_in(rows["event"], pa.array(LEASE_EVENTS))
        if not pc.any(leases).as_py():
            return rows, None
        newest = self._newest_lease_record(pc.unique(rows["consumer"]))
        stamp = max(self._table.clock.now(), newest + timedelta(microseconds=1))
        at = pc.if_else(leases, pa.scalar(stamp, TIMESTAMP), rows["at"])
        index = STATE_SCHEMA.get_field_index("at")
        return rows.set_column(index, STATE_SCHEMA.field(index), at), stamp

    def _newest_lease_record(self, consumers: pa.Array) -> datetime:
        """The time of the newest lease or release record of any of ``consumers`` (the epoch: none)."""
        rows = self._table.rows()
        mine = pc.and_(pc.is_in(rows["consumer"], consumers), pc.is_in(rows["event"], pa.array(LEASE_EVENTS)))
        return pc.max(rows["at"].filter(mine)).as_py() or datetime.fromtimestamp(0, UTC)
