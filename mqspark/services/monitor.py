"""Backlog monitoring (spec section 6): the monitor of a queue and consumer group, its points, the
group's health, MQ's events and the history table. The OpenTP1 rules themselves are
:class:`~mqspark.services.backlog_judge.BacklogJudge`. The module is over 500 lines because
:class:`Monitor` is one concept (a point, its measures and what it records) that reads best whole.

:class:`Monitor` runs the judge against a queue and consumer group, one point per
``watch_interval``. A point is exact: the backlog is the group's waiting messages (as ``depth``
counts them), kept as ranges of message identities, so ``still_waiting`` counts which messages of
the previous point's backlog still wait, not only how many. Each point also reports:

- the group's health over a window of points, as LinkedIn Burrow judges it: ``STOP`` (messages
  wait and no query holds the group's lease), ``STALL`` (messages waited at the last two points and
  none was processed across the window), ``WARNING`` (the backlog grew across the window), ``OK``;
- the claimable messages and the age of the oldest (put time to now), leaving out messages delayed
  by ``available_at`` or parked by the queue's ``retry_delay`` after a failure;
- the processing rate (A per second since the previous point);
- MQ's events: queue depth high/low (CURDEPTH as a percentage of ``max_depth`` reaching
  ``depth_high``, then falling to ``depth_low``) and service interval high/ok (messages waited
  ``service_interval`` seconds with nothing processed; then something was);
- the messages of this queue waiting on its backout queue, error queue and the dead-letter queue.

Every point is appended to the monitor history table ``<root>/monitor/<queue>``. An ``abort``
verdict records an ``abort`` row in the queue's state table for the group: the query holding the
group's lease fails at its next trigger with ``MQRC_Q_SERVICE_INTERVAL_HIGH`` (2226) and the numbers,
wherever it runs (see :meth:`mqspark.engine.planner.Planner.stopped_by_monitor`).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from itertools import pairwise
from typing import TYPE_CHECKING, Any, TypedDict

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from mqspark import store
from mqspark.engine.access import HoldsQueues, queues_of
from mqspark.engine.backout import failures
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.leases import DEFAULT_LEASE_TIMEOUT
from mqspark.engine.state_rows import abort_rows
from mqspark.engine.waiting import depth_by_original_queue
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import validate_name
from mqspark.model.messages import TIMESTAMP
from mqspark.model.numbers import check_number
from mqspark.model.ranges import NO_RANGES, merge_ranges, overlap_counts, single_ranges

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from mqspark.engine.queues import Queues
    from mqspark.model.definitions import QueueDefinition
from mqspark.services.backlog_judge import (
    BacklogJudge,
    JudgementPoint,
    MonitorState,
    Verdict,
    count_parameter,
    validate_watch_interval,
)

# The logger users configure for monitor warnings (docs/monitoring.md); it keeps its name wherever the module lives.
_log = logging.getLogger("mqspark.monitor")


class GroupStatus(StrEnum):
    """A consumer group's health over the window of points (LinkedIn Burrow's names)."""

    OK = "OK"
    WARNING = "WARNING"
    STALL = "STALL"
    STOP = "STOP"


def group_status(window: list[MonitorPoint]) -> GroupStatus:
    """The group's status at the last point of ``window`` (its points, oldest first)."""
    last = window[-1]
    if last.backlog and not last.active:
        return GroupStatus.STOP
    later = window[1:]
    if later and window[-2].backlog and last.backlog and not any(p.judgement.processed for p in later):
        return GroupStatus.STALL
    backlogs = [p.backlog for p in window]
    if len(window) >= 3 and backlogs[-1] > backlogs[0] and all(b >= a for a, b in pairwise(backlogs)):
        return GroupStatus.WARNING
    return GroupStatus.OK


class _FailedCounts(TypedDict):
    """How many of a queue's failed messages wait on its backout, error and dead-letter queues."""

    backed_out: int | None
    errors: int | None
    dead_letters: int | None


