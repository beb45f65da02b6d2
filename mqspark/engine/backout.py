"""Failed messages (spec sections 1, 5 and 9): backout counts, the retry delay, and the move to the
backout, error or dead-letter queue when a message has failed too often.

A delivery of a message to a consumer group fails in one of two ways:

- **explicitly**: the consumer gives the message back with :func:`backout` (inside ``foreachBatch``);
  the batch itself succeeds, and the message is not consumed with it;
- **implicitly**: the batch fails and Spark replays it (a rolled-back unit of work).

Each failure is a row of the queue's state table (:mod:`mqspark.engine.state_rows`): ``backout`` for an
explicit one, ``rollback`` for a replayed plan, with the plan it happened in. A message's
``backout_count`` for a group is the number of its failures. A failure **pinpoints** its message
when it was explicit, or when the replayed plan delivered that message alone; a failed batch of many
messages says nothing about which of them is bad, so only a pinpointed failure can move a message.

A failed message is redelivered to its group no sooner than the queue's ``retry_delay`` after the
failure; later items of its message group wait behind it, other messages flow past.

**Poison messages** (no crash loop). A replay delivers the same messages as the batch it replays,
because mqspark cannot know whether the failed attempt's processing committed. When the replay
fails too, the batch is not a passing failure: the next replay of that plan is **given up**. It
delivers nothing, and its messages go back to the queue (``return`` rows with a ``batch_limit``)
to be delivered in batches of at most 1/:data:`ISOLATE_FACTOR` of the plan's size, whenever one of
them is at the head of the logical order. A bad message so ends, after a few rounds, in a batch of
its own, whose failure pinpoints it; the others are processed on the way. A batch that failed in
its sink never committed there, so giving it up loses and duplicates nothing. A replay cannot tell
that from a driver killed after the sink committed (twice in a row on one batch): the sink then
sees the messages again.

**The limit** (:class:`BackoutPolicy`). MQ's rule applies when ``backout_threshold`` > 0: at that
many failures the message moves to ``backout_queue``, or to the dead-letter queue when none is named
(reason 2362, ``MQRC_BACKOUT_THRESHOLD_REACHED``). Tuxedo's rule applies otherwise, and also beside
MQ's when ``retry_count`` > 0 or ``error_queue`` is named: after ``retry_count`` retries (failure
``retry_count + 1``) the message moves to ``error_queue``, or to the dead-letter queue (reason
:attr:`Reason.MQFB_RETRIES_EXHAUSTED`). When both apply, the limit reached first wins; at a tie, MQ's.
A queue with none of these set moves a message at its :data:`DEFAULT_DELIVERY_LIMIT`-th failure, by
Tuxedo's rule (to its ``failure_queue`` or the dead-letter queue): one passing error must not cost
a message its place, and a poison message must not come back for ever (MQ's BOTHRESH 0 never moves
it, Tuxedo's retry count 0 moves it at once; Kafka share groups stop at 5 deliveries, Service Bus at
10).

**The move** happens exactly once across crashes, through the state table:

1. a ``move`` record names the messages, the target queue and the Delta transaction version the
   put will carry (one past the target's last for this queue and group);
2. the put to the target carries that ``txn``, so a put done before a crash is never repeated;
3. a ``consumed`` record for the move takes the messages off the queue for the group.

A move recorded but not consumed is finished before anything else is planned for the group, and
maintenance keeps its messages meanwhile. When the target refuses the put (full, put-inhibited), an
``abandoned`` record ends the move and the messages stay; a move to a backout or error queue then
goes to the dead-letter queue instead. The target does not check the copies' message groups as it
checks a producer's put: each consumer group that failed a group item moves its own copy there.
The moved copy carries the dead-letter header (reason, a text with the last error given, original
queue and queue manager, the consumer group that moved it, time) and its ``backout_count``.

**Redrive** (:mod:`mqspark.engine.redrive`) moves messages of a backout, error or dead-letter queue
back to their original queue the same way, under the consumer group ``mqspark.redrive`` of that
queue, with the header cleared and the backout count reset, in the order they arrived there; a
copy a group moved goes back for that group only (``redriven_for``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.pending import lookup
from mqspark.engine.state_commit import Stale
from mqspark.engine.state_rows import STATE_SCHEMA, EventKind, event_rows, failure_rows, move_rows
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.dead_letter import dead_letter
from mqspark.model.definitions import QueueDefinition, validate_name
from mqspark.model.groups import group_items
from mqspark.model.messages import MESSAGE_SCHEMA, QUEUE_TABLE_SCHEMA, TIMESTAMP, replace_column
from mqspark.model.ranges import RANGE_COLUMNS, expand_ranges, overlap_counts, single_ranges

if TYPE_CHECKING:
    from mqspark.engine.pending import PendingMessages
    from mqspark.engine.queues import Queues

FAILURE_EVENTS = (EventKind.BACKOUT, EventKind.ROLLBACK)
# The error text of a rolled-back delivery (the batch failed and was replayed).
ROLLED_BACK = "MQRC_BACKED_OUT (2003): the micro-batch that delivered it failed and was replayed"
# The error text of a Python get's messages whose lock passed before the get ended (see :mod:`mqspark.engine.get`).
LOCK_EXPIRED = "MQRC_BACKED_OUT (2003): the get that claimed it did not end within the queue's lock_duration"
# The error text of messages a Python get gave back unprocessed (not a failure).
RELEASED = "released: the get that claimed it gave it back unprocessed"
# The error text of the messages of a plan given up after its replay failed too.
GIVEN_UP = "returned in smaller batches: the micro-batch that delivered it failed again when replayed"
# A plan given up is delivered again in batches of about 1/ISOLATE_FACTOR of its size.
ISOLATE_FACTOR = 16
# The failures at which a message moves to the dead-letter queue when its queue sets no limit.
DEFAULT_DELIVERY_LIMIT = 5
# The error text of a later item of a message group, returned with an item backed out before it.
HELD_BEHIND = "returned behind an earlier item of its message group that was backed out"
IDENTITY_SCHEMA = pa.schema([pa.field("origin", pa.string()), pa.field("row", pa.int64())])
FAILURE_SCHEMA = pa.schema(
    [
        pa.field("origin", pa.string()),
        pa.field("row", pa.int64()),
        pa.field("backout_count", pa.int32()),
        pa.field("failed_at", TIMESTAMP),
        pa.field("error", pa.string()),
        pa.field("pinpointed", pa.bool_()),
    ]
)


@dataclass(frozen=True)
class Destination:
    """Where a message that failed too often goes, and why."""

    queue: str
    reason: Reason
    text: str


@dataclass(frozen=True)
class BackoutPolicy:
    """A queue's failure attributes, and the rule that decides when a failed message moves."""

    queue: str
    qmgr: str
    backout_threshold: int
    backout_queue: str | None
    retry_count: int
    retry_delay: timedelta
    error_queue: str | None
    dead_letter_queue: str

    @classmethod
    def of(cls, qm: Queues, definition: QueueDefinition) -> BackoutPolicy:
        return cls(
            queue=definition.name,
            qmgr=qm.name,
            backout_threshold=definition.backout_threshold,
            backout_queue=definition.backout_queue,
            retry_count=definition.retry_count,
            retry_delay=timedelta(seconds=definition.retry_delay),
            error_queue=definition.error_queue,
            dead_letter_queue=qm.dead_letter_queue,
        )

    def limits(self) -> tuple[int | None, int | None]:
        """The failure count at which MQ's rule and Tuxedo's rule move a message (None: not in force);
        with neither configured, Tuxedo's rule at :data:`DEFAULT_DELIVERY_LIMIT`."""
        mq = self.backout_threshold if self.backout_threshold > 0 else None
        if self._tuxedo_set():
            return mq, self.retry_count + 1
        return mq, None if mq is not None else DEFAULT_DELIVERY_LIMIT

    def _tuxedo_set(self) -> bool:
        return self.retry_count > 0 or bool(self.error_queue)

    def destination(self, backout_count: int, error: str | None) -> Destination | None:
        """Where a message with ``backout_count`` failures goes now; None while it is retried."""
        mq, tuxedo = self.limits()
        last = f"; last error: {error}" if error else ""
        if mq is not None and backout_count >= mq and (tuxedo is None or mq <= tuxedo):
            return Destination(
                self.backout_queue or self.dead_letter_queue,
                Reason.MQRC_BACKOUT_THRESHOLD_REACHED,
                f"backout count {backout_count} reached the backout threshold {mq} of queue {self.queue}{last}",
            )
        if tuxedo is not None and backout_count >= tuxedo:
            limit = f"retry count {self.retry_count} of queue {self.queue}"
            if not self._tuxedo_set():
                limit = f"default delivery limit {tuxedo} of queue {self.queue} (it sets no limit)"
            return Destination(
                self.error_queue or self.dead_letter_queue,
                Reason.MQFB_RETRIES_EXHAUSTED,
                f"{limit} used up after {backout_count} failed deliveries{last}",
            )
        return None


