"""Consumer groups: the state table of a queue, where plans, consumption and leases are recorded.

``<root>/state/<queue>`` is an append-only Delta table. Rows, by ``event``:

- ``plan``: one row per message of a planned micro-batch: where it lies (``file``, ``row``: a
  message's identity in the append-only table) and its ``delivery_seq``, null for an expired
  message the batch discards. Recorded before the batch runs, so a replay after a crash delivers
  the same messages.
- ``consumed``: the plan ``plan_id`` has been processed; its messages are gone for the group.
- ``lease`` / ``release``: the query (``owner``) reading for the group, renewed while it runs.

A consumer group's depth is the queue's committed messages minus those of its consumed plans.
Plans never consumed are rolled back: their messages are delivered again. Nothing is ever deleted
from the message table.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from . import storage
from .errors import MQError, Reason
from .messages import TIMESTAMP

STATE_SCHEMA = pa.schema(
    [
        pa.field("consumer", pa.string(), nullable=False),
        pa.field("owner", pa.string(), nullable=False),
        pa.field("event", pa.string(), nullable=False),
        pa.field("plan_id", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field("file", pa.string()),
        pa.field("row", pa.int64()),
        pa.field("delivery_seq", pa.int64()),
        pa.field("partition", pa.int32()),
        pa.field("at", TIMESTAMP, nullable=False),
    ]
)
KEY_COLUMNS = ["file", "row"]
_ATTEMPTS = 100


@dataclass(frozen=True)
class Lease:
    """Who reads for a consumer group, and when that query was last seen alive."""

    owner: str
    seen: datetime


class ConsumerState:
    """The state table of one queue. Open it with the queue manager root and the (local) queue name."""

    def __init__(self, root: str, queue: str, storage_options: storage.StorageOptions = None) -> None:
        self.queue = queue
        self.location = storage.state_location(root, queue)
        self.storage_options = storage_options

    def table(self) -> DeltaTable | None:
        return storage.open_table(self.location, self.storage_options)

    def _table_or_create(self) -> DeltaTable:
        table = self.table()
        if table is not None:
            return table
        try:
            return storage.create_table(self.location, STATE_SCHEMA, self.storage_options)
        except Exception:
            # Another consumer created it first.
            table = self.table()
            if table is None:
                raise
            return table

    def events(
        self,
        consumer: str,
        events: tuple[str, ...] | None = None,
        columns: list[str] | None = None,
        plan_id: str | None = None,
    ) -> pa.Table:
        """The group's recorded rows (of the given ``events``, of one plan), in no particular order."""
        table = self.table()
        if table is None:
            return STATE_SCHEMA.empty_table().select(columns or STATE_SCHEMA.names)
        condition = pc.field("consumer") == consumer
        if events is not None:
            condition &= pc.field("event").isin(list(events))
        if plan_id is not None:
            condition &= pc.field("plan_id") == plan_id
        return table.to_pyarrow_dataset().to_table(columns=columns, filter=condition)

    def consumed_plans(self, consumer: str) -> pa.Array:
        ids = self.events(consumer, ("consumed",), ["plan_id"])["plan_id"]
        return pc.unique(ids.combine_chunks() if ids.num_chunks else pa.array([], pa.string()))

    def consumed_keys(self, consumer: str) -> pa.Table:
        """The ``file`` and ``row`` of every message the group has consumed or discarded (once each)."""
        plans = self.events(consumer, ("plan",), ["plan_id", *KEY_COLUMNS])
        consumed = plans.filter(pc.is_in(plans["plan_id"], self.consumed_plans(consumer)))
        return consumed.select(KEY_COLUMNS).group_by(KEY_COLUMNS, use_threads=False).aggregate([])

    def plan(self, consumer: str, plan_id: str) -> pa.Table:
        """The rows of one recorded plan (a duplicate recording of the same plan counts once)."""
        rows = self.events(consumer, ("plan",), plan_id=plan_id)
        return (
            rows.select([*KEY_COLUMNS, "delivery_seq", "partition"])
            .group_by(KEY_COLUMNS, use_threads=False)
            .aggregate([("delivery_seq", "first"), ("partition", "first")])
            .rename_columns([*KEY_COLUMNS, "delivery_seq", "partition"])
        )

    def last_position(self, consumer: str) -> tuple[int, int]:
        """The group's last plan sequence number and the next ``delivery_seq`` (0, 0 for a new group)."""
        plans = self.events(consumer, ("plan",), ["seq", "delivery_seq"])
        seq = pc.max(plans["seq"]).as_py()
        delivered = pc.max(plans["delivery_seq"]).as_py()
        return (seq or 0, 0 if delivered is None else delivered + 1)

    def append(self, rows: pa.Table) -> None:
        """Append rows; concurrent appends of other processes are fine, so conflicts just retry."""
        self._commit(rows.cast(STATE_SCHEMA), check=None)

    def _commit(self, rows: pa.Table, check: Callable[[], None] | None) -> None:
        self._table_or_create()
        file = storage.write_data_file(self.location, rows.to_batches(), STATE_SCHEMA)
        if file is None:
            return

        def prepare(attempt: int) -> Callable[[], int]:
            table = self._table_or_create()
            if check is not None:
                check()
            return lambda: storage.commit_files(table, [file], STATE_SCHEMA)

        storage.commit_until_landed(
            self.location,
            [file],
            prepare,
            _ATTEMPTS,
            f"queue {self.queue}: state commit gave up after {_ATTEMPTS} conflicts",
        )

    def record_consumed(self, consumer: str, owner: str, plan_id: str, seq: int) -> None:
        self.append(_event_rows(consumer, owner, "consumed", plan_id=plan_id, seq=seq))

    def lease(self, consumer: str, timeout: timedelta, now: datetime | None = None) -> Lease | None:
        """The live lease of the group: the owner of the newest lease record, unless that record is
        a release or older than ``timeout`` (leases are renewed by new records, see :class:`Heartbeat`)."""
        rows = self.events(consumer, ("lease", "release"), ["owner", "event", "at"])
        if rows.num_rows == 0:
            return None
        latest = rows.take(pc.sort_indices(rows, [("at", "descending")]))
        owner, event, seen = (latest[name][0].as_py() for name in ("owner", "event", "at"))
        if event == "release" or seen < (now or datetime.now(UTC)) - timeout:
            return None
        return Lease(owner, seen)

    def acquire(self, consumer: str, owner: str, timeout: timedelta) -> None:
        """Take the group's lease for ``owner``, refused (2042) while another live query holds it.

        The check and the lease record commit at exactly the next version, so of two queries
        starting at once only one gets the lease.
        """

        def check() -> None:
            holder = self.lease(consumer, timeout)
            if holder is not None and holder.owner != owner:
                age = (datetime.now(UTC) - holder.seen).total_seconds()
                raise MQError(
                    f"queue {self.queue}: consumer group {consumer!r} is already being read by a running query "
                    f"(last seen {age:.1f} s ago); stop it, wait {timeout.total_seconds():g} s after it died, "
                    "or read with another consumer",
                    Reason.MQRC_OBJECT_IN_USE,
                )

        self._commit(_event_rows(consumer, owner, "lease"), check)

    def release(self, consumer: str, owner: str) -> None:
        holder = self.lease(consumer, timedelta(days=3650))
        if holder is not None and holder.owner == owner:
            self.append(_event_rows(consumer, owner, "release"))


