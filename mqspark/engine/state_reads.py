"""What a queue's state table says of its consumer groups (:class:`StateReads`): a group's rows by
event, plan or time, which groups exist and which are idle, what each consumed and what is in flight,
its position, the batch a streaming query has under way, Python gets' claims and unfinished moves.
Every answer is read from the rows of one :class:`~mqspark.engine.state_table.StateTable` handle;
the events are :mod:`mqspark.engine.state_rows`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from mqspark.engine.state_rows import GET_OWNER, STATE_SCHEMA, EventKind, claims_of, consumed_of, position_of
from mqspark.engine.state_table import StateTable
from mqspark.errors import MQError, Reason
from mqspark.model.messages import TIMESTAMP
from mqspark.model.ranges import KEY_COLUMNS, RANGE_COLUMNS


@dataclass(frozen=True)
class Claims:
    """The Python gets' claims of a consumer group at one moment (see :meth:`StateReads.claims`):
    the plan rows of those whose lock runs, with each one's ``expiry``, and the plans of those whose
    lock has passed and whose messages no one has taken back yet."""

    live: pa.Table
    expired: dict[str, pa.Table]


@dataclass(frozen=True)
class GroupsSnapshot:
    """The counted consumer groups of a queue at one moment: each one's consumed messages, and the
    messages of every group's plans not yet consumed (``origin``/``row``/``count`` ranges)."""

    groups: list[str]
    consumed: dict[str, pa.Table]
    in_flight: pa.Table

    def require(self, queue: str, consumer: str) -> None:
        """Refuse (2085) a question about a group the queue does not have: a misspelt group must not
        be answered with a number."""
        if consumer not in self.groups:
            raise MQError(
                f"queue {queue} has no consumer group {consumer!r}; its groups: {', '.join(self.groups) or 'none'} "
                "(a group exists once declared, or once it first reads)",
                Reason.MQRC_UNKNOWN_OBJECT_NAME,
            )


