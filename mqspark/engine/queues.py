"""The queues of one queue manager, as the engine sees them: opening or creating the queue manager,
the queue definitions and how a name resolves (an alias to its target, inhibited puts and gets), the
message tables kept open, the put and its commit (every put path ends in :meth:`Queues.commit_put`),
and the live messages that depth counts.

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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from functools import partial
from typing import Any, Self, TypeVar

import cachetools
import numpy as np
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from mqspark import store
from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.engine import group_commit, staged_puts
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
from mqspark.engine.duplicates import LandedIds, PendingPut
from mqspark.engine.maintenance import DEFAULT_RETENTION, MESSAGE_TABLE_PROPERTIES, maintain
from mqspark.engine.put_checks import before_targets, check_against_committed, check_before_targets
from mqspark.engine.state_reads import GroupsSnapshot
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import DEAD_LETTER_QUEUE, QueueDefinition, QueueManagerDefinition, validate_name
from mqspark.model.groups import group_items
from mqspark.model.messages import QUEUE_TABLE_SCHEMA, replace_column
from mqspark.model.put import prepare_put, rows_to_table

_QUEUE_COLUMNS = frozenset(QUEUE_TABLE_SCHEMA.names)

MESSAGE_TABLE_CONFIGURATION = {"delta.enableChangeDataFeed": "true", **MESSAGE_TABLE_PROPERTIES}

PUT_ATTEMPTS = 100

_READ_ATTEMPTS = 3

_Read = TypeVar("_Read")

# A put that leaves the queue table with this many data files runs maintenance, which compacts them:
# a queue fed by many small puts keeps few files even when no consumer runs maintenance.
MAINTAIN_AT_FILES = 256

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
        # Each local queue's appender: what a plain put checks, kept without delta-rs (see
        # mqspark.store.appends); None for a queue whose table mqspark does not append to itself.
        self._appenders: dict[str, store.Appender | None] = {}
        # Each local queue's msg_ids put within its duplicate window, as this process last read them.
        self._landed_ids: dict[str, LandedIds] = {}
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

    @store.connected
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
        connection leaves the put in doubt (see :mod:`mqspark.reconnect`).
        """
        validate_name(queue)
        if producer is not None and batch_id is None:
            raise MQValidationError(f"queue {queue}: a put with producer {producer!r} needs a batch_id")
        transaction = None if producer is None or batch_id is None else (producer, batch_id)
        data = rows if isinstance(rows, pa.Table) else rows_to_table(queue, rows)
        definition = self.resolve_for_put(queue)
        messages, msg_ids = prepare_put(definition, data, segmentation=segmentation, now=self.clock.now())
        if not messages.num_rows:
            return msg_ids
        groups, targets = group_items(messages), before_targets(messages)
        if transaction is None and before_commit is None and not groups.num_rows and not targets:
            # A plain put: written and committed with the process's other puts to the queue waiting
            # meanwhile. Keyed by the name put to: an alias retargeted meanwhile backs out every put
            # of the commit.
            group_commit.commit(
                self.root, queue, messages, lambda tables: self._commit_together(queue, tables, groups, definition)
            )
            return msg_ids
        file = store.write_data_file(self._location(definition.name), messages.to_batches(), QUEUE_TABLE_SCHEMA)
        if file is None:
            return msg_ids
        if before_commit is not None:
            before_commit(msg_ids)
        self.commit_put(
            queue, [file], groups, targets, transaction=transaction, definition=definition, deduplicate=True
        )
        return msg_ids

    def _commit_together(self, queue: str, puts: list[pa.Table], groups: pa.Table, definition: QueueDefinition) -> None:
        """Commit the rows of plain puts to ``queue`` (``groups``: none) in one commit; on a local
        queue put to by its own name, with the puts other processes staged meanwhile (see
        :mod:`mqspark.engine.staged_puts`). A put through an alias commits alone: an alias
        retargeted meanwhile backs out its puts, and only its own."""
        location = self._location(definition.name)
        messages = pa.concat_tables(puts)
        commit_rows = partial(self.commit_rows, queue, groups, definition)
        if store.is_uri(location) or queue != definition.name:
            commit_rows(messages, {})
        else:
            staged_puts.commit(location, messages, commit_rows)

    def commit_rows(
        self, queue: str, groups: pa.Table, definition: QueueDefinition, messages: pa.Table, metadata: dict[str, Any]
    ) -> None:
        """Commit ``messages`` in one data file and one commit, numbered one after another: a
        message's identity is its commit version and ``put_seq``."""
        messages = replace_column(messages, "put_seq", pa.array(np.arange(messages.num_rows, dtype=np.int64)))
        # One batch, not one per put gathered: each batch a Parquet writer takes costs about a
        # millisecond on its own, inside the commit lock's round.
        messages = messages.combine_chunks()
        file = store.write_data_file(self._location(definition.name), messages.to_batches(), QUEUE_TABLE_SCHEMA)
        if file is None:
            return
        if definition.duplicate_window:
            # What duplicate detection would read back from the file.
            self._landed(definition.name).written(file.path, messages)
        self.commit_put(queue, [file], groups, metadata=metadata or None, definition=definition, deduplicate=True)

    @store.connected
    def commit_staged(self, queue: str, age: float = 0.0) -> int:
        """Commit the puts other processes staged for local queue ``queue`` at least ``age`` seconds
        ago and left there (see :mod:`mqspark.engine.staged_puts`); how many were settled. They were
        accepted before they were staged: a queue put-inhibited since still takes them."""
        definition = self.resolve(queue)
        location = self._location(definition.name)
        if store.is_uri(location):
            return 0

        def commit_rows(messages: pa.Table, metadata: dict[str, Any]) -> None:
            no_groups = group_items(QUEUE_TABLE_SCHEMA.empty_table())
            self.commit_rows(definition.name, no_groups, definition, messages, metadata)

        return staged_puts.commit_staged(location, age, commit_rows)

    @store.connected
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
        transaction: tuple[str, int] | None = None,
        metadata: dict[str, Any] | None = None,
        definition: QueueDefinition | None = None,
        deduplicate: bool = False,
    ) -> int | None:
        """Commit the data files of one put in one Delta commit and return its version.

        Every put path ends here. Inhibit flags, max depth, the group rules (``groups``: the put's
        group items, see :func:`group_items`) and the ``before_msg_id`` targets (``targets``) are
        checked against exactly the version the commit follows; a concurrent commit makes it re-read
        and check again. A ``transaction`` (a producer and its batch id) is recorded as a Delta
        ``txn``, and a transaction already committed is not committed again (returns None). With
        ``deduplicate`` (a producer's put) a queue's ``duplicate_window`` drops the messages already
        landed (see :mod:`mqspark.engine.duplicates`); None when none is left and there is no
        transaction to record. Files that will never be committed are deleted. ``metadata`` is
        added to the commit's ``commitInfo``. ``definition`` is the queue's definition when the
        caller has just read it.
        """
        if not files:
            return None
        definition = definition or self.resolve_for_put(queue)
        local = definition.name
        put = PendingPut(list(files), groups)
        live_files = [0]

        def prepare(attempt: int) -> Callable[[], int] | None:
            resolved = self.resolve_for_put(queue) if attempt else definition
            if resolved.name != local:
                # The files lie in the first target's folder: never commit them elsewhere.
                raise MQError(
                    f"queue {queue} now resolves to {resolved.name}, not {local}; the put is backed out",
                    Reason.MQRC_BACKED_OUT,
                )
            window = resolved.duplicate_window if deduplicate else 0.0
            appender = self._appender(local) if not put.groups.num_rows and not targets else None
            # A depth the statistics say may not fit is counted from the messages, on the delta-rs path.
            if (
                appender is not None
                and appender.columns >= _QUEUE_COLUMNS
                and appender.live_rows + put.rows <= resolved.max_depth
            ):
                live_files[0] = appender.live_files
                return self._append_checked(appender, resolved, put, transaction, metadata, window)
            live_files[0], commit = self._table_checked(resolved, put, targets, transaction, metadata, window)
            return commit

        version = store.commit_until_landed(
            self._location(local),
            put.files,
            prepare,
            PUT_ATTEMPTS,
            f"queue {queue}: put gave up after {PUT_ATTEMPTS} conflicting commits",
        )
        if version is not None and live_files[0] + len(put.files) >= MAINTAIN_AT_FILES:
            self._maintain_quietly(definition)
        return version

    def _table_checked(
        self,
        definition: QueueDefinition,
        put: PendingPut,
        targets: Sequence[str],
        transaction: tuple[str, int] | None,
        metadata: dict[str, Any] | None,
        window: float,
    ) -> tuple[int, Callable[[], int] | None]:
        """A put's checks against its queue table's latest version read through delta-rs, and its
        commit (None as for :meth:`_append_checked`); with the number of live files."""
        local = definition.name
        table = self._message_table(local)
        if store.is_closed(table):
            raise MQError(f"queue {local} is being deleted", Reason.MQRC_Q_DELETED)
        if store.add_missing_columns(table, QUEUE_TABLE_SCHEMA):
            # A queue table of an earlier mqspark: migrated before its first put of this one.
            table = self._message_table(local)
        # CURDEPTH is at most the live messages: count those from statistics, and only when they
        # would not fit find which still wait.
        live_files, depth = store.live_counts(table)
        if transaction is not None:
            committed = table.transaction_version(transaction[0])
            if committed is not None and committed >= transaction[1]:
                return live_files, None
        if window:
            found = store.live_files(table)
            live = dict(zip(found["path"].to_pylist(), found["rows"].to_pylist(), strict=True))
            landed = self._drop_duplicates(local, put, live, window)
        else:
            landed = None
        if not put.files and transaction is None:
            return live_files, None
        rows = put.rows
        if depth + rows > definition.max_depth:
            depth = self._count_waiting(local, table)
        if depth + rows > definition.max_depth:
            raise MQError(
                f"queue {local} is full (max_depth {definition.max_depth}, depth {depth}, put of {rows})",
                Reason.MQRC_Q_FULL,
            )
        check_against_committed(local, table, put.groups)
        check_before_targets(local, table, targets)
        info = _put_info(rows, transaction, metadata)
        files = put.files
        return live_files, _then(
            lambda: store.commit_files(table, files, QUEUE_TABLE_SCHEMA, transaction=transaction, metadata=info), landed
        )

    def _drop_duplicates(
        self, queue: str, put: PendingPut, live: Mapping[str, int], window: float
    ) -> Callable[[], None]:
        """Drop ``put``'s messages already landed within local queue ``queue``'s duplicate window, at the
        version whose live files hold ``live`` rows by path; what records its messages once it landed."""
        return self._landed(queue).drop_duplicates(put, live, self.clock.now(), window)

    def _landed(self, queue: str) -> LandedIds:
        landed = self._landed_ids.get(queue)
        if landed is None:
            landed = self._landed_ids.setdefault(queue, LandedIds(self._location(queue)))
        return landed

    def _appender(self, queue: str) -> store.Appender | None:
        """The appender of local queue ``queue`` at its table's latest version (see
        :mod:`mqspark.store.appends`), None when its table is not appended to by mqspark itself."""
        location = self._location(queue)
        if store.is_uri(location):
            return None
        appender = self._appenders.get(queue)
        if appender is None or not appender.advance():
            appender = self._appenders[queue] = store.appender_of(location, self._message_table(queue))
        return appender

    def _append_checked(
        self,
        appender: store.Appender,
        definition: QueueDefinition,
        put: PendingPut,
        transaction: tuple[str, int] | None,
        metadata: dict[str, Any] | None,
        window: float,
    ) -> Callable[[], int] | None:
        """A plain put's checks against ``appender``'s version (its depth fits, by the statistics), and
        its commit: None when the producer's transaction already landed, or duplicate detection (a
        ``window`` of more than 0 seconds) left nothing to commit."""
        if appender.closed:
            raise MQError(f"queue {definition.name} is being deleted", Reason.MQRC_Q_DELETED)
        if transaction is not None:
            committed = appender.transaction_version(transaction[0])
            if committed is not None and committed >= transaction[1]:
                return None
        landed = self._drop_duplicates(definition.name, put, appender.live_rows_by_path, window) if window else None
        if not put.files and transaction is None:
            return None
        info = _put_info(put.rows, transaction, metadata)
        files = put.files
        return _then(lambda: appender.append(files, transaction=transaction, metadata=info), landed)

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
        return self._message_table(self._resolve(queue).name).version()

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
            store.close_table(self._message_table(queue), closed=False)
            raise
        self._tables.pop(queue, None)
        self._appenders.pop(queue, None)
        self._landed_ids.pop(queue, None)

    def _close(self, queue: str, purge: bool) -> None:
        """Check the depth and close the message table in one step, so no put can land in between."""
        for attempt in range(PUT_ATTEMPTS):
            table = self._message_table(queue)
            depth = self._count_waiting(queue, table)
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

    def _location(self, queue: str) -> str:
        return store.queue_location(self.root, queue)

    def _message_table(self, queue: str) -> DeltaTable:
        """The message table of ``queue`` at its latest version. Not for concurrent use by threads."""
        handle = store.current_handle(
            self._location(queue), self.storage_options, self._tables.pop(queue, (None, None))
        )
        if handle is None:
            raise MQError(
                f"queue {queue} has no message table at {self._location(queue)}", Reason.MQRC_UNKNOWN_OBJECT_NAME
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

    def _maintain_quietly(self, definition: QueueDefinition) -> None:
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
                return read(self._message_table(queue))
            except store.LogEntryGone:
                if not retry:
                    raise
        return read(self._message_table(queue))

    def waiting_count(self, queue: str, consumer: str | None = None) -> int:
        """How many messages wait on local queue ``queue``: for ``consumer``, or (None) for at least one
        counted group (CURDEPTH); see :func:`mqspark.engine.depth.count_waiting`."""
        return self.with_snapshot(queue, lambda table: self._count_waiting(queue, table, consumer))

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

    def _count_waiting(self, queue: str, table: DeltaTable, consumer: str | None = None) -> int:
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


def _then(commit: Callable[[], int], landed: Callable[[], None] | None) -> Callable[[], int]:
    """``commit``, followed once it landed by ``landed`` (duplicate detection's record of the put)."""
    if landed is None:
        return commit

    def committed() -> int:
        version = commit()
        landed()
        return version

    return committed


def _put_info(rows: int, transaction: tuple[str, int] | None, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The ``commitInfo`` of a put's commit."""
    info = {"mqspark.operation": "put", "mqspark.messages": rows, **(metadata or {})}
    if transaction is not None:
        info.update({"mqspark.producer": transaction[0], "mqspark.batch_id": transaction[1]})
    return info


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
