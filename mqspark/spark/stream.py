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

Planning itself (pending messages, failed messages, ordering, admission, the records of plans and
consumption) is the :class:`~mqspark.engine.planner.Planner`'s, shared with the Python get.

Every ``maintenanceInterval`` the planner also starts a maintenance run of the queue in the
background (see :mod:`mqspark.engine.maintenance`); a run already going elsewhere is left to finish.

Failed deliveries (:mod:`mqspark.engine.backout`): messages given back with ``mqspark.backout``
are left out when their plan is recorded consumed; a plan replayed by a new run counts a rolled-back
delivery for each of its messages. Planning moves the messages that failed too often, holds the
others back until their retry delay has passed, and delivered rows carry their ``backout_count``.

The last batch of a run is recorded as consumed by the listener :func:`mqspark.register` installs
(``latestOffset`` after it never comes), or by ``latestOffset`` when the query restarts.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.maintenance import Maintenance
from mqspark.engine.ordering import DeliveryOptions
from mqspark.engine.planner import PlannedRows, Planner
from mqspark.engine.queues import Queues
from mqspark.engine.state_rows import EventKind, consumed_rows
from mqspark.errors import MQError, Reason
from mqspark.reconnect import Reconnect
from mqspark.spark.browse import batch_rows
from mqspark.spark.plain import without_frames

OFFSET_KEYS = ("root", "queue", "consumer", "owner", "seq", "plan", "delivered", "version", "now")
_Result = TypeVar("_Result")
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
    # The instance of a service this query runs for (see :mod:`mqspark.services.instances`): it, not
    # the checkpoint's owner, holds the group's lease, so instances sharing a checkpoint fence each other.
    instance: str | None = None
    # How the query reconnects when the queue manager's storage breaks (options reconnect, reconnectTimeout).
    reconnect: Reconnect | None = None


def offset(values: dict) -> dict:
    """An offset with its keys in one fixed order: Spark compares offsets as JSON strings."""
    return {key: values[key] for key in OFFSET_KEYS}


def is_offset(value: object) -> bool:
    return isinstance(value, dict) and tuple(value) == OFFSET_KEYS


