"""The forwarding service (Tuxedo's TMQFORWARD, spec section 5): get each request of a queue, call a
service with it, put the reply on the request's reply queue, and send a request whose calls keep
failing to its failure queue.

:func:`forward` runs a streaming get of the queue in its own consumer group (default ``forward``)
with a ``foreachBatch`` that writes the batch with an internal Python data source (format
:data:`REPLY_FORMAT`): its tasks call the service on the rows Spark hands them and write the
replies into their target queues' folders, as the ``mq`` sink's tasks do; its commit hands the
outcomes to the ``foreachBatch``, which records them and commits each target's files in one put.
A request and its reply are never in one transaction: the reply is put while the request's batch
runs, and the request is consumed when the batch ends.

- **Success**: the reply goes to ``reply_to_queue`` on ``reply_to_qmgr`` (this queue manager when
  empty; another queue manager by name when this one shares a cluster with it: its root is the
  member's root in the cluster repository). The reply's ``correl_id`` is the request's, or its
  ``msg_id`` when it has none; it keeps the request's priority and carries the user return code in
  property :data:`RETURN_CODE`. A request without a reply queue gets no reply; the streaming query
  counts those in its observed metrics (``forward``: ``requests``, ``without_reply_queue``).
- **Unknown reply queue** (or queue manager), or a reply queue that refuses the put: the reply goes
  to the dead-letter queue with the dead-letter header (2085 ``MQRC_UNKNOWN_OBJECT_NAME``, or the
  put's reason).
- **Failure**: the service raised (a :class:`ServiceError` carries a return code), ran over the
  per-call time limit, or returned neither bytes nor str. The request is backed out, as
  :func:`mqspark.services.backout.backout` records it: the queue's ``retry_count`` and ``retry_delay``
  apply; when they are used up it moves to its ``failure_queue``, else to the error queue or the
  dead-letter queue, with the error text in its dead-letter header.

**Exactly one reply per request, across crashes.** Before the replies of a batch are put, a
``reply`` record per target queue, holding the requests answered as ranges of message identities
(and the Delta ``txn`` version the put will carry), goes to the queue's state table. Every batch
starts by checking the records of requests still waiting: a record whose put did not land (the
target's ``txn`` for the forwarder is below its version) is cancelled (an ``unreplied`` record),
before anything else is put. A request with a landed record is not called again, whatever batch
delivers it next (a replay, or the smaller batches after a replay was given up); it is consumed
without a second reply.
"""

from __future__ import annotations

import base64
import importlib
import json
import pickle
import tempfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as CallTimeout
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceWriter, WriterCommitMessage

from .. import storage
from ..cluster.repository import Cluster
from ..consumers import RANGE_COLUMNS, STATE_SCHEMA, ConsumerState, in_ranges, merge_ranges, single_ranges
from ..definitions import validate_name
from ..errors import MQError, MQValidationError, Reason
from ..messages import PROPERTIES, TIMESTAMP, dead_letter
from ..spark.sink import PARTITION_SHIFT, PutCommitMessage, QueueShare, SinkPlan, abort_batch, commit_batch
from .backout import failure_rows, plan_messages

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

    from ..qmgr import QueueManager

# The consumer group a forwarder reads in, unless told otherwise.
FORWARDER = "forward"
# The property of a reply that carries the service's user return code (Tuxedo's tpurcode).
RETURN_CODE = "mqspark.return_code"
# Options of the streaming get a forwarder passes on.
GET_OPTIONS = (
    "maxMessagesPerTrigger",
    "maxBytesPerTrigger",
    "leaseTimeout",
    "maintenanceInterval",
    "instance",
    "reconnect",
    "reconnectTimeout",
)

