"""The records of a cluster repository (spec section 7): members, advertised queues, bindings and
the producer journal, as values and as the rows of the repository table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from mqspark import store
from mqspark.errors import MQError, Reason
from mqspark.model.messages import TIMESTAMP

ROUTE_STATES = ("running", "stopped", "retrying", "unavailable")


@dataclass(frozen=True)
class Member:
    """A queue manager in a cluster, reached through this cluster's route (channel) to it.

    ``route_state_by`` is None while the health check keeps ``route_state``, else the administrator
    who set it; ``route_state_at`` is when it was last set.
    """

    cluster: str
    qmgr: str
    root: str
    suspended: bool = False
    route_state: str = "running"
    network_priority: int = 0
    last_used: datetime | None = None
    route_state_by: str | None = None
    route_state_at: datetime | None = None


@dataclass(frozen=True)
class AdvertisedQueue:
    """A queue a member advertises in a cluster, with its cluster-visible attributes."""

    cluster: str
    qmgr: str
    name: str
    type: str = "local"
    default_bind: str = "on_open"
    default_priority: int = 0
    put_inhibited: bool = False
    description: str = ""


@dataclass(frozen=True)
class Binding:
    """A fixed choice of replica: a producer's (``group_id`` None, bind on open) or a group's (bind on group)."""

    cluster: str
    queue: str
    producer: str
    group_id: str | None
    qmgr: str


@dataclass(frozen=True)
class ClusterSnapshot:
    """One committed version of a cluster repository.

    Members are sorted by queue manager, queues by name then queue manager, bindings by queue,
    producer and group (the producer's own binding first).
    """

    cluster: str
    version: int
    members: tuple[Member, ...] = ()
    queues: tuple[AdvertisedQueue, ...] = ()
    bindings: tuple[Binding, ...] = ()


@dataclass(frozen=True)
class ProducerEntry:
    """The routing journal of one producer and queue.

    ``routed_batch`` is the last batch recorded (-1: none yet), routed with snapshot ``routed_with``;
    the next batch routes with ``next_snapshot``, the version of the commit that wrote this row.
    """

    producer: str
    queue: str
    routed_batch: int
    routed_with: int | None
    next_snapshot: int


REPOSITORY_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("cluster", pa.string()),
        pa.field("qmgr", pa.string()),
        pa.field("root", pa.string()),
        pa.field("suspended", pa.bool_()),
        pa.field("route_state", pa.string()),
        pa.field("network_priority", pa.int32()),
        pa.field("last_used", TIMESTAMP),
        pa.field("route_state_by", pa.string()),
        pa.field("route_state_at", TIMESTAMP),
        pa.field("queue", pa.string()),
        pa.field("type", pa.string()),
        pa.field("default_bind", pa.string()),
        pa.field("default_priority", pa.int32()),
        pa.field("put_inhibited", pa.bool_()),
        pa.field("description", pa.string()),
        pa.field("producer", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("routed_batch", pa.int64()),
        pa.field("routed_with", pa.int64()),
        pa.field("next_snapshot", pa.int64()),
    ]
)


def binding_key(binding: Binding) -> tuple[str, str, str | None]:
    return (binding.queue, binding.producer, binding.group_id)


# Row kind -> the dataclass its rows hold, and the key it is found by in a repository.
RECORD_KINDS: dict[str, tuple[type, Callable[[Any], Any]]] = {
    "member": (Member, lambda m: m.qmgr),
    "queue": (AdvertisedQueue, lambda q: (q.qmgr, q.name)),
    "binding": (Binding, binding_key),
    "producer": (ProducerEntry, lambda p: (p.producer, p.queue)),
}


def record_columns(kind: str) -> list[tuple[str, str]]:
    """(dataclass field, table column) of a row kind; the cluster's name is on the cluster row only."""
    return [
        (f.name, "queue" if (kind, f.name) == ("queue", "name") else f.name)
        for f in dataclasses.fields(RECORD_KINDS[kind][0])
        if f.name != "cluster"
    ]


@dataclass(frozen=True)
class RepositoryState:
    """One version of the repository table, keyed for changes (see ``RECORD_KINDS``)."""

    name: str
    version: int
    members: dict[str, Member]
    queues: dict[tuple[str, str], AdvertisedQueue]
    bindings: dict[tuple[str, str, str | None], Binding]
    producers: dict[tuple[str, str], ProducerEntry]

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            self.name,
            self.version,
            tuple(sorted(self.members.values(), key=lambda m: m.qmgr)),
            tuple(sorted(self.queues.values(), key=lambda q: (q.name, q.qmgr))),
            tuple(
                sorted(
                    self.bindings.values(),
                    key=lambda b: (b.queue, b.producer, b.group_id is not None, b.group_id or ""),
                )
            ),
        )

    def member(self, qmgr: str) -> Member:
        try:
            return self.members[qmgr]
        except KeyError:
            raise MQError(
                f"queue manager {qmgr} is not a member of cluster {self.name}", Reason.MQRC_UNKNOWN_OBJECT_NAME
            ) from None

    def with_member(self, member: Member) -> RepositoryState:
        return dataclasses.replace(self, members={**self.members, member.qmgr: member})

    def to_rows(self) -> pa.Table:
        snapshot = self.snapshot()
        items = {
            "member": snapshot.members,
            "queue": snapshot.queues,
            "binding": snapshot.bindings,
            "producer": [self.producers[key] for key in sorted(self.producers)],
        }
        rows: list[dict[str, Any]] = [{"kind": "cluster", "cluster": self.name}]
        for kind, values in items.items():
            columns = record_columns(kind)
            rows += [{"kind": kind, **{column: getattr(v, field) for field, column in columns}} for v in values]
        return pa.Table.from_pylist(rows, schema=REPOSITORY_SCHEMA)


def repository_of(table: DeltaTable) -> RepositoryState:
    rows = store.table_dataset(table).to_table().to_pylist()
    names = [row["cluster"] for row in rows if row["kind"] == "cluster"]
    if len(names) != 1:
        raise MQError(f"cluster repository {table.table_uri} has {len(names)} cluster rows, not one")
    items: dict[str, dict[Any, Any]] = {kind: {} for kind in RECORD_KINDS}
    for row in rows:
        kind = row["kind"]
        if kind == "cluster":
            continue
        if kind not in RECORD_KINDS:
            raise MQError(f"cluster repository {table.table_uri} has a row of unknown kind {kind!r}")
        cls, key = RECORD_KINDS[kind]
        values = {field: row[column] for field, column in record_columns(kind)}
        item = cls(**values) if cls is ProducerEntry else cls(cluster=names[0], **values)
        items[kind][key(item)] = item
    return RepositoryState(
        names[0], table.version(), items["member"], items["queue"], items["binding"], items["producer"]
    )
