"""The Python get (MQGET), without Spark: destructive for a consumer group, in logical order, with
match, wait and syncpoint. ``QueueManager.get``, ``syncpoint_get`` and ``claim`` call it.

A get plans like the streaming get (:class:`~mqspark.engine.planner.Planner`): the same ordering, failed
messages, retry delays and backout moves. ``qm.get`` reads the planned messages, then records its
plan and their consumption in one commit to the queue's state table: a read that fails leaves
nothing claimed. A syncpoint get and the block consumer record the plan as a claim before they
hand the messages out, and its end after.

**Competing gets: claims.** Gets of one consumer group run at once and take disjoint messages. A
get's recorded plan is its *claim* (owner ``get:<id>``): it holds its messages for the queue's
``lock_duration`` from the plan's or its newest ``renew`` record. A get plans around the live claims
of others: their messages, and every message of a group with an item claimed, wait (so a group is
read by one get at a time, in logical order); ungrouped messages go to whichever get asks, higher
priorities first. The claim commits at exactly the version after the look it was planned on, and
only when no other plan was recorded meanwhile (:class:`~mqspark.engine.state_commit.Stale`
otherwise: the get plans again). Its consumption commits only while the claim holds: a get whose
lock passed is refused (2003), and the next get to plan takes its messages back, each counting one
rolled-back delivery. Moves to the backout, error and dead-letter queues go one at a time per group
(see :class:`~mqspark.engine.backout.Transfer`).

**Shared gets.** A plain get (``qm.get`` without match options, of a local queue named as such)
shares one plan and one commit with the plain gets other processes make of the group at the same
time (:mod:`mqspark.engine.shared_gets`): the lock's holder gets for all of them, each its share in
logical order, instead of each get's claim conflicting with the others'.

**Sharing a consumer group with a streaming query.** A query holds the group's lease while it runs
(:meth:`~mqspark.engine.consumer_groups.ConsumerState.acquire`), and gets and queries exclude each
other:

- a get refuses with 2042 ``MQRC_OBJECT_IN_USE`` while a streaming query holds the lease, and while
  a batch of a query that stopped is recorded but not consumed: restarting the query replays that
  batch, so its messages are not the get's to take;
- a query starting while gets' claims are locked waits for them to end (up to its ``leaseTimeout``).

Plans of gets and of queries are numbered in one sequence: a query goes on after the gets' plans.

A thread keeps, per consumer group, its handle on the state table and the pending index of its last
get (:class:`_Kept`): the next get brings the index up to date instead of reading the whole queue.

**Syncpoint** (:func:`syncpoint_get`): the messages are consumed only when the caller's block ends
without an exception. When it raises, each message counts one failed delivery, with the exception's
text as its error (see :mod:`mqspark.engine.backout`): it comes back after the queue's retry delay,
or moves to the backout, error or dead-letter queue once it has failed too often. The claim is
renewed in the background while the block runs; a process killed inside the block gives its
messages back once the lock passes.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.engine import shared_gets, staged_puts
from mqspark.engine.backout import RELEASED, check_error_text, plan_messages
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.heartbeat import Heartbeat
from mqspark.engine.ordering import DeliveryOptions
from mqspark.engine.pending import PendingMessages
from mqspark.engine.planner import Planner
from mqspark.engine.queues import Queues
from mqspark.engine.state_commit import Stale
from mqspark.engine.state_reads import Claims
from mqspark.engine.state_rows import GET_OWNER, EventKind, consumed_rows, event_rows, failure_rows
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import validate_name
from mqspark.model.messages import BROWSE_SCHEMA
from mqspark.model.numbers import check_number

# How often a waiting get looks for new messages (it plans only when the queue table changed).
_POLL = 0.05
# The consumer groups whose state handle and pending index a thread keeps between its gets.
_KEPT_GROUPS = 16
# A get gives up after this many conflicts with other gets' commits in a row.
_CONFLICTS = 200


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
        planner.state.rows()  # a look that notices a rewrite, or a table deleted with its queue
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


@dataclass(frozen=True)
class Settlement:
    """The end of claim ``plan_id`` (its ``plan``) not committed yet: its ``rows`` (its consumption,
    backouts and returns), and ``held(state)``, the check that the claim still holds, on the state
    handle committing them."""

    plan_id: str
    plan: pa.Table
    rows: pa.Table
    held: Callable[[ConsumerState], Callable[[], None]]


class Claim:
    """A get's claim: its plan, recorded in the state table, and its ``messages``, held until the
    lock passes unless :meth:`commit`, :meth:`backout`, :meth:`release` or :meth:`renew` come first."""

    def __init__(self, planner: Planner, plan_id: str, seq: int, plan: pa.Table, messages: pa.Table) -> None:
        self.planner, self.plan_id, self.seq, self.plan, self.messages = planner, plan_id, seq, plan, messages
        self._heartbeat: Heartbeat | None = None

    @property
    def root(self) -> str:
        return self.planner.qm.root

    def hold(self) -> None:
        """Renew the claim in the background (every third of the lock) until it ends."""
        planner = self.planner
        self._heartbeat = Heartbeat(planner.state, planner.consumer, planner.owner, planner.lock, self._renew_on)

    @store.connected
    def renew(self) -> None:
        """Extend the claim's lock to a whole ``lock_duration`` from now; refused (2003) once it passed."""
        self._renew_on(self.planner.state)

    def _renew_on(self, state: ConsumerState) -> None:
        planner = self.planner
        state.append(
            event_rows(planner.consumer, planner.owner, EventKind.RENEW, self.plan_id, self.seq, state.clock.now()),
            self._held(state),
        )

    @store.connected
    def commit(self) -> None:
        """Consume the claim's messages (MQCMIT), in one state commit; refused (2003) once its lock passed."""
        self._end(self._ending([]))

    @store.connected
    def backout(self, error: str) -> None:
        """Give the messages back as failed (MQBACK): each counts one failed delivery, with ``error``
        as its error, and the queue's retry and backout rules apply. Refused (2003) once the lock passed."""
        check_error_text(error, f"get from queue {self.planner.queue}: backout error")
        self._end(self._ending([self._failures(EventKind.BACKOUT, self._identities(), error)]))

    def release(self) -> None:
        """Give the messages back unprocessed, at once, without counting a failed delivery."""
        self.settle(0)

    @store.connected
    def settle(self, processed: int, error: str | None = None) -> None:
        """End the claim in one commit: its first ``processed`` messages consumed, the next one
        backed out with ``error`` when given (one failed delivery), and the rest given back without
        a failure. Refused (2003) once the lock passed."""
        identities = self._identities()
        rows = []
        if error is not None and processed < identities.num_rows:
            rows.append(self._failures(EventKind.BACKOUT, identities.slice(processed, 1), error))
            processed += 1
        if processed < identities.num_rows:
            rows.append(self._failures(EventKind.RETURN, identities.slice(processed), RELEASED))
        self._end(self._ending(rows))

    def acknowledgement(self) -> Settlement:
        """The claim's messages all consumed, to commit with the next claim of the group (see
        :func:`plan_get`) instead of alone. The claim is no longer renewed."""
        return self._ending([])

    def _identities(self) -> pa.Table:
        """``origin`` and ``row`` of the claim's messages, in delivery order."""
        identities = plan_messages(self.plan)
        return identities.take(pc.sort_indices(identities, [("delivery_seq", "ascending")])).select(["origin", "row"])

    def _failures(self, event: EventKind, identities: pa.Table, error: str) -> pa.Table:
        planner = self.planner
        return failure_rows(planner.consumer, planner.owner, event, self.plan_id, identities, error)

    def _ending(self, rows: list[pa.Table]) -> Settlement:
        """``rows`` with the claim's consumption, to commit while the claim holds; it is no longer renewed."""
        planner = self.planner
        if self._heartbeat is not None:
            self._heartbeat.stop()
        rows = [*rows, consumed_rows(planner.consumer, planner.owner, self.plan_id, self.seq)]
        return Settlement(self.plan_id, self.plan, pa.concat_tables(rows), self._held)

    def _end(self, settlement: Settlement) -> None:
        state = self.planner.state
        state.append(settlement.rows, settlement.held(state))

    def _held(self, state: ConsumerState) -> Callable[[], None]:
        """A check that the claim still holds its messages: not consumed, not taken back by another
        get after its lock passed, its lock not passed, and no streaming query reading the group."""
        planner, plan_id = self.planner, self.plan_id

        def check() -> None:
            consumer = planner.consumer
            if state.events(consumer, (EventKind.CONSUMED,), ["event"], plan_id).num_rows:
                raise MQError(f"get from queue {planner.queue}: claim {plan_id} ended already", Reason.MQRC_BACKED_OUT)
            # A claim rolled back by another get, or whose lock passed, is not live.
            if plan_id not in state.claims(consumer, planner.lock).live["plan_id"].to_pylist():
                raise MQError(
                    f"get from queue {planner.queue}: consumer group {consumer!r}: the lock of its "
                    f"{self.messages.num_rows} messages passed (lock_duration {planner.lock.total_seconds():g} s); "
                    "they wait again, each counting one rolled-back delivery",
                    Reason.MQRC_BACKED_OUT,
                )
            _refuse_while_a_query_reads(state, planner)

        return check

    def commit_in_doubt(self) -> None:
        """:meth:`commit` a claim whose first try at it may or may not have landed (in doubt)."""
        planner = self.planner
        if self.plan_id in planner.state.consumed_plans(planner.consumer).to_pylist():
            return
        self.commit()


