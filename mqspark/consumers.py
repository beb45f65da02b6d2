"""Consumer groups: the state table of a queue, where plans, consumption and leases are recorded.

``<root>/state/<queue>`` is a small Delta table. Rows, by ``event``:

- ``plan``: the messages of a planned micro-batch as ranges: ``count`` rows of data file ``file``
  from row ``row`` on (a message's identity in the append-only queue table), delivered as
  ``delivery_seq``, ``delivery_seq`` + 1, ... (null: expired messages the batch discards).
  Recorded before the batch runs, so a replay after a crash delivers the same messages.
- ``consumed``: the plan ``plan_id`` has been processed; its messages are gone for the group.
- ``checkpoint``: what compaction folded the group's consumed plans into: ranges of consumed
  messages, with the group's position (``seq``, next ``delivery_seq``) on every row.
- ``lease`` / ``release``: the query (``owner``) reading for the group, renewed while it runs.

A consumer group's depth is the queue's committed messages minus its checkpoint and its consumed
plans. Plans never consumed are rolled back: their messages are delivered again. Nothing is ever
deleted from the message table. Every :data:`COMPACT_EVERY` versions the table is rewritten to
that compact form, so its size follows the backlog in flight, not the history.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError

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
        pa.field("count", pa.int64()),
        pa.field("delivery_seq", pa.int64()),
        pa.field("partition", pa.int32()),
        pa.field("at", TIMESTAMP, nullable=False),
    ]
)
RANGE_COLUMNS = ["file", "row", "count"]
KEY_COLUMNS = ["file", "row"]
# Compaction runs when the table has grown this many versions since the last one.
COMPACT_EVERY = 100
# Old log entries and removed files are kept this long for readers still on an older version.
_RETENTION = {
    "delta.logRetentionDuration": "interval 1 hours",
    "delta.deletedFileRetentionDuration": "interval 1 hours",
}
_ATTEMPTS = 100


@dataclass(frozen=True)
class Lease:
    """Who reads for a consumer group, and when that query was last seen alive."""

    owner: str
    seen: datetime


class ConsumerState:
    """The state table of one queue. Open it with the queue manager root and the (local) queue name.

    The table is opened once and brought up to date incrementally: one instance per thread.
    """

    def __init__(self, root: str, queue: str, storage_options: storage.StorageOptions = None) -> None:
        self.root = root
        self.queue = queue
        self.location = storage.state_location(root, queue)
        self.storage_options = storage_options
        self._table: DeltaTable | None = None

    def table(self) -> DeltaTable | None:
        """The table at its latest version, None when there is none (yet, or any more)."""
        if self._table is not None:
            try:
                self._table.update_incremental()
                return self._table
            except Exception:
                self._table = None  # deleted with its queue, or recreated
        self._table = storage.open_table(self.location, self.storage_options)
        return self._table

    def _table_or_create(self) -> DeltaTable:
        table = self.table()
        if table is not None:
            return table
        try:
            storage.create_table(self.location, STATE_SCHEMA, self.storage_options, configuration=_RETENTION)
        except Exception:
            # Another consumer created it first.
            if self.table() is None:
                raise
        return self.table()

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

    def groups(self) -> list[str]:
        """The consumer groups with records in the table, by name."""
        table = self.table()
        if table is None:
            return []
        return sorted(pc.unique(table.to_pyarrow_dataset().to_table(columns=["consumer"])["consumer"]).to_pylist())

    def consumed_plans(self, consumer: str) -> pa.Array:
        ids = self.events(consumer, ("consumed",), ["plan_id"])["plan_id"]
        return pc.unique(ids.combine_chunks() if ids.num_chunks else pa.array([], pa.string()))

    def consumed_ranges(self, consumer: str) -> pa.Table:
        """``file``, ``row`` and ``count`` of the messages the group has consumed or discarded."""
        rows = self.events(consumer, ("plan", "checkpoint"), ["event", "plan_id", *RANGE_COLUMNS])
        consumed = pc.or_(
            pc.equal(rows["event"], "checkpoint"), pc.is_in(rows["plan_id"], self.consumed_plans(consumer))
        )
        # A plan recorded twice (a retried append) counts once.
        return rows.filter(consumed).group_by(RANGE_COLUMNS, use_threads=False).aggregate([])

    def consumed_count(self, consumer: str) -> int:
        return int(pc.sum(self.consumed_ranges(consumer)["count"]).as_py() or 0)

    def plan(self, consumer: str, plan_id: str) -> pa.Table:
        """The ranges of one recorded plan (a duplicate recording of the same plan counts once)."""
        rows = self.events(consumer, ("plan",), plan_id=plan_id)
        return (
            rows.select([*RANGE_COLUMNS, "delivery_seq", "partition"])
            .group_by(KEY_COLUMNS, use_threads=False)
            .aggregate([("count", "first"), ("delivery_seq", "first"), ("partition", "first")])
            .rename_columns([*RANGE_COLUMNS, "delivery_seq", "partition"])
        )

    def last_position(self, consumer: str) -> tuple[int, int]:
        """The group's last plan sequence number and the next ``delivery_seq`` (0, 0 for a new group)."""
        rows = self.events(consumer, ("plan", "checkpoint"), ["event", "seq", "count", "delivery_seq"])
        plans = pc.equal(rows["event"], "plan")
        # A plan range delivers delivery_seq .. delivery_seq + count - 1; a checkpoint holds the next one.
        following = pc.if_else(plans, pc.add(rows["delivery_seq"], rows["count"]), rows["delivery_seq"])
        seq = pc.max(rows["seq"]).as_py()
        delivered = pc.max(following).as_py()
        return (seq or 0, delivered or 0)

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

        version = storage.commit_until_landed(
            self.location,
            [file],
            prepare,
            _ATTEMPTS,
            f"queue {self.queue}: state commit gave up after {_ATTEMPTS} conflicts",
        )
        if version is not None and version % COMPACT_EVERY == 0:
            self.compact()

    def compact(self) -> bool:
        """Rewrite the table in its compact form (see :func:`compact_rows`) in one commit at exactly the
        next version; False when a concurrent commit got in first (a later compaction does it).
        Files and log entries it replaces stay an hour for readers still on an older version."""
        table = self.table()
        if table is None:
            return False
        compacted = compact_rows(table.to_pyarrow_table(), datetime.now(UTC))
        file = storage.write_data_file(self.location, compacted.to_batches(), STATE_SCHEMA)
        try:
            table.create_write_transaction(
                [file.add_action()] if file is not None else [],
                mode="overwrite",
                schema=STATE_SCHEMA,
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except CommitFailedError:
            if file is not None:
                storage.remove_data_files(self.location, [file])
            return False
        table = self.table()
        table.create_checkpoint()
        table.cleanup_metadata()
        table.vacuum(retention_hours=1, dry_run=False, enforce_retention_duration=False)
        return True

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


def consumed_rows(consumer: str, owner: str, plan_id: str, seq: int) -> pa.Table:
    """The record that plan ``plan_id`` (number ``seq``) of the group has been processed."""
    return _event_rows(consumer, owner, "consumed", plan_id=plan_id, seq=seq)


def compact_rows(rows: pa.Table, now: datetime) -> pa.Table:
    """The compact form of a state table's rows, per consumer group: one checkpoint of merged
    ranges for everything consumed (and the group's position), the plans that may still run (those
    after the last consumed one), and the newest lease record. Rolled-back plans are dropped."""
    pieces = []
    for consumer in pc.unique(rows["consumer"]).to_pylist():
        mine = rows.filter(pc.equal(rows["consumer"], consumer))
        event = mine["event"]
        consumed = pc.unique(mine.filter(pc.equal(event, "consumed"))["plan_id"])
        plans = pc.equal(event, "plan")
        folded = mine.filter(pc.or_(pc.equal(event, "checkpoint"), pc.and_(plans, pc.is_in(mine["plan_id"], consumed))))
        position = pc.max(folded["seq"]).as_py()
        if folded.num_rows:
            following = pc.if_else(
                pc.equal(folded["event"], "plan"),
                pc.add(folded["delivery_seq"], folded["count"]),
                folded["delivery_seq"],
            )
            ranges = merge_ranges(folded.select(RANGE_COLUMNS))
            count = ranges.num_rows
            given = {
                "consumer": pa.repeat(consumer, count),
                "owner": pa.repeat("", count),
                "event": pa.repeat("checkpoint", count),
                "seq": pa.repeat(pa.scalar(position, pa.int64()), count),
                "delivery_seq": pa.repeat(pa.scalar(pc.max(following).as_py(), pa.int64()), count),
                "at": pa.repeat(pa.scalar(now, TIMESTAMP), count),
                **{name: ranges[name] for name in RANGE_COLUMNS},
            }
            pieces.append(pa.table({f.name: given.get(f.name, pa.nulls(count, f.type)) for f in STATE_SCHEMA}))
        waiting = pc.invert(pc.is_in(mine["plan_id"], consumed))
        if position is not None:
            waiting = pc.and_(waiting, pc.greater(mine["seq"], position))
        pieces.append(mine.filter(pc.and_(plans, waiting)))
        leases = mine.filter(pc.is_in(event, pa.array(["lease", "release"])))
        if leases.num_rows:
            pieces.append(leases.take(pc.sort_indices(leases, [("at", "descending")])[:1]))
    return pa.concat_tables([piece.cast(STATE_SCHEMA) for piece in pieces]) if pieces else STATE_SCHEMA.empty_table()


def merge_ranges(ranges: pa.Table) -> pa.Table:
    """``file``/``row``/``count`` ranges with duplicates dropped and adjacent ones joined, in file order."""
    ranges = ranges.group_by(RANGE_COLUMNS, use_threads=False).aggregate([])
    if ranges.num_rows == 0:
        return ranges.select(RANGE_COLUMNS)
    ranges = ranges.take(pc.sort_indices(ranges, [("file", "ascending"), ("row", "ascending")]))
    file = pc.dictionary_encode(ranges["file"]).combine_chunks().indices.to_numpy()
    row = ranges["row"].to_numpy()
    end = row + ranges["count"].to_numpy()
    starts = np.ones(len(row), dtype=bool)
    starts[1:] = (file[1:] != file[:-1]) | (row[1:] != end[:-1])
    first = np.flatnonzero(starts)
    last = np.append(first[1:], len(row)) - 1
    return pa.table(
        {
            "file": ranges["file"].take(pa.array(first)),
            "row": pa.array(row[first]),
            "count": pa.array(end[last] - row[first]),
        }
    )


def in_ranges(file: pa.ChunkedArray, row: pa.ChunkedArray, ranges: pa.Table) -> pa.Array:
    """Whether each ``file``/``row`` lies in one of the ``file``/``row``/``count`` ranges."""
    ranges = merge_ranges(ranges)
    if ranges.num_rows == 0:
        return pa.array(np.zeros(len(row), dtype=bool))
    paths = pa.array(pc.unique(ranges["file"]).to_pylist() if ranges.num_rows else [], pa.string())
    number = pc.fill_null(pc.index_in(file, value_set=paths), -1).to_numpy().astype(np.int64)
    key = number << 32 | row.to_numpy()
    first = pc.index_in(ranges["file"], value_set=paths).to_numpy().astype(np.int64) << 32 | ranges["row"].to_numpy()
    # merge_ranges sorts by file then row, and file numbers follow that order: ``first`` is sorted.
    at = np.searchsorted(first, key, side="right") - 1
    ends = first + ranges["count"].to_numpy()
    return pa.array((number >= 0) & (at >= 0) & (key < ends[np.maximum(at, 0)]))


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
        # Its own handle on the table: a DeltaTable is not shared between threads.
        self.state = ConsumerState(state.root, state.queue, state.storage_options)
        self.consumer, self.owner, self.timeout = consumer, owner, timeout
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