@dataclass(frozen=True)
class MonitorPoint:
    """One point of a :class:`Monitor`: the judgement and what was measured with it."""

    at: datetime
    queue: str
    consumer: str
    judgement: JudgementPoint
    watch_count: int
    active: bool
    claimable: int
    oldest_claimable_age_s: float | None
    rate_per_s: float | None
    depth: int
    max_depth: int
    status: GroupStatus = GroupStatus.OK
    events: tuple[str, ...] = ()
    backed_out: int | None = None
    errors: int | None = None
    dead_letters: int | None = None

    @property
    def backlog(self) -> int:
        return self.judgement.backlog

    @property
    def verdict(self) -> Verdict:
        return self.judgement.verdict

    @property
    def state(self) -> MonitorState:
        return self.judgement.state

    def as_dict(self) -> dict[str, Any]:
        point: dict[str, Any] = {"at": self.at.isoformat(), "queue": self.queue, "consumer": self.consumer}
        point.update(self.judgement.as_dict())
        point.update(
            {
                "watch_count": self.watch_count,
                "active": self.active,
                "claimable": self.claimable,
                "oldest_claimable_age_s": self.oldest_claimable_age_s,
                "rate_per_s": self.rate_per_s,
                "depth": self.depth,
                "max_depth": self.max_depth,
                "status": self.status.value,
                "events": list(self.events),
                "backed_out": self.backed_out,
                "errors": self.errors,
                "dead_letters": self.dead_letters,
            }
        )
        return point

    def line(self) -> str:
        """The point as one line, for the CLI."""
        j = self.judgement
        age = "-" if self.oldest_claimable_age_s is None else f"{self.oldest_claimable_age_s:.1f}s"
        rate = "-" if self.rate_per_s is None else f"{self.rate_per_s:.1f}/s"
        numbers = f"A={_text(j.processed)} B={j.expected} C={_text(j.previous_backlog)}"
        events = f" events={','.join(self.events)}" if self.events else ""
        return (
            f"{self.at.strftime('%H:%M:%S')} {self.queue} {self.consumer} backlog={self.backlog} {numbers} "
            f"{j.state.value} {j.verdict.value} status={self.status.value} oldest={age} rate={rate} "
            f"depth={self.depth}{events}"
        )


def _text(value: int | None) -> str:
    return "-" if value is None else str(value)


HISTORY_SCHEMA = pa.schema(
    [
        pa.field("at", TIMESTAMP, nullable=False),
        pa.field("monitor", pa.string(), nullable=False),
        pa.field("queue", pa.string(), nullable=False),
        pa.field("consumer", pa.string(), nullable=False),
        pa.field("backlog", pa.int64()),
        pa.field("still_waiting", pa.int64()),
        pa.field("processed", pa.int64()),
        pa.field("expected", pa.int64()),
        pa.field("previous_backlog", pa.int64()),
        pa.field("watch_count", pa.int64()),
        pa.field("state", pa.string()),
        pa.field("verdict", pa.string()),
        pa.field("judged", pa.bool_()),
        pa.field("active", pa.bool_()),
        pa.field("claimable", pa.int64()),
        pa.field("oldest_claimable_age_s", pa.float64()),
        pa.field("rate_per_s", pa.float64()),
        pa.field("depth", pa.int64()),
        pa.field("max_depth", pa.int64()),
        pa.field("status", pa.string()),
        pa.field("events", pa.list_(pa.string())),
        pa.field("backed_out", pa.int64()),
        pa.field("errors", pa.int64()),
        pa.field("dead_letters", pa.int64()),
    ]
)
# The history table keeps a day of log entries; a checkpoint every 100 points keeps opening it cheap.
_HISTORY_CONFIGURATION = {"delta.logRetentionDuration": "interval 1 days", "delta.checkpointInterval": "100"}


def _age(now: datetime, stamp: datetime | None) -> float | None:
    return None if stamp is None else (now - stamp).total_seconds()


def _event(reason: Reason) -> str:
    return f"{reason.name} ({reason.value})"


def parked_messages(definition: QueueDefinition, state: ConsumerState, consumer: str, now: datetime) -> pa.Table:
    """The ranges of group ``consumer``'s messages parked by the queue's ``retry_delay`` after a failure."""
    retry_delay = timedelta(seconds=definition.retry_delay)
    failed = failures(state, consumer) if retry_delay > timedelta(0) else None
    if failed is None or not failed.num_rows:
        return NO_RANGES
    held = failed.filter(pc.greater(failed["failed_at"], pa.scalar(now - retry_delay, TIMESTAMP)))
    return merge_ranges(single_ranges(held))


@dataclass(frozen=True)
class GroupHealth:
    """A consumer group's health now, as ``mqspark depth`` reports it (see :func:`group_health`)."""

    queue: str
    consumer: str
    backlog: int
    active: bool
    held_by: str | None
    claimable: int
    oldest_claimable_age_s: float | None
    status: GroupStatus | None
    status_at: datetime | None
    rate_per_s: float | None