def get(qm: Queues, request: GetRequest) -> pa.Table:
    """Get up to ``max_messages`` messages of ``queue`` for ``consumer``, in logical order, waiting up
    to ``wait`` seconds for the first; consumed as they are returned. Empty when nothing matched.
    A get without match options of a local queue shares its commit with the other processes'
    (see :mod:`mqspark.engine.shared_gets`)."""
    started = qm.clock.monotonic()
    if _checked(request) is None:
        shared = _shared_get(qm, request)
        if shared is not None and (shared.num_rows or not request.wait):
            return shared
        request = replace(request, wait=max(0.0, request.wait - (qm.clock.monotonic() - started)))
    planned = plan_get(qm, request, consume=True)
    return BROWSE_SCHEMA.empty_table() if planned is None else planned.messages


def _shared_get(qm: Queues, request: GetRequest) -> pa.Table | None:
    """The get's messages, got with other processes' gets of the group in one commit; None when the
    queue is on an object store or named through an alias, or no holder took the request in time."""
    queue = qm.resolve_for_get(request.queue).name
    location = store.state_location(qm.root, queue)
    # Through an alias, a holder could plan on another queue than the one asked: those get alone.
    if store.is_uri(location) or queue != request.queue:
        return None
    folder = os.path.join(location, store.GETS_FOLDER, store.queue_dir_name(request.consumer))

    def serve(max_messages: int, share: Callable[[str, pa.Table], None]) -> pa.Table:
        planned = plan_get(qm, replace(request, max_messages=max_messages, wait=0), consume=True, share=share)
        return BROWSE_SCHEMA.empty_table() if planned is None else planned.messages

    return shared_gets.take(folder, location, request.max_messages, serve)