# The fields of a reply the forwarder puts.
REPLY_FIELDS = ["payload", "correl_id", "priority", "properties"]
# The request fields a reply is made from, and the call's outcome.
REQUEST_FIELDS = ("delivery_seq", "msg_id", "correl_id", "priority", "reply_to_queue", "reply_to_qmgr", "queue")
RESULT_SCHEMA = pa.schema(
    [
        pa.field("delivery_seq", pa.int64()),
        pa.field("msg_id", pa.string()),
        pa.field("correl_id", pa.string()),
        pa.field("priority", pa.int32()),
        pa.field("reply_to_queue", pa.string()),
        pa.field("reply_to_qmgr", pa.string()),
        pa.field("queue", pa.string()),
        pa.field("reply", pa.binary()),
        pa.field("return_code", pa.int32()),
        pa.field("error", pa.string()),
    ]
)

# The format of the forwarder's internal write: its tasks call the service and write the replies.
REPLY_FORMAT = "mq_forward_replies"


class ServiceError(Exception):
    """Raised by a service to fail a request with a user return code (Tuxedo's ``tpreturn(TPFAIL, rcode)``)."""

    def __init__(self, text: str, return_code: int = 0) -> None:
        super().__init__(text)
        self.return_code = return_code


def load_service(service: str | Callable[..., Any]) -> Callable[..., Any]:
    """The service: a callable, or ``"module:function"`` imported now. Refused with a clear error
    when it cannot be imported or is not callable."""
    if isinstance(service, str):
        module_name, _, name = service.partition(":")
        if not module_name or not name:
            raise MQValidationError(f"forward: service {service!r} must be given as module:function")
        try:
            found = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as error:
            raise MQValidationError(f"forward: service {service!r} cannot be imported: {error}") from None
        service_name, service = service, found
    else:
        service_name = getattr(service, "__qualname__", repr(service))
    if not callable(service):
        raise MQValidationError(f"forward: service {service_name!r} is not callable")
    return service


def forward(
    spark: SparkSession,
    root: str,
    queue: str,
    service: str | Callable[..., Any],
    *,
    consumer: str = FORWARDER,
    exit_when_empty: bool = False,
    idle_interval: float = 1.0,
    call_timeout: float | None = None,
    vectorized: bool = False,
    checkpoint_location: str | None = None,
    **options: Any,
) -> StreamingQuery:
    """Start the forwarding service of ``queue`` and return its running query.

    ``service(message)`` takes a dict of the request's fields and returns the reply payload (bytes
    or str), or a pair (payload, user return code); with ``vectorized``, ``service(requests)`` takes
    a pyarrow Table of requests and returns one reply per request: a list of such payloads, or an
    Arrow array of binary or string (return code 0). ``exit_when_empty`` stops once the queue is
    drained (TMQFORWARD ``-e``; ``trigger(availableNow=True)``); otherwise the queue is polled every
    ``idle_interval`` seconds (``-i``; 0: as soon as the last batch is done). A call running longer
    than ``call_timeout`` seconds fails (``-t``). ``options`` are the streaming get's per-trigger
    limits, lease, instance and reconnect options (:data:`GET_OPTIONS`): run under
    :class:`~mqspark.services.instances.Instance` with ``instance=instance_id``. The checkpoint is
    ``checkpoint_location``, by default under the queue manager root.
    """
    from ..qmgr import QueueManager

    qm = QueueManager.open(root)
    validate_name(consumer, "consumer group")
    local = qm.resolve_for_get(queue).name
    unknown = sorted(set(options) - set(GET_OPTIONS))
    if unknown:
        raise MQValidationError(
            f"forward: queue {local}: unknown option(s) {', '.join(unknown)}; options are {', '.join(GET_OPTIONS)}"
        )
    if isinstance(idle_interval, bool) or not isinstance(idle_interval, int | float) or not idle_interval >= 0:
        raise MQValidationError(f"forward: idle_interval must be a number of seconds >= 0, got {idle_interval!r}")
    if call_timeout is not None and (
        isinstance(call_timeout, bool) or not isinstance(call_timeout, int | float) or not call_timeout > 0
    ):
        raise MQValidationError(f"forward: call_timeout must be a number of seconds > 0, got {call_timeout!r}")
    load_service(service)
    checkpoint = checkpoint_location or storage.forward_location(qm.root, local, consumer)
    batch = _Batch(qm.root, local, consumer, service, vectorized, call_timeout, checkpoint)

    from pyspark.sql import functions as F

    spark.dataSource.register(ReplyDataSource)
    requests = (
        spark.readStream.format("mq")
        .option("queue", local)
        .option("consumer", consumer)
        .options(**{key: str(value) for key, value in options.items()})
        .load(qm.root)
        .observe(
            "forward",
            F.count(F.lit(1)).alias("requests"),
            F.count(F.when(F.col("reply_to_queue").isNull(), 1)).alias("without_reply_queue"),
        )
    )
    writer = requests.writeStream.foreachBatch(batch.process).option("checkpointLocation", checkpoint)
    writer = (
        writer.trigger(availableNow=True)
        if exit_when_empty
        else writer.trigger(processingTime=f"{idle_interval} seconds")
    )
    return writer.queryName(f"mqspark-forward-{local}-{consumer}").start()