@store.connected
def latest_point(qm: Queues, queue: str, consumer: str) -> dict[str, Any] | None:
    """The newest point of the monitor history of ``queue`` and group ``consumer``, or None."""
    table = store.open_table(store.monitor_location(qm.root, queue), qm.storage_options)
    if table is None:
        return None
    match = (pc.field("queue") == queue) & (pc.field("consumer") == consumer)
    points = store.table_dataset(table).to_table(filter=match, columns=["at", "status", "rate_per_s"])
    if not points.num_rows:
        return None
    return points.slice(pc.index(points["at"], pc.max(points["at"])).as_py(), 1).to_pylist()[0]


def history_points(qm: Queues, queue: str, since: datetime, columns: list[str]) -> pa.Table:
    """The points of the monitor history of ``queue`` (every group's) taken at or after ``since``,
    with ``at``, ``consumer`` and ``columns``, oldest first; none without a history."""
    table = store.open_table(store.monitor_location(qm.root, queue), qm.storage_options)
    names = ["at", "consumer", *(name for name in columns if name not in ("at", "consumer"))]
    if table is None:
        return HISTORY_SCHEMA.empty_table().select(names)
    match = (pc.field("queue") == queue) & (pc.field("at") >= pa.scalar(since, TIMESTAMP))
    return store.table_dataset(table).to_table(filter=match, columns=names).sort_by("at")


@store.connected
def group_health(
    qm: Queues | HoldsQueues,
    queue: str,
    consumer: str,
    now: datetime | None = None,
    lease_timeout: timedelta = DEFAULT_LEASE_TIMEOUT,
) -> GroupHealth:
    """Group ``consumer``'s health on ``queue`` now, without taking a monitor point; ``held_by`` is
    who holds the group's lease: a service instance's id (see :mod:`mqspark.services.instances`) or
    a query's checkpoint owner.

    The backlog, lease and claimable age are measured now. The status: ``STOP`` when messages
    wait and no query holds the group's lease, ``OK`` when none waits; otherwise the status of the
    newest point in the monitor history (``WARNING`` and ``STALL`` need a window of points), or
    None when no monitor recorded one. The rate is that point's rate. ``now`` defaults to the queue
    manager's clock.
    """
    qm = queues_of(qm)
    now = now or qm.clock.now()
    definition = qm.resolve(queue)
    consumer = validate_name(consumer, "consumer group")
    state = qm.consumer_state(definition.name)
    parked = parked_messages(definition, state, consumer, now)
    backlog = qm.group_backlog(definition.name, state.all_groups(), now, consumer, parked)
    lease = state.lease(consumer, lease_timeout, now)
    active = lease is not None
    latest = latest_point(qm, definition.name, consumer)
    status, status_at = None, None
    if backlog.count and not active:
        status, status_at = GroupStatus.STOP, now
    elif not backlog.count:
        status, status_at = GroupStatus.OK, now
    elif latest is not None and latest["status"] != GroupStatus.STOP:
        status, status_at = GroupStatus(latest["status"]), latest["at"]
    return GroupHealth(
        queue=definition.name,
        consumer=consumer,
        backlog=backlog.count,
        active=active,
        held_by=None if lease is None else lease.owner,
        claimable=backlog.claimable,
        oldest_claimable_age_s=_age(now, backlog.oldest_claimable),
        status=status,
        status_at=status_at,
        rate_per_s=None if latest is None else latest["rate_per_s"],
    )


