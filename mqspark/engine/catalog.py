"""The queue manager's catalog: one small Delta table holding the queue manager, its queue definitions
and the clusters it has joined (``cluster`` rows: the cluster's name and its repository root).

Every change rewrites the whole catalog in one commit made against the version it read, with no
automatic retry: two concurrent changes can never both win, the loser re-reads and tries again.
:func:`rewrite_until_landed` is that loop, shared with the other small tables rewritten this way.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TypeVar

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from mqspark import store
from mqspark.errors import MQError, Reason
from mqspark.model.definitions import QueueDefinition, QueueManagerDefinition

CATALOG_SCHEMA = pa.schema(
    [
        pa.field("object_type", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("type", pa.string()),
        pa.field("target_queue", pa.string()),
        pa.field("default_priority", pa.int32()),
        pa.field("delivery_sequence", pa.string()),
        pa.field("put_inhibited", pa.bool_()),
        pa.field("get_inhibited", pa.bool_()),
        pa.field("max_depth", pa.int64()),
        pa.field("max_message_length", pa.int64()),
        pa.field("default_bind", pa.string()),
        pa.field("backout_threshold", pa.int64()),
        pa.field("backout_queue", pa.string()),
        pa.field("retry_count", pa.int64()),
        pa.field("retry_delay", pa.float64()),
        pa.field("error_queue", pa.string()),
        pa.field("lock_duration", pa.float64()),
        pa.field("consumer_group_expiry", pa.float64()),
        pa.field("duplicate_window", pa.float64()),
        pa.field("cluster", pa.list_(pa.string())),
        pa.field("description", pa.string()),
        pa.field("dead_letter_queue", pa.string()),
        pa.field("repository", pa.string()),
        pa.field("default_reconnect", pa.string()),
        pa.field("altered_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)

_QUEUE_FIELDS = tuple(f.name for f in dataclasses.fields(QueueDefinition))
_COMMIT_ATTEMPTS = 50
_Result = TypeVar("_Result")


def rewrite_until_landed(
    prepare: Callable[[], tuple[DeltaTable, pa.Table | None, _Result]], what: str, attempts: int = _COMMIT_ATTEMPTS
) -> _Result:
    """Replace every row of a small table in one commit made at exactly the version after the one read.

    ``prepare()`` reads the table, decides (it may raise to refuse the change) and returns the table
    it read, the new rows (None: nothing to commit) and what the change yields; that result may count
    on the commit landing at ``table.version() + 1``. A commit that loses to a concurrent one is
    prepared again on a fresh read. A table written before a column was added gains it here.
    """
    for attempt in range(attempts):
        table, rows, result = prepare()
        if rows is None:
            return result
        try:
            write_deltalake(
                table,
                rows,
                mode="overwrite",
                schema_mode="merge",
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except CommitFailedError:
            time.sleep(random.uniform(0.005, 0.05) * (attempt + 1))
            continue
        return result
    raise MQError(f"{what} is changing too often; gave up after {attempts} attempts")


@dataclasses.dataclass(frozen=True)
class CatalogState:
    """One committed version of the catalog."""

    version: int
    qmgr: QueueManagerDefinition
    queues: dict[str, QueueDefinition]
    altered_at: dict[str, datetime]
    clusters: dict[str, str]
    """Cluster name -> root of its repository, for each cluster the queue manager has joined."""

    def queue(self, name: str) -> QueueDefinition:
        """The definition of queue ``name``; MQRC_UNKNOWN_OBJECT_NAME when it is not defined."""
        try:
            return self.queues[name]
        except KeyError:
            raise MQError(
                f"queue {name} is not defined in queue manager {self.qmgr.name}", Reason.MQRC_UNKNOWN_OBJECT_NAME
            ) from None


class Catalog:
    """Reads and changes the catalog table at ``<root>/_qmgr``."""

    def __init__(self, root: str, storage_options: store.StorageOptions = None) -> None:
        self.root = root
        self.location = store.catalog_location(root)
        self.storage_options = storage_options
        store.remember(root, storage_options)
        # The catalog last read: its table id and version, and what it holds.
        self._read: tuple[tuple[str, int], CatalogState] | None = None
        # Per thread: the look that reads inside :meth:`pinned` answer from.
        self._looks = threading.local()

    def create(self, qmgr: QueueManagerDefinition, queues: list[QueueDefinition]) -> None:
        table = store.create_table(self.location, CATALOG_SCHEMA, self.storage_options)
        write_deltalake(table, _to_rows(qmgr, {q.name: q for q in queues}, {}, {}), mode="append")

    def read(self) -> CatalogState:
        """The catalog at its latest version; inside :meth:`pinned`, at the first look taken there."""
        look: CatalogState | None = getattr(self._looks, "pinned", None)
        if look is None:
            look = self._snapshot()[1]
            if getattr(self._looks, "depth", 0):
                self._looks.pinned = look
        return look

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Answer this thread's reads inside from one look at the catalog: a Python get resolves its
        queue several times, and each look opens the table."""
        depth = getattr(self._looks, "depth", 0)
        self._looks.depth = depth + 1
        try:
            yield
        finally:
            self._looks.depth = depth
            if not depth:
                self._looks.pinned = None

    def _snapshot(self) -> tuple[DeltaTable, CatalogState]:
        # This thread's handle, kept while the catalog has not moved (a DeltaTable is not shared
        # between threads): every get and put reads the catalog, and opening it lists its log.
        handle = store.current_handle(self.location, self.storage_options, getattr(self._looks, "table", (None, None)))
        self._looks.table = handle or (None, None)
        table = handle[0] if handle is not None else None
        if table is None:
            raise MQError(f"no queue manager at {self.root}", Reason.MQRC_UNKNOWN_OBJECT_NAME)
        # The table's id is a UUID string (deltalake's annotation says int, which it is not): str() keeps it as is.
        qmid = str(table.metadata().id)
        # Every put and get reads the catalog: the rows are read and parsed again only once it changed.
        key = (qmid, table.version())
        if self._read is None or self._read[0] != key:
            self._read = key, _from_rows(table.version(), store.table_dataset(table).to_table(), qmid)
        return table, self._read[1]

    def change(self, apply: Callable[[CatalogState], dict[str, QueueDefinition]]) -> CatalogState:
        """Commit ``apply(state)`` (the new set of queues) against the state it was computed from.

        ``apply`` may raise to refuse the change; it is called again on a fresh state after a conflict.
        """
        return self._rewrite(lambda state: (apply(state), state.clusters, state.qmgr))

    def change_clusters(self, apply: Callable[[CatalogState], dict[str, str]]) -> CatalogState:
        """Commit ``apply(state)`` (the new map of cluster name to repository root), like :meth:`change`.

        The queue manager's ``cluster`` attribute follows: the names of the clusters, sorted.
        """
        return self._rewrite(lambda state: (state.queues, apply(state), state.qmgr))

    def change_qmgr(self, apply: Callable[[CatalogState], QueueManagerDefinition]) -> CatalogState:
        """Commit ``apply(state)`` (the queue manager's new attributes), like :meth:`change`."""
        return self._rewrite(lambda state: (state.queues, state.clusters, apply(state)))

    def _rewrite(
        self,
        apply: Callable[[CatalogState], tuple[dict[str, QueueDefinition], dict[str, str], QueueManagerDefinition]],
    ) -> CatalogState:
        def prepare() -> tuple[DeltaTable, pa.Table, CatalogState]:
            table, state = self._snapshot()
            queues, clusters, qmgr = apply(state)
            now = datetime.now(UTC)
            altered = {
                name: state.altered_at.get(name, now) if queues[name] == state.queues.get(name) else now
                for name in queues
            }
            qmgr = dataclasses.replace(qmgr, cluster=tuple(sorted(clusters)))
            changed = CatalogState(table.version() + 1, qmgr, queues, altered, clusters)
            return table, _to_rows(qmgr, queues, altered, clusters), changed

        return rewrite_until_landed(prepare, f"catalog of {self.root}")