def check_error_text(error: str, what: str) -> None:
    """Refuse a backout's error that is not a non-empty text, in one line starting with ``what``."""
    if not isinstance(error, str) or not error:
        raise MQValidationError(f"{what} must be a non-empty text, got {error!r}")


def failures(state: ConsumerState, consumer: str, unrecorded: Sequence[pa.Table] = ()) -> pa.Table:
    """Each failed message of the group: its ``backout_count``, the time and error of its last
    failure, and whether that failure was ``pinpointed`` (see the module doc). With the failures
    among ``unrecorded`` state rows (to commit with the next plan) too, when given.

    A failure is counted once per plan and kind, however often it was recorded."""
    pending = [
        rows.filter(pc.and_(pc.equal(rows["consumer"], consumer), pc.is_in(rows["event"], pa.array(FAILURE_EVENTS))))
        for rows in unrecorded
    ]
    if any(rows.num_rows for rows in pending):
        return _failures(pa.concat_tables([_failure_events(state, consumer), *(r.select(_COLUMNS) for r in pending)]))
    return state.derived(("failures", consumer), lambda: _failures(_failure_events(state, consumer)))


# The columns of a failure record that counting failures reads.
_COLUMNS = ["event", "plan_id", "seq", "origin", "row", "at", "error"]