class Monitor:
    """The backlog monitor of ``queue`` and consumer group ``consumer`` (see the module docstring).

    Call :meth:`point` once per ``watch_interval`` yourself, or let :meth:`run` (the CLI) or
    :meth:`attach` (a thread beside a running query) do it. Points and the waits between them read
    the queue manager's clock (see :mod:`mqspark.clock`) unless a point is given ``now``.
    """

    def __init__(  # noqa: PLR0913 - the monitor's thresholds, public keywords as the docs show them
        self,
        qm: Queues | HoldsQueues,
        queue: str,
        consumer: str = "default",
        *,
        watch_interval: float,
        watch_count: int,
        expected_count: int,
        abort: bool = False,
        window: int = 10,
        depth_high: float = 80.0,
        depth_low: float = 20.0,
        service_interval: float | None = None,
        lease_timeout: timedelta = DEFAULT_LEASE_TIMEOUT,
        history: bool = True,
    ) -> None:
        self.watch_interval = validate_watch_interval(watch_interval)
        self.judge = BacklogJudge(watch_count, expected_count, abort)
        self.window: deque[MonitorPoint] = deque(maxlen=count_parameter("window", window, 2))
        for name, value in (("depth_high", depth_high), ("depth_low", depth_low)):
            check_number(
                value, f"monitor parameter {name} must be a percentage 0-100, got {value!r}", at_least=0, at_most=100
            )
        if depth_low > depth_high:
            raise MQValidationError(
                f"monitor parameter depth_low ({depth_low!r}) must not be above depth_high ({depth_high!r})"
            )
        if service_interval is not None:
            service_interval = validate_watch_interval(service_interval)
        self.depth_high, self.depth_low, self.service_interval = depth_high, depth_low, service_interval
        self.qm = qm = queues_of(qm)
        with store.answering(qm.root):
            self.definition = qm.resolve(queue)
        self.queue = self.definition.name
        self.consumer = validate_name(consumer, "consumer group")
        self.lease_timeout = lease_timeout
        self.id = f"monitor:{uuid.uuid4().hex[:12]}"
        self.history = store.monitor_location(qm.root, self.queue) if history else None
        self.state = ConsumerState(qm.root, self.queue, qm.storage_options, clock=qm.clock)
        with store.answering(qm.root):
            self.state.all_groups().require(self.queue, self.consumer)
        self._waiting: pa.Table | None = None
        self._last_progress: datetime | None = None
        self._depth_high_raised = False
        self._service_high_raised = False
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._history_table: DeltaTable | None = None
        self.error: MQError | None = None
        self.taken = 0

    @property
    def root(self) -> str:
        return self.qm.root

    @store.connected
    def point(self, now: datetime | None = None) -> MonitorPoint:
        """Measure, judge and record one point; an ``abort`` verdict also stops the group's query."""
        now = now or self.qm.clock.now()
        parked = parked_messages(self.definition, self.state, self.consumer, now)
        backlog = self.qm.group_backlog(self.queue, self.state.all_groups(), now, self.consumer, parked)
        still = None
        if self._waiting is not None:
            still = int(overlap_counts(backlog.waiting, self._waiting).sum())
        previous = self.window[-1] if self.window else None
        judgement = self.judge.observe(backlog.count, still)
        self._waiting = backlog.waiting
        seconds = None if previous is None else (now - previous.at).total_seconds()
        rate = None if not seconds or judgement.processed is None else judgement.processed / seconds
        max_depth = self.definition.max_depth
        point = MonitorPoint(
            at=now,
            queue=self.queue,
            consumer=self.consumer,
            judgement=judgement,
            watch_count=self.judge.watch_count,
            active=self.state.lease(self.consumer, self.lease_timeout, now) is not None,
            claimable=backlog.claimable,
            oldest_claimable_age_s=_age(now, backlog.oldest_claimable),
            rate_per_s=rate,
            depth=backlog.depth,
            max_depth=max_depth,
            **self._failed_on(),
        )
        window = deque(self.window, self.window.maxlen)
        window.append(point)
        point = replace(point, status=group_status(list(window)), events=self._events(point, now))
        self.window.append(point)
        self.taken += 1
        if self.history is not None:
            self._record(point)
        if point.verdict is Verdict.WARN:
            _log.warning("%s", self._falling_behind(point))
        elif point.verdict is Verdict.ABORT:
            self.error = MQError(self._falling_behind(point), Reason.MQRC_Q_SERVICE_INTERVAL_HIGH)
            self._stop_the_group(Reason.MQRC_Q_SERVICE_INTERVAL_HIGH, self.error.detail)
        return point

    def _falling_behind(self, point: MonitorPoint) -> str:
        j = point.judgement
        return (
            f"queue {self.queue}: consumer group {self.consumer!r} is falling behind: it processed "
            f"A={j.processed} messages since the previous point, fewer than expected B={j.expected} and than "
            f"the previous backlog C={j.previous_backlog}; backlog now {j.backlog} (watch_count "
            f"{point.watch_count}, watch_interval {self.watch_interval:g} s)"
        )

    def _stop_the_group(self, reason: Reason, detail: str) -> None:
        """Record the abort in the state table: the query holding the lease fails at its next trigger."""
        self.state.append(abort_rows(self.consumer, self.id, reason, detail))

    def _events(self, point: MonitorPoint, now: datetime) -> tuple[str, ...]:
        events = []
        percent = 100.0 * point.depth / point.max_depth if point.max_depth else 0.0
        if not self._depth_high_raised and percent >= self.depth_high:
            self._depth_high_raised = True
            events.append(_event(Reason.MQRC_Q_DEPTH_HIGH))
        elif self._depth_high_raised and percent <= self.depth_low:
            self._depth_high_raised = False
            events.append(_event(Reason.MQRC_Q_DEPTH_LOW))
        progressed = not point.backlog or bool(point.judgement.processed)
        if progressed or self._last_progress is None:
            self._last_progress = now
        if self.service_interval is not None:
            idle = (now - self._last_progress).total_seconds()
            if not self._service_high_raised and point.backlog and idle >= self.service_interval:
                self._service_high_raised = True
                events.append(_event(Reason.MQRC_Q_SERVICE_INTERVAL_HIGH))
            elif self._service_high_raised and progressed:
                self._service_high_raised = False
                events.append(_event(Reason.MQRC_Q_SERVICE_INTERVAL_OK))
        return tuple(events)

    def _failed_on(self) -> _FailedCounts:
        """How many of this queue's failed messages wait on its backout, error and dead-letter queues."""

        def waiting_on(name: str | None) -> int | None:
            if name is None:
                return None
            try:
                return depth_by_original_queue(self.qm, name).get(self.queue, 0)
            except MQError as error:
                if error.reason != Reason.MQRC_UNKNOWN_OBJECT_NAME:
                    raise
                return None

        dead_letters = self.qm.dead_letter_queue if self.queue != self.qm.dead_letter_queue else None
        return {
            "backed_out": waiting_on(self.definition.backout_queue),
            "errors": waiting_on(self.definition.error_queue),
            "dead_letters": waiting_on(dead_letters),
        }

    def _record(self, point: MonitorPoint) -> None:
        values = point.as_dict()
        values.update({"at": point.at, "monitor": self.id})
        row = pa.table({f.name: pa.array([values[f.name]], f.type) for f in HISTORY_SCHEMA}, schema=HISTORY_SCHEMA)
        assert self.history is not None
        if self._history_table is None:
            if not store.table_exists(self.history, self.qm.storage_options):
                try:
                    store.create_table(self.history, HISTORY_SCHEMA, self.qm.storage_options, _HISTORY_CONFIGURATION)
                except Exception:  # noqa: BLE001 - another monitor created it first
                    if not store.table_exists(self.history, self.qm.storage_options):
                        raise
            # Kept open: each append then reads only the log entries added since the last one.
            self._history_table = store.open_table(self.history, self.qm.storage_options)
            if self._history_table is None:
                raise MQError(f"monitor history {self.history} was deleted", Reason.MQRC_UNKNOWN_OBJECT_NAME)
        write_deltalake(self._history_table, row, mode="append")

    def run(self, points: int | None = None, on_point: Callable[[MonitorPoint], None] | None = None) -> MonitorPoint:
        """Take a point every ``watch_interval`` seconds, ``points`` times (None: until :meth:`stop`)
        or until an abort; return the last point."""
        taken = 0
        while True:
            point = self.point()
            taken += 1
            if on_point is not None:
                on_point(point)
            if point.verdict is Verdict.ABORT or (points is not None and taken >= points):
                return point
            if self.qm.clock.wait(self._stopped, self.watch_interval):
                return point

    def attach(self, query: StreamingQuery) -> Monitor:
        """Monitor beside ``query`` (a running query of the group) in a daemon thread, until the query
        ends or :meth:`stop`. ``warn`` points are logged; an ``abort`` point makes the query fail."""

        def watch() -> None:
            while query.isActive and not self._stopped.is_set():
                try:
                    point = self.point()
                except Exception:  # noqa: BLE001 - a point that failed is logged; the next one may work
                    _log.exception("backlog monitor of queue %s, group %s: a point failed", self.queue, self.consumer)
                else:
                    if point.verdict is Verdict.ABORT:
                        return
                self.qm.clock.wait(self._stopped, self.watch_interval)

        self._thread = threading.Thread(target=watch, name=f"mqspark-monitor-{self.queue}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop taking points, and wait for the attached thread to end."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