def _event_rows(consumer: str, owner: str, event: str, plan_id: str | None = None, seq: int | None = None) -> pa.Table:
    given = {
        "consumer": [consumer],
        "owner": [owner],
        "event": [event],
        "plan_id": [plan_id],
        "seq": [seq],
        "at": [datetime.now(UTC)],
    }
    return pa.table({f.name: pa.array(given.get(f.name, [None]), f.type) for f in STATE_SCHEMA}, schema=STATE_SCHEMA)


class Heartbeat:
    """Renews a lease in the background while the query's planner process lives.

    The planner process is killed when the query ends (``stop()`` is never called), which ends the
    renewals; the lease then lapses after its timeout unless the query's end was seen and released.
    """

    def __init__(self, state: ConsumerState, consumer: str, owner: str, timeout: timedelta) -> None:
        self.state, self.consumer, self.owner, self.timeout = state, consumer, owner, timeout
        self.lost: MQError | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mqspark-lease-{consumer}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        interval = self.timeout.total_seconds() / 3
        while not self._stopped.wait(interval):
            if self.state.table() is None:
                return  # the queue was deleted
            holder = self.state.lease(self.consumer, self.timeout * 1000)
            if holder is not None and holder.owner != self.owner:
                self.lost = MQError(
                    f"queue {self.state.queue}: consumer group {self.consumer!r} was taken over by another query",
                    Reason.MQRC_OBJECT_IN_USE,
                )
                return
            self.state.append(_event_rows(self.consumer, self.owner, "lease"))