def _failure_events(state: ConsumerState, consumer: str) -> pa.Table:
    return state.events(consumer, FAILURE_EVENTS, _COLUMNS)


def _failures(rows: pa.Table) -> pa.Table:
    if rows.num_rows == 0:
        return FAILURE_SCHEMA.empty_table()
    # Each replay of a plan (numbered in ``seq``) is a failure of its own.
    rows = rows.group_by(["origin", "row", "event", "plan_id", "seq"], use_threads=False).aggregate(
        [("at", "min"), ("error", "first")]
    )
    # A replayed plan of one message pinpoints it as surely as an explicit backout.
    sizes = (
        rows.filter(pc.equal(rows["event"], EventKind.ROLLBACK))
        .group_by(["plan_id", "seq"], use_threads=False)
        .aggregate([("row", "count")])
    )
    alone = sizes.filter(pc.equal(sizes["row_count"], 1))["plan_id"]
    pinpointed = pc.or_(pc.equal(rows["event"], EventKind.BACKOUT), pc.is_in(rows["plan_id"], value_set=alone))
    rows = rows.append_column("pinpointed", pinpointed)
    rows = rows.take(pc.sort_indices(rows, [("at_min", "ascending")]))
    counted = rows.group_by(["origin", "row"], use_threads=False).aggregate(
        [("event", "count"), ("at_min", "max"), ("error_first", "last"), ("pinpointed", "last")]
    )
    return pa.table(
        {
            "origin": counted["origin"],
            "row": counted["row"],
            "backout_count": pc.cast(counted["event_count"], pa.int32()),
            "failed_at": counted["at_min_max"],
            "error": counted["error_first_last"],
            "pinpointed": counted["pinpointed_last"],
        },
        schema=FAILURE_SCHEMA,
    )


