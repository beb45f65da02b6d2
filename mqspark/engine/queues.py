"""The queues of one queue manager, as the engine sees them: opening or creating the queue manager,
the queue definitions and how a name resolves (an alias to its target, inhibited puts and gets), the
message tables kept open, and the live messages that depth counts. The put and its commit are
:class:`~mqspark.engine.puts.Puts`'s, which a :class:`Queues` holds as ``puts``.

Everything below the :class:`~mqspark.qmgr.QueueManager` facade takes a :class:`Queues`. The facade
holds one and does not show it to users (see :mod:`mqspark.engine.access` for how a queue manager a
user hands a layer below the facade reaches it).
"""

from __future__ import annotations

import logging
import operator
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, Self, TypeVar

import cachetools
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from mqspark import store
from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.engine.catalog import Catalog
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.depth import (
    GroupBacklog,
    KeptAnswer,
    OldestWaiting,
    count_waiting,
    group_backlog,
    kept_or_counted,
    live_messages,
    oldest_waiting,
)
from mqspark.engine.maintenance import DEFAULT_RETENTION, MESSAGE_TABLE_PROPERTIES, maintain
from mqspark.engine.puts import PUT_ATTEMPTS, Puts
from mqspark.engine.state_reads import GroupsSnapshot
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import DEAD_LETTER_QUEUE, QueueDefinition, QueueManagerDefinition, validate_name
from mqspark.model.messages import QUEUE_TABLE_SCHEMA

MESSAGE_TABLE_CONFIGURATION = {"delta.enableChangeDataFeed": "true", **MESSAGE_TABLE_PROPERTIES}

_READ_ATTEMPTS = 3

_Read = TypeVar("_Read")

# The most bytes of data file reads a queue manager keeps (see ``Queues._file_reads``).
FILE_READS_BYTES = 64 * 1024 * 1024

_log = logging.getLogger("mqspark.engine.queues")


