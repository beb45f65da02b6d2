"""Instances of one consumer service (spec section 8): one active, the others standing by.

Several Spark applications may run the same consumer (a streaming get of group G, a forwarder) as
instances of one service. They share the queue manager root and one checkpoint location on shared
storage, as MQ's multi-instance queue managers share their data; no server is added.

**Who is active.** The group's lease in the queue's state table (see :mod:`mqspark.engine.consumer_groups`)
decides: the active instance is the one whose id holds it. An :class:`Instance` stands by while
another holder's lease is alive, taking no lease and delivering nothing; once the lease lapsed
(the active instance died, or could not renew it for ``lease_timeout``) or was released, it takes
the lease for its own id (the check and the lease record commit at exactly the next version, so of
two standbys only one gets it) and starts the query on the shared checkpoint, with
``.option("instance", id)``: the query's planner then holds the lease under the instance's id, not
under the checkpoint's owner, which every instance shares. The new active instance resumes exactly
where the checkpoint and the state table say: a micro-batch in flight is replayed with the same
messages, groups in flight go on at their next item.

**Fencing.** An active instance that lost its lease (paused past the timeout, cut off from
storage) must stop before the next one delivers:

1. its planner renews the lease with a check at the next version
   (:meth:`~mqspark.engine.consumer_groups.ConsumerState.renew`); once another instance holds it the renewal is
   refused, and the query fails at its next trigger with ``MQRC_OBJECT_IN_USE`` (2042), before it
   plans or delivers another micro-batch;
2. a micro-batch that was already planned is checked again before the user's code sees it:
   :meth:`Instance.fence` wraps a ``foreachBatch`` function, which then runs only while this
   instance still holds the lease;
3. what a paused instance wrote before it was stopped is written again identically by the new
   active instance (same checkpoint, same batch ids): the ``delta`` and ``mq`` sinks write each
   batch id of a query once.

A process paused inside the user's own ``foreachBatch`` code resumes that code; nothing outside it
can stop it there.

**Switchover** (:func:`switchover`, ``mqspark instance switchover``, MQ's ``endmqm -s``) records a
``switchover`` row in the state table. The active query sees it when Spark asks for its next
micro-batch, which Spark does only once the last one committed: it records that batch consumed,
releases the lease and plans nothing more; the instance then stops the query, and a standby takes
the released lease at its next look, with nothing to redeliver.

**The registry.** Each instance writes a small JSON file,
``<root>/instances/<QUEUE>/<consumer>/<instance>.json``, at every heartbeat (a third of the lease
timeout): its service, host, pid, since when it runs and since when it is active.
:func:`instances` lists them with the lease holder's last renewal (``mqspark instance list``).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from mqspark import store
from mqspark.engine.access import HoldsQueues, queues_of
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.leases import DEFAULT_LEASE_TIMEOUT
from mqspark.engine.state_rows import EventKind, event_rows
from mqspark.errors import MQError, Reason
from mqspark.model.definitions import validate_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from mqspark.engine.queues import Queues

_log = logging.getLogger(__name__)
# How often a standby looks whether the group's lease lapsed: a read of the state table, so often
# enough that takeover waits mostly for the lease, not for the look.
STANDBY_POLL = 0.5
# How often a standby given a Spark session browses one message: Spark keeps an idle Python worker
# for about a minute, and starting them cost most of a takeover's first batch (measured: 4-6 s
# from the query's start to its first batch when warm, 9-14 s when not).
WARM_EVERY = 30.0

# Registry files older than this belong to instances long gone: the lister removes them.
_FORGET_AFTER = timedelta(days=1)
# The Java exceptions Spark counts as a stop of the query (StreamExecution.IO_EXCEPTION_NAMES).
_INTERRUPTIONS = frozenset(
    ("java.lang.InterruptedException", "java.io.InterruptedIOException", "java.nio.channels.ClosedByInterruptException")
)


def new_instance_id(service: str) -> str:
    """An instance id naming the service, the host and the process: ``get@host:1234:1a2b3c4d``."""
    return f"{service}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class InstanceInfo:
    """One instance as :func:`instances` sees it."""

    instance: str
    service: str
    role: str
    host: str
    pid: int
    since: datetime
    active_since: datetime | None
    heartbeat: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "service": self.service,
            "role": self.role,
            "host": self.host,
            "pid": self.pid,
            "since": self.since.isoformat(),
            "active_since": None if self.active_since is None else self.active_since.isoformat(),
            "heartbeat": self.heartbeat.isoformat(),
        }


def registry_location(root: str, queue: str, consumer: str) -> str:
    return f"{root}/{store.INSTANCES_DIR}/{store.queue_dir_name(queue)}/{consumer}"


class Instance:
    """One instance of the consumer service of ``queue`` and group ``consumer``.

    :meth:`run` stands by until this instance may be active, then starts the query; see the module
    docstring. Given ``spark``, a standby keeps that session's Python workers warm (a browse of one
    message every :data:`WARM_EVERY` seconds): a takeover's first batch then does not wait for them.
    """

    def __init__(
        self,
        qm: Queues | HoldsQueues,
        queue: str,
        consumer: str = "default",
        *,
        service: str = "get",
        lease_timeout: timedelta = DEFAULT_LEASE_TIMEOUT,
        spark: SparkSession | None = None,
    ) -> None:
        self.qm = qm = queues_of(qm)
        with store.answering(qm.root):
            self.queue = qm.resolve_for_get(queue).name
        self.consumer = validate_name(consumer, "consumer group")
        self.service = service
        self.lease_timeout = lease_timeout
        self.id = new_instance_id(service)
        self._clock = qm.clock
        self.since = self._clock.now()
        self.active_since: datetime | None = None
        self.state = ConsumerState(qm.root, self.queue, qm.storage_options, clock=self._clock)
        self._stopped = threading.Event()
        self._kept_until = threading.Event()  # the current run's keeping; :meth:`stop` ends it too
        self._registry = registry_location(qm.root, self.queue, self.consumer)
        self._spark = spark
        self._warmed = -math.inf

    @property
    def root(self) -> str:
        return self.qm.root

    @property
    def interval(self) -> float:
        return self.lease_timeout.total_seconds() / 3

    @store.connected
    def wait_until_active(self, timeout: float | None = None) -> None:
        """Stand by until the group's lease is free, then take it for this instance. Raises
        ``MQRC_OBJECT_IN_USE`` (2042) when ``timeout`` seconds pass first, or when :meth:`stop`
        was called."""
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        while True:
            self._warm()
            self._register()
            if self.state.lease(self.consumer, self.lease_timeout) is None:
                try:
                    self.state.acquire(self.consumer, self.id, self.lease_timeout)
                except MQError as error:
                    if error.reason != Reason.MQRC_OBJECT_IN_USE:
                        raise
                else:
                    self.active_since = self._clock.now()
                    self._register()
                    return
            poll = min(self.interval, STANDBY_POLL)
            wait = poll if deadline is None else min(poll, deadline - self._clock.monotonic())
            if wait <= 0 or self._clock.wait(self._stopped, wait):
                raise MQError(
                    f"queue {self.queue}: instance {self.id} of consumer group {self.consumer!r} did not become "
                    "active" + ("" if self._stopped.is_set() else f" within {timeout:g} s"),
                    Reason.MQRC_OBJECT_IN_USE,
                )

    def _warm(self) -> None:
        """With a Spark session, browse one message of the queue now and then while standing by,
        so the session's Python data source workers are up when the query starts. (A one-row
        ``mapInArrow`` task does not do: measured, only a read of the ``mq`` source does.)"""
        if self._spark is None or self._clock.monotonic() - self._warmed < WARM_EVERY:
            return
        self._warmed = self._clock.monotonic()
        try:
            self._spark.read.format("mq").option("queue", self.queue).option("limit", 1).load(self.qm.root).collect()
        except Exception as error:  # noqa: BLE001 - a standby goes on standing by; the query will meet the fault
            _log.warning("instance %s could not warm its session: %s", self.id, error)

    def run(self, start: Callable[[str], StreamingQuery], timeout: float | None = None) -> StreamingQuery:
        """Stand by until active (:meth:`wait_until_active`), then ``start(instance_id)``, which must
        start the group's query on the shared checkpoint with ``.option("instance", instance_id)``.
        Returns the running query. A thread renews the lease from the moment this instance is
        active (starting a query takes seconds, longer than a short lease) and keeps the registry
        entry current while the query runs; if a renewal is refused, it stops the query.

        If ``start`` raises, the renewals end and the lease is given back. When this instance had
        lost the group meanwhile, that is ``MQRC_OBJECT_IN_USE`` (2042), raised from the start's
        error; either way the instance may stand by again."""
        self.wait_until_active(timeout)
        started: list[StreamingQuery] = []
        self._kept_until = ended = threading.Event()
        threading.Thread(
            target=self._keep, args=(started, ended), name=f"mqspark-instance-{self.consumer}", daemon=True
        ).start()
        try:
            query = start(self.id)
        except Exception as error:
            ended.set()
            if not self._still_held():
                raise MQError(
                    f"queue {self.queue}: instance {self.id} lost consumer group {self.consumer!r} "
                    "while its query started",
                    Reason.MQRC_OBJECT_IN_USE,
                ) from error
            self.state.release(self.consumer, self.id)
            raise
        started.append(query)
        return query

    def _still_held(self) -> bool:
        holder = self.state.lease(self.consumer, self.lease_timeout)
        return holder is not None and holder.owner == self.id

    def fence(self, function: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
        """``function`` as a ``foreachBatch`` function that runs only while this instance holds the
        group's lease; otherwise the batch fails with ``MQRC_OBJECT_IN_USE`` (2042)."""

        # Plain values only: through Spark Connect the function is pickled to the server, and this
        # instance's threading state cannot be.
        root, options, queue, consumer = self.qm.root, self.qm.storage_options, self.queue, self.consumer
        instance, lease_timeout = self.id, self.lease_timeout

        def fenced(batch: DataFrame, batch_id: int) -> None:
            with store.answering(root):
                holder = ConsumerState(root, queue, options).lease(consumer, lease_timeout)
            if holder is None or holder.owner != instance:
                raise MQError(
                    f"queue {queue}: instance {instance} no longer holds consumer group {consumer!r} "
                    f"(held by {holder.owner if holder else 'nobody'}); micro-batch {batch_id} is not delivered",
                    Reason.MQRC_OBJECT_IN_USE,
                )
            function(batch, batch_id)

        return stoppable(fenced)

    def stop(self) -> None:
        """Stop standing by, and stop keeping the registry entry current."""
        self._stopped.set()
        self._kept_until.set()

    def _keep(self, started: list[StreamingQuery], ended: threading.Event) -> None:
        """Renew the lease and the registry entry until the query (``started[0]``, once started) ends,
        or, on a switchover, until its planner released the lease at a batch boundary. A store that
        does not answer is tried again at the next renewal; the lease may pass meanwhile."""
        state = ConsumerState(self.qm.root, self.queue, self.qm.storage_options, clock=self._clock)
        while not self._clock.wait(ended, self.interval):
            try:
                if self._kept(state, started):
                    ended.set()
                    return
            except Exception as error:
                if not store.unanswered(error):
                    raise
                _log.warning("instance %s could not renew its lease, the store did not answer: %s", self.id, error)

    def _kept(self, state: ConsumerState, started: list[StreamingQuery]) -> bool:
        """One renewal of :meth:`_keep`; True when keeping ends."""
        if started and not started[0].isActive:
            return True
        if state.events(self.consumer, (EventKind.SWITCHOVER,), ["at"], since=self.active_since).num_rows:
            holder = state.lease(self.consumer, self.lease_timeout)
            if started and (holder is None or holder.owner != self.id):
                _log.info("instance %s handed consumer group %r over", self.id, self.consumer)
                started[0].stop()
                return True
            return False
        try:
            # The query's planner renews the lease too once it runs.
            state.renew(self.consumer, self.id, self.lease_timeout)
        except MQError as lost:
            _log.warning("instance %s stops its query: %s", self.id, lost)
            if started:
                started[0].stop()
            return True
        self._register()
        return False

    def _register(self) -> None:
        entry = {
            "instance": self.id,
            "service": self.service,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": self.since.isoformat(),
            "active_since": None if self.active_since is None else self.active_since.isoformat(),
            "heartbeat": self._clock.now().isoformat(),
        }
        filesystem, path = store.filesystem_of(self._registry)
        filesystem.create_dir(path, recursive=True)
        with filesystem.open_output_stream(f"{path}/{_file_name(self.id)}") as out:
            out.write(json.dumps(entry).encode())