def plan_messages(plan: pa.Table) -> pa.Table:
    """The delivered messages of a recorded plan, one row each: ``origin``, ``row``, ``delivery_seq``."""
    plan = plan.filter(pc.is_valid(plan["delivery_seq"]))
    count = plan["count"].to_numpy()
    return pa.table(
        {
            "origin": plan["origin"].take(pa.array(np.repeat(np.arange(plan.num_rows), count))),
            "row": pa.array(expand_ranges(plan["row"].to_numpy(), count)),
            "delivery_seq": pa.array(expand_ranges(plan["delivery_seq"].to_numpy(), count)),
        }
    )


def backout(rows: Any, error: str, *, root: str, consumer: str = "default") -> int:
    """Give back messages of the batch being processed, inside ``foreachBatch``: they are not consumed
        with the batch, count one failed delivery each (later items of their message groups in the batch go
    back with them, uncounted), and come back after the queue's retry delay (or
        move once they have failed too often). Returns how many messages were backed out.

        ``rows`` are delivered rows of the batch (a Spark DataFrame, a pyarrow Table, or a list of dicts)
        with at least their ``queue`` and ``delivery_seq``; ``root`` is the queue manager root and
        ``consumer`` the consumer group the query reads for. Backing out the same messages again when a
        batch is replayed records them once. Rows that are not in the group's current batch are refused
        and nothing is recorded.
    """
    from mqspark.engine.queues import Queues

    check_error_text(error, "backout: error")
    validate_name(consumer, "consumer group")
    table = _as_table(rows)
    missing = [name for name in ("queue", "delivery_seq") if name not in table.column_names]
    if missing:
        raise MQValidationError(f"backout: rows lack the column(s) {', '.join(missing)} of delivered messages")
    if table.num_rows == 0:
        return 0
    queues = pc.unique(table["queue"]).to_pylist()
    if len(queues) != 1 or queues[0] is None:
        raise MQValidationError(f"backout: rows come from more than one queue: {sorted(map(str, queues))}")
    qm = Queues.open(root)
    queue = qm.resolve_for_get(queues[0]).name
    state = ConsumerState(qm.root, queue, qm.storage_options)
    plan_id, owner, plan = state.current_plan(consumer)
    wanted = pc.unique(table["delivery_seq"].cast(pa.int64()))
    delivered = plan_messages(plan if plan is not None else STATE_SCHEMA.empty_table())
    known = pc.is_in(wanted, value_set=delivered["delivery_seq"])
    if not pc.all(known).as_py():
        strangers = sorted(wanted.filter(pc.invert(known)).to_pylist())
        shown = ", ".join(map(str, strangers[:10])) + (" ..." if len(strangers) > 10 else "")
        raise MQValidationError(
            f"backout: queue {queue}: delivery_seq {shown} not in the batch consumer group {consumer!r} "
            "is processing; nothing was backed out"
        )
    chosen = delivered.filter(pc.is_in(delivered["delivery_seq"], value_set=wanted))
    done = state.events(consumer, (EventKind.BACKOUT,), ["origin", "row"], plan_id=plan_id)
    if done.num_rows:
        seen = pc.is_in(
            pc.binary_join_element_wise(chosen["origin"], pc.cast(chosen["row"], pa.string()), ":"),
            value_set=pc.binary_join_element_wise(done["origin"], pc.cast(done["row"], pa.string()), ":"),
        )
        chosen = chosen.filter(pc.invert(seen))
    if chosen.num_rows:
        assert plan_id is not None, "rows were chosen from the current plan"
        state.append(failure_rows(consumer, owner, EventKind.BACKOUT, plan_id, chosen.select(["origin", "row"]), error))
    return int(len(wanted))


