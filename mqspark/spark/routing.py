"""Workload routing on Spark (spec section 7): :func:`route`, and the routed put behind the sink's
``.option("cluster", ...)``.

The decision itself is :func:`mqspark.cluster.routing.route_messages`; this module feeds it the right cluster
snapshots and applies it per Spark task. A streaming put routes micro-batch N of a producer against
the snapshot its cluster journal names for N (:meth:`mqspark.cluster.Cluster.routing_snapshot`), so
a replay routes exactly as the first attempt, and every replica commit is then made exactly once by
its own ``txn``. Only after every replica committed does the journal record the batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from mqspark.cluster.records import Binding, ClusterSnapshot
from mqspark.cluster.repository import Cluster
from mqspark.cluster.routing import RouteRequest, Routing, check_bind, route_messages
from mqspark.engine.queues import Queues
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.dead_letter import dead_letter
from mqspark.model.definitions import QueueDefinition, validate_name
from mqspark.model.messages import MESSAGE_SCHEMA
from mqspark.qmgr import QueueManager, engine
from mqspark.spark.tasks import task_context

# What route() adds to a DataFrame.
ROUTE_COLUMNS = StructType(
    [
        StructField("target_qmgr", StringType()),
        StructField("target_cluster", StringType()),
        StructField("dlq_reason", IntegerType()),
        StructField("dlq_reason_text", StringType()),
    ]
)
_ROUTING_DEFAULTS = {
    "group_id": None,
    "msg_seq_number": 1,
    "offset": 0,
    "last_in_group": False,
    "segmented": False,
    "last_segment": False,
}


@dataclass(frozen=True)
class ClusterRoute:
    """A put to a cluster queue as fixed on the driver: who puts, through which cluster repositories."""

    from_qmgr: str
    repositories: tuple[str, ...]
    bind: str
    qmgr: str | None
    dead_letter: QueueDefinition
    # The repository versions a one-off batch write routes with, read when it started: its tasks
    # must agree, and a streaming put's journal is not there to make them.
    versions: tuple[int, ...] = ()

    def request(self, queue: str, producer: str) -> RouteRequest:
        return RouteRequest(queue, self.from_qmgr, producer, self.bind, self.qmgr)


@dataclass
class TaskRouting:
    """What one task's routing used and decided, for the cluster journals (see :func:`record_routing`)."""

    versions: dict[str, int]
    used: tuple[str, ...]
    bindings: tuple[Binding, ...]
    finished_groups: tuple[str, ...]


@dataclass
class DeadLetters:
    """Rows no replica can take, all with one reason, and the header they get on the dead-letter queue."""

    rows: pa.Table
    reason: int
    reason_text: str
    queue: str
    qmgr: str

    def header(self, messages: pa.Table) -> pa.Table:
        count = messages.num_rows
        return dead_letter(
            messages,
            pa.repeat(pa.scalar(self.reason, pa.int32()), count),
            pa.repeat(self.reason_text, count),
            self.queue,
            self.qmgr,
            datetime.now(UTC),
        )


@dataclass
class RoutedTask:
    """A task's rows split by target: each replica's share (root, definition, rows), and the dead letters."""

    shares: list[tuple[tuple[str, QueueDefinition], pa.Table]]
    dead_letters: list[DeadLetters]
    record: TaskRouting


def cluster_route(qm: Queues, clusters: Sequence[str], queue: str, bind: str, qmgr: str | None) -> ClusterRoute:
    """Check a put to cluster queue ``queue`` from ``qm`` through ``clusters`` (names it has joined)."""
    validate_name(queue)
    check_bind(bind)
    if qmgr is not None:
        validate_name(qmgr, "queue manager")
    repositories = tuple(qm.cluster_repository(name) for name in clusters)
    dead_letter_queue = qm.resolve_for_put(qm.dead_letter_queue)
    versions = tuple(Cluster.open(root).snapshot().version for root in repositories)
    return ClusterRoute(qm.name, repositories, bind, qmgr, dead_letter_queue, versions)


