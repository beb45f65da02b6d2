"""Putting from Spark: ``df.write`` / ``df.writeStream`` ``.format("mq")``, one atomic commit per (micro-)batch.

Executors validate their rows with the same :func:`mqspark.model.messages.prepare_put` as every other put
and write Parquet files into the queue table's folder. The driver then commits every task's files in
one Delta commit (:meth:`mqspark.engine.puts.Puts.commit_put`). A streaming commit carries a Delta
``txn`` of (producer, batchId), so a micro-batch replayed after a failure is recognised and never
committed twice. Commit messages are keyed by queue, so one batch can commit to several queues,
each exactly once.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from mqspark import store
from mqspark.engine.put_checks import before_targets
from mqspark.engine.queues import Queues
from mqspark.errors import MQError, Reason
from mqspark.model.definitions import QueueDefinition
from mqspark.model.groups import GROUP_COLUMNS, check_group_items, group_items
from mqspark.model.messages import MESSAGE_SCHEMA, QUEUE_TABLE_SCHEMA
from mqspark.model.put import prepare_put
from mqspark.reconnect import DEFAULT_RECONNECT_TIMEOUT, Reconnect, ReconnectMode
from mqspark.spark import routing
from mqspark.spark.tasks import commit_messages, task_context

_Result = TypeVar("_Result")
# put_seq of a row = (partition << 32) + its position in the partition: task order, then row order.
PARTITION_SHIFT = 32

_log = logging.getLogger("mqspark.spark.sink")


@dataclass(frozen=True)
class SinkPlan:
    """What every task and the commit need, fixed on the driver when the write starts."""

    root: str
    queue: str
    definition: QueueDefinition | None
    segmentation: bool
    producer: str | None
    reconnect: Reconnect | None = None
    cluster: routing.ClusterRoute | None = None
    # A one-off write's own id: the producer of its rows unless option producerId names one, and the
    # transaction that recognises its commits in doubt after a reconnect.
    write_id: str = ""

    @classmethod
    def build(  # noqa: PLR0913 - the sink's options, checked together before any task runs
        cls,
        root: str,
        queue: str,
        schema: StructType,
        *,
        segmentation: bool,
        producer: str | None,
        reconnect: tuple[ReconnectMode | None, timedelta] = (None, DEFAULT_RECONNECT_TIMEOUT),
        cluster: tuple[str, ...] = (),
        bind: str = "as_q_def",
        qmgr: str | None = None,
        reopen: bool = False,
    ) -> SinkPlan:
        """Check the queue (or the cluster route) and the input columns before any task runs; a
        ``reopen`` is a streaming put's writer made again for a later micro-batch."""
        qm, policy = Reconnect.open(root, *reconnect, f"put to queue {queue}", reopen=reopen)
        if cluster:
            route = routing.cluster_route(qm, cluster, queue, bind, qmgr)
            definition, checked = None, route.dead_letter
        else:
            route = None
            definition = checked = qm.resolve_for_put(queue)
        # The same validation as each row gets, on no rows: catches unknown columns and wrong types.
        prepare_put(checked, to_arrow_schema(schema, timezone="UTC").empty_table())
        return cls(qm.root, queue, definition, segmentation, producer, policy, route, f"write:{uuid.uuid4().hex}")

    def reconnects(self) -> bool:
        """Whether a broken connection is retried (else it fails the write with 2009)."""
        return self.reconnect is not None and self.reconnect.mode in (ReconnectMode.YES, ReconnectMode.QMGR)

    def producer_of(self, query: str | None) -> str:
        """The one producer identity of this write's rows, from routing to the binding records: option
        producerId, else the streaming query's id, else the one-off write's own."""
        return self.producer or query or self.write_id

    def call(self, operation: Callable[[], _Result]) -> _Result:
        """``operation()`` under the write's reconnect policy."""
        if self.reconnect is None:
            return operation()
        return self.reconnect.call(operation, f"put to queue {self.queue}")


# Where a share of a put goes: (queue manager root, local queue name).
Target = tuple[str, str]


@dataclass
class PutCommitMessage(WriterCommitMessage):
    """One task's part of a put: the files it wrote and the group items to check, per target queue,
    and how its rows were routed when the put went to a cluster queue."""

    producer: str | None
    files: dict[Target, list[store.DataFile]] = field(default_factory=dict)
    groups: dict[Target, bytes] = field(default_factory=dict)
    targets: dict[Target, list[str]] = field(default_factory=dict)
    routing: routing.TaskRouting | None = None


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