def _as_table(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, Sequence):
        return pa.Table.from_pylist(list(rows))
    if hasattr(rows, "toArrow"):
        return rows.select("queue", "delivery_seq").toArrow()
    raise MQValidationError(f"backout: rows must be a DataFrame, a pyarrow Table or a list of dicts, not {type(rows)}")


class Transfer:
    """Moves messages of a queue, for one consumer group, to other queues exactly once: a ``move``
    record first, then the put carrying the record's ``txn`` version, then the record's consumption
    (see the module doc). ``copy`` turns the messages as stored, with their ``move`` rows, into the
    copies to put. ``group_rules``: whether the target checks the copies' message groups as it checks
    a producer's put (not on a backout, error or dead-letter queue, which holds a copy of the same
    group item for each consumer group that failed it; nor for a copy redriven for one group)."""

    def __init__(
        self,
        qm: Queues,
        queue: str,
        state: ConsumerState,
        consumer: str,
        owner: str,
        app_id: str,
        copy: Callable[[pa.Table, pa.Table], pa.Table],
        group_rules: bool,
    ) -> None:
        self.qm, self.queue, self.state, self.consumer, self.owner = qm, queue, state, consumer, owner
        self.app_id, self.copy, self.group_rules = app_id, copy, group_rules

    def finish_pending(self, pending: PendingMessages) -> pa.Table:
        """Finish moves recorded but not consumed (a crash came between); their identities."""
        moves = self.state.pending_moves(self.consumer)
        finished = [IDENTITY_SCHEMA.empty_table()]
        for move_id in pc.unique(moves["plan_id"]).to_pylist():
            mine = moves.filter(pc.equal(moves["plan_id"], move_id))
            self._put(mine, pending)
            self.state.append(event_rows(self.consumer, self.owner, EventKind.CONSUMED, plan_id=move_id))
            finished.append(mine.select(IDENTITY_SCHEMA.names))
        return pa.concat_tables(finished)

    def transfer(self, chosen: pa.Table, target: str, pending: PendingMessages, **given: pa.Array) -> None:
        """Move the messages ``chosen`` (``origin``, ``row``) to queue ``target``; ``given`` are more
        columns of their ``move`` rows (``delivery_seq``, ``reason``, ``error``)."""
        table = store.open_table(store.queue_location(self.qm.root, target), self.qm.storage_options)
        committed = table.transaction_version(self.app_id) if table is not None else None
        move_id = uuid.uuid4().hex
        rows = move_rows(self.consumer, self.owner, move_id, (committed or 0) + 1, chosen, target, **given)
        self.state.append(rows, self._alone(target, committed, chosen))
        try:
            self._put(rows, pending)
        except MQError as refused:
            # The target refused the put (full, inhibited, group rules): nothing moved, the messages stay.
            if refused.reason == Reason.MQRC_BACKED_OUT:
                raise
            self.state.append(event_rows(self.consumer, self.owner, EventKind.ABANDONED, plan_id=move_id))
            raise
        self.state.append(event_rows(self.consumer, self.owner, EventKind.CONSUMED, plan_id=move_id))

    def _alone(self, target: str, committed: int | None, chosen: pa.Table) -> Callable[[], None]:
        """A check that no other move of the group was recorded since ``target``'s ``txn`` version was
        read as ``committed``, and none is under way (recorded, neither consumed nor abandoned): moves
        of competing gets go one at a time, each with its own version, and none moves a message
        another moved meanwhile (:class:`Stale` otherwise). Two moves under way at once would carry
        the same version, and the later put would be skipped as a repeat, its messages lost for the
        group. The messages ``chosen`` must not be consumed either: a compaction folds finished moves
        into the group's consumed ranges, so a move by another process that finished and was folded
        meanwhile shows only as its messages consumed."""
        seen = set(self.state.events(self.consumer, (EventKind.MOVE,), ["plan_id"])["plan_id"].to_pylist())
        wanted = single_ranges(chosen)

        def check() -> None:
            moves = set(self.state.events(self.consumer, (EventKind.MOVE,), ["plan_id"])["plan_id"].to_pylist())
            table = store.open_table(store.queue_location(self.qm.root, target), self.qm.storage_options)
            now = table.transaction_version(self.app_id) if table is not None else None
            taken = overlap_counts(wanted, self.state.consumed_ranges(self.consumer)).any()
            if moves - seen or now != committed or taken or self._under_way().num_rows:
                raise Stale(f"queue {self.queue}: consumer group {self.consumer!r} moved messages since")

        return check

    def _under_way(self) -> pa.Table:
        """The ranges of the group's moves neither finished nor abandoned."""
        rows = self.state.events(
            self.consumer,
            (EventKind.MOVE, EventKind.CONSUMED, EventKind.ABANDONED),
            ["event", "plan_id", *RANGE_COLUMNS],
        )
        ended = rows.filter(pc.invert(pc.equal(rows["event"], EventKind.MOVE)))["plan_id"]
        moves = pc.and_(pc.equal(rows["event"], EventKind.MOVE), pc.invert(pc.is_in(rows["plan_id"], value_set=ended)))
        return rows.filter(moves).select(RANGE_COLUMNS)

    def _put(self, move: pa.Table, pending: PendingMessages) -> None:
        """Put the copies a ``move`` record names on its target, once (the ``txn`` check)."""
        target = move["target"][0].as_py()
        version = move["seq"][0].as_py()
        file, file_row = pending.locate(pending.range_keys(move.select(["origin", "row", "count"])))
        if (file < 0).any():
            raise MQError(
                f"queue {self.queue}: a message to move to {target} is no longer in the queue", Reason.MQRC_BACKED_OUT
            )
        location = store.queue_location(self.qm.root, self.queue)
        pieces = []
        for number in np.unique(file):
            rows = file_row[file == number]
            data = store.read_data_rows(
                location, pending.files[number], int(rows.min()), int(rows.max()) + 1, MESSAGE_SCHEMA.names
            )
            pieces.append(data.take(pa.array(rows - rows.min())).select(MESSAGE_SCHEMA.names))
        # Back in the order of the move rows, which is the order the copies are put in.
        order = np.argsort(np.concatenate([np.flatnonzero(file == n) for n in np.unique(file)]))
        messages = pa.concat_tables(pieces).cast(MESSAGE_SCHEMA).take(pa.array(order))
        count = messages.num_rows
        messages = replace_column(messages, "put_time", pa.repeat(pa.scalar(datetime.now(UTC), TIMESTAMP), count))
        messages = replace_column(messages, "put_seq", pa.array(np.arange(count, dtype=np.int64)))
        messages = self.copy(messages, move)
        data = store.write_data_file(
            store.queue_location(self.qm.root, target), messages.to_batches(), QUEUE_TABLE_SCHEMA
        )
        assert data is not None, "a move names at least one message"
        # A copy redriven for one group is not checked: the queue may still hold the item itself.
        checked = messages.filter(pc.is_null(messages["redriven_for"])) if self.group_rules else messages.slice(0, 0)
        self.qm.puts.commit_put(
            target,
            [data],
            group_items(checked),
            transaction=(self.app_id, version),
            metadata={"mqspark.moved_from": self.queue},
        )


