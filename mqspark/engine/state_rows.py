"""The rows of a queue's state table (``<root>/state/<queue>``): its schema, the events its rows
record, the rows each event records, and what one group's rows say (its position, its claims, what
it consumed). :class:`~mqspark.engine.consumer_groups.ConsumerState` reads and commits them.

Rows, by ``event`` (an :class:`EventKind`):

- ``plan``: the messages of a planned micro-batch as ranges: ``count`` messages of origin ``origin``
  from row ``row`` on (a message's identity, see :func:`mqspark.model.messages.origins`), delivered as
  ``delivery_seq``, ``delivery_seq`` + 1, ... (null: expired messages the batch discards).
  Recorded before the batch runs, so a replay after a crash delivers the same messages.
- ``consumed``: the plan ``plan_id`` has been processed; its messages are gone for the group.
- ``checkpoint``: what compaction folded the group's consumed plans and finished moves into: ranges
  of consumed messages, with the group's position (``seq``, next ``delivery_seq``) on every row
  (null for a group that only moves messages, as redrive's does).
- ``lease`` / ``release``: the query (``owner``) reading for the group, renewed while it runs.
- ``declare``: the group was declared on the queue before it first read, so it counts already.
- ``abort``: the backlog monitor stopped the group's reader (its ``reason`` and ``error`` text); a
  query whose lease began before it fails at its next trigger (see :mod:`mqspark.services.monitor`).
- ``switchover``: an administrator asked the group's active instance to hand over (``endmqm -s``):
  a query whose lease began before it records its last micro-batch, releases the lease and plans
  nothing more (see :mod:`mqspark.services.instances`).
- ``backout`` / ``rollback``: a delivery of a message in plan ``plan_id`` failed, explicitly (given
  back, with its ``error``) or because the plan's batch was replayed; see
  :mod:`mqspark.engine.backout`. A backed-out message is not consumed with its plan.
- ``return``: a later item of a backed-out message's group in the same plan, which goes back with
  it (not a failure of its own); or, with ``batch_limit``, a message of a plan given up after its
  replay failed too, delivered from then on in batches of at most ``batch_limit`` units.
- ``reply`` / ``unreplied``: the forwarding service's record of the replies it puts for a range of
  requests (``target`` queue, ``txn`` version in ``seq``), and its cancellation when that put did not land;
  see :mod:`mqspark.services.forward`.
- ``move``: messages that failed too often, on their way to queue ``target`` (the put's ``txn``
  version in ``seq``, each message's backout count in ``delivery_seq``, the dead-letter ``reason``
  and ``error`` text). A ``consumed`` record with the move's ``plan_id`` finishes it; an
  ``abandoned`` one ends it with its messages left in place (the target refused them).
- ``renew``: a Python get renewed its claim, plan ``plan_id`` (see :mod:`mqspark.engine.get`).

A consumer group's depth is the queue's live messages minus its checkpoint, its consumed plans
(without the messages backed out of them) and its finished moves.
Plans never consumed are rolled back: their messages are delivered again. Compaction
(:mod:`mqspark.engine.state_compaction`) rewrites the table to its compact form.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mqspark.model.messages import TIMESTAMP
from mqspark.model.ranges import KEY_COLUMNS, RANGE_COLUMNS, subtract_messages


class EventKind(StrEnum):
    """What a state row records, its ``event`` (see above). A member is its stored string, so tables
    written by earlier versions read as they are."""

    PLAN = "plan"
    CONSUMED = "consumed"
    CHECKPOINT = "checkpoint"
    LEASE = "lease"
    RELEASE = "release"
    DECLARE = "declare"
    ABORT = "abort"
    SWITCHOVER = "switchover"
    BACKOUT = "backout"
    ROLLBACK = "rollback"
    RETURN = "return"
    REPLY = "reply"
    UNREPLIED = "unreplied"
    MOVE = "move"
    ABANDONED = "abandoned"
    RENEW = "renew"


# Owners of the Python get (:mod:`mqspark.engine.get`) are named with this prefix: their plans are
# claims on messages, and they take no lease.
GET_OWNER = "get:"
# The events that say who holds a group's lease: the newest of them by time.
LEASE_EVENTS = (EventKind.LEASE, EventKind.RELEASE)

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
    plans = pc.equal(rows["event"], EventKind.PLAN)
    # A plan range delivers delivery_seq .. delivery_seq + count - 1; a checkpoint holds the next one.
    following = pc.if_else(plans, pc.add(rows["delivery_seq"], rows["count"]), rows["delivery_seq"])
    return (pc.max(rows["seq"]).as_py() or 0, pc.max(following).as_py() or 0)


def claims_of(rows: pa.Table) -> pa.Array:
    """Which of one group's rows are plan rows of Python gets that were not rolled back: claims,
    live, lapsed or consumed (see :mod:`mqspark.engine.get`)."""
    event = rows["event"]
    rolled_back = rows.filter(pc.equal(event, EventKind.ROLLBACK))["plan_id"]
    gets = pc.and_(pc.equal(event, EventKind.PLAN), pc.starts_with(rows["owner"], GET_OWNER))
    return pc.and_(gets, pc.invert(pc.is_in(rows["plan_id"], value_set=rolled_back)))


def consumed_of(rows: pa.Table) -> pa.Table:
    """The consumed ranges among one group's rows: its checkpoint, its consumed plans without the
    messages backed out of them, and its finished moves."""
    event = rows["event"]
    done = pc.unique(rows.filter(pc.equal(event, EventKind.CONSUMED))["plan_id"])
    finished = pc.and_(
        pc.is_in(event, pa.array([EventKind.PLAN, EventKind.MOVE])), pc.is_in(rows["plan_id"], value_set=done)
    )
    consumed = pc.and_(pc.or_(pc.equal(event, EventKind.CHECKPOINT), finished), pc.is_valid(rows["origin"]))
    # A plan recorded twice (a retried append) counts once.
    return without_backouts(rows.filter(pc.fill_null(consumed, False)), rows)


def without_backouts(consumed: pa.Table, rows: pa.Table) -> pa.Table:
    """The ranges of ``consumed`` rows (of one group) without, for each plan among them, the messages
    backed out of that plan (``backout`` and ``return`` rows among ``rows``)."""
    given_back = rows.filter(pc.is_in(rows["event"], pa.array([EventKind.BACKOUT, EventKind.RETURN])))
    plans = pc.unique(given_back["plan_id"]).to_pylist()
    affected = pc.fill_null(pc.is_in(consumed["plan_id"], value_set=pa.array(plans, pa.string())), False)
    pieces = [consumed.filter(pc.invert(affected)).select(RANGE_COLUMNS)]
    for plan_id in plans:
        ranges = consumed.filter(pc.fill_null(pc.equal(consumed["plan_id"], plan_id), False)).select(RANGE_COLUMNS)
        if ranges.num_rows:
            messages = given_back.filter(pc.equal(given_back["plan_id"], plan_id)).select(KEY_COLUMNS)
            pieces.append(subtract_messages(ranges, messages))
    return pa.concat_tables(pieces).group_by(RANGE_COLUMNS, use_threads=False).aggregate([])


# Building rows: every state row is made by one of these.


def state_rows(columns: Mapping[str, Any], count: int = 1) -> pa.Table:
    """``count`` rows in the table's schema. Each of ``columns`` is an array of ``count`` values, or
    one value (None: null) for every row; a column not given is null, a name not in the schema is
    left out."""
    arrays = []
    for field in STATE_SCHEMA:
        value = columns.get(field.name)
        if isinstance(value, pa.Array | pa.ChunkedArray):
            arrays.append(value if value.type == field.type else value.cast(field.type))
        else:
            one = value.cast(field.type) if isinstance(value, pa.Scalar) else pa.scalar(value, field.type)
            arrays.append(pa.repeat(one, count))
    return pa.Table.from_arrays(arrays, schema=STATE_SCHEMA)


def event_rows(
    consumer: str,
    owner: str,
    event: EventKind,
    plan_id: str | None = None,
    seq: int | None = None,
    at: datetime | None = None,
) -> pa.Table:
    """One ``event`` record of group ``consumer`` by ``owner``, made ``at`` (default now)."""
    return state_rows(
        {"consumer": consumer, "owner": owner, "event": event, "plan_id": plan_id, "seq": seq, "at": at or _now()}
    )


def consumed_rows(consumer: str, owner: str, plan_id: str, seq: int) -> pa.Table:
    """The record that plan ``plan_id`` (number ``seq``) of the group has been processed."""
    return event_rows(consumer, owner, EventKind.CONSUMED, plan_id=plan_id, seq=seq)


def lease_rows(consumer: str, owner: str, timeout: timedelta) -> pa.Table:
    """A lease record; its ``count`` is the holder's lease timeout in milliseconds, so a reader that
    does not know the holder's timeout (a Python get) can tell whether the lease lapsed."""
    milliseconds = timeout // timedelta(milliseconds=1)
    return state_rows(
        {"consumer": consumer, "owner": owner, "event": EventKind.LEASE, "count": milliseconds, "at": _now()}
    )