def cluster_names(text: str) -> tuple[str, ...]:
    """The cluster names of an option value: one name, or several separated by commas."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise MQValidationError(f"option cluster must name at least one cluster; got {text!r}")
    return tuple(validate_name(name, "cluster") for name in names)


def routing_view(data: pa.Table) -> pa.Table:
    """The columns routing reads, typed as messages, with a put's defaults where the producer gave none."""
    columns = {}
    for name, default in _ROUTING_DEFAULTS.items():
        kind = MESSAGE_SCHEMA.field(name).type
        if name in data.column_names:
            column = data[name].cast(kind)
            columns[name] = column if default is None else pc.fill_null(column, pa.scalar(default, kind))
        else:
            columns[name] = pa.repeat(pa.scalar(default, kind), data.num_rows)
    return pa.table(columns)


def route_task(
    route: ClusterRoute, queue: str, producer: str, batch_id: int | None, data: pa.Table, partition: int
) -> RoutedTask:
    """Route one task's rows of batch ``batch_id`` (None: a one-off write) and split them by target."""
    snapshots = _snapshots(route, producer, queue, batch_id)
    routing = route_messages(
        routing_view(data), snapshots, route.request(queue, producer), rotation=partition, hash_groups=True
    )
    record = TaskRouting(
        {root: snapshot.version for root, snapshot in zip(route.repositories, snapshots, strict=True)},
        routing.used,
        routing.bindings,
        routing.finished_groups,
    )
    shares = []
    for qmgr in pc.unique(routing.target_qmgr.drop_null()).to_pylist():
        root = _member_root(snapshots, qmgr)
        definition = _REPLICAS.get((root, queue, producer, batch_id)) if batch_id is not None else None
        if definition is None:
            definition = Queues.open(root).resolve_for_put(queue)
            if batch_id is not None:
                _REPLICAS[(root, queue, producer, batch_id)] = definition
        shares.append(((root, definition), data.filter(pc.equal(routing.target_qmgr, qmgr))))
    return RoutedTask(shares, _dead_letters(route, queue, data, routing), record)


# Per Python worker, the last micro-batches' snapshots and replica definitions: the tasks of one
# batch that a worker runs route alike anyway, and each read costs tens of milliseconds.
_SNAPSHOTS: dict[tuple[str, str, str, int], ClusterSnapshot] = {}
_REPLICAS: dict[tuple[str, str, str, int], QueueDefinition] = {}
_CACHED_BATCHES = 16


def _snapshots(route: ClusterRoute, producer: str, queue: str, batch_id: int | None) -> list[ClusterSnapshot]:
    """The snapshots batch ``batch_id`` routes with: the journal's for a streaming batch, else those
    fixed when the write started."""
    if batch_id is None:
        return [
            Cluster.open(root).snapshot(version)
            for root, version in zip(route.repositories, route.versions, strict=True)
        ]
    snapshots = []
    for root in route.repositories:
        key = (root, producer, queue, batch_id)
        if key not in _SNAPSHOTS:
            for cache in (_SNAPSHOTS, _REPLICAS):
                for old in list(cache)[: max(0, len(cache) - _CACHED_BATCHES)]:
                    del cache[old]
            _SNAPSHOTS[key] = Cluster.open(root).routing_snapshot(producer, queue, batch_id)
        snapshots.append(_SNAPSHOTS[key])
    return snapshots


def _dead_letters(route: ClusterRoute, queue: str, data: pa.Table, routing: Routing) -> list[DeadLetters]:
    dead = pc.is_null(routing.target_qmgr)
    if not pc.any(dead).as_py():
        return []
    texts = routing.reason_text.filter(dead)
    reasons = routing.reason.filter(dead)
    rows = data.filter(dead)
    letters = []
    for text in pc.unique(texts).to_pylist():
        chosen = pc.equal(texts, text)
        reason = reasons.filter(chosen)[0].as_py()
        letters.append(DeadLetters(rows.filter(chosen), reason, text, queue, route.qmgr or route.from_qmgr))
    return letters


def _member_root(snapshots: Sequence[ClusterSnapshot], qmgr: str) -> str:
    for snapshot in snapshots:
        for member in snapshot.members:
            if member.qmgr == qmgr:
                return member.root
    raise MQError(f"queue manager {qmgr} is in no cluster snapshot", Reason.MQRC_CLUSTER_RESOLUTION_ERROR)


