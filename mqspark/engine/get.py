"""The Python get (MQGET), without Spark: destructive for a consumer group, in logical order, with
match, wait and syncpoint. ``QueueManager.get`` and ``QueueManager.syncpoint_get`` call it.

A get plans like the streaming get (:class:`~mqspark.engine.planner.Planner`): the same ordering, failed
messages, retry delays and backout moves. It records its plan in the queue's state table before it
reads the messages, and their consumption after, so a get that dies in between gives its messages
back (counted as a rolled-back delivery by the next get of the group).

**Sharing a consumer group with a streaming query.** Gets and queries of one group take turns on
the group's lease (:meth:`~mqspark.engine.consumer_groups.ConsumerState.acquire`). A get holds it only while
it plans, reads and records (owner ``get:<id>``); while it waits for messages, it holds nothing.

- A get refuses with 2042 ``MQRC_OBJECT_IN_USE`` while a streaming query reads the group, and while
  a batch of a query that stopped is recorded but not consumed: restarting the query replays that
  batch, so its messages are not the get's to take.
- A query starting while a get holds the lease waits for it (up to the query's ``leaseTimeout``).
- Gets of one group wait for each other, up to their ``wait`` and at least :data:`GET_PATIENCE`.

Plans of gets and of queries are numbered in one sequence: a query goes on after the gets' plans.

A thread keeps, per consumer group, its handle on the state table and the pending index of its last
get (:class:`_Kept`): the next get brings the index up to date instead of reading the whole queue.

**Syncpoint** (:func:`syncpoint_get`): the messages are consumed only when the caller's block ends
without an exception. When it raises, each message counts one failed delivery, with the exception's
text as its error (see :mod:`mqspark.engine.backout`): it comes back after the queue's retry delay,
or moves to the backout, error or dead-letter queue once it has failed too often. The lease is held
and renewed for the whole block, so a streaming query of the group waits for it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from mqspark.engine.backout import failure_rows, plan_messages
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.leases import DEFAULT_LEASE_TIMEOUT, GET_OWNER
from mqspark.engine.ordering import DeliveryOptions
from mqspark.engine.pending import PendingMessages
from mqspark.engine.planner import Planner
from mqspark.engine.queues import Queues
from mqspark.engine.state_rows import consumed_rows, event_rows
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import validate_name
from mqspark.model.messages import BROWSE_SCHEMA

# How long a get waits for another get of its group at least, whatever its own ``wait``.
GET_PATIENCE = timedelta(seconds=10)
# How often a waiting get looks for new messages (it plans only when the queue table changed).
_POLL = 0.05
# The consumer groups whose state handle and pending index a thread keeps between its gets.
_KEPT_GROUPS = 16


class _Kept:
    """What a thread's gets of one consumer group keep between calls: a handle on the queue's state
    table, read incrementally, and the pending index of the last get, brought up to date by the next
    (see :meth:`Planner.adopt`) unless the state table was rewritten since."""

    def __init__(self) -> None:
        self.state: ConsumerState | None = None
        self.pending: PendingMessages | None = None
        self.rewrites = 0

    def keep(self, planner: Planner) -> None:
        self.state, self.pending, self.rewrites = planner.state, planner.loaded, planner.state.rewrites

    def offer(self, planner: Planner) -> None:
        """Give ``planner`` the kept index when it still holds for the group."""
        if self.pending is not None and planner.state is self.state and planner.state.rewrites == self.rewrites:
            planner.adopt(self.pending)
        self.pending = None  # the planner changes it: kept again only once the get is through


_threads = threading.local()


def _kept(qm: Queues, queue: str, consumer: str) -> _Kept:
    groups: OrderedDict[tuple[str, str, str], _Kept] = _threads.__dict__.setdefault("groups", OrderedDict())
    key = (qm.root, queue, consumer)
    kept = groups.pop(key, None) or _Kept()
    groups[key] = kept
    while len(groups) > _KEPT_GROUPS:
        groups.popitem(last=False)
    return kept


@dataclass(frozen=True)
class GetRequest:
    """What one MQGET asks for: up to ``max_messages`` messages of ``queue`` for consumer group
    ``consumer``, waiting up to ``wait`` seconds for the first, matching ``msg_id``, ``correl_id``
    and ``group_id`` when given. Checked when the get plans (:func:`plan_get`)."""

    queue: str
    consumer: str = "default"
    max_messages: int = 1
    wait: float = 0.0
    msg_id: str | None = None
    correl_id: str | None = None
    group_id: str | None = None


class PlannedGet:
    """A get's recorded plan and its messages, with the planner that holds the group's lease."""

    def __init__(self, planner: Planner, plan_id: str, seq: int, plan: pa.Table, messages: pa.Table) -> None:
        self.planner, self.plan_id, self.seq, self.plan, self.messages = planner, plan_id, seq, plan, messages

    def finish(self, error: str | None = None) -> None:
        """Record the plan consumed (its messages backed out first, with ``error``, when given) and
        release the lease, in one state commit; refused (2042) once another reader took the lease."""
        planner = self.planner
        planner.heartbeat.stop()
        consumer, owner = planner.consumer, planner.owner
        rows = [
            consumed_rows(consumer, owner, self.plan_id, self.seq),
            event_rows(consumer, owner, "release"),
        ]
        if error is not None:
            identities = plan_messages(self.plan).select(["origin", "row"])
            rows.insert(0, failure_rows(consumer, owner, "backout", self.plan_id, identities, error))
        planner.state.append_holding(consumer, owner, pa.concat_tables(rows))

    def settle(self) -> None:
        """:meth:`finish` a get whose first try at it may or may not have landed (in doubt). When
        another reader took the lease meanwhile, it replays the plan: the get is backed out (2003)."""
        planner = self.planner
        if self.plan_id in planner.state.consumed_plans(planner.consumer).to_pylist():
            return
        try:
            self.finish()
        except MQError as error:
            if error.reason is not Reason.MQRC_OBJECT_IN_USE:
                raise
            raise MQError(
                f"get from queue {planner.queue}: consumer group {planner.consumer!r} was taken over while its "
                f"consumption was in doubt; its {self.messages.num_rows} messages wait again, each counting one "
                "rolled-back delivery",
                Reason.MQRC_BACKED_OUT,
            ) from error


def get(qm: Queues, request: GetRequest) -> pa.Table:
    """Get up to ``max_messages`` messages of ``queue`` for ``consumer``, in logical order, waiting up
    to ``wait`` seconds for the first; consumed as they are returned. Empty when nothing matched."""
    planned = plan_get(qm, request)
    if planned is None:
        return BROWSE_SCHEMA.empty_table()
    planned.finish()
    return planned.messages


@contextmanager
def syncpoint_get(qm: Queues, request: GetRequest) -> Iterator[pa.Table]:
    """Like :func:`get`, but the messages are consumed only when the ``with`` block succeeds; when it
    raises, they are backed out (one failed delivery each) and the exception goes on."""
    planned = plan_get(qm, request)
    if planned is None:
        yield BROWSE_SCHEMA.empty_table()
        return
    try:
        yield planned.messages
    except BaseException as error:
        planned.finish(f"{type(error).__name__}: {error}")
        raise
    planned.finish()


def plan_get(qm: Queues, request: GetRequest) -> PlannedGet | None:
    """Plan, record and read a get's messages under the group's lease, which it keeps until
    :meth:`PlannedGet.finish`; None when nothing matched within ``wait``."""
    queue, consumer, max_messages, wait = request.queue, request.consumer, request.max_messages, request.wait
    msg_id, correl_id, group_id = request.msg_id, request.correl_id, request.group_id
    validate_name(consumer, "consumer group")
    if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
        raise MQValidationError(f"get: queue {queue}: max_messages must be an integer >= 1, got {max_messages!r}")
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
        raise MQValidationError(f"get: queue {queue}: wait must be a number of seconds >= 0, got {wait!r}")
    for name, value in (("msg_id", msg_id), ("correl_id", correl_id), ("group_id", group_id)):
        if value is not None and (not isinstance(value, str) or not value):
            raise MQValidationError(f"get: queue {queue}: {name} must be a non-empty text, got {value!r}")
    match: DeliveryOptions | None = DeliveryOptions(msg_id=msg_id, correl_id=correl_id, group_id=group_id)
    match = match if (msg_id or correl_id or group_id) else None
    deadline = time.monotonic() + wait
    patience = max(timedelta(seconds=wait), GET_PATIENCE)
    seen = None
    due: datetime | None = None
    while True:
        version = qm.queue_version(queue)
        if version != seen or (due is not None and datetime.now(UTC) >= due):
            seen = version
            kept = _kept(qm, queue, consumer)
            planner = Planner(
                qm,
                queue,
                consumer,
                f"{GET_OWNER}{uuid.uuid4().hex}",
                DeliveryOptions(),
                DEFAULT_LEASE_TIMEOUT,
                patience=patience,
                state=kept.state,
            )
            try:
                # One look at the state table answers the planning step's questions, taken again after
                # each of its commits: the get holds the group's lease meanwhile.
                with planner.state.pinned():
                    kept.offer(planner)
                    planned = _plan(planner, max_messages, match)
            except BaseException:
                planner.close()
                raise
            kept.keep(planner)
            if planned is not None:
                return planned
            due = planner.next_due
            planner.close()
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))


def _plan(planner: Planner, max_messages: int, match: DeliveryOptions | None) -> PlannedGet | None:
    """Plan, record and read the get's messages under the lease; None when none matched."""
    state, consumer = planner.state, planner.consumer
    plan_id, owner, plan = state.current_plan(consumer)
    if plan_id is not None:
        if not owner.startswith(GET_OWNER):
            raise MQError(
                f"get: queue {planner.queue}: consumer group {consumer!r} has a batch of a streaming query "
                f"recorded but not consumed (plan {plan_id}); restart the query to finish it, or get with "
                "another consumer group",
                Reason.MQRC_OBJECT_IN_USE,
            )
        if state.events(consumer, ("rollback",), ["row"], plan_id).num_rows == 0:
            # A get that died inside its syncpoint: a rolled-back delivery of each of its messages.
            planner.count_replay(plan_id, plan)
    planner.consume("", 0)
    while True:
        seq, delivered = state.last_position(consumer)
        plan = planner.plan(delivered, datetime.now(UTC), max_messages, None, match)
        if plan is None:
            planner.flush()
            return None
        plan_id = plan.schema.metadata[b"plan_id"].decode()
        planner.record(plan_id, seq + 1, plan)
        pieces = [rows.messages() for rows in planner.planned_rows(plan_id, plan)]
        if pieces:
            return PlannedGet(planner, plan_id, seq + 1, plan, pa.concat_tables(pieces))
        # Only expired messages, discarded: they are consumed, and the get looks again.
        planner.consume(plan_id, seq + 1)
