"""Leases of a consumer group (spec section 4): one reader at a time per group, renewed while it
reads. The lease records live in the group's state table (see ``ConsumerState.acquire``, ``renew``,
``release``); this module holds the lease record, its owners and the background heartbeat.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from mqspark import store
from mqspark.errors import MQError, Reason

if TYPE_CHECKING:
    from mqspark.engine.consumer_groups import ConsumerState

# How long a consumer group's lease lives without renewal, unless the query sets ``leaseTimeout``.
DEFAULT_LEASE_TIMEOUT = timedelta(seconds=30)
# The lease maintenance runs under is kept like a consumer group's, under this name, in a table of its
# own (``store.maintenance_location``). It is not a valid group name, so it never passes for one.
MAINTENANCE = "*maintenance"
# Owners of the Python get (:mod:`mqspark.engine.get`) are named with this prefix: their plans are
# claims on messages, and they take no lease.
GET_OWNER = "get:"
# How often a reader waiting for a Python get's lease looks again.
LEASE_POLL = 0.05


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


class Heartbeat:
    """Renews a lease in the background while the query's planner process lives.

    The planner process is killed when the query ends (``stop()`` is never called), which ends the
    renewals; the lease then lapses after its timeout unless the query's end was seen and released.
    """

    def __init__(
        self,
        state: ConsumerState,
        consumer: str,
        owner: str,
        timeout: timedelta,
        renew: Callable[[ConsumerState], None] | None = None,
    ) -> None:
        """``renew(state)`` renews what is held (default: the group's lease) on the heartbeat's own
        handle of the state table, every third of ``timeout``."""
        # Its own handle on the table: a DeltaTable is not shared between threads.
        self.state = state.reopened()
        self.consumer, self.owner, self.timeout = consumer, owner, timeout
        self._renew = renew or (lambda state: state.renew(consumer, owner, timeout))
        self.lost: MQError | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mqspark-lease-{consumer}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the renewals. One still in flight is refused once the lease is released (a renewal
        needs its owner to hold the lease), so this does not wait for it: the store may be out of reach."""
        self._stopped.set()

    def _run(self) -> None:
        interval = self.timeout.total_seconds() / 3
        while not self._stopped.wait(interval):
            try:
                if self.state.table() is None:
                    if store.reachable(self.state.root, self.state.storage_options):
                        return  # the queue was deleted
                    continue
                self._renew(self.state)
            except MQError as error:
                self.lost = error
                return
            except Exception as error:
                if not store.broken(error, self.state.root, self.state.storage_options):
                    raise
                # Out of reach: renewals go on once it is back (see :mod:`mqspark.reconnect`).
                continue