@dataclass(frozen=True)
class BatchRouting:
    """How every task of one batch routed, merged and checked before any replica commit; the cluster
    journals record it once every replica share is committed (:func:`record_routing`)."""

    queue: str
    producer: str
    batch_id: int | None
    versions: dict[str, int]
    used: tuple[str, ...]
    bindings: tuple[Binding, ...]
    finished_groups: tuple[str, ...]


def batch_routing(
    route: ClusterRoute, queue: str, producer: str, batch_id: int | None, records: Sequence[TaskRouting | None]
) -> BatchRouting | None:
    """Merge the tasks' routing of batch ``batch_id`` (None: a one-off write) by ``producer``, or None
    when no task routed a row. Raises 2003 when the tasks disagree, before anything is committed."""
    routed = [record for record in records if record is not None]
    if not routed:
        return None
    what = f"cluster queue {queue}: {'write' if batch_id is None else f'batch {batch_id}'} of producer {producer}"
    versions = {}
    for root in route.repositories:
        seen = {record.versions[root] for record in routed}
        if len(seen) != 1:
            raise MQError(
                f"{what}: its tasks routed with different snapshots of {root} (versions {sorted(seen)}); "
                "nothing was committed",
                Reason.MQRC_BACKED_OUT,
            )
        versions[root] = seen.pop()
    bindings = tuple(dict.fromkeys(binding for record in routed for binding in record.bindings))
    strangers = sorted({b.producer for b in bindings if (b.queue, b.producer) != (queue, producer)})
    if strangers:
        raise MQError(
            f"{what}: its tasks made bindings for producers {', '.join(strangers)}; nothing was committed",
            Reason.MQRC_BACKED_OUT,
        )
    # Least recent first over the whole batch: a queue manager's last use is in the last task that used it.
    used = tuple(dict.fromkeys(reversed([qmgr for record in routed for qmgr in record.used])))[::-1]
    finished = tuple(sorted({group for record in routed for group in record.finished_groups}))
    return BatchRouting(queue, producer, batch_id, versions, used, bindings, finished)


def record_routing(batch: BatchRouting) -> None:
    """Record a batch's routing in each cluster journal, once every replica share has been committed."""
    at = datetime.now(UTC)
    for root, version in batch.versions.items():
        cluster = Cluster.open(root)
        mine = [binding for binding in batch.bindings if binding.cluster == cluster.name]
        cluster.record_routing(
            batch.producer, batch.queue, batch.batch_id, version, batch.used, mine, batch.finished_groups, at
        )


def route(
    df: DataFrame,
    *,
    cluster: str | Sequence[str],
    queue: str,
    from_qmgr: str | QueueManager,
    bind: str = "as_q_def",
    qmgr: str | None = None,
    producer: str = "route",
) -> DataFrame:
    """``df`` with the replica each message goes to (``target_qmgr``, through ``target_cluster``), or
    null and the dead-letter reason (``dlq_reason``, ``dlq_reason_text``) when none is eligible.

    ``from_qmgr`` is the producer's queue manager (root or opened); ``cluster`` the names of clusters
    it has joined. The clusters are read once, now: the result is deterministic for ``df``. The
    sink's ``.option("cluster", ...)`` routes the same way and records least-recently-used order and
    bindings; this function records nothing.
    """
    qm = engine(from_qmgr) if isinstance(from_qmgr, QueueManager) else Queues.open(from_qmgr)
    names = cluster_names(cluster) if isinstance(cluster, str) else tuple(cluster)
    plan = cluster_route(qm, names, queue, bind, qmgr)
    snapshots = [Cluster.open(root).snapshot() for root in plan.repositories]
    request = plan.request(queue, producer)
    schema = StructType(df.schema.fields + ROUTE_COLUMNS.fields)

    def routed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        given = [batch for batch in batches if batch.num_rows]
        if not given:
            return
        data = pa.Table.from_batches(given)
        partition = task_context().partitionId()
        decided = route_messages(routing_view(data), snapshots, request, rotation=partition, hash_groups=True)
        columns = {
            "target_qmgr": decided.target_qmgr,
            "target_cluster": decided.target_cluster,
            "dlq_reason": decided.reason,
            "dlq_reason_text": decided.reason_text,
        }
        for name, column in columns.items():
            data = data.append_column(name, column)
        yield from data.to_batches()

    return df.mapInArrow(routed, schema)
