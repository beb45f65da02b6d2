"""The forwarding service on Spark (``mqspark.forward``): the streaming get of the request queue,
its ``foreachBatch``, and the internal Python data source whose tasks call the service on the
executors and write the replies. The replies' records and targets are in
:mod:`mqspark.services.forward`.
"""

from __future__ import annotations

import base64
import functools
import json
import pickle
import tempfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as CallTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceWriter, WriterCommitMessage

from mqspark import store
from mqspark.engine.backout import plan_messages
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.state_rows import EventKind, failure_rows, reply_rows
from mqspark.errors import MQValidationError
from mqspark.model.definitions import validate_name
from mqspark.model.numbers import check_number
from mqspark.model.ranges import RANGE_COLUMNS, in_ranges, merge_ranges, single_ranges
from mqspark.spark.sink import PARTITION_SHIFT, PutCommitMessage, QueueShare, SinkPlan, abort_batch, commit_batch
from mqspark.spark.tasks import commit_messages, task_context

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

    from mqspark.engine.queues import Queues
from mqspark.services.forward import (
    FORWARDER,
    GET_OPTIONS,
    REPLY_FIELDS,
    REQUEST_FIELDS,
    RESULT_SCHEMA,
    ServiceError,
    by_value,
    dead_letter_header,
    failed_outcome,
    is_payload,
    live_reply_records,
    load_service,
    open_queues,
    outcome_of,
    reply_landed,
    reply_targets,
    with_properties,
)
from mqspark.services.instances import stoppable

# The format of the forwarder's internal write: its tasks call the service and write the replies.
REPLY_FORMAT = "mq_forward_replies"