def _to_rows(
    qmgr: QueueManagerDefinition,
    queues: dict[str, QueueDefinition],
    altered: dict[str, datetime],
    clusters: dict[str, str],
) -> pa.Table:
    now = datetime.now(UTC)
    rows = [
        {
            "object_type": "qmgr",
            "name": qmgr.name,
            "cluster": list(qmgr.cluster),
            "description": qmgr.description,
            "dead_letter_queue": qmgr.dead_letter_queue,
            "default_reconnect": qmgr.default_reconnect,
            "altered_at": now,
        }
    ]
    for name in sorted(queues):
        rows.append({"object_type": "queue", **queues[name].attributes(), "altered_at": altered.get(name, now)})
    for name in sorted(clusters):
        rows.append({"object_type": "cluster", "name": name, "repository": clusters[name], "altered_at": now})
    return pa.Table.from_pylist(rows, schema=CATALOG_SCHEMA)


def _from_rows(version: int, table: pa.Table, qmid: str) -> CatalogState:
    qmgr = None
    queues = {}
    altered = {}
    clusters = {}
    for row in table.to_pylist():
        if row["object_type"] == "qmgr":
            qmgr = QueueManagerDefinition(
                name=row["name"],
                dead_letter_queue=row["dead_letter_queue"],
                cluster=tuple(row["cluster"] or ()),
                description=row["description"] or "",
                # A catalog of an earlier mqspark lacks the column until its next change.
                default_reconnect=row.get("default_reconnect") or "no",
                qmid=f"{row['name']}_{qmid}",
            )
        elif row["object_type"] == "cluster":
            clusters[row["name"]] = row["repository"]
        else:
            # A catalog of an earlier mqspark lacks the newer attributes' columns: they take their defaults.
            values = {name: row[name] for name in _QUEUE_FIELDS if row.get(name) is not None}
            values["cluster"] = tuple(values.get("cluster") or ())
            queues[row["name"]] = QueueDefinition(**values)
            altered[row["name"]] = row["altered_at"]
    if qmgr is None:
        raise MQError(f"catalog at version {version} has no queue manager row", Reason.MQRC_UNKNOWN_OBJECT_NAME)
    return CatalogState(version, qmgr, queues, altered, clusters)