@dataclass
class QueuePartition(PlannedRows, InputPartition):
    """Planned messages for one task (see :class:`~mqspark.engine.planner.PlannedRows`)."""

    value: int = 0


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming get of one consumer group. Pickled to executors right after construction, so
    everything heavy is created lazily, in the driver planner process only."""

    def __init__(self, options: GetOptions) -> None:
        self.options = options
        self._group: Planner | None = None
        self._owner = ""
        self._handed_over = False
        self._maintenance: Maintenance | None = None
        self._initial: dict | None = None
        self._target: tuple[int, datetime] | None = None

    # Planner methods (driver)

    @without_frames
    def initialOffset(self) -> dict:
        return self._reconnecting("first offset", self._initial_offset)

    def _initial_offset(self) -> dict:
        # Spark calls this again after a crash in the first micro-batch (to replay it), so it takes no
        # lease: the lease goes to the owner named by the offsets the query actually runs on.
        if self._initial is None:
            qm = Queues.open(self.options.root)
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

    @without_frames
    def prepareForTriggerAvailableNow(self) -> None:
        version = self._reconnecting(
            "trigger", lambda: Queues.open(self.options.root).queue_version(self.options.queue)
        )
        self._target = (version, datetime.now(UTC))
        if self._group is not None:
            self._group.up_to = self._target[0]

    @without_frames
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self._handed_over:
            return start

        def plan() -> dict:
            group = self._join(start["owner"], start["seq"] if start["plan"] else 0)
            with group.state.pinned():
                return self._next_offset(group, start, limit)

        return self._reconnecting("planning", plan)

    def _next_offset(self, group: Planner, start: dict, limit: ReadLimit) -> dict:
        group.consume(start["plan"], start["seq"])
        if self.options.maintenance_interval is not None:
            if self._maintenance is None:
                self._maintenance = Maintenance(group.qm, partial(group.qm.resolve, group.definition.name))
            self._maintenance.start_if_due(self.options.maintenance_interval)
        # A plan returned earlier that Spark did not start from was never run: its messages wait again.
        group.drop_unstarted_plans()
        if group.lost is not None:
            raise group.lost
        stopped = group.stopped_by_monitor()
        if stopped is not None:
            # The last batch's consumption is recorded and the lease released: a restart goes on at once.
            group.flush()
            group.close()
            raise stopped
        if self.options.instance and group.switchover_requested():
            # Switchover at a batch boundary: Spark asks for the next batch only once the last one
            # committed, so recording it consumed and releasing the lease leaves a standby nothing to replay.
            group.flush()
            group.close()
            self._handed_over = True
            return start
        now = self._target[1] if self._target else datetime.now(UTC)
        news = group.catch_up()
        due = group.is_due(now)
        if group.exhausted and not news and not due:
            group.flush()
            return start
        # Numbers go on past every plan recorded: Python gets of the group may have planned since
        # this query's last batch, and a plan recorded by a run that ended before Spark logged its
        # offsets is never started (its messages go in this plan again). So the batch being
        # processed is the group's last plan (see ConsumerState.current_plan), which a backout names.
        seq = max(start["seq"], group.state.last_position(self.options.consumer)[0])
        _, delivered = group.state.consumed_position(self.options.consumer)
        delivered = max(delivered, start["delivered"])
        plan = group.plan(delivered, now, *self._limits(limit))
        if plan is None:
            group.flush()
            return start
        end = offset(
            {
                **start,
                "seq": seq + 1,
                "plan": plan.schema.metadata[b"plan_id"].decode(),
                "delivered": int(plan.schema.metadata[b"delivered"]),
                "version": group.index_version(),
                "now": int(now.timestamp() * 1_000_000),
            }
        )
        group.record(end["plan"], end["seq"], plan)
        return end

    def _limits(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        """The most messages and payload bytes the next batch may take."""
        if isinstance(limit, ReadAllAvailable):
            return None, None
        options = self.options
        max_messages = limit.max_rows if isinstance(limit, ReadMaxRows) else options.max_messages
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else options.max_bytes
        return max_messages, max_bytes

    @without_frames
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if start == end or not end["plan"]:
            return []
        return self._reconnecting("partitions", lambda: self._partitions(start, end))

    def _partitions(self, start: dict, end: dict) -> list[InputPartition]:
        group = self._join(end["owner"], end["seq"])
        with group.state.pinned():
            # Spark replays a batch only once the one before it is done: this also loads the pending
            # index, which must know where maintenance has moved the plan's messages since.
            group.consume(start["plan"], start["seq"])
            group.catch_up()
            plan = group.plans.get(end["plan"])
            if plan is None:
                plan = group.state.plan(self.options.consumer, end["plan"])
                if group.count_replay(end["plan"], plan):
                    return []
            return [
                QueuePartition(**vars(rows), value=index)
                for index, rows in enumerate(group.planned_rows(end["plan"], plan))
            ]

    @without_frames
    def commit(self, end: dict) -> None:
        if end.get("plan"):

            def consume() -> None:
                group = self._join(end["owner"])
                group.consume(end["plan"], end["seq"])
                group.flush()

            if self._group is not None:
                self._reconnecting("commit", consume)

    def stop(self) -> None:
        """Release the group's lease. Spark does not call this for Python sources today (the planner
        process is killed); the lease then lapses, or the query listener releases it."""
        if self._group is not None:
            self._group.close()
            self._group = None

    # Executor

    @without_frames
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueuePartition), "Spark hands read() a partition of partitions()"
        table = self._reconnecting("read", partition.messages, planner=False)
        yield from table.to_batches(max_chunksize=batch_rows(table))

    # Helpers

    def _reconnecting(self, what: str, operation: Callable[[], _Result], planner: bool = True) -> _Result:
        """``operation()`` under the query's reconnect policy. After a reconnect the planner is made
        again from the state table, as after a restart: its memory may hold half of a failed step."""
        tries = [0]

        def attempt() -> _Result:
            if tries[0] and planner and self._group is not None:
                self._group.stop_renewing()
                self._group = None
            tries[0] += 1
            return operation()

        options = self.options
        if options.reconnect is None:
            return operation()
        return options.reconnect.call(attempt, f"streaming get of queue {options.queue} ({what})")

    def _join(self, owner: str, resumes_at: int = 0) -> Planner:
        """The planner of this run, taking the group's lease for ``owner`` on first use (waiting for
        a Python get of the group to finish). ``resumes_at``: the plan number the offsets Spark
        resumes from say the group reached."""
        if self._group is None:
            options = self.options
            self._owner = owner
            self._group = Planner(
                Queues.open(options.root),
                options.queue,
                options.consumer,
                options.instance or owner,
                options.delivery,
                options.lease_timeout,
                exact_lengths=options.max_bytes is not None,
                patience=options.lease_timeout,
                resumes_at=resumes_at,
            )
            self._group.up_to = self._target[0] if self._target else None
        elif self._owner != owner:
            raise MQError(
                f"queue {self.options.queue}: offsets of another query reached consumer {self.options.consumer!r}",
                Reason.MQRC_OBJECT_IN_USE,
            )
        return self._group


def record_finished_batch(end_offset: str) -> None:
    """Record the plan of a finished batch as consumed, given the source's end offset as Spark
    reports it (a JSON string). Offsets of other sources are ignored."""
    try:
        end = json.loads(end_offset)
    except (TypeError, ValueError):
        return
    if not is_offset(end) or not end["plan"]:
        return
    qm = Queues.open(end["root"])
    state = ConsumerState(qm.root, qm.resolve_for_get(end["queue"]).name, qm.storage_options)
    settled = end["plan"] in state.consumed_plans(end["consumer"]).to_pylist()
    # A batch that backed out messages is settled by the group's next run, which knows their groups.
    if not settled and not state.events(end["consumer"], (EventKind.BACKOUT,), ["row"], end[EventKind.PLAN]).num_rows:
        state.append(consumed_rows(end["consumer"], end["owner"], end["plan"], end["seq"]))
    state.release(end["consumer"], end["owner"])
