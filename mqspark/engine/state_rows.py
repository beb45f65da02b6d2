"""The rows of a queue's state table: its schema, the rows each event records, and the compaction
that folds a consumer group's consumed plans into ranges. :class:`ConsumerState` reads and commits
them (see :mod:`mqspark.engine.consumer_groups` for the events).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from mqspark.engine.leases import GET_OWNER
from mqspark.model.messages import TIMESTAMP
from mqspark.model.ranges import KEY_COLUMNS, RANGE_COLUMNS, in_ranges, merge_ranges, subtract_messages

STATE_SCHEMA = pa.schema(
    [
        pa.field("consumer", pa.string(), nullable=False),
        pa.field("owner", pa.string(), nullable=False),
        pa.field("event", pa.string(), nullable=False),
        pa.field("plan_id", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field("origin", pa.string()),
        pa.field("row", pa.int64()),
        pa.field("count", pa.int64()),
        pa.field("delivery_seq", pa.int64()),
        pa.field("partition", pa.int32()),
        pa.field("at", TIMESTAMP, nullable=False),
        pa.field("target", pa.string()),
        pa.field("reason", pa.int32()),
        pa.field("error", pa.string()),
        pa.field("batch_limit", pa.int64()),
    ]
)


def position_of(rows: pa.Table) -> tuple[int, int]:
    """The highest plan number and the next ``delivery_seq`` among ``plan`` and ``checkpoint`` rows."""
    plans = pc.equal(rows["event"], "plan")
    # A plan range delivers delivery_seq .. delivery_seq + count - 1; a checkpoint holds the next one.
    following = pc.if_else(plans, pc.add(rows["delivery_seq"], rows["count"]), rows["delivery_seq"])
    return (pc.max(rows["seq"]).as_py() or 0, pc.max(following).as_py() or 0)


def claims_of(rows: pa.Table) -> pa.Array:
    """Which of one group's rows are plan rows of Python gets that were not rolled back: claims,
    live, lapsed or consumed (see :mod:`mqspark.engine.get`)."""
    event = rows["event"]
    rolled_back = rows.filter(pc.equal(event, "rollback"))["plan_id"]
    gets = pc.and_(pc.equal(event, "plan"), pc.starts_with(rows["owner"], GET_OWNER))
    return pc.and_(gets, pc.invert(pc.is_in(rows["plan_id"], value_set=rolled_back)))


def consumed_of(rows: pa.Table) -> pa.Table:
    """The consumed ranges among one group's rows: its checkpoint, its consumed plans without the
    messages backed out of them, and its finished moves."""
    event = rows["event"]
    done = pc.unique(rows.filter(pc.equal(event, "consumed"))["plan_id"])
    finished = pc.and_(pc.is_in(event, pa.array(["plan", "move"])), pc.is_in(rows["plan_id"], value_set=done))
    consumed = pc.and_(pc.or_(pc.equal(event, "checkpoint"), finished), pc.is_valid(rows["origin"]))
    # A plan recorded twice (a retried append) counts once.
    return without_backouts(rows.filter(pc.fill_null(consumed, False)), rows)


def without_backouts(consumed: pa.Table, rows: pa.Table) -> pa.Table:
    """The ranges of ``consumed`` rows (of one group) without, for each plan among them, the messages
    backed out of that plan (``backout`` and ``return`` rows among ``rows``)."""
    given_back = rows.filter(pc.is_in(rows["event"], pa.array(["backout", "return"])))
    plans = pc.unique(given_back["plan_id"]).to_pylist()
    affected = pc.fill_null(pc.is_in(consumed["plan_id"], value_set=pa.array(plans, pa.string())), False)
    pieces = [consumed.filter(pc.invert(affected)).select(RANGE_COLUMNS)]
    for plan_id in plans:
        ranges = consumed.filter(pc.fill_null(pc.equal(consumed["plan_id"], plan_id), False)).select(RANGE_COLUMNS)
        if ranges.num_rows:
            messages = given_back.filter(pc.equal(given_back["plan_id"], plan_id)).select(KEY_COLUMNS)
            pieces.append(subtract_messages(ranges, messages))
    return pa.concat_tables(pieces).group_by(RANGE_COLUMNS, use_threads=False).aggregate([])


def consumed_rows(consumer: str, owner: str, plan_id: str, seq: int) -> pa.Table:
    """The record that plan ``plan_id`` (number ``seq``) of the group has been processed."""
    return event_rows(consumer, owner, "consumed", plan_id=plan_id, seq=seq)


def compact_rows(rows: pa.Table, forget: Callable[[pa.Table], pa.Array] | None = None) -> pa.Table:
    """The compact form of a state table's rows, per consumer group: one checkpoint of merged
    ranges for everything consumed, finished moves included (and the group's position, if it
    planned), the plans that may still run (those after the last consumed one, and Python gets'
    claims with their renewals), and the newest lease, abort and switchover records. Rolled-back
    plans are dropped.

    ``forget`` marks merged ranges to leave out (messages no longer in the queue table). A group
    whose every range goes keeps one checkpoint row without a range, for its position."""
    pieces = []
    for consumer in pc.unique(rows["consumer"]).to_pylist():
        mine = rows.filter(pc.equal(rows["consumer"], consumer))
        event = mine["event"]
        consumed = pc.unique(mine.filter(pc.equal(event, "consumed"))["plan_id"])
        plans = pc.equal(event, "plan")
        folded = mine.filter(pc.or_(pc.equal(event, "checkpoint"), pc.and_(plans, pc.is_in(mine["plan_id"], consumed))))
        moves = pc.equal(event, "move")
        finished_moves = mine.filter(pc.and_(moves, pc.is_in(mine["plan_id"], consumed)))
        # Failures, the batch limits of messages returned from a plan given up, and the forwarding
        # service's reply records (see :mod:`mqspark.services.forward`).
        failed = pc.or_(
            pc.is_in(event, pa.array(["backout", "rollback", "reply", "unreplied"])),
            pc.and_(pc.equal(event, "return"), pc.is_valid(mine["batch_limit"])),
        )
        position = pc.max(folded["seq"]).as_py()
        ranges = None  # the merged ranges of the folded rows, when there are any
        # A group that only moves messages (redrive) has finished moves and nothing else to fold.
        if folded.num_rows or finished_moves.num_rows:
            following = pc.if_else(
                pc.equal(folded["event"], "plan"),
                pc.add(folded["delivery_seq"], folded["count"]),
                folded["delivery_seq"],
            )
            ranges = merge_ranges(
                pa.concat_tables([without_backouts(folded, mine), finished_moves.select(RANGE_COLUMNS)])
            )
            if forget is not None:
                ranges = ranges.filter(pc.invert(forget(ranges)))
            if ranges.num_rows == 0:
                ranges = pa.table({name: pa.nulls(1, STATE_SCHEMA.field(name).type) for name in RANGE_COLUMNS})
            count = ranges.num_rows
            given = {
                "consumer": pa.repeat(consumer, count),
                "owner": pa.repeat("", count),
                "event": pa.repeat("checkpoint", count),
                "seq": pa.repeat(pa.scalar(position, pa.int64()), count),
                "delivery_seq": pa.repeat(pa.scalar(pc.max(following).as_py(), pa.int64()), count),
                # The group's newest record time, so that compaction does not make an idle group look active.
                "at": pa.repeat(pc.max(mine["at"]).cast(TIMESTAMP), count),
                **{name: ranges[name] for name in RANGE_COLUMNS},
            }
            pieces.append(pa.table({f.name: given.get(f.name, pa.nulls(count, f.type)) for f in STATE_SCHEMA}))
        waiting = pc.invert(pc.is_in(mine["plan_id"], consumed))
        if position is not None:
            # A Python get's claim stays until it is consumed or rolled back, whatever plans follow it.
            waiting = pc.and_(waiting, pc.or_(pc.greater(mine["seq"], position), claims_of(mine)))
        kept = mine.filter(pc.and_(plans, waiting))
        pieces.append(kept)
        renewals = mine.filter(pc.equal(event, "renew"))
        pieces.append(renewals.filter(pc.is_in(renewals["plan_id"], kept["plan_id"])))
        ended = pa.concat_arrays([consumed, pc.unique(mine.filter(pc.equal(event, "abandoned"))["plan_id"])])
        pieces.append(mine.filter(pc.and_(moves, pc.invert(pc.is_in(mine["plan_id"], ended)))))
        # Failures are kept while their message still waits for the group: they make its backout count.
        failures = mine.filter(failed)
        if ranges is not None and failures.num_rows:
            consumed_all = in_ranges(failures["origin"], failures["row"], ranges, pc.fill_null(failures["count"], 1))
            failures = failures.filter(pc.invert(consumed_all))
        pieces.append(failures)
        for kinds in (["lease", "release"], ["abort"], ["switchover"]):
            latest = mine.filter(pc.is_in(event, pa.array(kinds)))
            if latest.num_rows:
                pieces.append(latest.take(pc.sort_indices(latest, [("at", "descending")])[:1]))
        pieces.append(mine.filter(pc.equal(event, "declare")).slice(0, 1))
    return pa.concat_tables([piece.cast(STATE_SCHEMA) for piece in pieces]) if pieces else STATE_SCHEMA.empty_table()


def event_rows(consumer: str, owner: str, event: str, plan_id: str | None = None, seq: int | None = None) -> pa.Table:
    given = {
        "consumer": [consumer],
        "owner": [owner],
        "event": [event],
        "plan_id": [plan_id],
        "seq": [seq],
        "at": [datetime.now(UTC)],
    }
    return pa.table({f.name: pa.array(given.get(f.name, [None]), f.type) for f in STATE_SCHEMA}, schema=STATE_SCHEMA)
