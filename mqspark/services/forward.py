"""The forwarding service (Tuxedo's TMQFORWARD, spec section 5), without Spark: the service call and
its outcome, the replies and where each goes, the reply records that make replies exactly once, and
``mqspark.request``. The query that runs it on Spark is :mod:`mqspark.spark.forward`.

What the service does: get each request of a queue, call a
service with it, put the reply on the request's reply queue, and send a request whose calls keep
failing to its failure queue.

:func:`mqspark.spark.forward.forward` runs a streaming get of the queue in its own consumer group (default ``forward``)
with a ``foreachBatch`` that writes the batch with an internal Python data source (format
:data:`mqspark.spark.forward.REPLY_FORMAT`): its tasks call the service on the rows Spark hands them and write the
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
  :func:`mqspark.engine.backout.backout` records it: the queue's ``retry_count`` and ``retry_delay``
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

import importlib
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.cluster.repository import Cluster
from mqspark.engine.access import HoldsQueues, queues_of
from mqspark.engine.get import GetRequest, get
from mqspark.engine.state_rows import EventKind
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.dead_letter import dead_letter
from mqspark.model.messages import PROPERTIES, TIMESTAMP

if TYPE_CHECKING:
    from mqspark.engine.queues import Queues

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


def with_properties(batch: pa.RecordBatch) -> pa.Table:
    """Requests as the streaming get delivers them: ``properties`` back from JSON to a map."""
    requests = pa.Table.from_batches([batch])
    index = requests.schema.get_field_index("properties")
    text = requests["properties"].to_pylist()
    entries = [None if value is None else list(json.loads(value).items()) for value in text]
    return requests.set_column(index, pa.field("properties", PROPERTIES), pa.array(entries, PROPERTIES))


def is_payload(kind: pa.DataType) -> bool:
    return (
        pa.types.is_binary(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_large_string(kind)
    )


def outcome_of(reply: Any) -> tuple[bytes | None, int, str | None]:
    """A service's answer as (payload, return code, error): bytes or str, optionally with a return code."""
    code = 0
    if isinstance(reply, tuple) and len(reply) == 2 and isinstance(reply[1], int):
        reply, code = reply
    if isinstance(reply, str):
        return reply.encode(), code, None
    if isinstance(reply, bytes | bytearray):
        return bytes(reply), code, None
    return None, 0, f"the service returned {type(reply).__name__}, not bytes or str"


def failed_outcome(error: Exception) -> tuple[None, int, str]:
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


# Why a reply cannot go where it was meant to: (reason, text, intended queue, intended queue manager).
_Refusal = tuple[Reason, str, str, str]


def by_value(table: pa.Table, *columns: str) -> Iterator[tuple[Any, pa.Table]]:
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


def _with_reasons(rows: pa.Table, reasons: Sequence[_Refusal | None] | None) -> pa.Table:
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


def reply_targets(qm: Queues, answered: pa.Table) -> dict[_Target, pa.Table]:
    """The replies to put, by target queue: reply rows with the request's delivery_seq, and (for the
    dead-letter queue) why each could not go where it was meant to."""
    replies: dict[_Target, list[pa.Table]] = {}
    dead_letter_queue = _Target(qm.name, qm.root, qm.dead_letter_queue)
    for (qmgr, queue), part in by_value(answered, "reply_to_qmgr", "reply_to_queue"):
        rows = _reply_rows(part)
        target = _resolve(qm, qmgr, queue)
        if isinstance(target, _Target):
            reasons = [None] * rows.num_rows if target == dead_letter_queue else None
            replies.setdefault(target, []).append(_with_reasons(rows, reasons))
        else:
            replies.setdefault(dead_letter_queue, []).append(_with_reasons(rows, [target] * rows.num_rows))
    return {target: pa.concat_tables(parts) for target, parts in replies.items()}


def dead_letter_header(rows: pa.Table) -> Callable[[pa.Table], pa.Table]:
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


def open_queues(root: str) -> Queues:
    from mqspark.engine.queues import Queues

    return Queues.open(root)


def _resolve(qm: Queues, qmgr: str | None, queue: str) -> _Target | _Refusal:
    """Where a reply to ``queue`` on ``qmgr`` goes, or why it cannot go there."""
    name = qmgr or qm.name
    if name == qm.name:
        target_qm = qm
    else:
        root = _member_root(qm, name)
        if root is None:
            text = f"reply queue manager {name} is unknown to queue manager {qm.name} (no shared cluster)"
            return Reason.MQRC_UNKNOWN_OBJECT_NAME, text, queue, name
        target_qm = open_queues(root)
    try:
        resolved = target_qm.resolve_for_put(queue)
    except MQError as refused:
        return refused.reason or Reason.MQRC_UNKNOWN_OBJECT_NAME, f"reply not put: {refused}", queue, name
    return _Target(target_qm.name, target_qm.root, resolved.name)


def _member_root(qm: Queues, name: str) -> str | None:
    for repository in qm.cluster_roots():
        for member in Cluster.open(repository).snapshot().members:
            if member.qmgr == name:
                return member.root
    return None


def reply_landed(qm: Queues, qmgr: str, queue: str, producer: str, version: int) -> bool:
    if qmgr == qm.name:
        target = qm
    else:
        root = _member_root(qm, qmgr)
        if root is None:
            return False
        target = open_queues(root)
    committed = target.puts.committed_transaction(queue, producer)
    return committed is not None and committed >= version


def reply_entries(records: pa.Table) -> Iterator[tuple[str, int, str]]:
    """The (plan_id, seq, target) of each reply record."""
    return zip(*(records[name].to_pylist() for name in ("plan_id", "seq", "target")), strict=True)


def live_reply_records(rows: pa.Table) -> Iterator[tuple[tuple[str, int, str], pa.Table]]:
    """The ``reply`` records among ``rows`` (``reply`` and ``unreplied`` events with ``at``) that no
    ``unreplied`` record cancelled, by (plan_id, seq, target). A replay of the same plan puts with
    the same txn version again, so a record is cancelled only by an ``unreplied`` record made after
    it: a record of a later attempt stands."""
    cancelled: dict[tuple[str, int, str], Any] = {}
    unreplied = rows.filter(pc.equal(rows["event"], EventKind.UNREPLIED))
    for entry, at in zip(reply_entries(unreplied), unreplied["at"].to_pylist(), strict=True):
        cancelled[entry] = max(at, cancelled.get(entry, at))
    records = rows.filter(pc.equal(rows["event"], EventKind.REPLY))
    for entry, mine in by_value(records, "plan_id", "seq", "target"):
        if entry in cancelled:
            mine = mine.filter(pc.greater(mine["at"], pa.scalar(cancelled[entry], mine.schema.field("at").type)))
        if mine.num_rows:
            yield entry, mine


@store.connected
def request(
    qm: Queues | HoldsQueues,
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
    qm = queues_of(qm)
    correl_id = uuid.uuid4().hex
    fields = {
        "payload": payload,
        "correl_id": correl_id,
        "reply_to_queue": reply_to,
        "failure_queue": failure_queue or reply_to,
        **({"priority": priority} if priority is not None else {}),
    }
    (msg_id,) = qm.puts.put(queue, [fields])
    got = get(qm, GetRequest(reply_to, consumer, wait=timeout, correl_id=correl_id))
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