@contextmanager
def syncpoint_get(qm: Queues, request: GetRequest) -> Iterator[pa.Table]:
    """Like :func:`get`, but the messages are consumed only when the ``with`` block succeeds; when it
    raises, they are backed out (one failed delivery each) and the exception goes on. The claim is
    renewed while the block runs."""
    with store.answering(qm.root):
        planned = plan_get(qm, request)
    if planned is None:
        yield BROWSE_SCHEMA.empty_table()
        return
    planned.hold()
    try:
        yield planned.messages
    except BaseException as error:
        try:
            planned.backout(f"{type(error).__name__}: {error}")
        except MQError as lost:
            # The lock passed: the messages wait again, counted as rolled back; the block's error goes on.
            if lost.reason is not Reason.MQRC_BACKED_OUT:
                raise
        raise
    planned.commit()


def plan_get(
    qm: Queues,
    request: GetRequest,
    settling: Settlement | None = None,
    *,
    consume: bool = False,
    share: Callable[[str, pa.Table], None] | None = None,
) -> Claim | None:
    """Plan, claim and read a get's messages; they are held until :meth:`Claim.commit` (or the
    lock passes). None when nothing matched within ``wait``. ``settling``, the end of an earlier
    claim of the same group, commits with the claim (or alone, first, when nothing matched): one
    commit where there would be two. With ``consume``, the messages are read first and the claim
    is recorded consumed in its own commit: they are the caller's once it returns. ``share`` is
    given the plan's id and messages once they are read, before the commit."""
    match = _checked(request)
    queue, consumer = request.queue, request.consumer
    # A put staged by a process that died meanwhile waits for the next commit: this get makes it.
    qm.puts.commit_staged(queue, staged_puts.HOLDER_PATIENCE)
    clock = qm.clock
    deadline = clock.monotonic() + request.wait
    seen = None
    due: datetime | None = None
    conflicts = 0
    while True:
        with qm.pinned_catalog():
            # Messages come with the queue's commits, and back with the state's (released, backed
            # out); a get that does not wait plans once and needs neither version.
            version = (qm.queue_version(queue), _state_version(qm, queue, consumer)) if request.wait else None
            if seen is None or version != seen or (due is not None and clock.now() >= due):
                seen = version
                kept = _kept(qm, queue, consumer)
                planner = Planner(
                    qm, queue, consumer, f"{GET_OWNER}{uuid.uuid4().hex}", DeliveryOptions(), None, state=kept.state
                )
                try:
                    # One look at the state table answers the planning step's questions, taken again
                    # after each of its commits.
                    with planner.state.pinned():
                        planner.state.created()
                        kept.offer(planner)
                        planned = _claim(planner, request.max_messages, match, settling, consume, share)
                        settling = None  # committed, with the claim or alone
                except Stale:
                    # Another get claimed or moved messages since the look: plan again on a new one.
                    conflicts += 1
                    if conflicts >= _CONFLICTS:
                        raise MQError(
                            f"get from queue {queue}: consumer group {consumer!r}: gave up after {conflicts} "
                            "conflicts with other gets",
                            Reason.MQRC_BACKED_OUT,
                        ) from None
                    planner.drop_unstarted_plans()
                    planner.drop_unrecorded()
                    kept.keep(planner)
                    seen = None
                    # Real time, not the clock's: it spaces out commits racing in other threads and processes.
                    time.sleep(random.uniform(0, 0.002 * min(conflicts, 10)))
                    continue
                kept.keep(planner)
                if planned is not None:
                    return planned
                due = planner.due()
        if clock.monotonic() >= deadline:
            return None
        clock.sleep(min(_POLL, max(0.0, deadline - clock.monotonic())))