class _Caller:
    """Calls the service on the requests of one partition (in an executor's Python worker)."""

    def __init__(
        self, root: str, service: str | Callable[..., Any], vectorized: bool, call_timeout: float | None
    ) -> None:
        self.root, self.service, self.vectorized, self.call_timeout = root, service, vectorized, call_timeout

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Outcomes:
        service = load_service(self.service)
        self._pool: ThreadPoolExecutor | None = None
        try:
            results = [self._results(service, _with_properties(batch)) for batch in batches if batch.num_rows]
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
        if not results:
            return Outcomes(None, PutCommitMessage(None))
        return _write_replies(self.root, pa.Table.from_batches(results))

    def _call(self, call: Callable[[], Any]) -> Any:
        if self.call_timeout is None:
            return call()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="mqspark-service")
        try:
            return self._pool.submit(call).result(timeout=self.call_timeout)
        except CallTimeout:
            # The call cannot be stopped: it is left to finish in its thread, and the next call gets a new one.
            self._pool.shutdown(wait=False)
            self._pool = None
            raise ServiceError(f"the call ran over its time limit of {self.call_timeout:g} s") from None

    def _results(self, service: Callable[..., Any], requests: pa.Table) -> pa.RecordBatch:
        count = requests.num_rows
        columns = [requests[name].combine_chunks() for name in REQUEST_FIELDS]
        outcomes: list[tuple[bytes | None, int, str | None]]
        if self.vectorized:
            try:
                replies = self._call(lambda: service(requests))
                if len(replies) != count:
                    raise ServiceError(f"the service returned {len(replies)} replies for {count} requests")
                if isinstance(replies, pa.Array | pa.ChunkedArray) and _is_payload(replies.type):
                    # Arrow in, Arrow out: every request succeeded, with return code 0.
                    replies = pc.cast(replies, pa.binary())
                    replies = replies.combine_chunks() if isinstance(replies, pa.ChunkedArray) else replies
                    columns += [replies, pa.nulls(count, pa.int32()).fill_null(0), pa.nulls(count, pa.string())]
                    return pa.RecordBatch.from_arrays(columns, schema=RESULT_SCHEMA)
                outcomes = [_outcome(reply) for reply in replies]
            except Exception as error:  # noqa: BLE001 - every failure of the service fails its requests
                outcomes = [_failed(error)] * count
        else:
            outcomes = []
            for message in requests.to_pylist():
                try:
                    outcomes.append(_outcome(self._call(lambda message=message: service(message))))
                except Exception as error:  # noqa: BLE001 - a failed call fails its request
                    outcomes.append(_failed(error))
        reply, code, error = zip(*outcomes, strict=True)
        columns += [pa.array(reply, pa.binary()), pa.array(code, pa.int32()), pa.array(error, pa.string())]
        return pa.RecordBatch.from_arrays(columns, schema=RESULT_SCHEMA)


