"""Leases of a consumer group (spec section 4): one reader at a time per group, renewed while it
reads. The lease records live in the group's state table (see ``ConsumerState.acquire``, ``renew``,
``release``); this module holds the lease record and its owners (:mod:`mqspark.engine.heartbeat`
renews a lease in the background).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from mqspark.errors import MQError, Reason

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
