"""The queue manager: administration of queues and the Python put, depth and browse (no Spark needed)."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from mqspark import store
from mqspark.cluster.repository import AdvertisedQueue, Cluster
from mqspark.engine.backout import redrive
from mqspark.engine.catalog import Catalog, CatalogState
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.depth import live_messages, waiting
from mqspark.engine.leases import DEFAULT_LEASE_TIMEOUT
from mqspark.engine.maintenance import DEFAULT_RETENTION, MaintenanceSummary, check_retention, maintain, purge
from mqspark.engine.ordering import DeliveryOptions, deliver
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import DEAD_LETTER_QUEUE, QueueDefinition, QueueManagerDefinition, validate_name
from mqspark.model.groups import GROUP_COLUMNS, check_group_items, group_items
from mqspark.model.messages import MESSAGE_SCHEMA, QUEUE_TABLE_SCHEMA
from mqspark.model.put import prepare_put, rows_to_table

MESSAGE_TABLE_CONFIGURATION = {
    "delta.enableChangeDataFeed": "true",
    # Log entries say which version added a file a put wrote: only maintenance may clean them up.
    "delta.enableExpiredLogCleanup": "false",
}
_PUT_ATTEMPTS = 100
_READ_ATTEMPTS = 3
_Read = TypeVar("_Read")
# A put that leaves the queue table with this many data files runs maintenance, which compacts them:
# a queue fed by many small puts keeps few files even when no consumer runs maintenance.
MAINTAIN_AT_FILES = 256
_log = logging.getLogger("mqspark.qmgr")
BROWSE_SCHEMA = pa.schema(
    [
        *MESSAGE_SCHEMA,
        pa.field("queue", pa.string(), nullable=False),
        pa.field("qmgr", pa.string(), nullable=False),
        pa.field("delivery_seq", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class Backlog:
    """What waits on a queue for one consumer group (``consumer`` None: every committed message)."""

    queue: str
    consumer: str | None
    depth: int
    oldest_put_time: datetime | None
    # Who reads for the group now: a service instance's id (see mqspark.services.instances) or a
    # query's checkpoint owner; None when no reader holds the group's lease.
    held_by: str | None = None

    def oldest_age(self, now: datetime | None = None) -> float | None:
        """Seconds the oldest waiting message has waited, None when nothing waits."""
        if self.oldest_put_time is None:
            return None
        return ((now or datetime.now(UTC)) - self.oldest_put_time).total_seconds()


class QueueManager:
    """A named root location holding queues. Create one with :meth:`create`, reopen it with :meth:`open`."""

    def __init__(self, root: str, catalog: Catalog, definition: QueueManagerDefinition) -> None:
        self.root = root
        self._catalog = catalog
        self._definition = definition
        # Message tables stay open and are brought up to date incrementally: opening one lists and
        # replays its log, which costs more the more log entries the retention keeps.
        self._tables: dict[str, DeltaTable] = {}

    @property
    def name(self) -> str:
        return self._definition.name

    @property
    def dead_letter_queue(self) -> str:
        return self._definition.dead_letter_queue

    @property
    def qmid(self) -> str:
        """The queue manager's identity (MQ's QMID): another queue manager never has it, even one
        created again at the same root under the same name."""
        return self._definition.qmid

    @property
    def definition(self) -> QueueManagerDefinition:
        """The queue manager's attributes as read when it was opened (or last altered here)."""
        return self._definition

    def alter_qmgr(self, **attributes: Any) -> QueueManagerDefinition:
        """Change the queue manager's own attributes (``description``, ``default_reconnect``)."""
        self._definition.altered(**attributes)
        state = self._catalog.change_qmgr(lambda state: state.qmgr.altered(**attributes))
        self._definition = state.qmgr
        return self._definition

    @property
    def storage_options(self) -> store.StorageOptions:
        return self._catalog.storage_options

    @classmethod
    def create(
        cls, root: str | os.PathLike, name: str, *, storage_options: dict[str, str] | None = None
    ) -> QueueManager:
        """Create queue manager ``name`` at ``root`` with its catalog and dead-letter queue."""
        validate_name(name, "queue manager")
        location = store.normalize_root(root)
        catalog = Catalog(location, storage_options)
        if _catalog_exists(catalog):
            existing = catalog.read().qmgr.name
            raise MQValidationError(f"queue manager {existing} already exists at {location}")
        dead_letter = QueueDefinition.build(DEAD_LETTER_QUEUE, description="dead-letter queue")
        _create_message_table(store.queue_location(location, DEAD_LETTER_QUEUE), storage_options)
        catalog.create(QueueManagerDefinition(name=name), [dead_letter])
        return cls(location, catalog, catalog.read().qmgr)

    @classmethod
    def open(cls, root: str | os.PathLike, *, storage_options: dict[str, str] | None = None) -> QueueManager:
        """Open the queue manager at ``root``; raises MQRC_UNKNOWN_OBJECT_NAME when there is none."""
        location = store.normalize_root(root)
        catalog = Catalog(location, storage_options)
        if not _catalog_exists(catalog):
            raise MQError(f"no queue manager at {location}", Reason.MQRC_UNKNOWN_OBJECT_NAME)
        return cls(location, catalog, catalog.read().qmgr)

    def __repr__(self) -> str:
        return f"QueueManager(name={self.name!r}, root={self.root!r})"

    # Queue administration

    def define_queue(self, name: str, **attributes: Any) -> QueueDefinition:
        """Define a new queue; raises when the name is taken or an attribute is bad."""
        definition = QueueDefinition.build(name, **attributes)

        def apply(state: CatalogState) -> dict[str, QueueDefinition]:
            if name in state.queues:
                raise MQValidationError(f"queue {name} already exists in queue manager {self.name}")
            _check_references(state, definition)
            return {**state.queues, name: definition}

        apply(self._catalog.read())
        if definition.type == "local":
            _create_message_table(self._location(name), self.storage_options)
        self._catalog.change(apply)
        return definition

    def alter_queue(self, name: str, **attributes: Any) -> QueueDefinition:
        """Change some attributes of an existing queue."""
        validate_name(name)
        if "type" in attributes:
            raise MQValidationError(f"queue {name}: attribute type cannot be altered; delete and define the queue")

        def apply(state: CatalogState) -> dict[str, QueueDefinition]:
            definition = QueueDefinition.build(name, base=self._definition_in(state, name), **attributes)
            _check_references(state, definition)
            return {**state.queues, name: definition}

        return self._catalog.change(apply).queues[name]

    def inquire_queue(self, name: str) -> QueueDefinition | AdvertisedQueue:
        """The queue's definition.

        A cluster queue that is not defined here shows only its advertised attributes (spec section 7):
        those of the replica of the first other queue manager by name (then by cluster name), over every
        cluster this queue manager has joined. Replicas may differ (one put-inhibited, say); the
        first one by name is a stable answer. Unknown everywhere: MQRC_UNKNOWN_OBJECT_NAME.
        """
        validate_name(name)
        state = self._catalog.read()
        advertised = None if name in state.queues else self._advertised_queue(state, name)
        return advertised or self._definition_in(state, name)

    def queues(self) -> list[QueueDefinition]:
        """Every queue definition, by name."""
        state = self._catalog.read()
        return [state.queues[name] for name in sorted(state.queues)]

    def delete_queue(self, name: str, purge: bool = False) -> None:
        """Delete a queue; a queue still holding messages is refused unless ``purge`` is set."""
        validate_name(name)
        if name == self.dead_letter_queue:
            raise MQValidationError(f"queue {name} is the dead-letter queue of queue manager {self.name}")

        def apply(state: CatalogState) -> dict[str, QueueDefinition]:
            self._definition_in(state, name)
            aliases = sorted(q.name for q in state.queues.values() if q.target_queue == name)
            if aliases:
                raise MQValidationError(f"queue {name} is the target of alias queue {aliases[0]}")
            return {queue: d for queue, d in state.queues.items() if queue != name}

        state = self._catalog.read()
        apply(state)
        if self._definition_in(state, name).type == "local":
            self._close(name, purge)
        try:
            self._catalog.change(apply)
        except MQError:
            store.close_table(self._message_table(name), closed=False)
            raise
        self._tables.pop(name, None)
        store.remove_tree(self._location(name))
        store.remove_tree(store.state_location(self.root, name))
        store.remove_tree(store.maintenance_location(self.root, name))

    def _close(self, name: str, purge: bool) -> None:
        """Check the depth and close the message table in one step, so no put can land in between."""
        for attempt in range(_PUT_ATTEMPTS):
            table = self._message_table(name)
            depth = self._curdepth(name, table)
            if depth and not purge:
                raise MQError(
                    f"queue {name} holds {depth} messages; delete with purge to discard them", Reason.MQRC_Q_NOT_EMPTY
                )
            try:
                store.close_table(table)
                return
            except CommitFailedError:
                time.sleep(random.uniform(0.001, 0.01) * min(attempt + 1, 10))
        raise MQError(f"queue {name}: delete gave up after {_PUT_ATTEMPTS} conflicting commits", Reason.MQRC_BACKED_OUT)

    # Clusters

    def cluster_repository(self, cluster: str) -> str:
        """The repository root of ``cluster``, which this queue manager has joined (see :meth:`Cluster.join`)."""
        validate_name(cluster, "cluster")
        try:
            return self._catalog.read().clusters[cluster]
        except KeyError:
            raise MQError(
                f"queue manager {self.name} is not a member of cluster {cluster}", Reason.MQRC_UNKNOWN_OBJECT_NAME
            ) from None

    def cluster_roots(self) -> list[str]:
        """The repository roots of the clusters this queue manager has joined."""
        return sorted(self._catalog.read().clusters.values())

    def _advertised_queue(self, state: CatalogState, name: str) -> AdvertisedQueue | None:
        """The replica :meth:`inquire_queue` shows for a queue not defined here; None when there is none."""
        replicas = [
            advertised
            for root in state.clusters.values()
            for advertised in Cluster.open(root, storage_options=self.storage_options).snapshot().queues
            if advertised.name == name and advertised.qmgr != self.name
        ]
        return min(replicas, key=lambda advertised: (advertised.qmgr, advertised.cluster), default=None)

    # Messages

    def put(
        self,
        queue: str,
        rows: Iterable[Mapping[str, Any]] | pa.Table,
        *,
        segmentation: bool = False,
        producer: str | None = None,
        batch_id: int | None = None,
        before_commit: Callable[[list[str]], object] | None = None,
    ) -> list[str]:
        """Put messages on ``queue`` in one transaction and return their msg_ids.

        ``rows`` is a list of dicts or a pyarrow Table of message fields; only ``payload`` is required.
        Nothing is written when any message is bad, the queue is put-inhibited or the put would
        exceed the queue's max depth. With ``producer`` and ``batch_id`` the put is exactly once: a
        transaction of the producer at or below ``batch_id`` already committed puts nothing again.
        ``before_commit`` is called with the msg_ids once the commit begins: from then on, a broken
        connection leaves the put in doubt (see :mod:`mqspark.connection`).
        """
        validate_name(queue)
        data = rows if isinstance(rows, pa.Table) else rows_to_table(queue, rows)
        definition = self.resolve_for_put(queue)
        messages, msg_ids = prepare_put(definition, data, segmentation=segmentation)
        file = store.write_data_file(self._location(definition.name), messages.to_batches(), QUEUE_TABLE_SCHEMA)
        if file is not None:
            if before_commit is not None:
                before_commit(msg_ids)
            self.commit_put(
                queue,
                [file],
                group_items(messages),
                before_targets(messages),
                producer=producer,
                batch_id=batch_id,
                definition=definition,
            )
        return msg_ids

    def committed_transaction(self, queue: str, producer: str) -> int | None:
        """The last ``batch_id`` producer ``producer`` committed to ``queue`` (None: none)."""
        return self._message_table(self._resolve(queue).name).transaction_version(producer)

    def commit_put(
        self,
        queue: str,
        files: list[store.DataFile],
        groups: pa.Table,
        targets: Sequence[str] = (),
        *,
        producer: str | None = None,
        batch_id: int | None = None,
        metadata: dict[str, Any] | None = None,
        definition: QueueDefinition | None = None,
    ) -> int | None:
        """Commit the data files of one put in one Delta commit and return its version.

        Every put path ends here. Inhibit flags, max depth, the group rules (``groups``: the put's
        group items, see :func:`group_items`) and the ``before_msg_id`` targets (``targets``) are
        checked against exactly the version the commit follows; a concurrent commit makes it re-read
        and check again. With ``producer`` and ``batch_id`` the commit records a Delta ``txn``, and a
        transaction already committed is not committed again (returns None). Files that will never
        be committed are deleted. ``metadata`` is added to the commit's ``commitInfo``.
        ``definition`` is the queue's definition when the caller has just read it.
        """
        if producer is not None and batch_id is None:
            raise MQValidationError(f"queue {queue}: a commit with producer {producer!r} needs a batch_id")
        if not files:
            return None
        definition = definition or self.resolve_for_put(queue)
        local = definition.name
        location = self._location(local)
        rows = sum(file.rows for file in files)

        def prepare(attempt: int):
            resolved = self.resolve_for_put(queue) if attempt else definition
            if resolved.name != local:
                # The files lie in the first target's folder: never commit them elsewhere.
                raise MQError(
                    f"queue {queue} now resolves to {resolved.name}, not {local}; the put is backed out",
                    Reason.MQRC_BACKED_OUT,
                )
            table = self._message_table(local)
            if store.is_closed(table):
                raise MQError(f"queue {local} is being deleted", Reason.MQRC_Q_DELETED)
            if store.add_missing_columns(table, QUEUE_TABLE_SCHEMA):
                # A queue table of an earlier mqspark: migrated before its first put of this one.
                table = self._message_table(local)
            committed = table.transaction_version(producer) if producer is not None else None
            if committed is not None and committed >= batch_id:
                return None
            # CURDEPTH is at most the live messages: count those from statistics, and only when they
            # would not fit find which still wait.
            live_files[0], depth = store.live_counts(table)
            if depth + rows > resolved.max_depth:
                depth = self._curdepth(local, table)
            if depth + rows > resolved.max_depth:
                raise MQError(
                    f"queue {local} is full (max_depth {resolved.max_depth}, depth {depth}, put of {rows})",
                    Reason.MQRC_Q_FULL,
                )
            _check_against_committed(local, table, groups)
            _check_before_targets(local, table, targets)
            info = {"mqspark.operation": "put", "mqspark.messages": rows, **(metadata or {})}
            if producer is not None:
                info.update({"mqspark.producer": producer, "mqspark.batch_id": batch_id})
            return lambda: store.commit_files(
                table, files, QUEUE_TABLE_SCHEMA, app_id=producer, app_version=batch_id, metadata=info
            )

        live_files = [0]
        version = store.commit_until_landed(
            location,
            files,
            prepare,
            _PUT_ATTEMPTS,
            f"queue {queue}: put gave up after {_PUT_ATTEMPTS} conflicting commits",
        )
        if version is not None and live_files[0] + len(files) >= MAINTAIN_AT_FILES:
            self._maintain_quietly(local)
        return version

    def resolve_for_put(self, queue: str) -> QueueDefinition:
        """The local queue a put to ``queue`` lands on; raises when it is unknown or put-inhibited."""
        return self._resolve(queue, for_put=True)

    def resolve_for_get(self, queue: str) -> QueueDefinition:
        """The local queue a get from ``queue`` reads; raises when it is unknown or get-inhibited."""
        return self._resolve(queue, for_get=True)

    def queue_version(self, queue: str) -> int:
        """The current Delta version of the message table behind ``queue``."""
        return self._message_table(self._resolve(queue).name).version()

    def depth(self, queue: str, consumer: str | None = None) -> int:
        """MQ's CURDEPTH: the messages still waiting for at least one counted consumer group (see
        :mod:`mqspark.depth`); with ``consumer``, the messages still waiting for that group.
        Expired messages are not counted."""
        return self.backlog(queue, consumer, oldest=False).depth

    def consumers(self, queue: str) -> list[str]:
        """The consumer groups that count for the queue's depth, by name: those that have read it, and
        those declared on it."""
        return self._state(self._resolve(queue).name).groups()

    def declare_consumer(self, queue: str, consumer: str) -> None:
        """Declare consumer group ``consumer`` on ``queue`` before it first reads: from now on, messages
        wait for it (maintenance keeps them) and count in the queue's depth."""
        local = self._resolve(queue).name
        self._state(local).declare(validate_name(consumer, "consumer group"))

    def delete_consumer(self, queue: str, consumer: str, lease_timeout: timedelta = DEFAULT_LEASE_TIMEOUT) -> None:
        """Delete consumer group ``consumer`` of ``queue`` and everything recorded for it: its messages
        no longer wait for it. Refused while a query of the group runs (its lease younger than
        ``lease_timeout``)."""
        local = self._resolve(queue).name
        self._state(local).delete(validate_name(consumer, "consumer group"), lease_timeout)

    def backlog(self, queue: str, consumer: str | None = None, *, oldest: bool = True) -> Backlog:
        """Depth (see :meth:`depth`) and, with ``oldest``, the put time of the oldest waiting message,
        which reads every live message's put_time; for a consumer group also who holds its lease,
        the active instance of a service."""
        local = self._resolve(queue).name
        waiting_now = self.waiting_messages(local, consumer, ["put_time"] if oldest else [])
        count = waiting_now.num_rows
        first = pc.min(waiting_now["put_time"]).as_py() if oldest and count else None
        lease = None if consumer is None else self._state(local).lease(consumer, DEFAULT_LEASE_TIMEOUT)
        return Backlog(local, consumer, count, first, None if lease is None else lease.owner)

    def waiting_messages(self, queue: str, consumer: str | None = None, columns: Sequence[str] = ()) -> pa.Table:
        """The live messages that wait, as :meth:`depth` counts them: their identity (``origin``,
        ``row``), ``expiry`` and ``columns``."""
        local = self._resolve(queue).name
        if consumer is not None:
            validate_name(consumer, "consumer group")
        _, live = self.live_messages(local, columns)
        return live.filter(pa.array(waiting(live, self._state(local).all_groups(), datetime.now(UTC), consumer)))

    def live_messages(self, queue: str, columns: Sequence[str] = ()) -> tuple[pa.Table, pa.Table]:
        """The live files of local queue ``queue`` and its live messages, with ``columns``: see
        :func:`mqspark.depth.live_messages`."""
        return self._with_snapshot(queue, lambda table: live_messages(table, list(columns) or None))

    def depth_by_original_queue(self, queue: str) -> dict[str, int]:
        """How many of the messages waiting on ``queue`` (as :meth:`depth` counts them) came from each
        queue, by their dead-letter header's ``dlq_original_queue``: for a backout, error or
        dead-letter queue. Messages without a header are not counted."""
        local = self._resolve(queue).name
        _, live = self._with_snapshot(local, lambda table: live_messages(table, ["dlq_original_queue"]))
        mask = waiting(live, self._state(local).all_groups(), datetime.now(UTC))
        counts = pc.value_counts(live["dlq_original_queue"].filter(pa.array(mask)).drop_null())
        return {item["values"].as_py(): item["counts"].as_py() for item in counts}

    def maintain(self, queue: str, retention: timedelta = DEFAULT_RETENTION) -> MaintenanceSummary:
        """Run maintenance on ``queue`` (its target, for an alias): remove what every counted group has
        consumed and what expired, compact files, checkpoint the log, clean it up and vacuum, keeping
        time travel for ``retention``. See :mod:`mqspark.services.maintenance`."""
        check_retention(retention)
        return maintain(self, self._resolve(queue).name, retention)

    def purge(self, queue: str, lease_timeout: timedelta = DEFAULT_LEASE_TIMEOUT) -> int:
        """MQ's CLEAR QLOCAL: remove every message of local queue ``queue`` for every consumer group at
        once, and return how many were removed. Refused for an alias queue, and while a query of any
        consumer group runs (a lease younger than ``lease_timeout``) or maintenance runs."""
        validate_name(queue)
        definition = self._definition_in(self._catalog.read(), queue)
        if definition.type != "local":
            raise MQValidationError(
                f"queue {queue} is an alias queue (target {definition.target_queue}); purge its target instead"
            )
        return purge(self, queue, lease_timeout)

    def redrive(
        self,
        queue: str,
        *,
        msg_ids: Sequence[str] | None = None,
        correl_ids: Sequence[str] | None = None,
        reasons: Sequence[int] | None = None,
    ) -> dict[str, int]:
        """Move messages of a backout, error or dead-letter queue back to the queues they came from,
        exactly once, with the dead-letter header cleared and ``backout_count`` reset, in the order
        they arrived: all of them, or those matching every selector given (msg_id, correl_id,
        ``dlq_reason``). Returns how many went back to each queue. See
        :func:`mqspark.services.backout.redrive`."""
        validate_name(queue)
        return redrive(self, queue, msg_ids=msg_ids, correl_ids=correl_ids, reasons=reasons)

    def get(
        self,
        queue: str,
        consumer: str = "default",
        max_messages: int = 1,
        wait: float = 0.0,
        msg_id: str | None = None,
        correl_id: str | None = None,
        group_id: str | None = None,
    ) -> pa.Table:
        """MQGET: up to ``max_messages`` messages of ``queue`` in logical order, consumed for consumer
        group ``consumer`` as they are returned, waiting up to ``wait`` seconds for the first. Matches
        msg_id, correl_id and group_id. Empty when nothing matched in time. Columns as :meth:`browse`.
        See :mod:`mqspark.get` for how it shares a group with a streaming query."""
        from mqspark.engine.get import get

        return get(self, queue, consumer, max_messages, wait, msg_id, correl_id, group_id)

    def syncpoint_get(
        self,
        queue: str,
        consumer: str = "default",
        max_messages: int = 1,
        wait: float = 0.0,
        msg_id: str | None = None,
        correl_id: str | None = None,
        group_id: str | None = None,
    ) -> AbstractContextManager[pa.Table]:
        """MQGET under syncpoint, as a context manager: ``with qm.syncpoint_get(Q) as messages:``. The
        messages are consumed when the block succeeds, and backed out (one failed delivery each) when
        it raises."""
        from mqspark.engine.get import syncpoint_get

        return syncpoint_get(self, queue, consumer, max_messages, wait, msg_id, correl_id, group_id)

    def browse(
        self,
        queue: str,
        order: str = "logical",
        *,
        all_messages_available: bool = False,
        complete_message: bool = False,
        msg_id: str | None = None,
        correl_id: str | None = None,
        group_id: str | None = None,
        msg_seq_number: int | None = None,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> pa.Table:
        """Committed messages of ``queue`` in delivery order, without removing anything (spec section 4).

        The result has the message columns plus ``queue``, ``qmgr`` and ``delivery_seq`` (the
        logical position). Expired messages are left out; their number is in the schema metadata
        under ``mqspark.expired``. ``now`` fixes the moment for expiry and ``available_at``
        (default: the current time).
        """
        options = DeliveryOptions(
            order, all_messages_available, complete_message, msg_id, correl_id, group_id, msg_seq_number
        )
        return self.browse_with(queue, options, limit=limit, now=now)

    def browse_with(
        self,
        queue: str,
        options: DeliveryOptions,
        *,
        limit: int | None = None,
        now: datetime | None = None,
        version: int | None = None,
    ) -> pa.Table:
        """:meth:`browse` with its options as one value, at queue table ``version`` (default: latest)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise MQValidationError(f"option limit must be a whole number >= 0, got {limit!r}")
        definition = self._resolve(queue)
        messages = self._with_snapshot(
            definition.name,
            lambda table: store.read_committed(table, MESSAGE_SCHEMA.names, MESSAGE_SCHEMA, version),
            retry=version is None,
        )
        delivery = deliver(messages, definition.delivery_sequence, options, now or datetime.now(UTC))
        delivered = delivery.messages.drop_columns(["commit_version"])
        if limit is not None:
            delivered = delivered.slice(0, limit)
        rows = delivered.num_rows
        delivered = delivered.append_column(BROWSE_SCHEMA.field("queue"), pa.repeat(definition.name, rows))
        delivered = delivered.append_column(BROWSE_SCHEMA.field("qmgr"), pa.repeat(self.name, rows))
        delivered = delivered.append_column(
            BROWSE_SCHEMA.field("delivery_seq"), pa.array(np.arange(rows, dtype=np.int64))
        )
        return delivered.cast(BROWSE_SCHEMA).replace_schema_metadata({"mqspark.expired": str(delivery.expired)})

    # Helpers

    def _location(self, queue: str) -> str:
        return store.queue_location(self.root, queue)

    def _message_table(self, queue: str) -> DeltaTable:
        """The message table of ``queue`` at its latest version. Not for concurrent use by threads."""
        table = self._tables.get(queue)
        if table is not None:
            try:
                table.update_incremental()
                return table
            except Exception:  # noqa: BLE001 - deleted, or deleted and defined again: open it afresh
                del self._tables[queue]
        table = store.open_table(self._location(queue), self.storage_options)
        if table is not None:
            self._tables[queue] = table
        if table is None:
            raise MQError(
                f"queue {queue} has no message table at {self._location(queue)}", Reason.MQRC_UNKNOWN_OBJECT_NAME
            )
        return table

    def _state(self, queue: str) -> ConsumerState:
        return ConsumerState(self.root, queue, self.storage_options)

    def _maintain_quietly(self, queue: str) -> None:
        """A maintenance run on behalf of a put whose queue holds many files; the put has landed, so a
        run that fails (or finds another one going) only leaves the files for the next one."""
        try:
            maintain(self, queue, DEFAULT_RETENTION)
        except Exception as error:  # noqa: BLE001 - see the docstring
            _log.info("maintenance of queue %s after a put did not run: %s", queue, error)

    def _with_snapshot(self, queue: str, read: Callable[[DeltaTable], _Read], retry: bool = True) -> _Read:
        """``read(table)`` on the message table of ``queue``; when maintenance cleaned up a log entry
        the snapshot needed, again on the newer snapshot (which needs no such entry)."""
        for _ in range(_READ_ATTEMPTS - 1):
            try:
                return read(self._message_table(queue))
            except store.LogEntryGone:
                if not retry:
                    raise
        return read(self._message_table(queue))

    def _curdepth(self, queue: str, table: DeltaTable) -> int:
        _, live = live_messages(table)
        return int(waiting(live, self._state(queue).all_groups(), datetime.now(UTC)).sum())

    def _definition_in(self, state: CatalogState, name: str) -> QueueDefinition:
        try:
            return state.queues[name]
        except KeyError:
            raise MQError(
                f"queue {name} is not defined in queue manager {self.name}", Reason.MQRC_UNKNOWN_OBJECT_NAME
            ) from None

    def _resolve(self, queue: str, for_put: bool = False, for_get: bool = False) -> QueueDefinition:
        """The local queue behind ``queue`` (itself, or an alias's target); for a put (a get), neither
        may be put-inhibited (get-inhibited)."""
        validate_name(queue)
        state = self._catalog.read()
        definition = self._definition_in(state, queue)
        chain = [definition]
        if definition.type == "alias":
            definition = self._definition_in(state, definition.target_queue)
            chain.append(definition)
        for item in chain:
            if for_put and item.put_inhibited:
                raise MQError(f"queue {item.name} is put-inhibited", Reason.MQRC_PUT_INHIBITED)
            if for_get and item.get_inhibited:
                raise MQError(f"queue {item.name} is get-inhibited", Reason.MQRC_GET_INHIBITED)
        return definition


def _catalog_exists(catalog: Catalog) -> bool:
    """Whether the root holds a queue manager; a store that refuses or does not answer is an error."""
    try:
        return store.table_exists(catalog.location, catalog.storage_options)
    except OSError as error:
        raise store.store_error(catalog.root, error) from None


def _create_message_table(location: str, storage_options: store.StorageOptions) -> None:
    existing = store.open_table(location, storage_options)
    if existing is None:
        store.create_table(location, QUEUE_TABLE_SCHEMA, storage_options, MESSAGE_TABLE_CONFIGURATION)
    elif store.live_counts(existing)[1]:
        # A table left behind by a delete that stopped half-way: never adopt its messages silently.
        raise MQError(f"a message table with data already exists at {location}; remove it first")


def _check_references(state: CatalogState, definition: QueueDefinition) -> None:
    if definition.type == "alias":
        target = state.queues.get(definition.target_queue)
        if target is None:
            raise MQError(
                f"queue {definition.name}: target_queue {definition.target_queue} is not defined",
                Reason.MQRC_UNKNOWN_OBJECT_NAME,
            )
        if target.type != "local":
            raise MQValidationError(f"queue {definition.name}: target_queue {target.name} must be a local queue")
    for attribute in ("backout_queue", "error_queue"):
        named = getattr(definition, attribute)
        if named is None:
            continue
        if named == definition.name:
            raise MQValidationError(f"queue {definition.name}: {attribute} {named} must be another queue")
        if named not in state.queues:
            raise MQError(
                f"queue {definition.name}: {attribute} {named} is not defined", Reason.MQRC_UNKNOWN_OBJECT_NAME
            )


def before_targets(messages: pa.Table) -> list[str]:
    """The msg_ids a put's messages are to be placed before."""
    return pc.unique(messages["before_msg_id"].drop_null()).to_pylist()


def _check_before_targets(queue: str, table: DeltaTable, targets: list[str]) -> None:
    """A ``before_msg_id`` must name a committed message outside any group, not itself placed before another."""
    if not targets:
        return
    found = table.to_pyarrow_dataset().to_table(
        columns=["msg_id", "group_id", "before_msg_id"], filter=pc.field("msg_id").isin(targets)
    )
    for target in targets:
        rows = found.filter(pc.equal(found["msg_id"], target))
        if rows.num_rows == 0:
            raise MQError(
                f"queue {queue}: field before_msg_id names {target}, which is not on the queue",
                Reason.MQRC_NO_MSG_AVAILABLE,
            )
        if pc.any(pc.is_valid(rows["group_id"])).as_py() or pc.any(pc.is_valid(rows["before_msg_id"])).as_py():
            raise MQValidationError(
                f"queue {queue}: field before_msg_id names {target}, which is in a group or was itself placed "
                "before another message"
            )


def _check_against_committed(queue: str, table: DeltaTable, groups: pa.Table) -> None:
    """Group rules across puts: no msg_seq_number twice, nothing after the group's last message."""
    if groups.num_rows == 0:
        return
    group_ids = pc.unique(groups["group_id"])
    committed = table.to_pyarrow_dataset().to_table(columns=GROUP_COLUMNS, filter=pc.field("group_id").isin(group_ids))
    if committed.num_rows:
        check_group_items(queue, pa.concat_tables([committed.cast(groups.schema), groups]))