def _state_version(qm: Queues, queue: str, consumer: str) -> int | None:
    """The version of the queue's state table as this thread's gets of the group see it."""
    state = _kept(qm, queue, consumer).state
    return state.version() if state is not None else None


def _checked(request: GetRequest) -> DeliveryOptions | None:
    """Check the request's values; the selection its match options make (None: every message)."""
    queue, max_messages, wait = request.queue, request.max_messages, request.wait
    validate_name(request.consumer, "consumer group")
    check_number(
        max_messages,
        f"get: queue {queue}: max_messages must be an integer >= 1, got {max_messages!r}",
        whole=True,
        at_least=1,
    )
    check_number(wait, f"get: queue {queue}: wait must be a number of seconds >= 0, got {wait!r}", at_least=0)
    msg_id, correl_id, group_id = request.msg_id, request.correl_id, request.group_id
    for name, value in (("msg_id", msg_id), ("correl_id", correl_id), ("group_id", group_id)):
        if value is not None and (not isinstance(value, str) or not value):
            raise MQValidationError(f"get: queue {queue}: {name} must be a non-empty text, got {value!r}")
    if not (msg_id or correl_id or group_id):
        return None
    return DeliveryOptions(msg_id=msg_id, correl_id=correl_id, group_id=group_id)


def _claim(
    planner: Planner,
    max_messages: int,
    match: DeliveryOptions | None,
    settling: Settlement | None,
    consume: bool,
    share: Callable[[str, pa.Table], None] | None = None,
) -> Claim | None:
    """Plan the get's messages around other gets' claims, read them and record the plan as this
    get's claim (consumed, with ``consume``); None when none matched. Claims whose lock passed are
    rolled back, and ``settling`` is committed, in the same commit. Raises :class:`Stale` when
    another get's commit came between the look and the claim."""
    state, consumer = planner.state, planner.consumer
    _refuse_while_a_query_reads(state, planner)
    planner.consume("", 0)
    if settling is not None:
        # Its messages are consumed by the commit that records this claim: planned as such, so
        # the rest of a group it held follows in logical order.
        planner.with_next_commit(settling.rows)
        planner.mark_consumed(settling.plan)
    while True:
        now = state.clock.now()
        claims = state.claims(consumer, planner.lock, now)
        if settling is not None:
            claims = Claims(claims.live.filter(pc.not_equal(claims.live["plan_id"], settling.plan_id)), claims.expired)
        for plan_id, plan in claims.expired.items():
            planner.roll_back(plan_id, plan)
        seq, delivered = state.last_position(consumer)
        claimed = planner.range_keys(claims.live)
        plan = planner.plan(delivered, now, max_messages, None, match, claimed)
        check = _unchanged(state, planner, seq, list(claims.expired))
        if settling is not None:
            check = _both(check, settling.held(state))
            settling = None  # recorded with the first commit below
        if plan is None:
            planner.flush(check=check)
            # Messages other gets hold come back when their lock passes, without a commit.
            planner.due_by(pc.min(claims.live["expiry"]).as_py())
            return None
        plan_id = plan.schema.metadata[b"plan_id"].decode()
        # Read before the claim commits: a read that fails leaves nothing claimed.
        pieces = [rows.messages() for rows in planner.planned_rows(plan_id, plan)]
        messages = pa.concat_tables(pieces) if pieces else None
        if consume and messages is not None:
            planner.with_next_commit(consumed_rows(consumer, planner.owner, plan_id, seq + 1))
        if share is not None and messages is not None:
            share(plan_id, messages)
        planner.record(plan_id, seq + 1, plan, check)
        if messages is not None:
            return Claim(planner, plan_id, seq + 1, plan, messages)
        # Only expired messages, discarded: they are consumed, and the get looks again.
        planner.consume(plan_id, seq + 1)


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def check() -> None:
        first()
        second()

    return check


