"""Consumer groups: the state table of a queue, where plans, consumption and leases are recorded.

This module owns a group's life on the queue (declared before it first reads, deleted with what it
recorded) and :class:`ConsumerState`, the one handle callers hold on a queue's state table. The
handle composes the parts, each of which owns one role, and delegates to them:

- :mod:`mqspark.engine.state_rows`: the rows, by event (what each records), and how they are built;
- :mod:`mqspark.engine.state_table`: the table, its rows read incrementally, pinned looks, the
  answers derived from its rows, its raw commits;
- :mod:`mqspark.engine.state_reads`: what the rows say of the groups (positions, plans, claims,
  moves, what each consumed);
- :mod:`mqspark.engine.state_commit`: appends, retried on conflict, lease records in commit order;
- :mod:`mqspark.engine.leases`: taking, renewing and releasing a group's lease;
- :mod:`mqspark.engine.state_compaction`: the compact form the table is rewritten to, so its size
  follows the backlog in flight, not the history.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from mqspark import store
from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.engine.leases import Lease, Leases
from mqspark.engine.state_commit import StateWriter
from mqspark.engine.state_compaction import Compaction
from mqspark.engine.state_reads import Claims, GroupsSnapshot, StateReads
from mqspark.engine.state_rows import EventKind, event_rows
from mqspark.engine.state_table import ATTEMPTS, DELETE_OPERATION, StateTable
from mqspark.errors import MQError, Reason

_Derived = TypeVar("_Derived")


class ConsumerState:
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
        self._table = StateTable(root, queue, storage_options, location, clock)
        self._reads = StateReads(self._table)
        self._compaction = Compaction(self._table)
        self._writer = StateWriter(self._table, self._compaction)
        self._leases = Leases(self._reads, self._writer, queue, clock)

    @property
    def root(self) -> str:
        return self._table.root

    @property
    def queue(self) -> str:
        return self._table.queue

    @property
    def location(self) -> str:
        return self._table.location

    @property
    def storage_options(self) -> store.StorageOptions:
        return self._table.storage_options

    @property
    def clock(self) -> Clock:
        return self._table.clock

    @property
    def rewrites(self) -> int:
        """How many times rows seen before went (see :attr:`StateTable.rewrites`)."""
        return self._table.rewrites

    def reopened(self) -> ConsumerState:
        """The same state table with a handle of its own: a DeltaTable is not shared between threads."""
        return ConsumerState(self.root, self.queue, self.storage_options, self.location, self.clock)

    # The table (:class:`StateTable`)

    def table(self) -> DeltaTable | None:
        return self._table.table()

    def version(self) -> int | None:
        return self._table.version()

    def pinned(self) -> AbstractContextManager[None]:
        return self._table.pinned()

    def created(self) -> None:
        self._table.created()

    def rows(self) -> pa.Table:
        return self._table.rows()

    def derived(self, key: tuple, compute: Callable[[], _Derived]) -> _Derived:
        return self._table.derived(key, compute)

    # What the rows say (:class:`StateReads`)

    def events(
        self,
        consumer: str,
        events: tuple[EventKind, ...] | None = None,
        columns: list[str] | None = None,
        plan_id: str | None = None,
        since: datetime | None = None,
    ) -> pa.Table:
        return self._reads.events(consumer, events, columns, plan_id, since)

    def groups(self) -> list[str]:
        return self._reads.groups()

    def idle_groups(self, expiry: timedelta, now: datetime) -> dict[str, datetime]:
        return self._reads.idle_groups(expiry, now)

    def consumed_plans(self, consumer: str) -> pa.Array:
        return self._reads.consumed_plans(consumer)

    def consumed_ranges(self, consumer: str) -> pa.Table:
        return self._reads.consumed_ranges(consumer)

    def all_groups(self) -> GroupsSnapshot:
        return self._reads.all_groups()

    def plan(self, consumer: str, plan_id: str) -> pa.Table:
        return self._reads.plan(consumer, plan_id)

    def last_position(self, consumer: str) -> tuple[int, int]:
        return self._reads.last_position(consumer)

    def consumed_position(self, consumer: str) -> tuple[int, int]:
        return self._reads.consumed_position(consumer)

    def current_plan(self, consumer: str) -> tuple[str | None, str, pa.Table | None]:
        return self._reads.current_plan(consumer)

    def claims(self, consumer: str, lock: timedelta, now: datetime | None = None) -> Claims:
        return self._reads.claims(consumer, lock, now)

    def pending_moves(self, consumer: str) -> pa.Table:
        return self._reads.pending_moves(consumer)

    # Commits (:class:`StateWriter`, :class:`Compaction`)

    def append(self, rows: pa.Table, check: Callable[[], None] | None = None) -> None:
        self._writer.append(rows, check)

    def compact(self, live: pa.Array | None = None, seen_version: int = -1) -> bool:
        return self._compaction.compact(live, seen_version)

    # Leases (:class:`Leases`)

    def lease(self, consumer: str, timeout: timedelta | None, now: datetime | None = None) -> Lease | None:
        return self._leases.lease(consumer, timeout, now)

    def acquire(
        self,
        consumer: str,
        owner: str,
        timeout: timedelta,
        patience: timedelta = timedelta(0),
        lock: timedelta | None = None,
    ) -> None:
        self._leases.acquire(consumer, owner, timeout, patience, lock)

    def renew(self, consumer: str, owner: str, timeout: timedelta) -> None:
        self._leases.renew(consumer, owner, timeout)

    def release(self, consumer: str, owner: str) -> None:
        self._leases.release(consumer, owner)

    # A group's life

    def declare(self, consumer: str) -> None:
        """Make ``consumer`` a counted group of the queue before it first reads: the messages put from
        now on wait for it. A group that exists already is left as it is."""
        if consumer not in self.groups():
            self.append(event_rows(consumer, "", EventKind.DECLARE))

    def delete(self, consumer: str, timeout: timedelta) -> None:
        """Remove the group and everything recorded for it, which releases its messages. Refused
        (2042) while a query of the group holds its lease, and (2085) for a group that does not exist."""
        for _ in range(ATTEMPTS):
            table = self._table.table()
            # Without a table there are no groups (one created after this look was not there to delete).
            if table is None or consumer not in self.groups():
                raise MQError(
                    f"queue {self.queue}: consumer group {consumer!r} does not exist", Reason.MQRC_UNKNOWN_OBJECT_NAME
                )
            holder = self.lease(consumer, timeout)
            if holder is not None:
                raise MQError(
                    f"queue {self.queue}: consumer group {consumer!r} is being read by a running query; stop it first",
                    Reason.MQRC_OBJECT_IN_USE,
                )
            rows = self._table.rows()
            if self._table.overwrite(table, rows.filter(pc.not_equal(rows["consumer"], consumer)), DELETE_OPERATION):
                return
        raise MQError(f"queue {self.queue}: deleting consumer group {consumer!r} gave up", Reason.MQRC_BACKED_OUT)
