"""Leases of a consumer group (spec section 4): one reader at a time per group, renewed while it
reads. This module owns the lease and its owners, and taking, renewing and releasing it
(:class:`Leases`): the lease records (``lease`` and ``release`` events) live in the group's state
table, and a check and its record commit at exactly the same version. :mod:`mqspark.engine.heartbeat`
renews a lease in the background.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pyarrow.compute as pc

from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.engine.state_commit import StateWriter
from mqspark.engine.state_reads import StateReads
from mqspark.engine.state_rows import GET_OWNER, LEASE_EVENTS, EventKind, event_rows, lease_rows
from mqspark.errors import MQError, Reason

# How long a consumer group's lease lives without renewal, unless the query sets ``leaseTimeout``.
DEFAULT_LEASE_TIMEOUT = timedelta(seconds=30)
# The lease maintenance runs under is kept like a consumer group's, under this name, in a table of its
# own (``store.maintenance_location``). It is not a valid group name, so it never passes for one.
MAINTENANCE = "*maintenance"
# How often a reader waiting for a Python get's lease looks again.
LEASE_POLL = 0.05
# Long enough that a lease record never expires: whether it is the newest is what counts.
_FOREVER = timedelta(days=3650)


class HeldByGet(MQError):
    """Python gets hold claimed messages of the group: they end in a moment (or their lock passes),
    so a query starting waits rather than fails."""

    def __init__(self, holder: Lease) -> None:
        super().__init__(f"held by the Python get {holder.owner}", Reason.MQRC_OBJECT_IN_USE)
        self.holder = holder


@dataclass(frozen=True)
class Lease:
    """Who reads for a consumer group, and when that query was last seen alive."""

    owner: str
    seen: datetime


class _NotHeld(MQError):
    """A release of a lease its owner no longer holds."""


class Leases:
    """The leases of the consumer groups of one queue, recorded in its state table: read with
    ``reads``, committed with ``writer``."""

    def __init__(self, reads: StateReads, writer: StateWriter, queue: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self._reads = reads
        self._writer = writer
        self.queue = queue
        self._clock = clock

    def lease(self, consumer: str, timeout: timedelta | None, now: datetime | None = None) -> Lease | None:
        """The live lease of the group: the owner of the newest lease record, unless that record is
        a release or older than ``timeout`` (leases are renewed by new records, see :class:`Heartbeat`).
        ``timeout`` None: the timeout the holder recorded (:data:`DEFAULT_LEASE_TIMEOUT` if none)."""
        rows = self._reads.events(consumer, LEASE_EVENTS, ["owner", "event", "at", "count"])
        if rows.num_rows == 0:
            return None
        latest = rows.take(pc.sort_indices(rows, [("at", "descending")]))
        owner, event, seen, recorded = (latest[name][0].as_py() for name in ("owner", "event", "at", "count"))
        if timeout is None:
            timeout = timedelta(milliseconds=recorded) if recorded is not None else DEFAULT_LEASE_TIMEOUT
        if event == EventKind.RELEASE or seen < (now or self._clock.now()) - timeout:
            return None
        return Lease(owner, seen)

    def acquire(
        self,
        consumer: str,
        owner: str,
        timeout: timedelta,
        patience: timedelta = timedelta(0),
        lock: timedelta | None = None,
    ) -> None:
        """Take the group's lease for ``owner``, refused (2042) while another live reader holds it.
        With ``lock`` (the queue's lock duration), also while Python gets' claims are locked (see
        :meth:`StateReads.claims`): their end is awaited for up to ``patience``.

        The check and the lease record commit at exactly the next version, so of two readers
        starting at once only one gets the lease.
        """
        deadline = self._clock.monotonic() + patience.total_seconds()

        def check() -> None:
            holder = self.lease(consumer, timeout)
            if holder is None and lock is not None:
                live = self._reads.claims(consumer, lock).live
                if live.num_rows:
                    holder = Lease(live["owner"][0].as_py(), live["expiry"][0].as_py() - lock)
            if holder is not None and holder.owner != owner:
                if holder.owner.startswith(GET_OWNER):
                    raise HeldByGet(holder)
                age = (self._clock.now() - holder.seen).total_seconds()
                raise MQError(
                    f"queue {self.queue}: consumer group {consumer!r} is already being read by a running query "
                    f"(last seen {age:.1f} s ago); stop it, wait {timeout.total_seconds():g} s after it died, "
                    "or read with another consumer",
                    Reason.MQRC_OBJECT_IN_USE,
                )

        while True:
            try:
                self._writer.commit(lease_rows(consumer, owner, timeout), check)
                return
            except HeldByGet as held:
                if self._clock.monotonic() >= deadline:
                    raise MQError(
                        f"queue {self.queue}: consumer group {consumer!r} has messages claimed by a Python get "
                        f"(owner {held.holder.owner}) for longer than {patience.total_seconds():g} s",
                        Reason.MQRC_OBJECT_IN_USE,
                    ) from None
                self._clock.sleep(LEASE_POLL)

    def renew(self, consumer: str, owner: str, timeout: timedelta) -> None:
        """Renew ``owner``'s lease of the group; refused (2042) once another owner holds it. The check
        and the renewal commit at exactly the next version, so a reader that was paused past its
        timeout cannot renew over a reader that took the group over meanwhile, nor renew a lease it
        released (its heartbeat may be late)."""

        def check() -> None:
            holder = self.lease(consumer, _FOREVER)
            if holder is None or holder.owner != owner:
                taken = f"was taken over by {holder.owner}" if holder is not None else f"was released by {owner}"
                raise MQError(f"queue {self.queue}: consumer group {consumer!r} {taken}", Reason.MQRC_OBJECT_IN_USE)

        self._writer.commit(lease_rows(consumer, owner, timeout), check)

    def release(self, consumer: str, owner: str) -> None:
        """Release ``owner``'s lease of the group; nothing when another owner holds it (the check and
        the release commit at exactly the next version)."""

        def check() -> None:
            holder = self.lease(consumer, _FOREVER)
            if holder is None or holder.owner != owner:
                raise _NotHeld(f"queue {self.queue}: consumer group {consumer!r} is not held by {owner}")

        holder = self.lease(consumer, _FOREVER)
        if holder is not None and holder.owner == owner:
            try:
                self._writer.commit(event_rows(consumer, owner, EventKind.RELEASE), check)
            except _NotHeld:
                pass
