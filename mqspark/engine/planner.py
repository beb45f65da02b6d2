"""Planning a consumer group's deliveries: which messages go next, in which order, recorded before
they are delivered. The streaming get (:mod:`mqspark.spark.stream`) and the Python get
(:mod:`mqspark.engine.get`) both plan with a :class:`Planner`.

A planner holds the group's lease while it lives (renewed by a :class:`~mqspark.engine.heartbeat.Heartbeat`)
and its pending messages (:mod:`mqspark.engine.pending`). A planning step:

1. records the plan that ended as consumed (:meth:`Planner.consume`), without the messages backed
   out of it;
2. reads new commits into the pending index (:meth:`Planner.catch_up`);
3. deals with failed messages (moves those that failed too often, holds the others back until
   their retry delay has passed, see :mod:`mqspark.engine.backout`);
4. orders the waiting messages (:mod:`mqspark.engine.ordering`) and admits a prefix (:func:`admit`): higher
   priorities first, never ending inside a logical message, or inside a group under
   ``allMessagesAvailable``;
5. records the plan in the state table (:meth:`Planner.record`) before anything is delivered, so a
   replay after a crash delivers the same messages.

The planned messages are then read from their data files (:class:`PlannedRows`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.engine.backout import (
    GIVEN_UP,
    HELD_BEHIND,
    ISOLATE_FACTOR,
    LOCK_EXPIRED,
    ROLLED_BACK,
    BackoutPolicy,
    Mover,
    failures,
    plan_messages,
)
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.heartbeat import Heartbeat
from mqspark.engine.ordering import HEAD, DeliveryOptions, deliver, join_segments, keep_rows
from mqspark.engine.pending import PendingMessages, lookup
from mqspark.engine.plans import admit, file_runs, keys_of, locate_plan, plan_ranges
from mqspark.engine.queues import Queues
from mqspark.engine.state_rows import EventKind, consumed_rows, failure_rows, plan_rows
from mqspark.errors import MQError, Reason
from mqspark.model.definitions import QueueDefinition
from mqspark.model.messages import BROWSE_SCHEMA, MESSAGE_SCHEMA, TIMESTAMP
from mqspark.model.ranges import RANGE_COLUMNS

_log = logging.getLogger("mqspark.engine.planner")


@dataclass
class PlannedRows:
    """Planned messages for one reader (a Spark task, or the Python get), as ranges of rows of data
    files, in delivery order."""

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

    def messages(self) -> pa.Table:
        # Each file is read once, only the row groups holding its planned rows.
        spans = {}
        for number in np.unique(self.file):
            mine = self.file == number
            first, stop = int(self.row[mine].min()), int((self.row[mine] + self.count[mine]).max())
            data = store.read_data_rows(self.location, self.files[number], first, stop, MESSAGE_SCHEMA.names)
            spans[number] = (first, store.cast_to(data.select(MESSAGE_SCHEMA.names), MESSAGE_SCHEMA))
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
        return store.cast_to(table.select(BROWSE_SCHEMA.names), BROWSE_SCHEMA)


class Planner:
    """What one reader of a consumer group knows of the group while it reads: its lease, its pending
    messages, and the plans it made."""

    def __init__(  # noqa: PLR0913 - the streaming get's options, each a reader option users set
        self,
        qm: Queues,
        queue: str,
        consumer: str,
        owner: str,
        delivery: DeliveryOptions,
        lease_timeout: timedelta | None,
        *,
        exact_lengths: bool = False,
        patience: timedelta = timedelta(0),
        state: ConsumerState | None = None,
        resumes_at: int = 0,
    ) -> None:
        """``state``: a handle on the queue's state table to use (one per thread), else one of its own.
        ``lease_timeout`` None: a Python get, which takes no lease (its plans are claims, see
        :mod:`mqspark.engine.get`). ``resumes_at``: the plan number a streaming query's checkpoint
        says the group has reached (0: nothing yet)."""
        definition = qm.resolve_for_get(queue)
        self.qm = qm
        self.definition = definition
        self.queue = definition.name
        self.consumer = consumer
        self.delivery = delivery
        self.delivery_sequence = definition.delivery_sequence
        self.exact_lengths = exact_lengths
        self.location = store.queue_location(qm.root, self.queue)
        # A handle kept from another queue manager on the root may read another clock.
        if state is None or state.queue != self.queue or state.root != qm.root or state.clock is not qm.clock:
            state = ConsumerState(qm.root, self.queue, qm.storage_options, clock=qm.clock)
        self.state = state
        _refuse_a_lost_history(state, definition, consumer, resumes_at)
        _warn_of_a_new_group(state, consumer)
        self.owner = owner
        self.started = datetime.now(UTC)
        self.lock = timedelta(seconds=definition.lock_duration)
        self.heartbeat: Heartbeat | None = None
        if lease_timeout is not None:
            self.state.acquire(consumer, owner, lease_timeout, patience, self.lock)
            self.heartbeat = Heartbeat(self.state, consumer, owner, lease_timeout)
        # The table version reads stop at (a run of ``trigger(availableNow=True)``); None: the latest.
        self.up_to: int | None = None
        self._pending: PendingMessages | None = None
        self.plans: dict[str, pa.Table] = {}
        # The planned messages of each plan in ``plans`` as pending-index keys.
        self.plan_keys: dict[str, np.ndarray] = {}
        # Where the delivered messages of each plan in ``plans`` lay when it was made (see
        # :func:`file_runs`), with the index and its count of moves then.
        self.plan_files: dict[str, tuple[PendingMessages, int, dict[str, np.ndarray]]] = {}
        self.consumed_plans: set[str] = set()
        # Consumption records waiting to go with the next plan's commit: one state commit per batch.
        self._unrecorded: list[pa.Table] = []
        self.exhausted = False
        self._next_due: datetime | None = None
        self.mover = Mover(qm, BackoutPolicy.of(qm, definition), self.state, consumer, owner)
        # Plans of earlier runs this run has replayed (each counted as one rolled-back delivery), and
        # whether each was given up.
        self.replayed: dict[str, bool] = {}

    @property
    def _index(self) -> PendingMessages:
        """The group's pending messages, built by :meth:`load` (the first :meth:`consume` loads them)."""
        if self._pending is None:
            raise RuntimeError(
                f"queue {self.queue}: consumer group {self.consumer!r}: the pending messages are not loaded"
            )
        return self._pending

    @property
    def loaded(self) -> PendingMessages | None:
        """The pending index, None before it is loaded."""
        return self._pending

    def index_version(self) -> int:
        """The version of the queue table the pending index has read up to."""
        return self._index.version

    def range_keys(self, ranges: pa.Table) -> np.ndarray:
        """The pending-index keys of the messages of ``ranges`` (``origin``/``row``/``count``)."""
        return self._index.range_keys(ranges.select(RANGE_COLUMNS))

    def mark_consumed(self, ranges: pa.Table) -> None:
        """Plan as if the messages of ``ranges`` were consumed (their record is to commit with the next
        plan, see :meth:`with_next_commit`)."""
        self._index.mark_consumed(self.range_keys(ranges))

    def with_next_commit(self, rows: pa.Table) -> None:
        """Commit the state ``rows`` with the next plan's commit (or :meth:`flush`'s)."""
        self._unrecorded.append(rows)

    def drop_unrecorded(self) -> None:
        """Forget the state rows waiting for the next commit: the step that made them is given up."""
        self._unrecorded.clear()

    def due(self) -> datetime | None:
        """When the next plan may find messages without a commit to the queue (an expiry, a claim's
        lock passing); None: only a commit brings new ones."""
        return self._next_due

    def is_due(self, now: datetime) -> bool:
        """Whether :meth:`due` has come at ``now``."""
        return self._next_due is not None and now >= self._next_due

    def due_by(self, when: datetime | None) -> None:
        """Make :meth:`due` no later than ``when`` (None: leave it)."""
        self._next_due = min((due for due in (self._next_due, when) if due is not None), default=None)

    @property
    def lost(self) -> MQError | None:
        """Why the lease was lost, once a renewal was refused."""
        return self.heartbeat.lost if self.heartbeat is not None else None

    def stop_renewing(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def close(self) -> None:
        """Stop renewing the lease and release it."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.state.release(self.consumer, self.owner)

    def stopped_by_monitor(self) -> MQError | None:
        """The backlog monitor's abort of this reader, when one was recorded after it took the lease."""
        rows = self.state.events(self.consumer, (EventKind.ABORT,), ["reason", "error"], since=self.started)
        if rows.num_rows == 0:
            return None
        return MQError(rows["error"][0].as_py(), Reason(rows["reason"][0].as_py()))

    def switchover_requested(self) -> bool:
        """Whether an administrator asked, after this reader took the lease, to hand the group over."""
        return self.state.events(self.consumer, (EventKind.SWITCHOVER,), ["at"], since=self.started).num_rows > 0

    def drop_unstarted_plans(self) -> None:
        """Forget the plans made but never started: their messages wait again."""
        if self.plans or self.plan_keys:
            self.plans.clear()
            self.plan_keys.clear()
            self.plan_files.clear()
            self.exhausted = False

    def consume(self, plan_id: str, seq: int) -> None:
        """Note plan ``plan_id`` (number ``seq``) as consumed (once; recorded with the next state
        commit), without the messages backed out of it, and load the pending messages on first use,
        without everything the group consumed."""
        if plan_id and plan_id not in self.consumed_plans:
            self.consumed_plans.add(plan_id)
            if self._pending is None:
                # Loaded before this consumption is recorded, so the plan's messages are in the index.
                self.load()
            self.plans.pop(plan_id, None)
            keys = self.plan_keys.pop(plan_id, None)
            self.plan_files.pop(plan_id, None)
            if keys is None:
                keys = self._index.range_keys(self.state.plan(self.consumer, plan_id))
            kept = self._backed_out(plan_id, keys)
            self._unrecorded.append(consumed_rows(self.consumer, self.owner, plan_id, seq))
            self._index.mark_consumed(keys[~np.isin(keys, kept)])
        if self._pending is None:
            self.load()

    def _backed_out(self, plan_id: str, keys: np.ndarray) -> np.ndarray:
        """The keys of the plan's messages that stay waiting: those backed out of it, and the later
        items of their message groups in the plan, which wait behind them (recorded as ``return``)."""
        given_back = self.state.events(
            self.consumer, (EventKind.BACKOUT, EventKind.RETURN), ["event", "origin", "row"], plan_id
        )
        if given_back.num_rows == 0:
            return np.zeros(0, dtype=np.int64)
        self.exhausted = False
        pending = self._index
        given_up = keys_of(pending, given_back.filter(pc.equal(given_back["event"], EventKind.RETURN)))
        failed = keys_of(pending, given_back.filter(pc.equal(given_back["event"], EventKind.BACKOUT)))
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
            self._unrecorded.append(
                failure_rows(self.consumer, self.owner, EventKind.RETURN, plan_id, identities, HELD_BEHIND)
            )
        return np.concatenate([failed, given_up, planned_keys[held]])

    def adopt(self, pending: PendingMessages) -> None:
        """Plan on ``pending``, an index of this group that an earlier reader of the same process
        built: brought up to date with the queue's new commits and with what the group consumed since."""
        self._pending = pending
        self.catch_up()
        self._index.consume_ranges(self.state.consumed_ranges(self.consumer))

    def load(self) -> None:
        """Build the pending index from the table's snapshot, without what the group consumed."""
        self.flush()
        self._pending = PendingMessages(
            self.location, self.qm.storage_options, exact_lengths=self.exact_lengths, consumer=self.consumer
        )
        self._pending.load(self.state.consumed_ranges(self.consumer), self.up_to, lanes=self.delivery_sequence)

    def catch_up(self) -> bool:
        """Bring the pending index up to date (to ``up_to``); True when it gained messages. When
        maintenance has cleaned up the log entries after the index's version, or rewrote files it has
        not read yet, it is built again."""
        if not self._index.behind_clean_up():
            news = self._index.refresh(self.up_to) if self._index.has_news() else False
            if not self._index.stale:
                self.exhausted &= not news
                return news
        # Maintenance cleaned up the log after the index's version, or rewrote files it has not read.
        self.load()
        # The new index numbers origins afresh: the keys of plans not yet consumed follow.
        self.plan_keys = {plan_id: self._index.range_keys(plan) for plan_id, plan in self.plans.items()}
        self.exhausted = False
        return True

    def flush(self, plan_rows: pa.Table | None = None, check: Callable[[], None] | None = None) -> None:
        """Commit the consumption records not yet recorded, with ``plan_rows`` when given; with
        ``check``, only once it passes, at exactly the version it checked."""
        rows = [*self._unrecorded, *([plan_rows] if plan_rows is not None else [])]
        if rows:
            self.state.append(pa.concat_tables(rows), check)
            self._unrecorded.clear()

    def roll_back(self, plan_id: str, plan: pa.Table) -> None:
        """Note a Python get's claim whose lock passed as rolled back, one failed delivery of each of
        its messages (recorded with the next state commit): they wait again."""
        messages = plan_messages(plan).select(["origin", "row"])
        rows = failure_rows(self.consumer, self.owner, EventKind.ROLLBACK, plan_id, messages, LOCK_EXPIRED, seq=1)
        self._unrecorded.append(rows)

    def plan(
        self,
        first_seq: int,
        now: datetime,
        max_messages: int | None,
        max_bytes: int | None,
        match: DeliveryOptions | None = None,
        claimed: np.ndarray | None = None,
    ) -> pa.Table | None:
        """The next plan: delivered messages (with delivery_seq and partition, from ``first_seq`` on)
        and expired ones, as ranges, with ``plan_id`` and the next ``delivered`` in its metadata; None
        when there is nothing to deliver or discard. ``match`` selects messages by msg_id, correl_id
        or group_id (and msg_seq_number). ``claimed``: the keys of messages other gets hold, left
        out with every group they are in."""
        self.qm.resolve_for_get(self.queue)
        # Order a head of the queue that the limits leave room to fill, and a longer one when what it
        # held was all taken: a batch costs what its head costs, not what the queue holds.
        head = None if max_messages is None and max_bytes is None else max(4 * (max_messages or 0), HEAD)
        if head is None or not self._index.ensure(head, now):
            self._index.read_all()
        rows = self._failed_messages(now)
        reads = self._index.reads
        while True:
            if head is not None and len(self._index.unread) == 0 and head >= rows.num_rows:
                head = None
            delivery = deliver(rows, self.delivery_sequence, self.delivery, now, join=False, head=head)
            candidates = self._candidates(delivery.messages.slice(0, delivery.exact), match, claimed)
            taken, delivered = admit(
                candidates, max_messages, max_bytes, first_seq, self.delivery, self._isolation(candidates)
            )
            if head is None or taken.num_rows < candidates.num_rows:
                break
            head *= 4
            if len(self._index.unread) and not self._index.ensure(head, now):
                self._index.read_all()
            # Parts read meanwhile (also for a message the head named) belong in the rows ordered.
            if self._index.reads != reads:
                rows = self._failed_messages(now)
                reads = self._index.reads
        moment = pa.scalar(now, TIMESTAMP)
        waiting = pc.invert(rows["consumed"])
        expired = rows.filter(pc.and_(waiting, pc.fill_null(pc.less_equal(rows["expiry"], moment), False)))
        later = pc.filter(
            rows["available_at"], pc.and_(waiting, pc.fill_null(pc.greater(rows["available_at"], moment), False))
        )
        self._next_due = pc.min(later).as_py() if len(later) else None
        if claimed is not None and len(claimed):
            expired = expired.filter(pa.array(~np.isin(self._index.keys(expired), claimed)))
        self.exhausted = taken.num_rows == candidates.num_rows
        if taken.num_rows == 0 and expired.num_rows == 0:
            return None
        where = file_runs(*(taken[name].to_numpy() for name in ("file", "file_row", "delivery_seq", "partition")))
        if expired.num_rows:
            expired = expired.append_column("delivery_seq", pa.nulls(expired.num_rows, pa.int64()))
            expired = expired.append_column("partition", pa.nulls(expired.num_rows, pa.int32()))
            taken = pa.concat_tables([taken, expired.select(taken.column_names)])
        plan = plan_ranges(taken, self._index.origins)
        plan_id = uuid.uuid4().hex
        self.plan_keys[plan_id] = self._index.keys(taken)
        self.plan_files[plan_id] = (self._index, self._index.moves, where)
        return plan.replace_schema_metadata({"plan_id": plan_id, "delivered": str(delivered)})

    def _candidates(self, ordered: pa.Table, match: DeliveryOptions | None, claimed: np.ndarray | None) -> pa.Table:
        """The messages of ``ordered`` (in delivery order) a plan may take: not consumed, held by no
        other get, and selected by ``match``."""
        candidates = keep_rows(ordered, pc.invert(ordered["consumed"]))
        if claimed is not None and len(claimed):
            candidates = self._unclaimed(candidates, claimed)
        if match is not None:
            candidates = self._matching(candidates, match)
        return candidates

    def _unclaimed(self, candidates: pa.Table, claimed: np.ndarray) -> pa.Table:
        """The candidates no other get holds: a group with a held item waits whole, in logical order."""
        held = np.isin(self._index.keys(candidates), claimed)
        if not held.any():
            return candidates
        groups = candidates["group_id"]
        busy = pc.unique(groups.filter(pa.array(held)).drop_null())
        in_busy = pc.fill_null(pc.is_in(groups, value_set=busy), False).to_numpy(zero_copy_only=False)
        return candidates.filter(pa.array(~(held | in_busy)))

    def _matching(self, candidates: pa.Table, match: DeliveryOptions) -> pa.Table:
        """The candidates selected by ``match``. In logical order an item of a group is selected by
        msg_id or correl_id only when it is the group's next item: a match never skips a group item."""
        by_identity = {name: getattr(match, name) for name in ("msg_id", "correl_id") if getattr(match, name)}
        if by_identity:
            read = self._index.read_columns(candidates, list(by_identity))
            selected = np.ones(candidates.num_rows, dtype=bool)
            for name, value in by_identity.items():
                selected &= pc.fill_null(pc.equal(read[name], value), False).to_numpy(zero_copy_only=False)
            if self.delivery.order == "logical":
                group_id = candidates["group_id"].to_numpy(zero_copy_only=False)
                grouped = pc.is_valid(candidates["group_id"]).to_numpy(zero_copy_only=False)
                _, first = np.unique(group_id[grouped].astype(str), return_index=True)
                next_item = np.ones(candidates.num_rows, dtype=bool)
                next_item[np.flatnonzero(grouped)] = False
                next_item[np.flatnonzero(grouped)[first]] = True
                selected &= next_item
            candidates = candidates.filter(pa.array(selected))
        if match.group_id is not None:
            candidates = candidates.filter(pc.fill_null(pc.equal(candidates["group_id"], match.group_id), False))
            if match.msg_seq_number is not None:
                candidates = candidates.filter(pc.equal(candidates["msg_seq_number"], match.msg_seq_number))
        return candidates

    def _failed_messages(self, now: datetime) -> pa.Table:
        """The pending index to plan on, after the group's failed messages were dealt with: those
        that failed too often are moved (moves a crash interrupted are finished first), the others
        wait until their retry delay has passed."""
        pending = self._index
        finished = self.mover.finish_pending(pending)
        if finished.num_rows:
            pending.mark_consumed(keys_of(pending, finished))
        failed = failures(self.state, self.consumer)
        if failed.num_rows == 0:
            return pending.rows
        keys = keys_of(pending, failed)
        waiting = pending.keys()[~pending.rows["consumed"].to_numpy(zero_copy_only=False)]
        failed = failed.filter(pa.array(np.isin(keys, waiting)))
        moved = self.mover.move(failed, pending)
        if moved.num_rows:
            pending.mark_consumed(keys_of(pending, moved))
        rows = pending.rows
        if self.mover.policy.retry_delay <= timedelta(0):
            return rows
        found, at = lookup(keys_of(pending, failed), pending.keys())
        if not found.any():
            return rows
        retry_at = pc.add(failed["failed_at"], pa.scalar(self.mover.policy.retry_delay, pa.duration("us")))
        retry = retry_at.take(pa.array(at))
        available_at = rows["available_at"]
        later = pc.fill_null(pc.greater(retry, available_at), True)
        held = pc.if_else(pc.and_(pa.array(found), later), retry, available_at)
        index = rows.schema.get_field_index("available_at")
        return rows.set_column(index, rows.schema.field(index), held.cast(rows.schema.field(index).type))

    def count_replay(self, plan_id: str, plan: pa.Table) -> bool:
        """A plan this reader did not make is being replayed: its batch failed, once for each message.
        True when the plan is given up: an earlier replay of it failed too (see
        :mod:`mqspark.engine.backout`)."""
        if plan_id in self.replayed:
            return self.replayed[plan_id]
        messages = plan_messages(plan).select(["origin", "row"])
        if messages.num_rows == 0:
            self.replayed[plan_id] = False
            return False
        consumer = self.consumer
        replays = pc.max(self.state.events(consumer, (EventKind.ROLLBACK,), ["seq"], plan_id)["seq"]).as_py() or 0
        rows = [failure_rows(consumer, self.owner, EventKind.ROLLBACK, plan_id, messages, ROLLED_BACK, seq=replays + 1)]
        given_up = replays >= 1
        if given_up:
            limit = -(-messages.num_rows // ISOLATE_FACTOR)
            rows.append(
                failure_rows(consumer, self.owner, EventKind.RETURN, plan_id, messages, GIVEN_UP, batch_limit=limit)
            )
        self.state.append(pa.concat_tables(rows))
        self.replayed[plan_id] = given_up
        return given_up

    def planned_rows(self, plan_id: str, plan: pa.Table) -> list[PlannedRows]:
        """Where the messages plan ``plan_id`` delivers lie now, one :class:`PlannedRows` per partition,
        in order."""
        delivered = plan.filter(pc.is_valid(plan["delivery_seq"]))
        delivered = delivered.take(pc.sort_indices(delivered, [("delivery_seq", "ascending")]))
        backout_seq, backout_count = self._backout_counts(delivered)
        made = self.plan_files.pop(plan_id, None)
        if made is not None and made[0] is self._index and made[1] == self._index.moves:
            where = made[2]
        else:
            # Made by another run, or maintenance has moved messages since.
            where = locate_plan(delivered, self._index)
        used, file = np.unique(where["file"], return_inverse=True)
        files = [self._index.files[number] for number in used]
        result = []
        for number in np.unique(where["partition"]):
            chosen = where["partition"] == number
            result.append(
                PlannedRows(
                    location=self.location,
                    queue=self.queue,
                    qmgr=self.qm.name,
                    files=files,
                    file=file[chosen].astype(np.int32),
                    row=where["file_row"][chosen],
                    count=where["count"][chosen],
                    delivery_seq=where["delivery_seq"][chosen],
                    complete_message=self.delivery.complete_message,
                    backout_seq=backout_seq,
                    backout_count=backout_count,
                )
            )
        return result

    def _backout_counts(self, delivered: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """The delivery_seq (sorted) and backout_count of the plan's messages that have failed before."""
        # Failures to commit with the plan (claims rolled back by a get) count already.
        failed = failures(self.state, self.consumer, self._unrecorded)
        empty = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32)
        if failed.num_rows == 0:
            return empty
        messages = plan_messages(delivered)
        found, at = lookup(keys_of(self._index, failed), keys_of(self._index, messages))
        seqs = messages["delivery_seq"].to_numpy()[found]
        counts = failed["backout_count"].to_numpy()[at[found]]
        by_seq = np.argsort(seqs)
        return seqs[by_seq], counts[by_seq].astype(np.int32)

    def _isolation(self, candidates: pa.Table) -> int | None:
        """The most units the next batch may hold: the ``batch_limit`` of the message at the head of
        the logical order when it was returned from a plan given up (None: no such limit)."""
        if candidates.num_rows == 0:
            return None
        returned = self.state.events(self.consumer, (EventKind.RETURN,), ["origin", "row", "batch_limit"])
        returned = returned.filter(pc.is_valid(returned["batch_limit"]))
        if returned.num_rows == 0:
            return None
        keys = keys_of(self._index, returned)
        head = self._index.keys(candidates.slice(0, 1))
        mine = returned["batch_limit"].filter(pa.array(keys == head[0]))
        return int(pc.min(mine).as_py()) if len(mine) else None

    def record(self, plan_id: str, seq: int, plan: pa.Table, check: Callable[[], None] | None = None) -> None:
        """Record plan ``plan_id`` as the group's plan number ``seq``, with the consumption records
        not yet recorded, in one state commit (once ``check`` passes, when given)."""
        # A get's claim is locked from this record: stamped by the clock its lock is judged by.
        self.flush(plan_rows(self.consumer, self.owner, plan_id, seq, plan, self.state.clock.now()), check)
        self.plans[plan_id] = plan


def _refuse_a_lost_history(state: ConsumerState, definition: QueueDefinition, consumer: str, resumes_at: int) -> None:
    """A query resuming from a checkpoint whose batches the group has no record of: the group was
    deleted or expired since. Going on would deliver again everything that query delivered."""
    if resumes_at and state.last_position(consumer)[0] < resumes_at:
        raise MQError(
            f"queue {definition.name}: consumer group {consumer!r} has no record of the batches this query's "
            f"checkpoint says it consumed (up to batch plan {resumes_at}): the group was deleted, or expired "
            f"after {definition.consumer_group_expiry:g} s without a read (consumer_group_expiry), and going on "
            "would deliver those messages again; start the query with a new checkpointLocation to read the "
            "group from the start",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        )


def _warn_of_a_new_group(state: ConsumerState, consumer: str) -> None:
    """A reader of a group the queue does not have, beside groups it has, may be a misspelling: say so
    once, as it starts the group (declaring the group first creates it on purpose, without this)."""
    groups = state.groups()
    if groups and consumer not in groups:
        _log.warning(
            "queue %s: consumer group %r is new: it reads every message still on the queue, and messages wait "
            "for it from now on; the queue's groups were %s (declare a group first to create it on purpose)",
            state.queue,
            consumer,
            ", ".join(groups),
        )