def abort_rows(consumer: str, owner: str, reason: int, error: str) -> pa.Table:
    """The backlog monitor's record (by ``owner``) that it stopped the group's reader, for ``reason``
    (an MQ reason code) with ``error`` as its text."""
    return state_rows(
        {
            "consumer": consumer,
            "owner": owner,
            "event": EventKind.ABORT,
            "at": _now(),
            "reason": int(reason),
            "error": error,
        }
    )


def plan_rows(consumer: str, owner: str, plan_id: str, seq: int, plan: pa.Table, at: datetime) -> pa.Table:
    """The records of plan ``plan_id``, the group's plan number ``seq``, made ``at``: one row per
    range of ``plan`` (its ``origin``, ``row``, ``count``, ``delivery_seq`` and ``partition``)."""
    given = {"consumer": consumer, "owner": owner, "event": EventKind.PLAN, "plan_id": plan_id, "seq": seq}
    return state_rows({**given, "at": at, **{name: plan[name] for name in plan.column_names}}, plan.num_rows)


def failure_rows(
    consumer: str,
    owner: str,
    event: EventKind,
    plan_id: str,
    identities: pa.Table,
    error: str,
    seq: int | None = None,
    batch_limit: int | None = None,
) -> pa.Table:
    """State rows recording that each message of ``identities`` (``origin``, ``row``) failed in plan
    ``plan_id``: ``event`` is ``backout`` (explicit) or ``rollback`` (the plan was replayed), or
    ``return`` for a later item of a backed-out item's group, which goes back without a failure."""
    given = {
        "consumer": consumer,
        "owner": owner,
        "event": event,
        "plan_id": plan_id,
        "origin": identities["origin"],
        "row": identities["row"],
        "count": 1,
        "error": error,
        "at": _now(),
        "seq": seq,
        "batch_limit": batch_limit,
    }
    return state_rows(given, identities.num_rows)