class Mover:
    """Moves a consumer group's messages that failed too often, exactly once (see the module doc)."""

    def __init__(self, qm: Queues, policy: BackoutPolicy, state: ConsumerState, consumer: str, owner: str):
        self.qm, self.policy, self.consumer = qm, policy, consumer
        app_id = f"mqspark.backout/{policy.qmgr}/{policy.queue}/{consumer}"
        self.transfer = Transfer(qm, policy.queue, state, consumer, owner, app_id, self._copy, group_rules=False)

    def finish_pending(self, pending: PendingMessages) -> pa.Table:
        """Finish moves a crash interrupted; their identities."""
        return self.transfer.finish_pending(pending)

    def move(self, failed: pa.Table, pending: PendingMessages) -> pa.Table:
        """Move the messages of ``failed`` (:data:`FAILURE_SCHEMA` rows) that reached the limit with a
        pinpointed failure; their identities."""
        destinations = [
            self.policy.destination(count, error) if pinpointed else None
            for count, error, pinpointed in zip(
                failed["backout_count"].to_pylist(),
                failed["error"].to_pylist(),
                failed["pinpointed"].to_pylist(),
                strict=True,
            )
        ]
        self._to_failure_queues(failed, destinations, pending)
        targets: dict[Destination, list[int]] = {}
        for index, destination in enumerate(destinations):
            if destination is not None:
                targets.setdefault(destination, []).append(index)
        moved = [IDENTITY_SCHEMA.empty_table()]
        for destination, indices in targets.items():
            chosen = failed.take(pa.array(indices))
            destination = self._available(destination)
            try:
                self._transfer(chosen, destination, pending)
            except MQError as refused:
                if destination.queue == self.policy.dead_letter_queue or refused.reason == Reason.MQRC_BACKED_OUT:
                    raise
                text = f"{destination.text}; not moved to {destination.queue}: {refused}"
                fallback = Destination(self.policy.dead_letter_queue, destination.reason, text)
                self._transfer(chosen, fallback, pending)
            moved.append(chosen.select(IDENTITY_SCHEMA.names))
        return pa.concat_tables(moved)

    def _to_failure_queues(
        self, failed: pa.Table, destinations: list[Destination | None], pending: PendingMessages
    ) -> None:
        """Tuxedo's rule sends a message that names its ``failure_queue`` there, not to the error queue."""
        retried = [i for i, d in enumerate(destinations) if d is not None and d.reason == Reason.MQFB_RETRIES_EXHAUSTED]
        if not retried:
            return
        # The keys first: finding them may read files into the index.
        wanted = pending.range_keys(single_ranges(failed.take(pa.array(retried))))
        found, at = lookup(pending.keys(), wanted)
        rows = pending.rows.take(pa.array(at[found]))
        named = pending.read_columns(rows, ["failure_queue"])["failure_queue"].to_pylist()
        for index, queue in zip(np.array(retried)[found], named, strict=True):
            if queue:
                destination = destinations[index]
                destinations[index] = Destination(queue, destination.reason, destination.text)

    def _transfer(self, chosen: pa.Table, destination: Destination, pending: PendingMessages) -> None:
        count = chosen.num_rows
        self.transfer.transfer(
            chosen,
            self.qm.resolve_for_put(destination.queue).name,
            pending,
            delivery_seq=pc.cast(chosen["backout_count"], pa.int64()),
            reason=pa.repeat(pa.scalar(int(destination.reason), pa.int32()), count),
            error=pa.repeat(destination.text, count),
        )

    def _available(self, destination: Destination) -> Destination:
        """``destination``, or the dead-letter queue when its queue cannot take the messages (deleted
        since it was named, or put-inhibited), as MQ does."""
        if destination.queue == self.policy.dead_letter_queue:
            return destination
        try:
            self.qm.resolve_for_put(destination.queue)
        except MQError as unavailable:
            return Destination(
                self.policy.dead_letter_queue, destination.reason, f"{destination.text}; not moved to {unavailable}"
            )
        return destination

    def _copy(self, messages: pa.Table, move: pa.Table) -> pa.Table:
        """The copy with its dead-letter header, naming the group that moved it, and backout count (kept
        in the move's ``delivery_seq``); on the target it is for every group (a redriven copy that
        failed again is no longer only for this one)."""
        messages = replace_column(messages, "backout_count", move["delivery_seq"])
        messages = replace_column(messages, "redriven_for", pa.nulls(messages.num_rows, pa.string()))
        at = datetime.now(UTC)
        return dead_letter(
            messages, move["reason"], move["error"], self.policy.queue, self.policy.qmgr, at, self.consumer
        )