def stoppable(function: Callable[[DataFrame, int], None]) -> Callable[[DataFrame, int], None]:
    """``function`` as a ``foreachBatch`` function whose Spark job, interrupted by the query's
    stop, fails with the first line of its error only.

    Spark tells a stop from a failure of a Python ``foreachBatch`` by matching the Python error's
    text against a regular expression that recurses once per character; the whole Java stack trace
    (17 KB for an interrupted Delta write) overflows the stream thread's stack, and the query ends
    with a ``StackOverflowError`` instead of stopping."""

    @functools.wraps(function)
    def run(batch: DataFrame, batch_id: int) -> None:
        try:
            function(batch, batch_id)
        except Exception as error:
            interruption = _interruption(error)
            if interruption is None:
                raise
            kind = f"{type(error).__module__}.{type(error).__qualname__}"
            raise RuntimeError(f"{kind}: {str(error.args[0]).strip()}: {interruption}") from None

    return run


def _interruption(error: Exception) -> str | None:
    """The name of the interruption among the Java causes of a Py4J error, if there is one."""
    java = getattr(error, "java_exception", None)
    while java is not None:
        name = java.getClass().getName()
        if name in _INTERRUPTIONS:
            return name
        java = java.getCause()
    return None


@store.connected
def switchover(qm: Queues | HoldsQueues, queue: str, consumer: str) -> None:
    """Ask the active instance of group ``consumer``'s service to hand over (MQ's ``endmqm -s``): at
    its next micro-batch boundary its query records the last batch consumed, releases the lease
    and stops, and a standby takes over at once with nothing to redeliver. With no standby, the
    group has no reader until an instance starts."""
    qm = queues_of(qm)
    local = qm.resolve_for_get(queue).name
    state = ConsumerState(qm.root, local, qm.storage_options)
    state.append(event_rows(validate_name(consumer, "consumer group"), new_instance_id("admin"), EventKind.SWITCHOVER))