def _unchanged(state: ConsumerState, planner: Planner, seq: int, rolled_back: list[str]) -> Callable[[], None]:
    """A check that what a claim was planned on still holds when it commits: no streaming query
    reads the group, no other plan was recorded since (plan number ``seq`` was the last), and the
    claims it rolls back were neither consumed nor rolled back meanwhile."""

    def check() -> None:
        _refuse_while_a_query_reads(state, planner)
        if state.last_position(planner.consumer)[0] != seq:
            raise Stale(f"queue {planner.queue}: consumer group {planner.consumer!r} planned since")
        ended = state.events(planner.consumer, (EventKind.CONSUMED, EventKind.ROLLBACK), ["plan_id"])["plan_id"]
        if pc.any(pc.is_in(ended, value_set=pa.array(rolled_back, pa.string()))).as_py():
            raise Stale(f"queue {planner.queue}: consumer group {planner.consumer!r}: a lapsed claim ended since")

    return check


def _refuse_while_a_query_reads(state: ConsumerState, planner: Planner) -> None:
    """Refuse (2042) while a streaming query holds the group's lease, or has a batch recorded but
    not consumed: restarting the query replays that batch, so its messages are not a get's to take."""
    consumer = planner.consumer
    holder = state.lease(consumer, None)
    if holder is not None and not holder.owner.startswith(GET_OWNER):
        raise MQError(
            f"get: queue {planner.queue}: consumer group {consumer!r} is already being read by a running query "
            f"(owner {holder.owner}); stop it, or get with another consumer group",
            Reason.MQRC_OBJECT_IN_USE,
        )
    plan_id, _, _ = state.current_plan(consumer)
    if plan_id is not None:
        raise MQError(
            f"get: queue {planner.queue}: consumer group {consumer!r} has a batch of a streaming query "
            f"recorded but not consumed (plan {plan_id}); restart the query to finish it, or get with "
            "another consumer group",
            Reason.MQRC_OBJECT_IN_USE,
        )