class Queues:
    """The queues of the queue manager at a root, as the engine uses them. Create one with
    :meth:`create`, reopen it with :meth:`open`; applications use the
    :class:`~mqspark.qmgr.QueueManager` facade, which holds one."""

    def __init__(
        self, root: str, catalog: Catalog, definition: QueueManagerDefinition, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.root = root
        # Time as leases, locks, instances, depth, browse and monitors read it (see mqspark.clock).
        self.clock = clock
        self._catalog = catalog
        self._definition = definition
        # Message tables stay open and are brought up to date incrementally: opening one lists and
        # replays its log, which costs more the more log entries the retention keeps.
        # Each queue's message table handle, with when its version's log entry was written.
        self._tables: dict[str, tuple[DeltaTable, tuple[int, int | None]]] = {}
        # Each queue's state table, kept open likewise (its rows too are read incrementally).
        self._states: dict[str, ConsumerState] = {}
        # What depth and age reads read of data files, which never change: asked again (a monitor,
        # a console), only the files new since are read.
        self._file_reads: cachetools.LRUCache = cachetools.LRUCache(
            FILE_READS_BYTES, getsizeof=operator.attrgetter("nbytes")
        )
        # Each queue's (and group's) last oldest_waiting answer and each group's last group_backlog
        # answer, by kind, queue and group: see KeptAnswer.
        self._kept: dict[tuple[str, str, str | None], KeptAnswer[Any]] = {}
        # The put and its commit (every put path ends in Puts.commit_put).
        self.puts = Puts(self)

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

    @property
    def storage_options(self) -> store.StorageOptions:
        return self._catalog.storage_options

    @property
    def catalog(self) -> Catalog:
        """The catalog table, which the facade's administration reads and changes."""
        return self._catalog

    @classmethod
    def create(
        cls,
        root: str | os.PathLike,
        name: str,
        *,
        storage_options: dict[str, str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> Self:
        """Create queue manager ``name`` at ``root`` with its catalog and dead-letter queue."""
        validate_name(name, "queue manager")
        location = store.normalize_root(root)
        if store.is_local_file(location):
            raise MQValidationError(f"queue manager root {location} is a file, not a folder")
        catalog = Catalog(location, storage_options)
        with store.answering(location, Reason.MQRC_Q_MGR_NOT_AVAILABLE):
            if _catalog_exists(catalog):
                existing = catalog.read().qmgr.name
                raise MQValidationError(f"queue manager {existing} already exists at {location}")
            dead_letter = QueueDefinition.build(DEAD_LETTER_QUEUE, description="dead-letter queue")
            create_message_table(store.queue_location(location, DEAD_LETTER_QUEUE), storage_options)
            catalog.create(QueueManagerDefinition(name=name), [dead_letter])
            return cls(location, catalog, catalog.read().qmgr, clock)

    @classmethod
    def open(
        cls, root: str | os.PathLike, *, storage_options: dict[str, str] | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> Self:
        """Open the queue manager at ``root``; raises MQRC_UNKNOWN_OBJECT_NAME when there is none."""
        location = store.normalize_root(root)
        catalog = Catalog(location, storage_options)
        with store.answering(location, Reason.MQRC_Q_MGR_NOT_AVAILABLE):
            if not _catalog_exists(catalog):
                raise MQError(f"no queue manager at {location}", Reason.MQRC_UNKNOWN_OBJECT_NAME)
            return cls(location, catalog, catalog.read().qmgr, clock)

    def __repr__(self) -> str:
        return f"Queues(name={self.name!r}, root={self.root!r})"

    @store.connected
    def queues(self) -> list[QueueDefinition]:
        """Every queue definition, by name."""
        state = self._catalog.read()
        return [state.queues[name] for name in sorted(state.queues)]

    @store.connected
    def alter_qmgr(self, **attributes: Any) -> QueueManagerDefinition:
        """Change the queue manager's own attributes (``description``, ``default_reconnect``)."""
        self._definition.altered(**attributes)
        state = self._catalog.change_qmgr(lambda state: state.qmgr.altered(**attributes))
        self._definition = state.qmgr
        return self._definition

    @store.connected
    def cluster_roots(self) -> list[str]:
        """The repository roots of the clusters this queue manager has joined."""
        return sorted(self._catalog.read().clusters.values())

    @store.connected
    def cluster_repository(self, cluster: str) -> str:
        """The repository root of ``cluster``, which this queue manager has joined (see :meth:`Cluster.join`)."""
        validate_name(cluster, "cluster")
        try:
            return self._catalog.read().clusters[cluster]
        except KeyError:
            raise MQError(
                f"queue manager {self.name} is not a member of cluster {cluster}", Reason.MQRC_UNKNOWN_OBJECT_NAME
            ) from None

    def pinned_catalog(self) -> AbstractContextManager[None]:
        """Resolve queues inside from one look at the catalog (see :meth:`Catalog.pinned`)."""
        return self._catalog.pinned()

    def resolve_for_put(self, queue: str) -> QueueDefinition:
        """The local queue a put to ``queue`` lands on; raises when it is unknown or put-inhibited."""
        return self._resolve(queue, for_put=True)

    def resolve(self, queue: str) -> QueueDefinition:
        """The local queue behind ``queue`` (itself, or an alias's target), whatever it inhibits: to
        look at it (depth, health, a monitor), not to put or get."""
        return self._resolve(queue)

    def resolve_for_get(self, queue: str) -> QueueDefinition:
        """The local queue a get from ``queue`` reads; raises when it is unknown or get-inhibited."""
        return self._resolve(queue, for_get=True)

    def queue_version(self, queue: str) -> int:
        """The current Delta version of the message table behind ``queue``."""
        return self.message_table(self._resolve(queue).name).version()

    def live_messages(self, queue: str, columns: Sequence[str] = ()) -> tuple[pa.Table, pa.Table]:
        """The live files of local queue ``queue`` and its live messages, with ``columns``: see
        :func:`mqspark.engine.depth.live_messages`."""
        return self.with_snapshot(queue, lambda table: live_messages(table, list(columns) or None, self._file_reads))

    @contextmanager
    def deleting(self, queue: str, purge: bool) -> Iterator[None]:
        """Close the message table of local queue ``queue`` for the block that deletes the queue. A
        queue holding messages is refused unless ``purge`` is set. A block that raises MQError opens
        the table again; one that succeeds leaves it closed, and forgotten here."""
        self._close(queue, purge)
        try:
            yield
        except MQError:
            store.close_table(self.message_table(queue), closed=False)
            raise
        self._tables.pop(queue, None)
        self.puts.forget(queue)

    def _close(self, queue: str, purge: bool) -> None:
        """Check the depth and close the message table in one step, so no put can land in between."""
        for attempt in range(PUT_ATTEMPTS):
            table = self.message_table(queue)
            depth = self.count_waiting(queue, table)
            if depth and not purge:
                raise MQError(
                    f"queue {queue} holds {depth} messages; delete with purge to discard them", Reason.MQRC_Q_NOT_EMPTY
                )
            try:
                store.close_table(table)
                return
            except CommitFailedError:
                time.sleep(random.uniform(0.001, 0.01) * min(attempt + 1, 10))
        raise MQError(f"queue {queue}: delete gave up after {PUT_ATTEMPTS} conflicting commits", Reason.MQRC_BACKED_OUT)

    def location(self, queue: str) -> str:
        return store.queue_location(self.root, queue)

    def message_table(self, queue: str) -> DeltaTable:
        """The message table of ``queue`` at its latest version. Not for concurrent use by threads."""
        handle = store.current_handle(self.location(queue), self.storage_options, self._tables.pop(queue, (None, None)))
        if handle is None:
            raise MQError(
                f"queue {queue} has no message table at {self.location(queue)}", Reason.MQRC_UNKNOWN_OBJECT_NAME
            )
        self._tables[queue] = handle
        return handle[0]

    def consumer_state(self, queue: str) -> ConsumerState:
        """The state table of local queue ``queue``, kept by this queue manager and brought up to date
        at each look (its rows read incrementally): the one its own reads and writes use, so not for
        concurrent use by threads."""
        state = self._states.get(queue)
        if state is None:
            state = self._states[queue] = ConsumerState(self.root, queue, self.storage_options, clock=self.clock)
        return state

    def maintain_quietly(self, definition: QueueDefinition) -> None:
        """A maintenance run on behalf of a put whose queue holds many files; the put has landed, so a
        run that fails (or finds another one going) only leaves the files for the next one."""
        try:
            maintain(self, definition, DEFAULT_RETENTION)
        except Exception as error:  # noqa: BLE001 - see the docstring
            _log.info("maintenance of queue %s after a put did not run: %s", definition.name, error)

    def with_snapshot(self, queue: str, read: Callable[[DeltaTable], _Read], retry: bool = True) -> _Read:
        """``read(table)`` on the message table of ``queue``; when maintenance cleaned up a log entry
        the snapshot needed, again on the newer snapshot (which needs no such entry)."""
        for _ in range(_READ_ATTEMPTS - 1):
            try:
                return read(self.message_table(queue))
            except store.LogEntryGone:
                if not retry:
                    raise
        return read(self.message_table(queue))

    def waiting_count(self, queue: str, consumer: str | None = None) -> int:
        """How many messages wait on local queue ``queue``: for ``consumer``, or (None) for at least one
        counted group (CURDEPTH); see :func:`mqspark.engine.depth.count_waiting`."""
        return self.with_snapshot(queue, lambda table: self.count_waiting(queue, table, consumer))

    def oldest_waiting(self, queue: str, consumer: str | None = None) -> tuple[int, datetime | None]:
        """How many messages wait on local queue ``queue`` (as :meth:`waiting_count` counts them) and
        the put time of the oldest; see :func:`mqspark.engine.depth.oldest_waiting`."""
        answer = self.with_snapshot(queue, lambda table: self._oldest_waiting(queue, table, consumer))
        return answer.count, answer.put_time

    def _oldest_waiting(self, queue: str, table: DeltaTable, consumer: str | None) -> OldestWaiting:
        """:func:`oldest_waiting` on ``table``, or the answer kept from before while it holds."""
        groups, now = self._groups(queue, consumer), self.clock.now()
        return kept_or_counted(
            self._kept,
            ("oldest", queue, consumer),
            self._kept_version(queue, table),
            groups,
            None,
            now,
            lambda: oldest_waiting(table, groups, now, consumer, self._file_reads),
        )

    def group_backlog(
        self, queue: str, groups: GroupsSnapshot, now: datetime, consumer: str, parked: pa.Table
    ) -> GroupBacklog:
        """Group ``consumer``'s backlog on local queue ``queue`` now, counted from ranges; see
        :func:`mqspark.engine.depth.group_backlog`."""
        groups.require(queue, consumer)
        return self.with_snapshot(queue, lambda table: self._group_backlog(queue, table, groups, now, consumer, parked))

    def _group_backlog(
        self, queue: str, table: DeltaTable, groups: GroupsSnapshot, now: datetime, consumer: str, parked: pa.Table
    ) -> GroupBacklog:
        """:func:`group_backlog` on ``table``, or the answer kept from before while it holds."""
        return kept_or_counted(
            self._kept,
            ("backlog", queue, consumer),
            self._kept_version(queue, table),
            groups,
            parked,
            now,
            lambda: group_backlog(table, groups, now, consumer, parked, self._file_reads),
        )

    def _kept_version(self, queue: str, table: DeltaTable) -> tuple[int, int] | None:
        """``table``'s version and its log entry's stamp, by which answers are kept; None when the
        stamp is unknown (nothing is kept then)."""
        version, written = self._tables[queue][1]
        return (version, written) if version == table.version() and written is not None else None

    def count_waiting(self, queue: str, table: DeltaTable, consumer: str | None = None) -> int:
        return count_waiting(table, self._groups(queue, consumer), self.clock.now(), consumer)

    def _groups(self, queue: str, consumer: str | None) -> GroupsSnapshot:
        """The counted groups of local queue ``queue``; refused (2085) when ``consumer`` is not one."""
        groups = self.consumer_state(queue).all_groups()
        if consumer is not None:
            groups.require(queue, consumer)
        return groups

    def _resolve(self, queue: str, for_put: bool = False, for_get: bool = False) -> QueueDefinition:
        """The local queue behind ``queue`` (itself, or an alias's target); for a put (a get), neither
        may be put-inhibited (get-inhibited)."""
        validate_name(queue)
        state = self._catalog.read()
        definition = state.queue(queue)
        chain = [definition]
        if definition.type == "alias":
            definition = state.queue(definition.alias_target)
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


def create_message_table(location: str, storage_options: store.StorageOptions) -> None:
    existing = store.open_table(location, storage_options)
    if existing is None:
        store.create_table(location, QUEUE_TABLE_SCHEMA, storage_options, MESSAGE_TABLE_CONFIGURATION)
    elif store.live_counts(existing)[1]:
        # A table left behind by a delete that stopped half-way: never adopt its messages silently.
        raise MQError(f"a message table with data already exists at {location}; remove it first")