class QueueShare:
    """Writes one target queue's share of a task's rows as one Parquet file, batch by batch."""

    def __init__(self, root: str, definition: QueueDefinition, segmentation: bool, first_seq: int) -> None:
        self.target: Target = (root, definition.name)
        self.definition = definition
        self.segmentation = segmentation
        self.next_seq = first_seq
        self.groups: list[pa.Table] = []
        self.before: set[str] = set()

    def prepared(
        self, parts: Iterable[tuple[pa.Table, Callable[[pa.Table], pa.Table] | None]]
    ) -> Iterator[pa.RecordBatch]:
        for data, header in parts:
            if data.num_rows == 0:
                continue
            rows = prepare_put(self.definition, data, segmentation=self.segmentation).messages
            if header is not None:
                rows = header(rows)
            seq = pc.add(rows["put_seq"], self.next_seq)
            rows = rows.set_column(rows.schema.get_field_index("put_seq"), MESSAGE_SCHEMA.field("put_seq"), seq)
            self.next_seq += rows.num_rows
            self.groups.append(group_items(rows, with_priority=True))
            self.before.update(before_targets(rows))
            yield from rows.to_batches()

    def write(
        self, message: PutCommitMessage, parts: Iterable[tuple[pa.Table, Callable[[pa.Table], pa.Table] | None]]
    ) -> None:
        """Write ``parts`` (rows, and the header to stamp on them or None) and add the file to ``message``."""
        location = store.queue_location(*self.target)
        file = store.write_data_file(location, self.prepared(parts), QUEUE_TABLE_SCHEMA)
        if file is not None:
            message.files[self.target] = [file]
            message.groups[self.target] = _to_ipc(pa.concat_tables(self.groups))
            message.targets[self.target] = sorted(self.before)


def write_partition(plan: SinkPlan, batches: Iterator[pa.RecordBatch]) -> PutCommitMessage:
    """Validate and write one task's rows, one Parquet file per target queue (executor side). With
    reconnection on, the task keeps its rows until they are written, to write them again after a
    reconnect."""
    context = task_context()
    partition = context.partitionId()
    producer = plan.producer_of(context.getLocalProperty("sql.streaming.queryId"))
    batch_id = context.getLocalProperty("streaming.sql.batchId")
    if not plan.reconnects() and plan.cluster is None:
        return plan.call(lambda: _write_task(plan, partition, producer, batch_id, batches))
    rows = [batch for batch in batches if batch.num_rows]
    return plan.call(lambda: _write_task(plan, partition, producer, batch_id, iter(rows)))


def _write_task(
    plan: SinkPlan, partition: int, producer: str, batch_id: str | None, batches: Iterator[pa.RecordBatch]
) -> PutCommitMessage:
    first_seq = partition << PARTITION_SHIFT
    message = PutCommitMessage(producer)
    if plan.cluster is None:
        assert plan.definition is not None, "a put not routed through a cluster has its queue's definition"
        share = QueueShare(plan.root, plan.definition, plan.segmentation, first_seq)
        share.write(message, ((pa.Table.from_batches([batch]), None) for batch in batches))
        return message
    rows = list(batches)
    if not rows:
        return message
    routed = routing.route_task(
        plan.cluster,
        plan.queue,
        producer,
        None if batch_id is None else int(batch_id),
        pa.Table.from_batches(rows),
        partition,
    )
    message.routing = routed.record
    for (root, definition), rows in routed.shares:
        QueueShare(root, definition, plan.segmentation, first_seq).write(message, [(rows, None)])
    if routed.dead_letters:
        dead_letters = QueueShare(plan.root, plan.cluster.dead_letter, plan.segmentation, first_seq)
        dead_letters.write(message, [(dead.rows, dead.header) for dead in routed.dead_letters])
    return message


@dataclass(frozen=True)
class BatchCommit:
    """What the driver commits for one batch: whose rows, under which Delta ``txn`` (producer,
    batch), and the routing the cluster journals record after the replica commits."""

    producer: str
    batch_id: int | None
    transaction: tuple[str, int] | None
    routed: routing.BatchRouting | None

    def describe(self) -> str:
        what = "write" if self.batch_id is None else f"batch {self.batch_id}"
        return f"{what} of producer {self.producer}"


def commit_batch(plan: SinkPlan, messages: Sequence[PutCommitMessage | None], batch_id: int | None) -> None:
    """Commit every task's files, once per target queue, then record how the rows were routed (driver
    side). ``batch_id`` is a streaming micro-batch's, None for a one-off write. A commit in doubt after
    a reconnect is resolved by its transaction: a one-off write that may reconnect gets one of its own."""
    given = [message for message in messages if message is not None]
    producer = plan.producer_of(given[0].producer if given else None)
    if batch_id is not None:
        transaction: tuple[str, int] | None = (producer, batch_id)
    else:
        transaction = (plan.write_id, 0) if plan.reconnects() else None
    routed = None
    if plan.cluster is not None:
        routed = routing.batch_routing(plan.cluster, plan.queue, producer, batch_id, [m.routing for m in given])
    batch = BatchCommit(producer, batch_id, transaction, routed)
    plan.call(lambda: _commit_batch(plan, given, batch))


