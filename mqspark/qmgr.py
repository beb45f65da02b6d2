"""The queue manager facade (``QueueManager``): what applications and the CLI call, over the engine's
:class:`~mqspark.engine.queues.Queues`: queue administration, clusters, depth and backlog, the get
and browse, maintenance, purge and redrive. Nothing below this module imports it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake.exceptions import CommitFailedError

from mqspark import store
from mqspark.cluster.records import AdvertisedQueue
from mqspark.cluster.repository import Cluster
from mqspark.engine.browse import browse_messages
from mqspark.engine.catalog import CatalogState
from mqspark.engine.consumer import Consumer
from mqspark.engine.depth import waiting
from mqspark.engine.get import Claim, GetRequest, get, plan_get, syncpoint_get
from mqspark.engine.leases import DEFAULT_LEASE_TIMEOUT
from mqspark.engine.maintenance import DEFAULT_RETENTION, MaintenanceSummary, check_retention, maintain, purge
from mqspark.engine.ordering import DeliveryOptions
from mqspark.engine.queues import PUT_ATTEMPTS, Queues, create_message_table
from mqspark.engine.redrive import redrive
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import QueueDefinition, QueueManagerDefinition, validate_name
from mqspark.model.messages import BROWSE_SCHEMA
from mqspark.model.numbers import check_number


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


class QueueManager(Queues):
    """A queue manager: a named root location holding queues. Create one with :meth:`create`, reopen
    it with :meth:`open`. Its put, resolution and live messages are those of :class:`Queues`."""

    @store.connected
    def alter_qmgr(self, **attributes: Any) -> QueueManagerDefinition:
        """Change the queue manager's own attributes (``description``, ``default_reconnect``)."""
        self._definition.altered(**attributes)
        state = self._catalog.change_qmgr(lambda state: state.qmgr.altered(**attributes))
        self._definition = state.qmgr
        return self._definition

    @store.connected
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
            create_message_table(self._location(name), self.storage_options)
        self._catalog.change(apply)
        return definition

    @store.connected
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

    @store.connected
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

    @store.connected
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
        for attempt in range(PUT_ATTEMPTS):
            table = self._message_table(name)
            depth = self._count_waiting(name, table)
            if depth and not purge:
                raise MQError(
                    f"queue {name} holds {depth} messages; delete with purge to discard them", Reason.MQRC_Q_NOT_EMPTY
                )
            try:
                store.close_table(table)
                return
            except CommitFailedError:
                time.sleep(random.uniform(0.001, 0.01) * min(attempt + 1, 10))
        raise MQError(f"queue {name}: delete gave up after {PUT_ATTEMPTS} conflicting commits", Reason.MQRC_BACKED_OUT)

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

    def _advertised_queue(self, state: CatalogState, name: str) -> AdvertisedQueue | None:
        """The replica :meth:`inquire_queue` shows for a queue not defined here; None when there is none."""
        replicas = [
            advertised
            for root in state.clusters.values()
            for advertised in Cluster.open(root, storage_options=self.storage_options).snapshot().queues
            if advertised.name == name and advertised.qmgr != self.name
        ]
        return min(replicas, key=lambda advertised: (advertised.qmgr, advertised.cluster), default=None)

    @store.connected
    def depth(self, queue: str, consumer: str | None = None) -> int:
        """MQ's CURDEPTH: the messages still waiting for at least one counted consumer group (see
        :mod:`mqspark.engine.depth`); with ``consumer``, the messages still waiting for that group.
        Expired messages are not counted."""
        return self._depth(self._resolve(queue).name, consumer)

    def _depth(self, local: str, consumer: str | None) -> int:
        if consumer is not None:
            validate_name(consumer, "consumer group")
        return self.waiting_count(local, consumer)

    @store.connected
    def consumers(self, queue: str) -> list[str]:
        """The consumer groups that count for the queue's depth, by name: those that have read it, and
        those declared on it."""
        return self.consumer_state(self._resolve(queue).name).groups()

    @store.connected
    def declare_consumer(self, queue: str, consumer: str) -> None:
        """Declare consumer group ``consumer`` on ``queue`` before it first reads: from now on, messages
        wait for it (maintenance keeps them) and count in the queue's depth."""
        local = self._resolve(queue).name
        self.consumer_state(local).declare(validate_name(consumer, "consumer group"))

    @store.connected
    def delete_consumer(self, queue: str, consumer: str, lease_timeout: timedelta = DEFAULT_LEASE_TIMEOUT) -> None:
        """Delete consumer group ``consumer`` of ``queue`` and everything recorded for it: its messages
        no longer wait for it. Refused while a query of the group runs (its lease younger than
        ``lease_timeout``)."""
        local = self._resolve(queue).name
        self.consumer_state(local).delete(validate_name(consumer, "consumer group"), lease_timeout)

    @store.connected
    def backlog(self, queue: str, consumer: str | None = None, *, oldest: bool = True) -> Backlog:
        """Depth (see :meth:`depth`) and, with ``oldest``, the put time of the oldest waiting message
        (from file statistics where they tell, see :meth:`oldest_waiting`); for a consumer group also
        who holds its lease, the active instance of a service."""
        local = self._resolve(queue).name
        if consumer is not None:
            validate_name(consumer, "consumer group")
        count, first = self.oldest_waiting(local, consumer) if oldest else (self.waiting_count(local, consumer), None)
        lease = None if consumer is None else self.consumer_state(local).lease(consumer, DEFAULT_LEASE_TIMEOUT)
        return Backlog(local, consumer, count, first, None if lease is None else lease.owner)

    @store.connected
    def waiting_messages(self, queue: str, consumer: str | None = None, columns: Sequence[str] = ()) -> pa.Table:
        """The live messages that wait, as :meth:`depth` counts them: their identity (``origin``,
        ``row``), ``expiry`` and ``columns``."""
        local = self._resolve(queue).name
        if consumer is not None:
            validate_name(consumer, "consumer group")
        groups = self._groups(local, consumer)
        _, live = self.live_messages(local, columns)
        return live.filter(pa.array(waiting(live, groups, datetime.now(UTC), consumer)))

    @store.connected
    def maintain(self, queue: str, retention: timedelta = DEFAULT_RETENTION) -> MaintenanceSummary:
        """Run maintenance on ``queue`` (its target, for an alias): remove what every counted group has
        consumed and what expired, compact files, checkpoint the log, clean it up and vacuum, keeping
        time travel for ``retention``. See :mod:`mqspark.engine.maintenance`."""
        check_retention(retention)
        return maintain(self, self._resolve(queue), retention)

    @store.connected
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

    @store.connected
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
        :func:`mqspark.engine.backout.redrive`."""
        validate_name(queue)
        return redrive(self, queue, msg_ids=msg_ids, correl_ids=correl_ids, reasons=reasons)

    @store.connected
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
        See :mod:`mqspark.engine.get` for how it shares a group with a streaming query."""
        return get(self, GetRequest(queue, consumer, max_messages, wait, msg_id, correl_id, group_id))

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
        return syncpoint_get(self, GetRequest(queue, consumer, max_messages, wait, msg_id, correl_id, group_id))

    @store.connected
    def claim(
        self,
        queue: str,
        consumer: str = "default",
        max_messages: int = 1,
        wait: float = 0.0,
        msg_id: str | None = None,
        correl_id: str | None = None,
        group_id: str | None = None,
    ) -> Claim | None:
        """MQGET under syncpoint, ended by the caller (SQS's receive, Service Bus's peek-lock): the
        claim's ``messages`` are held for the queue's ``lock_duration`` until ``commit()``,
        ``backout(error)`` or ``release()``; ``renew()`` holds them a whole lock again. None when
        nothing matched within ``wait``."""
        return plan_get(self, GetRequest(queue, consumer, max_messages, wait, msg_id, correl_id, group_id))

    def consumer(self, queue: str, consumer: str = "default", prefetch: int = 500, wait: float = 0.0) -> Consumer:
        """A block consumer for throughput: ``with qm.consumer(Q, G, prefetch=500) as c: for message
        in c: ...``. Claims ``prefetch`` messages per commit and acknowledges them per block: at least
        once. See :mod:`mqspark.engine.consumer`."""
        return Consumer(self, queue, consumer, prefetch, wait)

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

    @store.connected
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
        if limit is not None:
            check_number(limit, f"option limit must be a whole number >= 0, got {limit!r}", whole=True, at_least=0)
        definition = self._resolve(queue)
        moment = now or datetime.now(UTC)
        delivered, expired = self._with_snapshot(
            definition.name,
            lambda table: browse_messages(
                table, self.storage_options, definition.delivery_sequence, options, moment, limit, version
            ),
            retry=version is None,
        )
        rows = delivered.num_rows
        delivered = delivered.append_column(BROWSE_SCHEMA.field("queue"), pa.repeat(definition.name, rows))
        delivered = delivered.append_column(BROWSE_SCHEMA.field("qmgr"), pa.repeat(self.name, rows))
        delivered = delivered.append_column(
            BROWSE_SCHEMA.field("delivery_seq"), pa.array(np.arange(rows, dtype=np.int64))
        )
        return delivered.cast(BROWSE_SCHEMA).replace_schema_metadata({"mqspark.expired": str(expired)})


def _check_references(state: CatalogState, definition: QueueDefinition) -> None:
    if definition.type == "alias":
        target = state.queues.get(definition.alias_target)
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