def _with_properties(batch: pa.RecordBatch) -> pa.Table:
    """Requests as the streaming get delivers them: ``properties`` back from JSON to a map."""
    requests = pa.Table.from_batches([batch])
    index = requests.schema.get_field_index("properties")
    text = requests["properties"].to_pylist()
    entries = [None if value is None else list(json.loads(value).items()) for value in text]
    return requests.set_column(index, pa.field("properties", PROPERTIES), pa.array(entries, PROPERTIES))


def _is_payload(kind: pa.DataType) -> bool:
    return (
        pa.types.is_binary(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_large_string(kind)
    )


def _outcome(reply: Any) -> tuple[bytes | None, int, str | None]:
    """A service's answer as (payload, return code, error): bytes or str, optionally with a return code."""
    code = 0
    if isinstance(reply, tuple) and len(reply) == 2 and isinstance(reply[1], int):
        reply, code = reply
    if isinstance(reply, str):
        return reply.encode(), code, None
    if isinstance(reply, bytes | bytearray):
        return bytes(reply), code, None
    return None, 0, f"the service returned {type(reply).__name__}, not bytes or str"


def _failed(error: Exception) -> tuple[None, int, str]:
    code = getattr(error, "return_code", 0)
    code = code if isinstance(code, int) else 0
    return None, code, f"{type(error).__name__}: {error} (return code {code})"


@dataclass(frozen=True)
class _Target:
    """Where replies go: a queue of a queue manager (by root)."""

    qmgr: str
    root: str
    queue: str

    def key(self) -> str:
        return json.dumps([self.qmgr, self.queue])


class _Batch:
    """The forwarder's ``foreachBatch``: runs on the driver, once per micro-batch (again on a replay)."""

    def __init__(
        self,
        root: str,
        queue: str,
        consumer: str,
        service: str | Callable[..., Any],
        vectorized: bool,
        call_timeout: float | None,
        checkpoint: str,
    ) -> None:
        self.root, self.queue, self.consumer = root, queue, consumer
        from pyspark import cloudpickle

        self.pickled_caller = base64.b64encode(
            cloudpickle.dumps(_Caller(root, service, vectorized, call_timeout))
        ).decode()
        self.checkpoint = checkpoint
        self._landed: set[tuple[str, int, str]] = set()
        # Kept from batch to batch: the queue manager keeps its tables open, the state its rows.
        self._qm: QueueManager | None = None
        self._state: ConsumerState | None = None
        self._producer_id: str | None = None

    def process(self, df: DataFrame, batch_id: int) -> None:
        if self._qm is None:
            self._qm = _open(self.root)
            self._state = ConsumerState(self._qm.root, self.queue, self._qm.storage_options)
        qm, state = self._qm, self._state
        producer = self._producer(qm)
        replied = self._settle(qm, state, producer)
        plan_id, owner, plan = state.current_plan(self.consumer)
        if plan_id is None:
            return
        identities = plan_messages(plan)
        done = state.events(self.consumer, ("backout",), RANGE_COLUMNS, plan_id)
        # Requests replied to already, and those backed out in an earlier attempt of this batch.
        skip = in_ranges(identities["origin"], identities["row"], pa.concat_tables([replied, done]))
        skipped = identities["delivery_seq"].filter(skip).to_pylist()
        requests = df.filter(~df["delivery_seq"].isin(skipped)) if skipped else df
        outcomes, written = self._call(requests, batch_id)
        if outcomes.num_rows == 0:
            return
        # Where each outcome's request lies in the plan: its identity.
        where = pc.index_in(outcomes["delivery_seq"], value_set=identities["delivery_seq"])
        outcomes = outcomes.append_column("origin", identities["origin"].take(where))
        outcomes = outcomes.append_column("row", identities["row"].take(where))
        sink = SinkPlan(qm.root, self.queue, None, False, producer)
        try:
            self._record_replies(state, plan_id, outcomes.filter(pc.is_valid(outcomes["target"])), producer, batch_id)
        except BaseException:
            # Nothing was committed: the tasks' files never will be.
            abort_batch(sink, written)
            raise
        commit_batch(sink, written, batch_id)
        failed = outcomes.filter(pc.is_valid(outcomes["error"]))
        if failed.num_rows:
            # Failed calls are failed deliveries (see mqspark.services.backout), recorded in one commit.
            state.append(
                pa.concat_tables(
                    failure_rows(self.consumer, owner, "backout", plan_id, chosen.select(["origin", "row"]), error)
                    for error, chosen in _by_value(failed, "error")
                )
            )

    def _call(self, requests: DataFrame, batch_id: int) -> tuple[pa.Table, list[PutCommitMessage]]:
        """Run the batch's calls: each task calls the service on its requests and writes their
        replies; the write's commit (in a Python process of the driver) hands this process the
        outcomes and files of the tasks that succeeded, through a file of this machine (the commit runs
        on the driver, whatever storage the checkpoint is on)."""
        handover = Path(tempfile.gettempdir()) / f"mqspark-forward-{batch_id}-{uuid.uuid4().hex}.pickle"
        from pyspark.sql import functions as F

        (
            # Spark hands a map column to Python far slower than its JSON text (0.23 s more per
            # 20,000 requests); the tasks turn it back into the map.
            requests.withColumn("properties", F.to_json("properties"))
            .write.format(REPLY_FORMAT)
            .option("caller", self.pickled_caller)
            .option("handover", str(handover))
            .mode("append")
            .save()
        )
        try:
            outcomes, written = pickle.loads(handover.read_bytes())
        finally:
            handover.unlink(missing_ok=True)
        return outcomes, written

    def _producer(self, qm: QueueManager) -> str:
        """The forwarder's producer id: queue manager, queue, group, and the query's id (kept in its
        checkpoint), so a new checkpoint starts new transactions."""
        if self._producer_id is None:
            filesystem, path = storage.filesystem_of(f"{self.checkpoint.removeprefix('file:')}/metadata")
            with filesystem.open_input_stream(path) as metadata:
                query_id = json.loads(metadata.read().decode())["id"]
            self._producer_id = f"mqspark.forward/{qm.name}/{self.queue}/{self.consumer}/{query_id}"
        return self._producer_id

    def _settle(self, qm: QueueManager, state: ConsumerState, producer: str) -> pa.Table:
        """Check the reply records not checked yet, before anything is put: cancel those whose put did
        not land. The requests whose reply landed, as ``origin``/``row``/``count`` ranges."""
        rows = state.events(
            self.consumer, ("reply", "unreplied"), ["event", "plan_id", "seq", "target", *RANGE_COLUMNS]
        )
        records = rows.filter(pc.equal(rows["event"], "reply"))
        cancelled = set(_entries(rows.filter(pc.equal(rows["event"], "unreplied"))))
        replied, cancel = [records.slice(0, 0).select(RANGE_COLUMNS)], []
        for entry, mine in _by_value(records, "plan_id", "seq", "target"):
            if entry in cancelled:
                continue
            if entry not in self._landed:
                qmgr, queue = json.loads(entry[2])
                if not _landed(qm, qmgr, queue, producer, entry[1]):
                    cancel.append(_state_rows(self.consumer, producer, "unreplied", entry, mine))
                    continue
                self._landed.add(entry)
            replied.append(mine.select(RANGE_COLUMNS))
        if cancel:
            state.append(pa.concat_tables(cancel))
        return pa.concat_tables(replied)

    def _record_replies(
        self, state: ConsumerState, plan_id: str, replied: pa.Table, producer: str, batch_id: int
    ) -> None:
        """The ``reply`` records of the requests answered (a range of requests per row), before the
        replies are committed."""
        if replied.num_rows:
            state.append(
                pa.concat_tables(
                    _state_rows(
                        self.consumer, producer, "reply", (plan_id, batch_id, target), merge_ranges(single_ranges(rows))
                    )
                    for target, rows in _by_value(replied, "target")
                )
            )


@dataclass
class Outcomes(WriterCommitMessage):
    """What a task of the forwarder's write reports: each request's outcome (``delivery_seq``,
    ``error``, and the key of its reply's target queue, null for no reply) and the files it wrote."""

    outcomes: pa.Table | None
    written: PutCommitMessage


class ReplyDataSource(DataSource):
    """The forwarder's internal write (format :data:`REPLY_FORMAT`), run once per micro-batch from
    its ``foreachBatch``; options ``caller`` (a pickled :class:`_Caller`) and ``handover`` (a file)."""

    @classmethod
    def name(cls) -> str:
        return REPLY_FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        caller = pickle.loads(base64.b64decode(self.options["caller"]))
        return _ReplyWriter(caller, self.options["handover"])


class _ReplyWriter(DataSourceArrowWriter):
    def __init__(self, caller: _Caller, handover: str) -> None:
        self.caller, self.handover = caller, handover

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Outcomes:
        return self.caller(iterator)

    def commit(self, messages: list[Outcomes | None]) -> None:
        done = [message for message in messages if message is not None]
        tables = [message.outcomes for message in done if message.outcomes is not None]
        outcomes = pa.concat_tables(tables) if tables else pa.table({"delivery_seq": pa.array([], pa.int64())})
        written = [message.written for message in done if message.written.files]
        # Written whole, then renamed: the foreachBatch never reads half a hand-over.
        partial = Path(f"{self.handover}.partial")
        partial.write_bytes(pickle.dumps((outcomes, written)))
        partial.rename(self.handover)

    def abort(self, messages: list[Outcomes | None]) -> None:
        written = [message.written for message in messages if message is not None]
        abort_batch(SinkPlan("", "", None, False, None), written)


def _by_value(table: pa.Table, *columns: str) -> Iterator[tuple[Any, pa.Table]]:
    """The rows of ``table`` by the distinct values of ``columns`` (nulls included)."""
    keys = table.select(list(columns)).group_by(list(columns), use_threads=False).aggregate([])
    for key in keys.to_pylist():
        mask = None
        for name in columns:
            value = key[name]
            equal = pc.is_null(table[name]) if value is None else pc.fill_null(pc.equal(table[name], value), False)
            mask = equal if mask is None else pc.and_(mask, equal)
        values = tuple(key[name] for name in columns)
        yield (values if len(columns) > 1 else values[0]), table.filter(mask)


def _reply_rows(answered: pa.Table) -> pa.Table:
    """The replies to ``answered`` requests: the service's payload, the request's correl_id (or its
    msg_id), its priority, the return code as a property, and the request's delivery_seq."""
    count = answered.num_rows
    properties = pa.MapArray.from_arrays(
        pa.array(range(count + 1), pa.int32()),
        pa.array([RETURN_CODE] * count, pa.string()),
        pc.cast(answered["return_code"], pa.string()).combine_chunks(),
    )
    return pa.table(
        {
            "payload": answered["reply"],
            "correl_id": pc.coalesce(answered["correl_id"], answered["msg_id"]),
            "priority": answered["priority"],
            "properties": properties,
            "delivery_seq": answered["delivery_seq"],
        }
    )


def _with_reasons(rows: pa.Table, reasons: list[tuple | None] | None) -> pa.Table:
    """``rows`` with the dead-letter reason of each (code, text, intended queue and queue manager)."""
    reasons = reasons or [None] * rows.num_rows

    def header(position: int, kind: pa.DataType) -> pa.Array:
        return pa.array([None if r is None else (int(r[0]) if position == 0 else r[position]) for r in reasons], kind)

    return (
        rows.append_column("dlq_reason", header(0, pa.int32()))
        .append_column("dlq_reason_text", header(1, pa.string()))
        .append_column("dlq_original_queue", header(2, pa.string()))
        .append_column("dlq_original_qmgr", header(3, pa.string()))
    )


def _write_replies(root: str, results: pa.Table) -> Outcomes:
    """Write the replies of one task's results into their target queues' folders (one file per
    target, not committed: the driver commits them), and return each request's outcome and the
    files written (executor side)."""
    from pyspark import TaskContext

    qm = _open(root)
    answered = pc.and_(pc.is_null(results["error"]), pc.fill_null(pc.not_equal(results["reply_to_queue"], ""), False))
    written = PutCommitMessage(None)
    first_seq = TaskContext.get().partitionId() << PARTITION_SHIFT
    targets = {}
    for target, rows in _targets(qm, results.filter(answered)).items():
        target_qm = qm if target.root == qm.root else _open(target.root)
        header = _dead_letter_header(rows) if target.queue == qm.dead_letter_queue and target_qm is qm else None
        share = QueueShare(target.root, target_qm.resolve_for_put(target.queue), False, first_seq)
        share.write(written, [(rows.select(REPLY_FIELDS), header)])
        targets.update(dict.fromkeys(rows["delivery_seq"].to_pylist(), target.key()))
    outcomes = pa.table(
        {
            "delivery_seq": results["delivery_seq"],
            "error": results["error"],
            "target": pa.array([targets.get(seq) for seq in results["delivery_seq"].to_pylist()], pa.string()),
        }
    )
    return Outcomes(outcomes, written)


def _targets(qm: QueueManager, answered: pa.Table) -> dict[_Target, pa.Table]:
    """The replies to put, by target queue: reply rows with the request's delivery_seq, and (for the
    dead-letter queue) why each could not go where it was meant to."""
    replies: dict[_Target, list[pa.Table]] = {}
    dead_letter_queue = _Target(qm.name, qm.root, qm.dead_letter_queue)
    for (qmgr, queue), part in _by_value(answered, "reply_to_qmgr", "reply_to_queue"):
        rows = _reply_rows(part)
        target, refused = _resolve(qm, qmgr, queue)
        if refused is None:
            reasons = [None] * rows.num_rows if target == dead_letter_queue else None
            replies.setdefault(target, []).append(_with_reasons(rows, reasons))
        else:
            replies.setdefault(dead_letter_queue, []).append(_with_reasons(rows, [refused] * rows.num_rows))
    return {target: pa.concat_tables(parts) for target, parts in replies.items()}


def _dead_letter_header(rows: pa.Table) -> Callable[[pa.Table], pa.Table]:
    """Stamps on prepared replies (in the order of ``rows``) the dead-letter header of why each could
    not go where it was meant to; replies whose own reply queue is the dead-letter queue get none."""

    def stamp(prepared: pa.Table) -> pa.Table:
        codes = rows["dlq_reason"]
        prepared = dead_letter(prepared, codes, rows["dlq_reason_text"], "", "", datetime.now(UTC))
        for name, column in (
            ("dlq_original_queue", rows["dlq_original_queue"]),
            ("dlq_original_qmgr", rows["dlq_original_qmgr"]),
            ("dlq_time", pc.if_else(pc.is_valid(codes), prepared["dlq_time"], pa.scalar(None, TIMESTAMP))),
        ):
            index = prepared.schema.get_field_index(name)
            prepared = prepared.set_column(index, prepared.schema.field(index), column)
        return prepared

    return stamp


def _open(root: str) -> QueueManager:
    from ..qmgr import QueueManager

    return QueueManager.open(root)


def _resolve(
    qm: QueueManager, qmgr: str | None, queue: str
) -> tuple[_Target | None, tuple[Reason, str, str, str] | None]:
    """Where a reply to ``queue`` on ``qmgr`` goes, or why it cannot go there: (reason, text,
    intended queue, intended queue manager)."""
    name = qmgr or qm.name
    if name == qm.name:
        target_qm = qm
    else:
        root = _member_root(qm, name)
        if root is None:
            text = f"reply queue manager {name} is unknown to queue manager {qm.name} (no shared cluster)"
            return None, (Reason.MQRC_UNKNOWN_OBJECT_NAME, text, queue, name)
        target_qm = _open(root)
    try:
        resolved = target_qm.resolve_for_put(queue)
    except MQError as refused:
        return None, (refused.reason or Reason.MQRC_UNKNOWN_OBJECT_NAME, f"reply not put: {refused}", queue, name)
    return _Target(target_qm.name, target_qm.root, resolved.name), None


def _member_root(qm: QueueManager, name: str) -> str | None:
    for repository in qm.cluster_roots():
        for member in Cluster.open(repository).snapshot().members:
            if member.qmgr == name:
                return member.root
    return None


def _landed(qm: QueueManager, qmgr: str, queue: str, producer: str, version: int) -> bool:
    if qmgr == qm.name:
        target = qm
    else:
        root = _member_root(qm, qmgr)
        if root is None:
            return False
        target = _open(root)
    committed = target.committed_transaction(queue, producer)
    return committed is not None and committed >= version


def _entries(records: pa.Table) -> Iterator[tuple[str, int, str]]:
    """The (plan_id, seq, target) of each reply record."""
    return zip(*(records[name].to_pylist() for name in ("plan_id", "seq", "target")), strict=True)


def _state_rows(consumer: str, owner: str, event: str, entry: tuple[str, int, str], ranges: pa.Table) -> pa.Table:
    """``event`` rows of one reply put (plan, txn version, target) for the requests of ``ranges``."""
    plan_id, seq, target = entry
    count = ranges.num_rows
    given = {
        "consumer": pa.repeat(consumer, count),
        "owner": pa.repeat(owner, count),
        "event": pa.repeat(event, count),
        "plan_id": pa.repeat(plan_id, count),
        "seq": pa.repeat(pa.scalar(seq, pa.int64()), count),
        "target": pa.repeat(target, count),
        "origin": ranges["origin"],
        "row": ranges["row"],
        "count": ranges["count"],
        "at": pa.repeat(pa.scalar(datetime.now(UTC), TIMESTAMP), count),
    }
    return pa.table({f.name: given.get(f.name, pa.nulls(count, f.type)) for f in STATE_SCHEMA}, schema=STATE_SCHEMA)


def request(
    qm: QueueManager,
    queue: str,
    payload: bytes | str,
    *,
    reply_to: str,
    timeout: float,
    failure_queue: str | None = None,
    consumer: str = "default",
    priority: int | None = None,
) -> pa.Table:
    """The client half of request/reply: put ``payload`` on ``queue`` as a request whose replies go to
    ``reply_to`` (and, unless ``failure_queue`` says otherwise, its failure record too), then wait up
    to ``timeout`` seconds for the message correlated to it and return it (a one-row table).

    Raises :class:`MQError` with the failure's dead-letter reason when a failure record comes back,
    and 2033 (``MQRC_NO_MSG_AVAILABLE``) when nothing came back in time.
    """
    correl_id = uuid.uuid4().hex
    fields = {
        "payload": payload,
        "correl_id": correl_id,
        "reply_to_queue": reply_to,
        "failure_queue": failure_queue or reply_to,
        **({"priority": priority} if priority is not None else {}),
    }
    (msg_id,) = qm.put(queue, [fields])
    got = qm.get(reply_to, consumer, wait=timeout, correl_id=correl_id)
    if got.num_rows == 0:
        raise MQError(
            f"request {msg_id} to queue {queue}: no reply on queue {reply_to} within {timeout:g} s",
            Reason.MQRC_NO_MSG_AVAILABLE,
        )
    reason = got["dlq_reason"][0].as_py()
    if reason is not None:
        try:
            code = Reason(reason)
        except ValueError:
            code = None
        raise MQError(f"request {msg_id} to queue {queue} failed: {got['dlq_reason_text'][0].as_py()}", code)
    return got