class StateReads:
    """The questions asked of one state table's rows (a :class:`StateTable` handle)."""

    def __init__(self, table: StateTable) -> None:
        self._table = table

    def events(
        self,
        consumer: str,
        events: tuple[EventKind, ...] | None = None,
        columns: list[str] | None = None,
        plan_id: str | None = None,
        since: datetime | None = None,
    ) -> pa.Table:
        """The group's recorded rows (of the given ``events``, of one plan, recorded at or after
        ``since``), in no particular order. Kept until the rows change: an idle streaming query asks
        for the monitor's abort and a switchover on every trigger, tens of times a second."""
        key = ("events", consumer, events, None if columns is None else tuple(columns), plan_id, since)
        return self._table.derived(key, lambda: self._events(consumer, events, columns, plan_id, since))

    def _events(
        self,
        consumer: str,
        events: tuple[EventKind, ...] | None,
        columns: list[str] | None,
        plan_id: str | None,
        since: datetime | None,
    ) -> pa.Table:
        rows = self._table.rows()
        # Compute kernels on the columns: a filter expression would start an Acero plan per question.
        mask = pc.equal(rows["consumer"], consumer)
        if events is not None:
            mask = pc.and_(mask, pc.is_in(rows["event"], pa.array(events, pa.string())))
        if plan_id is not None:
            mask = pc.and_(mask, pc.fill_null(pc.equal(rows["plan_id"], plan_id), False))
        if since is not None:
            mask = pc.and_(mask, pc.greater_equal(rows["at"], pa.scalar(since, TIMESTAMP)))
        return (rows.select(columns) if columns is not None else rows).filter(mask)

    def groups(self) -> list[str]:
        """The consumer groups that count for the queue's depth, by name: those with records in the
        table (they have read the queue, or were declared on it)."""
        return sorted(pc.unique(self._table.rows()["consumer"]).to_pylist())

    def idle_groups(self, expiry: timedelta, now: datetime) -> dict[str, datetime]:
        """The groups with nothing recorded for longer than ``expiry``, with their newest record's time.
        Every read, lease renewal and declaration is a record, and compaction keeps the newest time."""
        newest = self._table.rows().group_by("consumer", use_threads=False).aggregate([("at", "max")])
        return {
            consumer: at
            for consumer, at in zip(newest["consumer"].to_pylist(), newest["at_max"].to_pylist(), strict=True)
            if at < now - expiry
        }

    def consumed_plans(self, consumer: str) -> pa.Array:
        ids = self.events(consumer, (EventKind.CONSUMED,), ["plan_id"])["plan_id"]
        return pc.unique(ids.combine_chunks() if ids.num_chunks else pa.array([], pa.string()))

    def consumed_ranges(self, consumer: str) -> pa.Table:
        """``origin``, ``row`` and ``count`` of the messages the group has consumed or discarded."""
        return consumed_of(
            self.events(
                consumer,
                (
                    EventKind.PLAN,
                    EventKind.CHECKPOINT,
                    EventKind.CONSUMED,
                    EventKind.MOVE,
                    EventKind.BACKOUT,
                    EventKind.RETURN,
                ),
            )
        )

    def all_groups(self) -> GroupsSnapshot:
        """Every counted group's consumed messages, and the messages of plans not yet consumed (which a
        replay may still deliver), from one read of the table; kept until the rows change."""
        return self._table.derived(("all_groups",), self._all_groups)

    def _all_groups(self) -> GroupsSnapshot:
        rows = self._table.rows()
        groups = sorted(pc.unique(rows["consumer"]).to_pylist())
        consumed = {g: consumed_of(rows.filter(pc.equal(rows["consumer"], g))) for g in groups}
        # Plans after a group's last consumed one may still run; earlier ones were rolled back.
        in_flight = []
        for group in groups:
            mine = rows.filter(pc.equal(rows["consumer"], group))
            event = mine["event"]
            done = mine.filter(pc.is_in(event, pa.array([EventKind.CONSUMED, EventKind.CHECKPOINT])))
            abandoned = mine.filter(pc.equal(event, EventKind.ABANDONED))["plan_id"]
            position = pc.max(done["seq"]).as_py()
            waiting = pc.and_(pc.equal(event, EventKind.PLAN), pc.invert(pc.is_in(mine["plan_id"], done["plan_id"])))
            if position is not None:
                # A Python get's claim holds its messages until it is consumed or rolled back.
                waiting = pc.and_(waiting, pc.or_(pc.greater(mine["seq"], position), claims_of(mine)))
            ended = pa.concat_arrays([done["plan_id"].combine_chunks(), abandoned.combine_chunks()])
            moving = pc.and_(pc.equal(event, EventKind.MOVE), pc.invert(pc.is_in(mine["plan_id"], ended)))
            in_flight.append(mine.filter(pc.or_(waiting, moving)).select(RANGE_COLUMNS))
        in_flight = pa.concat_tables(in_flight) if in_flight else STATE_SCHEMA.empty_table().select(RANGE_COLUMNS)
        return GroupsSnapshot(groups, consumed, in_flight)

    def plan(self, consumer: str, plan_id: str) -> pa.Table:
        """The ranges of one recorded plan (a duplicate recording of the same plan counts once)."""
        rows = self.events(consumer, (EventKind.PLAN,), plan_id=plan_id)
        return (
            rows.select([*RANGE_COLUMNS, "delivery_seq", "partition"])
            .group_by(KEY_COLUMNS, use_threads=False)
            .aggregate([("count", "first"), ("delivery_seq", "first"), ("partition", "first")])
            .rename_columns([*RANGE_COLUMNS, "delivery_seq", "partition"])
        )

    def last_position(self, consumer: str) -> tuple[int, int]:
        """The group's last plan sequence number and the next ``delivery_seq`` (0, 0 for a new group)."""
        return position_of(
            self.events(consumer, (EventKind.PLAN, EventKind.CHECKPOINT), ["event", "seq", "count", "delivery_seq"])
        )

    def consumed_position(self, consumer: str) -> tuple[int, int]:
        """Like :meth:`last_position`, counting only the plans that were consumed."""
        rows = self.events(
            consumer,
            (EventKind.PLAN, EventKind.CHECKPOINT, EventKind.CONSUMED),
            ["event", "plan_id", "seq", "count", "delivery_seq"],
        )
        event = rows["event"]
        done = rows.filter(pc.equal(event, EventKind.CONSUMED))["plan_id"]
        consumed_plans = pc.and_(pc.equal(event, EventKind.PLAN), pc.is_in(rows["plan_id"], value_set=done))
        return position_of(rows.filter(pc.or_(consumed_plans, pc.equal(event, EventKind.CHECKPOINT))))

    def current_plan(self, consumer: str) -> tuple[str | None, str, pa.Table | None]:
        """The last plan a streaming query of the group recorded, when it is not consumed yet (the
        batch being processed): its id, its owner and its ranges; (None, "", None) when there is
        none. Python gets' plans are claims (see :meth:`claims`), not batches."""
        rows = self.events(
            consumer, (EventKind.PLAN, EventKind.CONSUMED, EventKind.CHECKPOINT), ["event", "plan_id", "seq", "owner"]
        )
        queries = pc.invert(pc.starts_with(rows["owner"], GET_OWNER))
        plans = rows.filter(pc.and_(pc.equal(rows["event"], EventKind.PLAN), queries))
        if plans.num_rows == 0:
            return None, "", None
        last = plans.take(pc.sort_indices(plans, [("seq", "descending")]))
        plan_id, owner, seq = (last[name][0].as_py() for name in ("plan_id", "owner", "seq"))
        done = rows.filter(pc.not_equal(rows["event"], EventKind.PLAN))
        position = pc.max(done["seq"]).as_py()
        if plan_id in done["plan_id"].to_pylist() or (position is not None and seq <= position):
            return None, "", None
        return plan_id, owner, self.plan(consumer, plan_id)

    def claims(self, consumer: str, lock: timedelta, now: datetime | None = None) -> Claims:
        """The group's claims: plans of Python gets (owner :data:`GET_OWNER` ...) neither consumed nor
        rolled back. A claim's lock runs ``lock`` from its plan's or its newest ``renew`` record."""
        rows = self.events(
            consumer,
            (EventKind.PLAN, EventKind.CONSUMED, EventKind.ROLLBACK, EventKind.RENEW),
            ["event", "plan_id", "owner", "at"],
        )
        event = rows["event"]
        consumed = rows.filter(pc.equal(event, EventKind.CONSUMED))["plan_id"]
        open_ = rows.filter(pc.and_(claims_of(rows), pc.invert(pc.is_in(rows["plan_id"], value_set=consumed))))
        ids = pc.unique(open_["plan_id"])
        stamps = rows.filter(
            pc.and_(
                pc.is_in(event, pa.array([EventKind.PLAN, EventKind.RENEW])), pc.is_in(rows["plan_id"], value_set=ids)
            )
        )
        newest = stamps.group_by("plan_id", use_threads=False).aggregate([("at", "max")])
        expiry = pc.add(newest["at_max"], pa.scalar(lock, pa.duration("us")))
        locked = pc.greater(expiry, pa.scalar(now or self._table.clock.now(), TIMESTAMP))
        live_ids = newest["plan_id"].filter(locked)
        plans = self.events(consumer, (EventKind.PLAN,))
        live = plans.filter(pc.is_in(plans["plan_id"], value_set=live_ids))
        at = pc.index_in(live["plan_id"], value_set=newest["plan_id"])
        live = live.select([*RANGE_COLUMNS, "plan_id", "owner", "seq"]).append_column("expiry", expiry.take(at))
        lapsed = newest["plan_id"].filter(pc.invert(locked)).to_pylist()
        return Claims(live, {plan_id: self.plan(consumer, plan_id) for plan_id in lapsed})

    def pending_moves(self, consumer: str) -> pa.Table:
        """The group's ``move`` rows whose move is not finished (no ``consumed`` record yet)."""
        rows = self.events(consumer, (EventKind.MOVE, EventKind.CONSUMED, EventKind.ABANDONED))
        done = rows.filter(pc.not_equal(rows["event"], EventKind.MOVE))["plan_id"]
        moves = rows.filter(pc.equal(rows["event"], EventKind.MOVE))
        return moves.filter(pc.invert(pc.is_in(moves["plan_id"], value_set=done)))