def _commit_batch(plan: SinkPlan, messages: list[PutCommitMessage], batch: BatchCommit) -> None:
    # With commitInfo's own timestamp this gives the driver-side commit time of every batch.
    metadata = {"mqspark.commit_started_ms": int(time.time() * 1000), "mqspark.producer": batch.producer}
    targets = sorted({target for message in messages for target in message.files})
    landed: list[str] = []
    managers: dict[str, Queues] = {}
    try:
        for target in targets:
            qm = managers.setdefault(target[0], Queues.open(target[0]))
            where = f"queue {target[1]} of {qm.name}" if plan.cluster is not None else f"queue {target[1]}"
            rows, version = _commit_target(qm, target, messages, batch.transaction, metadata)
            landed.append(f"{where} ({rows} messages)")
            if version is None:
                _report(f"{where}: {batch.describe()} was committed before; skipped {rows} rows")
            else:
                _report(f"{where}: {batch.describe()} committed {rows} messages at version {version}")
        if batch.routed is not None:
            routing.record_routing(batch.routed)
    except Exception as error:
        if not landed:
            raise
        raise _partly_committed(plan.queue, batch, error, landed) from error


def _partly_committed(queue: str, batch: BatchCommit, error: Exception, landed: list[str]) -> MQError:
    """One line for a batch that failed after some of its commits: the cause, then exactly what landed."""
    reason = error.reason if isinstance(error, MQError) else Reason.MQRC_UNEXPECTED_ERROR
    detail = error.detail if isinstance(error, MQError) else f"{type(error).__name__}: {error}"
    journal = "" if batch.routed is None else "; its routing was not recorded"
    return MQError(
        f"put to queue {queue}, {batch.describe()}: {detail}; already committed: {', '.join(landed)}{journal}", reason
    )


def _commit_target(
    qm: Queues,
    target: Target,
    messages: list[PutCommitMessage],
    transaction: tuple[str, int] | None,
    metadata: dict[str, object],
) -> tuple[int, int | None]:
    """Commit the tasks' files for one target queue: their rows, and the version (None: committed before)."""
    root, queue = target
    files = [file for message in messages for file in message.files.get(target, [])]
    groups = pa.concat_tables([_from_ipc(message.groups[target]) for message in messages if target in message.groups])
    try:
        # Across tasks: a group may be spread over several of them.
        check_group_items(queue, groups)
    except MQError:
        store.remove_data_files(store.queue_location(root, queue), files)
        raise
    before = sorted({name for message in messages for name in message.targets.get(target, [])})
    version = qm.puts.commit_put(
        queue,
        files,
        groups.select(GROUP_COLUMNS),
        before,
        transaction=transaction,
        metadata=metadata,
        deduplicate=True,
    )
    return sum(file.rows for file in files), version


def abort_batch(plan: SinkPlan, messages: Sequence[PutCommitMessage | None]) -> None:
    """Delete the files of a failed batch that no commit took. A batch to several queues can fail
    after some of them committed: their files stay, and the commit's error says which landed."""
    shares: dict[Target, list[store.DataFile]] = {}
    for message in messages:
        for target, files in message.files.items() if message is not None else ():
            shares.setdefault(target, []).extend(files)
    for (root, queue), files in shares.items():
        location = store.queue_location(root, queue)
        table = store.open_table(location, store.options_for(location))
        committed = set(store.live_paths(table)) if table is not None else set()
        store.remove_data_files(location, [file for file in files if file.path not in committed])


def _report(text: str) -> None:
    # The commit runs in a Python worker whose stderr reaches the driver's log.
    if not _log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s INFO mqspark.spark.sink: %(message)s", "%H:%M:%S"))
        _log.addHandler(handler)
        _log.setLevel(logging.INFO)
    _log.info(text)


class QueueWriter(DataSourceArrowWriter):
    """``df.write.format("mq")``: one commit for the whole write."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PutCommitMessage:
        return write_partition(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_batch(self.plan, commit_messages(messages, PutCommitMessage), None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_batch(self.plan, commit_messages(messages, PutCommitMessage))


class QueueStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("mq")``: one commit per micro-batch, exactly once per (producer, batchId)."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PutCommitMessage:
        return write_partition(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        commit_batch(self.plan, commit_messages(messages, PutCommitMessage), batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        abort_batch(self.plan, commit_messages(messages, PutCommitMessage))