def _file_name(instance: str) -> str:
    return instance.replace("/", "~2F") + ".json"


@store.connected
def instances(
    qm: Queues | HoldsQueues, queue: str, consumer: str, lease_timeout: timedelta = DEFAULT_LEASE_TIMEOUT
) -> list[InstanceInfo]:
    """The instances of group ``consumer``'s service on ``queue``: the one holding the group's lease
    is active, the others whose heartbeat is within ``lease_timeout`` stand by. Entries older than a
    day are removed."""
    qm = queues_of(qm)
    local = qm.resolve(queue).name
    holder = qm.consumer_state(local).lease(consumer, lease_timeout)
    filesystem, path = store.filesystem_of(registry_location(qm.root, local, consumer))
    selector = pafs.FileSelector(path, allow_not_found=True)
    now = qm.clock.now()
    found = []
    for info in filesystem.get_file_info(selector):
        if not info.path.endswith(".json"):
            continue
        with filesystem.open_input_stream(info.path) as stream:
            entry = json.loads(stream.read())
        heartbeat = datetime.fromisoformat(entry["heartbeat"])
        active = holder is not None and holder.owner == entry["instance"]
        if now - heartbeat > _FORGET_AFTER:
            filesystem.delete_file(info.path)
            continue
        if not active and now - heartbeat > lease_timeout:
            continue
        found.append(
            InstanceInfo(
                instance=entry["instance"],
                service=entry["service"],
                role="active" if active else "standby",
                host=entry["host"],
                pid=entry["pid"],
                since=datetime.fromisoformat(entry["since"]),
                active_since=None if entry["active_since"] is None else datetime.fromisoformat(entry["active_since"]),
                heartbeat=max(heartbeat, holder.seen) if active and holder is not None else heartbeat,
            )
        )
    return sorted(found, key=lambda i: (i.role != "active", i.since))
