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

from datetime import UTC, datetime
from enum import StrEnum

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


def consumed_rows(consumer: str, owner: str, plan_id: str, seq: int) -> pa.Table:
    """The record that plan ``plan_id`` (number ``seq``) of the group has been processed."""
    return event_rows(consumer, owner, EventKind.CONSUMED, plan_id=plan_id, seq=seq)


def event_rows(
    consumer: str, owner: str, event: EventKind, plan_id: str | None = None, seq: int | None = None
) -> pa.Table:
    given = {
        "consumer": [consumer],
        "owner": [owner],
        "event": [event],
        "plan_id": [plan_id],
        "seq": [seq],
        "at": [datetime.now(UTC)],
    }
    return pa.table({f.name: pa.array(given.get(f.name, [None]), f.type) for f in STATE_SCHEMA}, schema=STATE_SCHEMA)
