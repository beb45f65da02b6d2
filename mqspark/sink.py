"""Putting from Spark: ``df.write`` / ``df.writeStream`` ``.format("mq")``, one atomic commit per (micro-)batch.

Executors validate their rows with the same :func:`mqspark.messages.prepare_put` as every other put
and write Parquet files into the queue table's folder. The driver then commits every task's files in
one Delta commit (:meth:`mqspark.QueueManager.commit_put`). A streaming commit carries a Delta
``txn`` of (producer, batchId), so a micro-batch replayed after a failure is recognised and never
committed twice. Commit messages are keyed by queue, so one batch can commit to several queues,
each exactly once.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from . import storage
from .definitions import QueueDefinition
from .errors import MQError
from .messages import GROUP_COLUMNS, MESSAGE_SCHEMA, check_group_items, group_items, prepare_put
from .qmgr import QueueManager, before_targets

# put_seq of a row = (partition << 32) + its position in the partition: task order, then row order.
_PARTITION_SHIFT = 32

_log = logging.getLogger("mqspark.sink")


@dataclass(frozen=True)
class SinkPlan:
    """What every task and the commit need, fixed on the driver when the write starts."""

    root: str
    queue: str
    location: str
    definition: QueueDefinition
    segmentation: bool
    producer: str | None

    @classmethod
    def build(cls, root: str, queue: str, schema: StructType, *, segmentation: bool, producer: str | None) -> SinkPlan:
        """Check the queue and the input columns before any task runs."""
        qm = QueueManager.open(root)
        definition = qm.resolve_for_put(queue)
        # The same validation as each row gets, on no rows: catches unknown columns and wrong types.
        prepare_put(definition, to_arrow_schema(schema, timezone="UTC").empty_table())
        location = storage.queue_location(qm.root, definition.name)
        return cls(qm.root, queue, location, definition, segmentation, producer)


@dataclass
class PutCommitMessage(WriterCommitMessage):
    """One task's part of a put: the files it wrote and the group items to check, per local queue."""

    producer: str | None
    files: dict[str, list[storage.DataFile]] = field(default_factory=dict)
    groups: dict[str, bytes] = field(default_factory=dict)
    targets: dict[str, list[str]] = field(default_factory=dict)


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def write_partition(plan: SinkPlan, batches: Iterator[pa.RecordBatch]) -> PutCommitMessage:
    """Validate and write one task's rows as one Parquet file (executor side)."""
    context = TaskContext.get()
    first_seq = context.partitionId() << _PARTITION_SHIFT
    producer = plan.producer or context.getLocalProperty("sql.streaming.queryId")
    groups: list[pa.Table] = []
    targets: set[str] = set()

    def prepared() -> Iterator[pa.RecordBatch]:
        written = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            messages = prepare_put(plan.definition, pa.Table.from_batches([batch]), segmentation=plan.segmentation)
            rows = messages.messages
            seq = pc.add(rows["put_seq"], first_seq + written)
            rows = rows.set_column(rows.schema.get_field_index("put_seq"), MESSAGE_SCHEMA.field("put_seq"), seq)
            written += rows.num_rows
            groups.append(group_items(rows, with_priority=True))
            targets.update(before_targets(rows))
            yield from rows.to_batches()

    file = storage.write_data_file(plan.location, prepared(), MESSAGE_SCHEMA)
    message = PutCommitMessage(producer)
    if file is not None:
        message.files[plan.definition.name] = [file]
        message.groups[plan.definition.name] = _to_ipc(pa.concat_tables(groups))
        message.targets[plan.definition.name] = sorted(targets)
    return message


def commit_batch(plan: SinkPlan, messages: list[PutCommitMessage | None], batch_id: int | None) -> None:
    """Commit every task's files, once per queue (driver side)."""
    # With commitInfo's own timestamp this gives the driver-side commit time of every batch.
    started_ms = int(time.time() * 1000)
    messages = [message for message in messages if message is not None]
    queues = sorted({queue for message in messages for queue in message.files})
    if not queues:
        return
    producer = (plan.producer or messages[0].producer) if batch_id is not None else None
    qm = QueueManager.open(plan.root)
    for queue in queues:
        files = [file for message in messages for file in message.files.get(queue, [])]
        groups = pa.concat_tables([_from_ipc(message.groups[queue]) for message in messages if queue in message.groups])
        try:
            # Across tasks: a group may be spread over several of them.
            check_group_items(queue, groups)
        except MQError:
            storage.remove_data_files(storage.queue_location(qm.root, queue), files)
            raise
        targets = sorted({target for message in messages for target in message.targets.get(queue, [])})
        version = qm.commit_put(
            queue,
            files,
            groups.select(GROUP_COLUMNS),
            targets,
            producer=producer,
            batch_id=batch_id,
            metadata={"mqspark.commit_started_ms": started_ms},
        )
        rows = sum(file.rows for file in files)
        if version is None:
            _report(f"queue {queue}: batch {batch_id} of producer {producer} was committed before; skipped {rows} rows")
        else:
            where = f"batch {batch_id} of producer {producer}" if batch_id is not None else "batch write"
            _report(f"queue {queue}: {where} committed {rows} messages at version {version}")


def abort_batch(plan: SinkPlan, messages: list[PutCommitMessage | None]) -> None:
    """Delete the files of a failed batch; nothing of it was committed."""
    for message in messages:
        if message is not None:
            for files in message.files.values():
                storage.remove_data_files(plan.location, files)


def _report(text: str) -> None:
    # The commit runs in a Python worker whose stderr reaches the driver's log.
    if not _log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s INFO mqspark.sink: %(message)s", "%H:%M:%S"))
        _log.addHandler(handler)
        _log.setLevel(logging.INFO)
    _log.info(text)


class QueueWriter(DataSourceArrowWriter):
    """``df.write.format("mq")``: one commit for the whole write."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PutCommitMessage:
        return write_partition(self.plan, iterator)

    def commit(self, messages: list[PutCommitMessage | None]) -> None:
        commit_batch(self.plan, messages, None)

    def abort(self, messages: list[PutCommitMessage | None]) -> None:
        abort_batch(self.plan, messages)


class QueueStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("mq")``: one commit per micro-batch, exactly once per (producer, batchId)."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PutCommitMessage:
        return write_partition(self.plan, iterator)

    def commit(self, messages: list[PutCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        commit_batch(self.plan, messages, batchId)

    def abort(self, messages: list[PutCommitMessage | None], batchId: int) -> None:  # noqa: N803
        abort_batch(self.plan, messages)