def move_rows(
    consumer: str, owner: str, move_id: str, version: int, chosen: pa.Table, target: str, **given: pa.Array
) -> pa.Table:
    """The ``move`` records of the messages ``chosen`` (``origin``, ``row``) on their way to queue
    ``target`` with the put's ``txn`` ``version``; ``given`` are more of their columns
    (``delivery_seq``, ``reason``, ``error``)."""
    columns = {
        "consumer": consumer,
        "owner": owner,
        "event": EventKind.MOVE,
        "plan_id": move_id,
        "seq": version,
        "origin": chosen["origin"],
        "row": chosen["row"],
        "count": 1,
        "target": target,
        "at": _now(),
        **given,
    }
    return state_rows(columns, chosen.num_rows)


def reply_rows(consumer: str, owner: str, event: EventKind, entry: tuple[str, int, str], ranges: pa.Table) -> pa.Table:
    """``event`` rows (``reply`` or ``unreplied``) of one reply put (plan, txn version, target) of
    the forwarding service for the requests of ``ranges``."""
    plan_id, seq, target = entry
    given = {"consumer": consumer, "owner": owner, "event": event, "plan_id": plan_id, "seq": seq, "target": target}
    ranges_of = {name: ranges[name] for name in RANGE_COLUMNS}
    return state_rows({**given, **ranges_of, "at": _now()}, ranges.num_rows)


def checkpoint_rows(
    consumer: str, position: int | None, following: int | None, at: pa.Scalar, ranges: pa.Table
) -> pa.Table:
    """A group's checkpoint: its consumed ``ranges`` (``origin``/``row``/``count``, one row each),
    with its position (plan number ``position``, next ``delivery_seq`` ``following``) on every row,
    at ``at``, the group's newest record time."""
    given = {"consumer": consumer, "owner": "", "event": EventKind.CHECKPOINT, "seq": position}
    ranges_of = {name: ranges[name] for name in RANGE_COLUMNS}
    return state_rows({**given, "delivery_seq": following, "at": at, **ranges_of}, ranges.num_rows)


def _now() -> datetime:
    return datetime.now(UTC)
