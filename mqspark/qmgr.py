"""The queue manager facade (``QueueManager``): what applications call, and nothing else. It holds the
engine's :class:`~mqspark.engine.queues.Queues` and shows none of it: queue administration, depth and
backlog, the get family, browse, maintenance, purge and redrive, each a call into the engine. The
package's layers above this one (Spark, the CLI, the console) reach the engine of a queue manager
they are handed with :func:`engine`. Nothing below this module imports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self, TypeVar

import pyarrow as pa

from mqspark import store
from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.cluster.records import AdvertisedQueue
from mqspark.cluster.repository import Cluster
from mqspark.engine.browse import browse_queue
from mqspark.engine.catalog import CatalogState
from mqspark.engine.consumer import Consumer
from mqspark.engine.get import Claim, GetRequest, get, plan_get, syncpoint_get
from mqspark.engine.leases import DEFAULT_LEASE_TIMEOUT
from mqspark.engine.maintenance import DEFAULT_RETENTION, MaintenanceSummary, check_retention, maintain, purge
from mqspark.engine.ordering import DeliveryOptions
from mqspark.engine.queues import Queues, create_message_table
from mqspark.engine.redrive import redrive
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import QueueDefinition, QueueManagerDefinition, validate_name

_Got = TypeVar("_Got")


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
    """A queue manager: a named root location holding queues. Create one with :meth:`create`, reopen
    it with :meth:`open`."""

    def __init__(self, queues: Queues) -> None:
        self._queues = queues

    @classmethod
    def create(
        cls,
        root: str | os.PathLike,
        name: str,
        *,
        storage_options: dict[str, str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> Self:
        """Create queue manager ``name`` at ``root`` with its catalog and dead-letter queue. ``clock``
        is the time its leases, locks and instances read (see :mod:`mqspark.clock`)."""
        return cls(Queues.create(root, name, storage_options=storage_options, clock=clock))

    @classmethod
    def open(
        cls, root: str | os.PathLike, *, storage_options: dict[str, str] | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> Self:
        """Open the queue manager at ``root``; raises MQRC_UNKNOWN_OBJECT_NAME when there is none.
        ``clock`` as for :meth:`create`."""
        return cls(Queues.open(root, storage_options=storage_options, clock=clock))

    def __repr__(self) -> str:
        return f"QueueManager(name={self.name!r}, root={self.root!r})"

    def __mqspark_queues__(self) -> Queues:
        # How the layers below this one, which cannot import it, reach the engine: see mqspark.engine.access.
        return self._queues

    @property
    def name(self) -> str:
        return self._queues.name

    @property
    def root(self) -> str:
        """Where the queue manager lies: a folder, or an object store URL."""
        return self._queues.root

    @property
    def qmid(self) -> str:
        """The queue manager's identity (MQ's QMID): another queue manager never has it, even one
        created again at the same root under the same name."""
        return self._queues.qmid

    def alter_qmgr(self, **attributes: Any) -> QueueManagerDefinition:
        """Change the queue manager's own attributes (``description``, ``default_reconnect``)."""
        return self._queues.alter_qmgr(**attributes)

    def queues(self) -> list[QueueDefinition]:
        """Every queue definition, by name."""
        return self._queues.queues()

    @store.connected
    def define_queue(self, name: str, **attributes: Any) -> QueueDefinition:
        """Define a new queue; raises when the name is taken or an attribute is bad."""
        definition = QueueDefinition.build(name, **attributes)

        def apply(state: CatalogState) -> dict[str, QueueDefinition]:
            if name in state.queues:
                raise MQValidationError(f"queue {name} already exists in queue manager {self.name}")
            _check_references(state, definition)
            return {**state.queues, name: definition}

        catalog = self._queues.catalog
        apply(catalog.read())
        if definition.type == "local":
            create_message_table(store.queue_location(self.root, name), self._queues.storage_options)
        catalog.change(apply)
        return definition

    @store.connected
    def alter_queue(self, name: str, **attributes: Any) -> QueueDefinition:
        """Change some attributes of an existing queue."""
        validate_name(name)
        if "type" in attributes:
            raise MQValidationError(f"queue {name}: attribute type cannot be altered; delete and define the queue")

        def apply(state: CatalogState) -> dict[str, QueueDefinition]:
            definition = QueueDefinition.build(name, base=state.queue(name), **attributes)
            _check_references(state, definition)
            return {**state.queues, name: definition}

        return self._queues.catalog.change(apply).queues[name]

    @store.connected
    def inquire_queue(self, name: str) -> QueueDefinition | AdvertisedQueue:
        """The queue's definition.

        A cluster queue that is not defined here shows only its advertised attributes (spec section 7):
        those of the replica of the first other queue manager by name (then by cluster name), over every
        cluster this queue manager has joined. Replicas may differ (one put-inhibited, say); the
        first one by name is a stable answer. Unknown everywhere: MQRC_UNKNOWN_OBJECT_NAME.
        """
        validate_name(name)
        state = self._queues.catalog.read()
        advertised = None if name in state.queues else _advertised_queue(self._queues, state, name)
        return advertised or state.queue(name)

    @store.connected
    def delete_queue(self, name: str, purge: bool = False) -> None:
        """Delete a queue; a queue still holding messages is refused unless ``purge`` is set."""
        validate_name(name)
        if name == self._queues.dead_letter_queue:
            raise MQValidationError(f"queue {name} is the dead-letter queue of queue manager {self.name}")

        def apply(state: CatalogState) -> dict[str, QueueDefinition]:
            state.queue(name)
            aliases = sorted(q.name for q in state.queues.values() if q.target_queue == name)
            if aliases:
                raise MQValidationError(f"queue {name} is the target of alias queue {aliases[0]}")
            return {queue: d for queue, d in state.queues.items() if queue != name}

        catalog = self._queues.catalog
        state = catalog.read()
        apply(state)
        # A local queue's message table stays closed from its depth check on, so no put lands meanwhile.
        with self._queues.deleting(name, purge) if state.queue(name).type == "local" else nullcontext():
            catalog.change(apply)
        store.remove_tree(store.queue_location(self.root, name))
        store.remove_tree(store.state_location(self.root, name))
        store.remove_tree(store.maintenance_location(self.root, name))

    def put(
        self,
        queue: str,
        rows: Iterable[Mapping[str, Any]] | pa.Table,
        *,
        segmentation: bool = False,
        producer: str | None = None,
        batch_id: int | None = None,
    ) -> list[str]:
        """Put messages on ``queue`` in one transaction and return their msg_ids.

        ``rows`` is a list of dicts or a pyarrow Table of message fields; only ``payload`` is required.
        Nothing is written when any message is bad, the queue is put-inhibited or the put would
        exceed the queue's max depth. ``segmentation`` splits a payload longer than the queue's
        ``max_message_length`` into segments. With ``producer`` and ``batch_id`` the put is exactly
        once: a transaction of the producer at or below ``batch_id`` already committed puts nothing again.
        """
        return self._queues.puts.put(queue, rows, segmentation=segmentation, producer=producer, batch_id=batch_id)

    @store.connected
    def depth(self, queue: str, consumer: str | None = None) -> int:
        """MQ's CURDEPTH: the messages still waiting for at least one counted consumer group (see
        :mod:`mqspark.engine.depth`); with ``consumer``, the messages still waiting for that group.
        Expired messages are not counted."""
        local = self._queues.resolve(queue).name
        if consumer is not None:
            validate_name(consumer, "consumer group")
        return self._queues.waiting_count(local, consumer)

    @store.connected
    def consumers(self, queue: str) -> list[str]:
        """The consumer groups that count for the queue's depth, by name: those that have read it, and
        those declared on it."""
        return self._queues.consumer_state(self._queues.resolve(queue).name).groups()

    @store.connected
    def declare_consumer(self, queue: str, consumer: str) -> None:
        """Declare consumer group ``consumer`` on ``queue`` before it first reads: from now on, messages
        wait for it (maintenance keeps them) and count in the queue's depth."""
        local = self._queues.resolve(queue).name
        self._queues.consumer_state(local).declare(validate_name(consumer, "consumer group"))

    @store.connected
    def delete_consumer(self, queue: str, consumer: str, lease_timeout: timedelta = DEFAULT_LEASE_TIMEOUT) -> None:
        """Delete consumer group ``consumer`` of ``queue`` and everything recorded for it: its messages
        no longer wait for it. Refused while a query of the group runs (its lease younger than
        ``lease_timeout``)."""
        local = self._queues.resolve(queue).name
        self._queues.consumer_state(local).delete(validate_name(consumer, "consumer group"), lease_timeout)

    @store.connected
    def backlog(self, queue: str, consumer: str | None = None, *, oldest: bool = True) -> Backlog:
        """Depth (see :meth:`depth`) and, with ``oldest``, the put time of the oldest waiting message
        (from file statistics where they tell); for a consumer group also who holds its lease, the
        active instance of a service."""
        queues = self._queues
        local = queues.resolve(queue).name
        if consumer is not None:
            validate_name(consumer, "consumer group")
        if oldest:
            count, first = queues.oldest_waiting(local, consumer)
        else:
            count, first = queues.waiting_count(local, consumer), None
        lease = None if consumer is None else queues.consumer_state(local).lease(consumer, DEFAULT_LEASE_TIMEOUT)
        return Backlog(local, consumer, count, first, None if lease is None else lease.owner)

    @store.connected
    def maintain(self, queue: str, retention: timedelta = DEFAULT_RETENTION) -> MaintenanceSummary:
        """Run maintenance on ``queue`` (its target, for an alias): remove what every counted group has
        consumed and what expired, compact files, checkpoint the log, clean it up and vacuum, keeping
        time travel for ``retention``. See :mod:`mqspark.engine.maintenance`."""
        check_retention(retention)
        definition = self._queues.resolve(queue)
        # Puts staged by processes that died are committed first, so that maintenance counts them.
        self._queues.puts.commit_staged(definition.name)
        return maintain(self._queues, definition, retention, now=self._queues.clock.now())

    @store.connected
    def purge(self, queue: str, lease_timeout: timedelta = DEFAULT_LEASE_TIMEOUT) -> int:
        """MQ's CLEAR QLOCAL: remove every message of local queue ``queue`` for every consumer group at
        once, and return how many were removed. Refused for an alias queue, and while a query of any
        consumer group runs (a lease younger than ``lease_timeout``) or maintenance runs."""
        validate_name(queue)
        definition = self._queues.catalog.read().queue(queue)
        if definition.type != "local":
            raise MQValidationError(
                f"queue {queue} is an alias queue (target {definition.target_queue}); purge its target instead"
            )
        return purge(self._queues, queue, lease_timeout)

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
        return redrive(self._queues, queue, msg_ids=msg_ids, correl_ids=correl_ids, reasons=reasons)

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
        return self._get(get, queue, consumer, max_messages, wait, msg_id, correl_id, group_id)

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
        return self._get(syncpoint_get, queue, consumer, max_messages, wait, msg_id, correl_id, group_id)

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
        return self._get(plan_get, queue, consumer, max_messages, wait, msg_id, correl_id, group_id)

    def _get(
        self,
        run: Callable[[Queues, GetRequest], _Got],
        queue: str,
        consumer: str,
        max_messages: int,
        wait: float,
        msg_id: str | None,
        correl_id: str | None,
        group_id: str | None,
    ) -> _Got:
        """``run`` on the one request of :meth:`get`, :meth:`syncpoint_get` or :meth:`claim` (the
        engine checks its values when the get plans)."""
        return run(self._queues, GetRequest(queue, consumer, max_messages, wait, msg_id, correl_id, group_id))

    def consumer(self, queue: str, consumer: str = "default", prefetch: int = 500, wait: float = 0.0) -> Consumer:
        """A block consumer for throughput: ``with qm.consumer(Q, G, prefetch=500) as c: for message
        in c: ...``. Claims ``prefetch`` messages per commit and acknowledges them per block: at least
        once. See :mod:`mqspark.engine.consumer`."""
        return Consumer(self._queues, queue, consumer, prefetch, wait)

    def browse(  # noqa: PLR0913 - MQ's browse options (MQGMO and match options) are its keywords
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
        return browse_queue(self._queues, queue, options, limit=limit, now=now)


def engine(qm: QueueManager) -> Queues:
    """The engine behind ``qm``, for the package's layers above the facade (Spark, the CLI, the
    console) where a user's queue manager reaches code that needs more than users are shown."""
    return qm._queues


def _advertised_queue(queues: Queues, state: CatalogState, name: str) -> AdvertisedQueue | None:
    """The replica :meth:`QueueManager.inquire_queue` shows for a queue not defined here; None when there is none."""
    replicas = [
        advertised
        for root in state.clusters.values()
        for advertised in Cluster.open(root, storage_options=queues.storage_options).snapshot().queues
        if advertised.name == name and advertised.qmgr != queues.name
    ]
    return min(replicas, key=lambda advertised: (advertised.qmgr, advertised.cluster), default=None)


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
