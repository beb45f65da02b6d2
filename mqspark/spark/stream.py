"""The streaming get: ``spark.readStream.format("mq")``, destructive for its consumer group.

How a micro-batch goes (the planner methods run in one long-lived driver process per query run):

1. ``latestOffset(start, limit)``: the batch that ended at ``start`` has been processed, so its plan
   is recorded as consumed. New commits are read from the log into the group's pending messages,
   the ordering engine orders them, admission control takes a prefix (higher priorities first,
   never ending inside a logical message, or inside a group under ``allMessagesAvailable``), and
   the plan (which messages, in which order, judged at which moment) is recorded in the state table
   before the offset that names it is returned.
2. ``partitions(start, end)``: the recorded plan of ``end``, split into partitions at message (or
   group) boundaries. A replay after a crash finds the same plan, so it delivers the same messages.
3. ``read(partition)``: the executor reads the planned rows from their data files.

Every ``maintenanceInterval`` the planner also starts a maintenance run of the queue in the
background (see :mod:`mqspark.services.maintenance`); a run already going elsewhere is left to finish.

Failed deliveries (:mod:`mqspark.services.backout`): messages given back with ``mqspark.backout``
are left out when their plan is recorded consumed; a plan replayed by a new run counts a rolled-back
delivery for each of its messages. Planning moves the messages that failed too often, holds the
others back until their retry delay has passed, and delivered rows carry their ``backout_count``.

The last batch of a run is recorded as consumed by the listener :func:`mqspark.register` installs
(``latestOffset`` after it never comes), or by ``latestOffset`` when the query restarts.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from .. import storage
from ..consumers import STATE_SCHEMA, ConsumerState, Heartbeat, consumed_rows, expand_ranges, single_ranges
from ..errors import MQError, Reason
from ..messages import MESSAGE_SCHEMA, TIMESTAMP
from ..ordering import DeliveryOptions, deliver, join_segments, keep_rows
from ..pending import PendingMessages, lookup
from ..qmgr import BROWSE_SCHEMA, QueueManager
from ..services.backout import (
    GIVEN_UP,
    HELD_BEHIND,
    ISOLATE_FACTOR,
    ROLLED_BACK,
    BackoutPolicy,
    Mover,
    failure_rows,
    failures,
    plan_messages,
)
from ..services.maintenance import Maintenance
from .browse import batch_rows

OFFSET_KEYS = ("root", "queue", "consumer", "owner", "seq", "plan", "delivered", "version", "now")
# Planned messages are split into partitions of about this many payload bytes.
PARTITION_BYTES = 64 * 1024 * 1024
# A running get starts a maintenance run of its queue this often, unless option maintenanceInterval says.
DEFAULT_MAINTENANCE_INTERVAL = timedelta(minutes=5)


@dataclass(frozen=True)
class GetOptions:
    """A streaming get as the user asked for it, checked on the driver."""

    root: str
    queue: str
    consumer: str
    delivery: DeliveryOptions
    max_messages: int | None
    max_bytes: int | None
    lease_timeout: timedelta
    maintenance_interval: timedelta | None = DEFAULT_MAINTENANCE_INTERVAL


def offset(values: dict) -> dict:
    """An offset with its keys in one fixed order: Spark compares offsets as JSON strings."""
    return {key: values[key] for key in OFFSET_KEYS}


def is_offset(value: object) -> bool:
    return isinstance(value, dict) and tuple(value) == OFFSET_KEYS


@dataclass
class QueuePartition(InputPartition):
    """Planned messages for one task, as ranges of rows of data files, in delivery order."""

    location: str
    queue: str
    qmgr: str
    files: list[str]
    file: np.ndarray
    row: np.ndarray
    count: np.ndarray
    delivery_seq: np.ndarray
    complete_message: bool
    # The backout_count of the planned messages that have failed before, by delivery_seq.
    backout_seq: np.ndarray
    backout_count: np.ndarray
    value: int = 0

    def messages(self) -> pa.Table:
        # Each file is read once, only the row groups holding its planned rows.
        spans = {}
        for number in np.unique(self.file):
            mine = self.file == number
            first, stop = int(self.row[mine].min()), int((self.row[mine] + self.count[mine]).max())
            data = storage.read_data_rows(self.location, self.files[number], first, stop, MESSAGE_SCHEMA.names)
            spans[number] = (first, data.select(MESSAGE_SCHEMA.names).cast(MESSAGE_SCHEMA))
        pieces = []
        for number, row, count in zip(self.file, self.row, self.count, strict=True):
            first, data = spans[number]
            pieces.append(data.slice(int(row) - first, int(count)))
        table = pa.concat_tables(pieces)
        delivery_seq = np.repeat(self.delivery_seq - np.cumsum(self.count) + self.count, self.count)
        delivery_seq = delivery_seq + np.arange(len(delivery_seq))
        table = table.append_column("delivery_seq", pa.array(delivery_seq, pa.int64()))
        if len(self.backout_seq):
            found, at = lookup(self.backout_seq, delivery_seq)
            counts = np.where(found, self.backout_count[at], table["backout_count"].to_numpy())
            index = MESSAGE_SCHEMA.get_field_index("backout_count")
            table = table.set_column(index, MESSAGE_SCHEMA.field(index), pa.array(counts.astype(np.int32)))
        if self.complete_message:
            # The segments of one message share their delivery_seq; joined in offset order.
            table = join_segments(table.sort_by([("delivery_seq", "ascending"), ("offset", "ascending")]))
        rows = table.num_rows
        table = table.append_column("queue", pa.repeat(self.queue, rows)).append_column(
            "qmgr", pa.repeat(self.qmgr, rows)
        )
        return table.select(BROWSE_SCHEMA.names).cast(BROWSE_SCHEMA)


class _Group:
    """What the planner process knows of its consumer group while the query runs."""

    def __init__(self, options: GetOptions, owner: str) -> None:
        qm = QueueManager.open(options.root)
        definition = qm.resolve_for_get(options.queue)
        self.qm = qm
        self.queue = definition.name
        self.delivery_sequence = definition.delivery_sequence
        self.location = storage.queue_location(qm.root, self.queue)
        self.state = ConsumerState(qm.root, self.queue, qm.storage_options)
        self.owner = owner
        self.state.acquire(options.consumer, owner, options.lease_timeout)
        self.heartbeat = Heartbeat(self.state, options.consumer, owner, options.lease_timeout)
        self.pending: PendingMessages | None = None
        self.plans: dict[str, pa.Table] = {}
        # The planned messages of each plan in ``plans`` as pending-index keys.
        self.plan_keys: dict[str, np.ndarray] = {}
        # Where the delivered messages of each plan in ``plans`` lay when it was made (see
        # :func:`file_runs`), with the index and its count of moves then.
        self.plan_files: dict[str, tuple[PendingMessages, int, dict[str, np.ndarray]]] = {}
        self.consumed_plans: set[str] = set()
        # Consumption records waiting to go with the next plan's commit: one state commit per batch.
        self.unrecorded: list[pa.Table] = []
        self.exhausted = False
        self.next_due: datetime | None = None
        self.maintenance = Maintenance(qm, self.queue)
        self.mover = Mover(qm, BackoutPolicy.of(qm, definition), self.state, options.consumer, owner)
        # Plans of earlier runs this run has replayed (each counted as one rolled-back delivery), and
        # whether each was given up.
        self.replayed: dict[str, bool] = {}


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming get of one consumer group. Pickled to executors right after construction, so
    everything heavy is created lazily, in the driver planner process only."""

    def __init__(self, options: GetOptions) -> None:
        self.options = options
        self._group: _Group | None = None
        self._initial: dict | None = None
        self._target: tuple[int, datetime] | None = None

    # Planner methods (driver)

    def initialOffset(self) -> dict:
        # Spark calls this again after a crash in the first micro-batch (to replay it), so it takes no
        # lease: the lease goes to the owner named by the offsets the query actually runs on.
        if self._initial is None:
            qm = QueueManager.open(self.options.root)
            state = ConsumerState(qm.root, qm.resolve_for_get(self.options.queue).name, qm.storage_options)
            seq, delivered = state.last_position(self.options.consumer)
            self._initial = offset(
                {
                    "root": qm.root,
                    "queue": self.options.queue,
                    "consumer": self.options.consumer,
                    "owner": uuid.uuid4().hex,
                    "seq": seq,
                    "plan": "",
                    "delivered": delivered,
                    "version": -1,
                    "now": 0,
                }
            )
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages is not None:
            return ReadMaxRows(self.options.max_messages)
        if self.options.max_bytes is not None:
            return ReadMaxBytes(self.options.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = (QueueManager.open(self.options.root).queue_version(self.options.queue), datetime.now(UTC))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        group = self._join(start["owner"])
        with group.state.pinned():
            return self._next_offset(group, start, limit)

    def _next_offset(self, group: _Group, start: dict, limit: ReadLimit) -> dict:
        self._consume(group, start)
        if self.options.maintenance_interval is not None:
            group.maintenance.start_if_due(self.options.maintenance_interval)
        if group.plans or group.plan_keys:
            # A plan returned earlier that Spark did not start from was never run: its messages wait again.
            group.plans.clear()
            group.plan_keys.clear()
            group.plan_files.clear()
            group.exhausted = False
        if group.heartbeat.lost is not None:
            raise group.heartbeat.lost
        up_to, now = self._target if self._target else (None, datetime.now(UTC))
        news = self._catch_up(group, up_to)
        due = group.next_due is not None and now >= group.next_due
        if group.exhausted and not news and not due:
            self._flush(group)
            return start
        plan = self._plan(group, start, now, limit)
        if plan is None:
            self._flush(group)
            return start
        end = offset(
            {
                **start,
                "seq": start["seq"] + 1,
                "plan": plan.schema.metadata[b"plan_id"].decode(),
                "delivered": int(plan.schema.metadata[b"delivered"]),
                "version": group.pending.version,
                "now": int(now.timestamp() * 1_000_000),
            }
        )
        self._record(group, end, plan)
        return end

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if start == end or not end["plan"]:
            return []
        group = self._join(end["owner"])
        with group.state.pinned():
            return self._partitions(group, start, end)

    def _partitions(self, group: _Group, start: dict, end: dict) -> list[InputPartition]:
        # Spark replays a batch only once the one before it is done: this also loads the pending index,
        # which must know where maintenance has moved the plan's messages since.
        self._consume(group, start)
        self._catch_up(group, self._target[0] if self._target else None)
        plan = group.plans.get(end["plan"])
        if plan is None:
            plan = group.state.plan(self.options.consumer, end["plan"])
            if self._count_replay(group, end["plan"], plan):
                return []
        delivered = plan.filter(pc.is_valid(plan["delivery_seq"]))
        delivered = delivered.take(pc.sort_indices(delivered, [("delivery_seq", "ascending")]))
        backout_seq, backout_count = self._backout_counts(group, delivered)
        made = group.plan_files.pop(end["plan"], None)
        if made is not None and made[0] is group.pending and made[1] == group.pending.moves:
            where = made[2]
        else:
            # Made by another run, or maintenance has moved messages since.
            where = locate_plan(delivered, group.pending)
        used, file = np.unique(where["file"], return_inverse=True)
        files = [group.pending.files[number] for number in used]
        result = []
        for index, number in enumerate(np.unique(where["partition"])):
            chosen = where["partition"] == number
            result.append(
                QueuePartition(
                    location=group.location,
                    queue=group.queue,
                    qmgr=group.qm.name,
                    files=files,
                    file=file[chosen].astype(np.int32),
                    row=where["file_row"][chosen],
                    count=where["count"][chosen],
                    delivery_seq=where["delivery_seq"][chosen],
                    complete_message=self.options.delivery.complete_message,
                    backout_seq=backout_seq,
                    backout_count=backout_count,
                    value=index,
                )
            )
        return result

    def commit(self, end: dict) -> None:
        if self._group is not None and end.get("plan"):
            self._consume(self._group, end)
            self._flush(self._group)

    def stop(self) -> None:
        """Release the group's lease. Spark does not call this for Python sources today (the planner
        process is killed); the lease then lapses, or the query listener releases it."""
        if self._group is not None:
            self._group.heartbeat.stop()
            self._group.state.release(self.options.consumer, self._group.owner)
            self._group = None

    # Executor

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        table = partition.messages()
        yield from table.to_batches(max_chunksize=batch_rows(table))

    # Helpers

    def _join(self, owner: str) -> _Group:
        """The group state of this run, taking the group's lease for ``owner`` on first use."""
        if self._group is None:
            self._group = _Group(self.options, owner)
        elif self._group.owner != owner:
            raise MQError(
                f"queue {self.options.queue}: offsets of another query reached consumer {self.options.consumer!r}",
                Reason.MQRC_OBJECT_IN_USE,
            )
        return self._group

    def _consume(self, group: _Group, start: dict) -> None:
        """Note the plan that ended at ``start`` as consumed (once; recorded with the next state
        commit), without the messages backed out of it, and load the pending messages on first use,
        without everything the group consumed."""
        plan_id = start["plan"]
        if plan_id and plan_id not in group.consumed_plans:
            group.consumed_plans.add(plan_id)
            if group.pending is None:
                # Loaded before this consumption is recorded, so the plan's messages are in the index.
                self._load(group)
            group.plans.pop(plan_id, None)
            keys = group.plan_keys.pop(plan_id, None)
            group.plan_files.pop(plan_id, None)
            if keys is None:
                keys = group.pending.range_keys(group.state.plan(self.options.consumer, plan_id))
            kept = self._backed_out(group, plan_id, keys)
            group.unrecorded.append(consumed_rows(self.options.consumer, group.owner, plan_id, start["seq"]))
            group.pending.mark_consumed(keys[~np.isin(keys, kept)])
        if group.pending is None:
            self._load(group)

    def _backed_out(self, group: _Group, plan_id: str, keys: np.ndarray) -> np.ndarray:
        """The keys of the plan's messages that stay waiting: those backed out of it, and the later
        items of their message groups in the plan, which wait behind them (recorded as ``return``)."""
        given_back = group.state.events(
            self.options.consumer, ("backout", "return"), ["event", "origin", "row"], plan_id
        )
        if given_back.num_rows == 0:
            return np.zeros(0, dtype=np.int64)
        group.exhausted = False
        pending = group.pending
        given_up = _keys(pending, given_back.filter(pc.equal(given_back["event"], "return")))
        failed = _keys(pending, given_back.filter(pc.equal(given_back["event"], "backout")))
        found, at = lookup(pending.keys(), keys)
        planned = pending.rows.take(pa.array(at[found]))
        planned_keys = keys[found]
        is_failed = np.isin(planned_keys, failed)
        held = np.zeros(len(planned_keys), dtype=bool)
        grouped = np.flatnonzero(pc.is_valid(planned["group_id"]).to_numpy(zero_copy_only=False))
        if len(grouped):
            items = planned.take(pa.array(grouped))
            group_id = items["group_id"].to_pylist()
            position = list(zip(items["msg_seq_number"].to_pylist(), items["offset"].to_pylist(), strict=True))
            first_failed: dict[str, tuple] = {}
            for index, gid, where in zip(grouped, group_id, position, strict=True):
                if is_failed[index]:
                    first_failed[gid] = min(first_failed.get(gid, where), where)
            for index, gid, where in zip(grouped, group_id, position, strict=True):
                held[index] = not is_failed[index] and gid in first_failed and where > first_failed[gid]
        if held.any():
            returned = planned.filter(pa.array(held))
            identities = pa.table(
                {
                    "origin": pa.array(pending.origins, pa.string()).take(returned["origin"]),
                    "row": returned["row"],
                }
            )
            group.unrecorded.append(
                failure_rows(self.options.consumer, group.owner, "return", plan_id, identities, HELD_BEHIND)
            )
        return np.concatenate([failed, given_up, planned_keys[held]])

    def _load(self, group: _Group) -> None:
        """Build the pending index from the table's snapshot, without what the group consumed."""
        self._flush(group)
        group.pending = PendingMessages(
            group.location, group.qm.storage_options, exact_lengths=self.options.max_bytes is not None
        )
        group.pending.load(
            group.state.consumed_ranges(self.options.consumer), self._target[0] if self._target else None
        )

    def _catch_up(self, group: _Group, up_to: int | None) -> bool:
        """Bring the pending index up to date (to ``up_to``); True when it gained messages. When
        maintenance has cleaned up the log entries after the index's version, it is built again."""
        if group.pending.behind_clean_up():
            self._load(group)
            # The new index numbers origins afresh: the keys of plans not yet consumed follow.
            group.plan_keys = {plan_id: group.pending.range_keys(plan) for plan_id, plan in group.plans.items()}
            group.exhausted = False
            return True
        news = group.pending.refresh(up_to) if group.pending.has_news() else False
        group.exhausted &= not news
        return news

    def _flush(self, group: _Group, plan_rows: pa.Table | None = None) -> None:
        """Commit the consumption records not yet recorded, with ``plan_rows`` when given."""
        rows = [*group.unrecorded, *([plan_rows] if plan_rows is not None else [])]
        if rows:
            group.state.append(pa.concat_tables(rows))
            group.unrecorded.clear()

    def _plan(self, group: _Group, start: dict, now: datetime, limit: ReadLimit) -> pa.Table | None:
        """The next micro-batch: delivered messages (with delivery_seq and partition) and expired ones."""
        options = self.options
        group.qm.resolve_for_get(options.queue)
        rows = self._failed_messages(group, now)
        moment = pa.scalar(now, TIMESTAMP)
        waiting = pc.invert(rows["consumed"])
        expired = rows.filter(pc.and_(waiting, pc.fill_null(pc.less_equal(rows["expiry"], moment), False)))
        later = pc.filter(
            rows["available_at"], pc.and_(waiting, pc.fill_null(pc.greater(rows["available_at"], moment), False))
        )
        group.next_due = pc.min(later).as_py() if len(later) else None
        ordered = deliver(rows, group.delivery_sequence, options.delivery, now, join=False).messages
        candidates = keep_rows(ordered, pc.invert(ordered["consumed"]))
        taken, delivered = self._admit(candidates, limit, start["delivered"], self._isolation(group, candidates))
        group.exhausted = taken.num_rows == candidates.num_rows
        if taken.num_rows == 0 and expired.num_rows == 0:
            return None
        where = file_runs(*(taken[name].to_numpy() for name in ("file", "file_row", "delivery_seq", "partition")))
        if expired.num_rows:
            expired = expired.append_column("delivery_seq", pa.nulls(expired.num_rows, pa.int64()))
            expired = expired.append_column("partition", pa.nulls(expired.num_rows, pa.int32()))
            taken = pa.concat_tables([taken, expired.select(taken.column_names)])
        plan = plan_ranges(taken, group.pending.origins)
        plan_id = uuid.uuid4().hex
        group.plan_keys[plan_id] = group.pending.keys(taken)
        group.plan_files[plan_id] = (group.pending, group.pending.moves, where)
        return plan.replace_schema_metadata({"plan_id": plan_id, "delivered": str(delivered)})

    def _failed_messages(self, group: _Group, now: datetime) -> pa.Table:
        """The pending index to plan on, after the group's failed messages were dealt with: those
        that failed too often are moved (moves a crash interrupted are finished first), the others
        wait until their retry delay has passed."""
        pending = group.pending
        finished = group.mover.finish_pending(pending)
        if finished.num_rows:
            pending.mark_consumed(_keys(pending, finished))
        failed = failures(group.state, self.options.consumer)
        if failed.num_rows == 0:
            return pending.rows
        keys = _keys(pending, failed)
        waiting = pending.keys()[~pending.rows["consumed"].to_numpy(zero_copy_only=False)]
        failed = failed.filter(pa.array(np.isin(keys, waiting)))
        moved = group.mover.move(failed, pending)
        if moved.num_rows:
            pending.mark_consumed(_keys(pending, moved))
        rows = pending.rows
        if group.mover.policy.retry_delay <= timedelta(0):
            return rows
        found, at = lookup(_keys(pending, failed), pending.keys())
        if not found.any():
            return rows
        retry_at = pc.add(failed["failed_at"], pa.scalar(group.mover.policy.retry_delay, pa.duration("us")))
        retry = retry_at.take(pa.array(at))
        available_at = rows["available_at"]
        later = pc.fill_null(pc.greater(retry, available_at), True)
        held = pc.if_else(pc.and_(pa.array(found), later), retry, available_at)
        index = rows.schema.get_field_index("available_at")
        return rows.set_column(index, rows.schema.field(index), held.cast(rows.schema.field(index).type))

    def _count_replay(self, group: _Group, plan_id: str, plan: pa.Table) -> bool:
        """A plan this run did not make is being replayed: its batch failed, once for each message.
        True when the plan is given up: an earlier replay of it failed too (see
        :mod:`mqspark.services.backout`)."""
        if plan_id in group.replayed:
            return group.replayed[plan_id]
        messages = plan_messages(plan).select(["origin", "row"])
        if messages.num_rows == 0:
            group.replayed[plan_id] = False
            return False
        consumer = self.options.consumer
        replays = pc.max(group.state.events(consumer, ("rollback",), ["seq"], plan_id)["seq"]).as_py() or 0
        rows = [failure_rows(consumer, group.owner, "rollback", plan_id, messages, ROLLED_BACK, seq=replays + 1)]
        given_up = replays >= 1
        if given_up:
            limit = -(-messages.num_rows // ISOLATE_FACTOR)
            rows.append(failure_rows(consumer, group.owner, "return", plan_id, messages, GIVEN_UP, batch_limit=limit))
        group.state.append(pa.concat_tables(rows))
        group.replayed[plan_id] = given_up
        return given_up

    def _backout_counts(self, group: _Group, delivered: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """The delivery_seq (sorted) and backout_count of the plan's messages that have failed before."""
        failed = failures(group.state, self.options.consumer)
        empty = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
        if failed.num_rows == 0:
            return empty
        messages = plan_messages(delivered)
        found, at = lookup(_keys(group.pending, failed), _keys(group.pending, messages))
        seqs = messages["delivery_seq"].to_numpy()[found]
        counts = failed["backout_count"].to_numpy()[at[found]]
        by_seq = np.argsort(seqs)
        return seqs[by_seq], counts[by_seq].astype(np.int32)

    def _isolation(self, group: _Group, candidates: pa.Table) -> int | None:
        """The most units the next batch may hold: the ``batch_limit`` of the message at the head of
        the logical order when it was returned from a plan given up (None: no such limit)."""
        if candidates.num_rows == 0:
            return None
        returned = group.state.events(self.options.consumer, ("return",), ["origin", "row", "batch_limit"])
        returned = returned.filter(pc.is_valid(returned["batch_limit"]))
        if returned.num_rows == 0:
            return None
        keys = _keys(group.pending, returned)
        head = group.pending.keys(candidates.slice(0, 1))
        mine = returned["batch_limit"].filter(pa.array(keys == head[0]))
        return int(pc.min(mine).as_py()) if len(mine) else None

    def _admit(
        self, candidates: pa.Table, limit: ReadLimit, first_seq: int, max_units: int | None = None
    ) -> tuple[pa.Table, int]:
        """The prefix of ``candidates`` this batch delivers, with delivery_seq and partition, and the
        next delivery_seq. Limits count delivered messages and payload bytes; at least one unit goes."""
        options = self.options
        max_messages = max_bytes = None
        if not isinstance(limit, ReadAllAvailable):
            max_messages = limit.max_rows if isinstance(limit, ReadMaxRows) else options.max_messages
            max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else options.max_bytes
        count = candidates.num_rows
        if count == 0:
            return candidates.append_column("delivery_seq", pa.array([], pa.int64())).append_column(
                "partition", pa.array([], pa.int32())
            ), first_seq
        grouped = pc.is_valid(candidates["group_id"]).to_numpy(zero_copy_only=False)
        group = pc.dictionary_encode(pc.fill_null(candidates["group_id"], "")).combine_chunks().indices.to_numpy()
        seq = candidates["msg_seq_number"].to_numpy()
        segmented = candidates["segmented"].to_numpy(zero_copy_only=False)
        same_group = np.zeros(count, dtype=bool)
        same_group[1:] = grouped[1:] & grouped[:-1] & (group[1:] == group[:-1])
        same_message = np.zeros(count, dtype=bool)
        same_message[1:] = same_group[1:] & (seq[1:] == seq[:-1]) & segmented[1:] & segmented[:-1]
        unit_start = ~(same_group if options.delivery.all_messages_available else same_message)
        message_start = ~same_message if options.delivery.complete_message else np.ones(count, dtype=bool)
        messages = np.cumsum(message_start)
        size = np.cumsum(candidates["payload_length"].to_numpy())
        unit_end = np.append(unit_start[1:], True)
        ends = np.flatnonzero(unit_end)
        fits = np.ones(len(ends), dtype=bool)
        if max_messages is not None:
            fits &= messages[ends] <= max_messages
        if max_bytes is not None:
            fits &= size[ends] <= max_bytes
        # Whole units are taken while they fit; the first always goes, so a big message cannot stall.
        units = len(ends) if fits.all() else max(1, int(np.argmin(fits)))
        if max_units is not None:
            units = min(units, max_units)
        stop = int(ends[units - 1]) + 1
        taken = candidates.slice(0, stop)
        total = int(size[stop - 1])
        parts = max(1, min(units, math.ceil(total / PARTITION_BYTES)))
        length = candidates["payload_length"].to_numpy()[:stop]
        file = candidates["file"].to_numpy()[:stop]
        # Partitions of about total / parts bytes, cut only where a unit starts in another data file
        # than the row before, so that a file is read by one task where the order allows it.
        cut = unit_start[:stop].copy()
        cut[1:] &= file[1:] != file[:-1]
        wanted = np.where(cut, (size[:stop] - length) * parts // max(total, 1), 0)
        # Non-decreasing, so codes in order of first appearance number the partitions in order.
        partition = pc.dictionary_encode(pa.array(np.maximum.accumulate(wanted))).indices
        delivery_seq = first_seq + messages[:stop] - 1
        taken = taken.append_column("delivery_seq", pa.array(delivery_seq, pa.int64()))
        taken = taken.append_column("partition", partition)
        return taken, int(first_seq + messages[stop - 1])

    def _record(self, group: _Group, end: dict, plan: pa.Table) -> None:
        rows = plan.num_rows
        given = {
            "consumer": pa.repeat(self.options.consumer, rows),
            "owner": pa.repeat(group.owner, rows),
            "event": pa.repeat("plan", rows),
            "plan_id": pa.repeat(end["plan"], rows),
            "seq": pa.repeat(pa.scalar(end["seq"], pa.int64()), rows),
            "at": pa.repeat(pa.scalar(datetime.now(UTC), TIMESTAMP), rows),
            **{name: plan[name] for name in plan.column_names},
        }
        self._flush(
            group,
            pa.table({f.name: given.get(f.name, pa.nulls(rows, f.type)) for f in STATE_SCHEMA}, schema=STATE_SCHEMA),
        )
        group.plans[end["plan"]] = plan


def _keys(pending: PendingMessages, messages: pa.Table) -> np.ndarray:
    """The pending-index keys of ``origin``/``row`` identities."""
    if messages.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    return pending.range_keys(single_ranges(messages))


def plan_ranges(taken: pa.Table, origins: list[str]) -> pa.Table:
    """A plan as ranges of message identities: one range per run of consecutive rows of one origin, in
    one partition, with consecutive delivery_seq (or all discarded, delivery_seq null)."""
    origin = taken["origin"].to_numpy()
    row = taken["row"].to_numpy()
    partition = pc.fill_null(taken["partition"], -1).to_numpy()
    delivered = pc.is_valid(taken["delivery_seq"]).to_numpy(zero_copy_only=False)
    delivery_seq = pc.fill_null(taken["delivery_seq"], -1).to_numpy()
    starts = np.ones(len(row), dtype=bool)
    starts[1:] = (
        (origin[1:] != origin[:-1])
        | (row[1:] != row[:-1] + 1)
        | (partition[1:] != partition[:-1])
        | (delivered[1:] != delivered[:-1])
        | (delivered[1:] & (delivery_seq[1:] != delivery_seq[:-1] + 1))
    )
    first = np.flatnonzero(starts)
    first_taken = pa.array(first)
    return pa.table(
        {
            "origin": pa.DictionaryArray.from_arrays(pa.array(origin[first]), pa.array(origins, pa.string())).cast(
                pa.string()
            ),
            "row": pa.array(row[first]),
            "count": pa.array(np.diff(np.append(first, len(row)))),
            "delivery_seq": taken["delivery_seq"].take(first_taken),
            "partition": taken["partition"].take(first_taken),
        }
    )


def locate_plan(delivered: pa.Table, pending: PendingMessages) -> dict[str, np.ndarray]:
    """Where the messages of a plan's delivered ranges (in delivery order) lie now, as runs of
    consecutive rows of one data file: ``file`` (numbers into ``pending.files``), ``file_row``,
    ``count``, ``delivery_seq`` and ``partition`` of each run.

    Maintenance may have moved them to other files since the plan was made; only a purge removes
    planned messages, and those are left out."""
    count = delivered["count"].to_numpy()
    file, file_row = pending.locate(pending.range_keys(delivered))
    delivery_seq = expand_ranges(delivered["delivery_seq"].to_numpy(), count)
    partition = np.repeat(delivered["partition"].to_numpy(), count)
    found = file >= 0
    return file_runs(file[found], file_row[found], delivery_seq[found], partition[found])


def file_runs(
    file: np.ndarray, file_row: np.ndarray, delivery_seq: np.ndarray, partition: np.ndarray
) -> dict[str, np.ndarray]:
    """Messages in delivery order (data file numbers, rows in them, delivery_seq, partition) as runs
    of consecutive rows of one data file in one partition, with consecutive delivery_seq."""
    starts = np.ones(len(file), dtype=bool)
    starts[1:] = (
        (file[1:] != file[:-1])
        | (file_row[1:] != file_row[:-1] + 1)
        | (partition[1:] != partition[:-1])
        | (delivery_seq[1:] != delivery_seq[:-1] + 1)
    )
    first = np.flatnonzero(starts)
    return {
        "file": file[first],
        "file_row": file_row[first],
        "count": np.diff(np.append(first, len(file))),
        "delivery_seq": delivery_seq[first],
        "partition": partition[first],
    }


def record_finished_batch(end_offset: str) -> None:
    """Record the plan of a finished batch as consumed, given the source's end offset as Spark
    reports it (a JSON string). Offsets of other sources are ignored."""
    try:
        end = json.loads(end_offset)
    except (TypeError, ValueError):
        return
    if not is_offset(end) or not end["plan"]:
        return
    qm = QueueManager.open(end["root"])
    state = ConsumerState(qm.root, qm.resolve_for_get(end["queue"]).name, qm.storage_options)
    settled = end["plan"] in state.consumed_plans(end["consumer"]).to_pylist()
    # A batch that backed out messages is settled by the group's next run, which knows their groups.
    if not settled and not state.events(end["consumer"], ("backout",), ["row"], end["plan"]).num_rows:
        state.append(consumed_rows(end["consumer"], end["owner"], end["plan"], end["seq"]))
    state.release(end["consumer"], end["owner"])
