"""The put and its commit: every put path ends in :meth:`Puts.commit_put`.

A put (``qm.put``) prepares its messages (:func:`~mqspark.model.put.prepare_put`), and a plain one
shares a commit with its process's other puts (:mod:`mqspark.engine.group_commit`) and with the
puts other processes staged (:mod:`mqspark.engine.staged_puts`). ``commit_put`` checks inhibits,
max depth, the group rules, ``before_msg_id`` targets and duplicates (:mod:`mqspark.engine.duplicates`)
against exactly the version the commit follows, on a local queue through its
:class:`~mqspark.store.Appender` when it can, and otherwise through delta-rs. The Spark sink and the
moves of backout and redrive end there too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from mqspark import store
from mqspark.clock import Clock
from mqspark.engine import group_commit, staged_puts
from mqspark.engine.duplicates import LandedIds, PendingPut
from mqspark.engine.put_checks import before_targets, check_against_committed, check_before_targets
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import QueueDefinition, validate_name
from mqspark.model.groups import group_items
from mqspark.model.messages import QUEUE_TABLE_SCHEMA, replace_column
from mqspark.model.put import prepare_put, rows_to_table

_QUEUE_COLUMNS = frozenset(QUEUE_TABLE_SCHEMA.names)

PUT_ATTEMPTS = 100

# A put that leaves the queue table with this many data files runs maintenance, which compacts them:
# a queue fed by many small puts keeps few files even when no consumer runs maintenance.
MAINTAIN_AT_FILES = 256


class QueueTables(Protocol):
    """What the put path asks of the queues it puts to (:class:`~mqspark.engine.queues.Queues`)."""

    root: str
    clock: Clock

    def resolve_for_put(self, queue: str) -> QueueDefinition: ...

    def resolve(self, queue: str) -> QueueDefinition: ...

    def location(self, queue: str) -> str: ...

    def message_table(self, queue: str) -> DeltaTable: ...

    def count_waiting(self, queue: str, table: DeltaTable, consumer: str | None = None) -> int: ...

    def maintain_quietly(self, definition: QueueDefinition) -> None: ...


class Puts:
    """The put path of one queue manager's queues, and what it keeps per local queue between puts:
    its appender and the msg_ids put within its duplicate window."""

    def __init__(self, queues: QueueTables) -> None:
        self._queues = queues
        # Each local queue's appender: what a plain put checks, kept without delta-rs (see
        # mqspark.store.appends); None for a queue whose table mqspark does not append to itself.
        self._appenders: dict[str, store.Appender | None] = {}
        # Each local queue's msg_ids put within its duplicate window, as this process last read them.
        self._landed_ids: dict[str, LandedIds] = {}

    @property
    def root(self) -> str:
        """The queue manager's root (whose store not answering raises 2009, see ``store.connected``)."""
        return self._queues.root

    def forget(self, queue: str) -> None:
        """Let go of what is kept for ``queue``, deleted."""
        self._appenders.pop(queue, None)
        self._landed_ids.pop(queue, None)

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
        definition = self._queues.resolve_for_put(queue)
        messages, msg_ids = prepare_put(definition, data, segmentation=segmentation, now=self._queues.clock.now())
        if not messages.num_rows:
            return msg_ids
        groups, targets = group_items(messages), before_targets(messages)
        if transaction is None and before_commit is None and not groups.num_rows and not targets:
            # A plain put: written and committed with the process's other puts to the queue waiting
            # meanwhile. Keyed by the name put to: an alias retargeted meanwhile backs out every put
            # of the commit.
            group_commit.commit(
                self.root,
                queue,
                messages,
                lambda tables: self._commit_together(queue, tables, groups, definition),
            )
            return msg_ids
        file = store.write_data_file(self._queues.location(definition.name), messages.to_batches(), QUEUE_TABLE_SCHEMA)
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
        location = self._queues.location(definition.name)
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
        file = store.write_data_file(self._queues.location(definition.name), messages.to_batches(), QUEUE_TABLE_SCHEMA)
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
        definition = self._queues.resolve(queue)
        location = self._queues.location(definition.name)
        if store.is_uri(location):
            return 0

        def commit_rows(messages: pa.Table, metadata: dict[str, Any]) -> None:
            no_groups = group_items(QUEUE_TABLE_SCHEMA.empty_table())
            self.commit_rows(definition.name, no_groups, definition, messages, metadata)

        return staged_puts.commit_staged(location, age, commit_rows)

    @store.connected
    def committed_transaction(self, queue: str, producer: str) -> int | None:
        """The last ``batch_id`` producer ``producer`` committed to ``queue`` (None: none)."""
        return self._queues.message_table(self._queues.resolve(queue).name).transaction_version(producer)

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
        definition = definition or self._queues.resolve_for_put(queue)
        local = definition.name
        put = PendingPut(list(files), groups, targets)
        live_files = [0]

        def prepare(attempt: int) -> Callable[[], int] | None:
            resolved = self._queues.resolve_for_put(queue) if attempt else definition
            if resolved.name != local:
                # The files lie in the first target's folder: never commit them elsewhere.
                raise MQError(
                    f"queue {queue} now resolves to {resolved.name}, not {local}; the put is backed out",
                    Reason.MQRC_BACKED_OUT,
                )
            window = resolved.duplicate_window if deduplicate else 0.0
            appender = self._appender(local) if not put.groups.num_rows and not put.targets else None
            # A depth the statistics say may not fit is counted from the messages, on the delta-rs path.
            if (
                appender is not None
                and appender.columns >= _QUEUE_COLUMNS
                and appender.live_rows + put.rows <= resolved.max_depth
            ):
                live_files[0] = appender.live_files
                return self._append_checked(appender, resolved, put, transaction, metadata, window)
            live_files[0], commit = self._table_checked(resolved, put, transaction, metadata, window)
            return commit

        version = store.commit_until_landed(
            self._queues.location(local),
            put.files,
            prepare,
            PUT_ATTEMPTS,
            f"queue {queue}: put gave up after {PUT_ATTEMPTS} conflicting commits",
        )
        if version is not None and live_files[0] + len(put.files) >= MAINTAIN_AT_FILES:
            self._queues.maintain_quietly(definition)
        return version

    def _table_checked(
        self,
        definition: QueueDefinition,
        put: PendingPut,
        transaction: tuple[str, int] | None,
        metadata: dict[str, Any] | None,
        window: float,
    ) -> tuple[int, Callable[[], int] | None]:
        """A put's checks against its queue table's latest version read through delta-rs, and its
        commit (None as for :meth:`_append_checked`); with the number of live files."""
        local = definition.name
        table = self._queues.message_table(local)
        if store.is_closed(table):
            raise MQError(f"queue {local} is being deleted", Reason.MQRC_Q_DELETED)
        if store.add_missing_columns(table, QUEUE_TABLE_SCHEMA):
            # A queue table of an earlier mqspark: migrated before its first put of this one.
            table = self._queues.message_table(local)
        # Nothing is committed (a transaction that landed before, a put left empty): no files to count.
        if transaction is not None:
            committed = table.transaction_version(transaction[0])
            if committed is not None and committed >= transaction[1]:
                return 0, None
        if window:
            found = store.live_files(table)
            live = dict(zip(found["path"].to_pylist(), found["rows"].to_pylist(), strict=True))
            landed = self._drop_duplicates(local, put, live, window)
        else:
            landed = None
        if not put.files and transaction is None:
            return 0, None
        # CURDEPTH is at most the live messages: count those from statistics, and only when they
        # would not fit find which still wait.
        live_files, depth = store.live_counts(table)
        rows = put.rows
        if depth + rows > definition.max_depth:
            depth = self._queues.count_waiting(local, table)
        if depth + rows > definition.max_depth:
            raise MQError(
                f"queue {local} is full (max_depth {definition.max_depth}, depth {depth}, put of {rows})",
                Reason.MQRC_Q_FULL,
            )
        check_against_committed(local, table, put.groups)
        check_before_targets(local, table, put.targets)
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
        return self._landed(queue).drop_duplicates(put, live, self._queues.clock.now(), window)

    def _landed(self, queue: str) -> LandedIds:
        landed = self._landed_ids.get(queue)
        if landed is None:
            landed = self._landed_ids.setdefault(queue, LandedIds(self._queues.location(queue)))
        return landed

    def _appender(self, queue: str) -> store.Appender | None:
        """The appender of local queue ``queue`` at its table's latest version (see
        :mod:`mqspark.store.appends`), None when its table is not appended to by mqspark itself."""
        location = self._queues.location(queue)
        if store.is_uri(location):
            return None
        appender = self._appenders.get(queue)
        if appender is None or not appender.advance():
            appender = self._appenders[queue] = store.appender_of(location, self._queues.message_table(queue))
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
        landed = (
            self._drop_duplicates(definition.name, put, dict(appender.live_rows_by_path), window) if window else None
        )
        if not put.files and transaction is None:
            return None
        info = _put_info(put.rows, transaction, metadata)
        files = put.files
        return _then(lambda: appender.append(files, transaction=transaction, metadata=info), landed)


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