def forward(  # noqa: PLR0913 - the forwarder's public keywords, as the docs show them
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
    qm = open_queues(root)
    validate_name(consumer, "consumer group")
    local = qm.resolve_for_get(queue).name
    unknown = sorted(set(options) - set(GET_OPTIONS))
    if unknown:
        raise MQValidationError(
            f"forward: queue {local}: unknown option(s) {', '.join(unknown)}; options are {', '.join(GET_OPTIONS)}"
        )
    check_number(
        idle_interval, f"forward: idle_interval must be a number of seconds >= 0, got {idle_interval!r}", at_least=0
    )
    if call_timeout is not None:
        check_number(
            call_timeout, f"forward: call_timeout must be a number of seconds > 0, got {call_timeout!r}", above=0
        )
    load_service(service)
    checkpoint = checkpoint_location or store.forward_location(qm.root, local, consumer)
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
    writer = requests.writeStream.foreachBatch(stoppable(batch.process)).option("checkpointLocation", checkpoint)
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
            results = [self._results(service, with_properties(batch)) for batch in batches if batch.num_rows]
        finally:
            self._stop_pool()
        if not results:
            return Outcomes(None, PutCommitMessage(None))
        return _write_replies(self.root, pa.Table.from_batches(results))

    def _stop_pool(self) -> None:
        """Stop the pool of the calls with a time limit (a call still running is left to finish)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

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
                if isinstance(replies, pa.Array | pa.ChunkedArray) and is_payload(replies.type):
                    # Arrow in, Arrow out: every request succeeded, with return code 0.
                    replies = pc.cast(replies, pa.binary())
                    replies = replies.combine_chunks() if isinstance(replies, pa.ChunkedArray) else replies
                    columns += [replies, pa.nulls(count, pa.int32()).fill_null(0), pa.nulls(count, pa.string())]
                    return pa.RecordBatch.from_arrays(columns, schema=RESULT_SCHEMA)
                outcomes = [outcome_of(reply) for reply in replies]
            except Exception as error:  # noqa: BLE001 - every failure of the service fails its requests
                outcomes = [failed_outcome(error)] * count
        else:
            outcomes = []
            for message in requests.to_pylist():
                try:
                    outcomes.append(outcome_of(self._call(functools.partial(service, message))))
                except Exception as error:  # noqa: BLE001 - a failed call fails its request
                    outcomes.append(failed_outcome(error))
        reply, code, error_text = zip(*outcomes, strict=True)
        columns += [pa.array(reply, pa.binary()), pa.array(code, pa.int32()), pa.array(error_text, pa.string())]
        return pa.RecordBatch.from_arrays(columns, schema=RESULT_SCHEMA)


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
        self._opened: tuple[Queues, ConsumerState] | None = None
        self._producer_id: str | None = None

    def process(self, df: DataFrame, batch_id: int) -> None:
        if self._opened is None:
            opened = open_queues(self.root)
            self._opened = (opened, ConsumerState(opened.root, self.queue, opened.storage_options))
        qm, state = self._opened
        producer = self._producer(qm)
        replied = self._settle(qm, state, producer)
        plan_id, owner, plan = state.current_plan(self.consumer)
        if plan_id is None:
            return
        identities = plan_messages(plan)
        done = state.events(self.consumer, (EventKind.BACKOUT,), RANGE_COLUMNS, plan_id)
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
            # Failed calls are failed deliveries (see mqspark.engine.backout), recorded in one commit.
            state.append(
                pa.concat_tables(
                    failure_rows(
                        self.consumer, owner, EventKind.BACKOUT, plan_id, chosen.select(["origin", "row"]), error
                    )
                    for error, chosen in by_value(failed, "error")
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

    def _producer(self, qm: Queues) -> str:
        """The forwarder's producer id: queue manager, queue, group, and the query's id (kept in its
        checkpoint), so a new checkpoint starts new transactions."""
        if self._producer_id is None:
            filesystem, path = store.filesystem_of(f"{self.checkpoint.removeprefix('file:')}/metadata")
            with filesystem.open_input_stream(path) as metadata:
                query_id = json.loads(metadata.read().decode())["id"]
            self._producer_id = f"mqspark.forward/{qm.name}/{self.queue}/{self.consumer}/{query_id}"
        return self._producer_id

    def _settle(self, qm: Queues, state: ConsumerState, producer: str) -> pa.Table:
        """Check the reply records not checked yet, before anything is put: cancel those whose put did
        not land. The requests whose reply landed, as ``origin``/``row``/``count`` ranges."""
        rows = state.events(
            self.consumer,
            (EventKind.REPLY, EventKind.UNREPLIED),
            ["event", "plan_id", "seq", "target", "at", *RANGE_COLUMNS],
        )
        replied, cancel = [rows.slice(0, 0).select(RANGE_COLUMNS)], []
        for entry, mine in live_reply_records(rows):
            if entry not in self._landed:
                qmgr, queue = json.loads(entry[2])
                if not reply_landed(qm, qmgr, queue, producer, entry[1]):
                    cancel.append(reply_rows(self.consumer, producer, EventKind.UNREPLIED, entry, mine))
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
                    reply_rows(
                        self.consumer,
                        producer,
                        EventKind.REPLY,
                        (plan_id, batch_id, target),
                        merge_ranges(single_ranges(rows)),
                    )
                    for target, rows in by_value(replied, "target")
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

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [message for message in commit_messages(messages, Outcomes) if message is not None]
        tables = [message.outcomes for message in done if message.outcomes is not None]
        outcomes = pa.concat_tables(tables) if tables else pa.table({"delivery_seq": pa.array([], pa.int64())})
        written = [message.written for message in done if message.written.files]
        # Written whole, then renamed: the foreachBatch never reads half a hand-over.
        partial = Path(f"{self.handover}.partial")
        partial.write_bytes(pickle.dumps((outcomes, written)))
        partial.rename(self.handover)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        written = [message.written for message in commit_messages(messages, Outcomes) if message is not None]
        abort_batch(SinkPlan("", "", None, False, None), written)


def _write_replies(root: str, results: pa.Table) -> Outcomes:
    """Write the replies of one task's results into their target queues' folders (one file per
    target, not committed: the driver commits them), and return each request's outcome and the
    files written (executor side)."""
    qm = open_queues(root)
    answered = pc.and_(pc.is_null(results["error"]), pc.fill_null(pc.not_equal(results["reply_to_queue"], ""), False))
    written = PutCommitMessage(None)
    first_seq = task_context().partitionId() << PARTITION_SHIFT
    targets = {}
    for target, rows in reply_targets(qm, results.filter(answered)).items():
        target_qm = qm if target.root == qm.root else open_queues(target.root)
        header = dead_letter_header(rows) if target.queue == qm.dead_letter_queue and target_qm is qm else None
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
