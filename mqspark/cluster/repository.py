"""Cluster repositories (spec section 7): which queue managers form a cluster and which queues they advertise.
The records themselves are in :mod:`mqspark.cluster.records`; :class:`Cluster`, the operations on one
repository table, is the rest (about 500 lines, one concept).

A repository is one small Delta table at ``<cluster root>/_cluster``. Every row has a ``kind``:

- ``cluster``: the cluster's name (one row).
- ``member``: a queue manager of the cluster (``qmgr``, ``root``) and the route to it: ``suspended``,
  ``route_state`` (kept by the health check, :meth:`Cluster.refresh`, unless an administrator set
  it: ``route_state_by``), ``network_priority`` and ``last_used`` (round robin).
- ``queue``: a queue a member advertises, with its cluster-visible attributes.
- ``binding``: a fixed choice of replica, for a producer (bind on open) or a group (bind on group).
- ``producer``: the routing journal of one producer and queue (:meth:`Cluster.routing_snapshot`).

Every change rewrites the table in one commit at exactly the version after the one it read, with
no automatic retry (:func:`mqspark.engine.catalog.rewrite_until_landed`). A snapshot is one committed
version of a repository; routing decisions are made against a snapshot, so a replayed micro-batch
routes exactly as the first attempt did. The table keeps its whole log, so that every snapshot
stays readable: never vacuum it.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from mqspark import store
from mqspark.engine.access import HoldsQueues, queues_of
from mqspark.engine.catalog import Catalog, rewrite_until_landed
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.maintenance import DEFAULT_RETENTION, check_retention
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.definitions import QueueDefinition, int_in, one_of, validate_name
from mqspark.model.numbers import check_number

if TYPE_CHECKING:
    from mqspark.engine.queues import Queues
from mqspark.cluster.records import (
    ROUTE_STATES,
    AdvertisedQueue,
    Binding,
    ClusterSnapshot,
    Member,
    ProducerEntry,
    RepositoryState,
    binding_key,
    repository_of,
)

CLUSTER_DIR = "_cluster"
# Checkpoints keep reads cheap. Only :meth:`Cluster.maintain` cleans up the log, keeping every snapshot a
# producer's replay may still route with.
TABLE_CONFIGURATION = {"delta.checkpointInterval": "100", "delta.enableExpiredLogCleanup": "false"}
# Recording a routed batch trims the repository's history every this many versions.
TRIM_EVERY = 100


class Cluster:
    """A cluster repository. Create one with :meth:`create`, reopen it with :meth:`open`.

    The health check and :meth:`leave` reach members' roots with the repository's storage options.
    """

    def __init__(self, root: str, name: str, storage_options: store.StorageOptions = None) -> None:
        self._root = root
        self._name = name
        self.storage_options = storage_options
        self.location = f"{root}/{CLUSTER_DIR}"

    @property
    def name(self) -> str:
        """The cluster's name."""
        return self._name

    @property
    def root(self) -> str:
        """The cluster root: the repository table lies at ``<root>/_cluster``."""
        return self._root

    def __repr__(self) -> str:
        return f"Cluster(name={self.name!r}, root={self.root!r})"

    @classmethod
    def create(cls, root: str | os.PathLike, name: str, *, storage_options: dict[str, str] | None = None) -> Cluster:
        """Create the repository of cluster ``name`` at ``root``; raises MQRC_OBJECT_IN_USE when one is there."""
        validate_name(name, "cluster")
        cluster = cls(store.normalize_root(root), name, storage_options)
        existing = store.open_table(cluster.location, storage_options)
        if existing is not None:
            raise MQError(
                f"cluster {repository_of(existing).name} already exists at {cluster.root}", Reason.MQRC_OBJECT_IN_USE
            )
        write_deltalake(
            cluster.location,
            RepositoryState(name, 0, {}, {}, {}, {}).to_rows(),
            mode="error",
            configuration=TABLE_CONFIGURATION,
            storage_options=storage_options,
        )
        return cluster

    @classmethod
    def open(cls, root: str | os.PathLike, *, storage_options: dict[str, str] | None = None) -> Cluster:
        """Open the repository at ``root``; raises MQRC_UNKNOWN_OBJECT_NAME when there is none."""
        location = store.normalize_root(root)
        return cls(location, repository_of(_open_table(location, storage_options)).name, storage_options)

    # Membership and advertisements

    def join(self, qm: Queues | HoldsQueues, *, network_priority: int = 0) -> Member:
        """Make ``qm`` a member (its name and root), and record the cluster in its catalog.

        A queue manager of that name already in the cluster is refused. The two tables change one
        after the other: should the second change fail, :meth:`leave` and join again.
        """
        int_in(0, 9)("network_priority", network_priority)
        qm = queues_of(qm)
        catalog = Catalog(qm.root, qm.storage_options)
        known = catalog.read().clusters.get(self.name)
        if known is not None and known != self.root:
            raise MQValidationError(
                f"queue manager {qm.name} is already a member of another cluster {self.name} (repository {known})"
            )

        def apply(repository: RepositoryState) -> RepositoryState:
            if qm.name in repository.members:
                raise MQValidationError(
                    f"queue manager {qm.name} is already a member of cluster {self.name} "
                    f"(root {repository.members[qm.name].root})"
                )
            return repository.with_member(Member(self.name, qm.name, qm.root, network_priority=network_priority))

        repository, _ = self._change(apply)
        catalog.change_clusters(lambda state: {**state.clusters, self.name: self.root})
        return repository.members[qm.name]

    def leave(self, qmgr: str | Queues | HoldsQueues) -> None:
        """Remove a member and its advertisements, and the cluster from the member's catalog (when its
        root is still there). Bindings to it stay: routing decides what a binding to a gone replica means."""
        name = _qmgr_name(qmgr)
        root = self._read().member(name).root

        def apply(repository: RepositoryState) -> RepositoryState:
            repository.member(name)
            return dataclasses.replace(
                repository,
                members={key: m for key, m in repository.members.items() if key != name},
                queues={key: q for key, q in repository.queues.items() if q.qmgr != name},
            )

        self._change(apply)
        catalog = Catalog(root, self.storage_options)
        try:
            joined = catalog.read().clusters.get(self.name) == self.root
        except MQError:
            return  # the queue manager is gone
        if joined:
            catalog.change_clusters(
                lambda state: {key: r for key, r in state.clusters.items() if (key, r) != (self.name, self.root)}
            )

    def advertise(self, qm: Queues | HoldsQueues, queue: str) -> AdvertisedQueue:
        """Advertise local queue ``queue`` of member ``qm``: copy its cluster-visible attributes
        (again, when it is advertised already)."""
        validate_name(queue)
        qm = queues_of(qm)
        definition = next((q for q in qm.queues() if q.name == queue), None)
        if definition is None:
            raise MQError(f"queue {queue} is not defined in queue manager {qm.name}", Reason.MQRC_UNKNOWN_OBJECT_NAME)
        if definition.type != "local":
            raise MQValidationError(
                f"queue {queue} of queue manager {qm.name} is an {definition.type} queue; "
                "only local queues can be advertised"
            )
        advertised = _advertised(self.name, qm.name, definition)

        def apply(repository: RepositoryState) -> RepositoryState:
            member = repository.member(qm.name)
            if member.root != qm.root:
                raise MQValidationError(
                    f"queue manager {qm.name} at {qm.root} is not the member {qm.name} of cluster {self.name} "
                    f"(root {member.root})"
                )
            return dataclasses.replace(repository, queues={**repository.queues, (qm.name, queue): advertised})

        self._change(apply)
        return advertised

    def unadvertise(self, qmgr: str | Queues | HoldsQueues, queue: str) -> None:
        """Withdraw the advertisement of ``queue`` by ``qmgr``."""
        name = _qmgr_name(qmgr)
        validate_name(queue)

        def apply(repository: RepositoryState) -> RepositoryState:
            if (name, queue) not in repository.queues:
                raise MQError(
                    f"queue {queue} is not advertised by queue manager {name} in cluster {self.name}",
                    Reason.MQRC_UNKNOWN_OBJECT_NAME,
                )
            return dataclasses.replace(
                repository, queues={key: q for key, q in repository.queues.items() if key != (name, queue)}
            )

        self._change(apply)

    # Routes

    def suspend(self, qmgr: str | Queues | HoldsQueues) -> Member:
        """Suspend a member: routing prefers resumed members (spec section 7, rule 3)."""
        return self._update_member(qmgr, lambda member: dataclasses.replace(member, suspended=True))

    def resume(self, qmgr: str | Queues | HoldsQueues) -> Member:
        """Resume a suspended member."""
        return self._update_member(qmgr, lambda member: dataclasses.replace(member, suspended=False))

    def set_network_priority(self, qmgr: str | Queues | HoldsQueues, network_priority: int) -> Member:
        """Set the network priority (0-9) of the route to a member; routing prefers the highest (rule 5)."""
        int_in(0, 9)("network_priority", network_priority)
        return self._update_member(qmgr, lambda member: dataclasses.replace(member, network_priority=network_priority))

    def set_route_state(
        self, qmgr: str | Queues | HoldsQueues, state: str | None, *, by: str | None = None, now: datetime | None = None
    ) -> Member:
        """Set the route state of a member and keep it through health checks; ``state`` None hands it
        back to the health check (the state stays until the next :meth:`refresh`).

        ``by`` names the administrator (default: the operating-system user).
        """
        if state is None:
            return self._update_member(qmgr, lambda member: dataclasses.replace(member, route_state_by=None))
        one_of(ROUTE_STATES)("route_state", state)
        if by is not None and (not isinstance(by, str) or not by):
            raise MQValidationError(f"option by must name an administrator, got {by!r}")
        setter = by or getpass.getuser()
        at = now or datetime.now(UTC)
        return self._update_member(
            qmgr,
            lambda member: dataclasses.replace(member, route_state=state, route_state_by=setter, route_state_at=at),
        )

    # Reading

    def snapshot(self, version: int | None = None) -> ClusterSnapshot:
        """The repository at committed ``version`` (default: the latest)."""
        return self._read(version).snapshot()

    def inquire_queue(self, qmgr: str | Queues | HoldsQueues | None, queue: str) -> AdvertisedQueue:
        """The advertised attributes of ``queue``: ``qmgr``'s replica, or (``qmgr`` None) the replica of
        the first queue manager by name."""
        name = None if qmgr is None else _qmgr_name(qmgr)
        validate_name(queue)
        for advertised in self.snapshot().queues:
            if advertised.name == queue and name in (None, advertised.qmgr):
                return advertised
        by = "" if name is None else f"by queue manager {name} "
        raise MQError(f"queue {queue} is not advertised {by}in cluster {self.name}", Reason.MQRC_UNKNOWN_OBJECT_NAME)

    # Health check

    def refresh(self, *, active_within: float = 300.0, now: datetime | None = None) -> ClusterSnapshot:
        """Check every member's route and re-copy what it advertises, in one commit (none when nothing changed).

        A member whose catalog opens is ``running`` when a consumer group of a queue it advertises
        holds a lease renewed within ``active_within`` seconds, else ``stopped`` (startable). One
        that does not open is ``retrying`` after a good check, ``unavailable`` after a failed one.
        A route state an administrator set stays. Advertisements of reachable members get their
        queue's current attributes; those of queues no longer defined (as local queues) are dropped.
        """
        check_number(
            active_within, f"option active_within must be a number of seconds >= 0, got {active_within!r}", at_least=0
        )
        now = now or datetime.now(UTC)
        window = timedelta(seconds=active_within)
        before = self._read()
        probes = {
            name: self._probe(member, [q.name for q in before.queues.values() if q.qmgr == name], window, now)
            for name, member in before.members.items()
        }

        def apply(repository: RepositoryState) -> RepositoryState:
            members = dict(repository.members)
            queues = dict(repository.queues)
            for name, probe in probes.items():
                member = members.get(name)
                if member is None or member.root != probe.root:
                    continue  # left (and maybe joined again) since the check
                if member.route_state_by is None:
                    state = _health_state(member.route_state, probe)
                    if state != member.route_state:
                        members[name] = dataclasses.replace(member, route_state=state, route_state_at=now)
                for queue, definition in probe.queues.items():
                    if (name, queue) not in queues:
                        continue
                    if definition is None:
                        del queues[(name, queue)]
                    else:
                        queues[(name, queue)] = _advertised(self.name, name, definition)
            return dataclasses.replace(repository, members=members, queues=queues)

        repository, _ = self._change(apply)
        return repository.snapshot()

    def _probe(self, member: Member, advertised: list[str], window: timedelta, now: datetime) -> _Probe:
        try:
            queues = Catalog(member.root, self.storage_options).read().queues
            current = {
                name: queues[name] if name in queues and queues[name].type == "local" else None for name in advertised
            }
            active = any(
                self._consumer_active(member.root, name, window, now)
                for name, definition in current.items()
                if definition is not None
            )
        except (MQError, OSError, DeltaError):
            return _Probe(member.root, False, False, {})
        return _Probe(member.root, True, active, current)

    def _consumer_active(self, root: str, queue: str, window: timedelta, now: datetime) -> bool:
        state = ConsumerState(root, queue, self.storage_options)
        return any(state.lease(group, window, now) is not None for group in state.groups())

    # Producer journal

    def routing_snapshot(self, producer: str, queue: str, batch_id: int | None) -> ClusterSnapshot:
        """The snapshot batch ``batch_id`` of ``producer`` on cluster queue ``queue`` routes with.

        Every call for one batch gets the same snapshot until the batch is recorded
        (:meth:`record_routing`), and a replay of the recorded batch gets it again. The first batch
        of a producer opens its journal in a commit whose version is the snapshot (concurrent
        callers converge on it). ``batch_id`` None (a one-off write): the latest version, no journal.
        """
        _check_producer(producer)
        validate_name(queue)
        _check_batch_id(batch_id)
        if batch_id is None:
            return self.snapshot()
        key = (producer, queue)

        def apply(repository: RepositoryState) -> RepositoryState:
            if key in repository.producers:
                return repository
            opened = ProducerEntry(producer, queue, -1, None, repository.version + 1)
            return dataclasses.replace(repository, producers={**repository.producers, key: opened})

        repository, _ = self._change(apply)
        journal = repository.producers[key]
        if journal.routed_batch > batch_id:
            raise MQError(
                f"producer {producer} on cluster queue {queue}: batch {batch_id} asked for after batch "
                f"{journal.routed_batch} was routed; a producer's batches never go back",
                Reason.MQRC_CLUSTER_RESOLUTION_ERROR,
            )
        version = journal.routed_with if journal.routed_batch == batch_id else journal.next_snapshot
        return repository.snapshot() if version == repository.version else self.snapshot(version)

    def record_routing(
        self,
        producer: str,
        queue: str,
        batch_id: int | None,
        snapshot_version: int,
        used: Sequence[str],
        bindings: Sequence[Binding],
        finished_groups: Sequence[str],
        at: datetime,
    ) -> int | None:
        """Record how batch ``batch_id`` was routed, in one commit, and return its version.

        The queue managers in ``used`` (least recent first) get ``last_used`` = ``at`` + 0, 1, 2...
        microseconds, so round robin goes on in that order (names no longer members are passed
        over); ``bindings`` are added (replacing those with the same queue, producer and group),
        then the producer's bindings of ``finished_groups`` on ``queue`` are dropped. The journal
        then says batch ``batch_id`` was routed with ``snapshot_version``. A batch already recorded
        (or an earlier one) commits nothing: None. ``batch_id`` None leaves the journal alone.
        """
        _check_producer(producer)
        validate_name(queue)
        _check_batch_id(batch_id)
        check_number(
            snapshot_version,
            f"snapshot_version must be a version number >= 0, got {snapshot_version!r}",
            whole=True,
            at_least=0,
        )
        if not isinstance(at, datetime) or at.tzinfo is None:
            raise MQValidationError(f"at must be a timezone-aware datetime, got {at!r}")
        for binding in bindings:
            if (binding.cluster, binding.queue, binding.producer) != (self.name, queue, producer):
                raise MQValidationError(
                    f"{binding} is not a binding of producer {producer} on queue {queue} in cluster {self.name}"
                )
        finished = {(queue, producer, group_id) for group_id in finished_groups}
        key = (producer, queue)

        def apply(repository: RepositoryState) -> RepositoryState:
            journal = repository.producers.get(key)
            if batch_id is not None and journal is not None and journal.routed_batch >= batch_id:
                return repository
            members = dict(repository.members)
            for offset, name in enumerate(used):
                if name in members:
                    members[name] = dataclasses.replace(members[name], last_used=at + timedelta(microseconds=offset))
            added = {**repository.bindings, **{binding_key(b): b for b in bindings}}
            kept = {k: b for k, b in added.items() if k not in finished}
            producers = dict(repository.producers)
            if batch_id is not None:
                producers[key] = ProducerEntry(producer, queue, batch_id, snapshot_version, repository.version + 1)
            return dataclasses.replace(repository, members=members, bindings=kept, producers=producers)

        repository, committed = self._change(apply)
        if committed and repository.version % TRIM_EVERY == 0:
            self.maintain()
        return repository.version if committed else None

    def maintain(self, retention: timedelta = DEFAULT_RETENTION) -> dict[str, int]:
        """Keep the repository's history bounded: every version a producer's replay may still route
        with (its journal's last and next snapshot) stays readable; older log entries and removed
        files go once older than ``retention``. Recording a routed batch runs it every
        :data:`TRIM_EVERY` versions."""
        check_retention(retention)
        table = self._table()
        repository = repository_of(table)
        needed = [v for j in repository.producers.values() for v in (j.routed_with, j.next_snapshot) if v is not None]
        keep_from = min([*needed, repository.version])
        cleaned, vacuumed = store.trim_history(table, keep_from, int(retention.total_seconds()))
        return {
            "version": repository.version,
            "kept_from": keep_from,
            "log_entries_removed": cleaned,
            "files_vacuumed": vacuumed,
        }

    # Helpers

    def _table(self) -> DeltaTable:
        return _open_table(self.root, self.storage_options)

    def _read(self, version: int | None = None) -> RepositoryState:
        table = self._table()
        if version is not None:
            latest = table.version()
            check_number(
                version,
                f"cluster {self.name} has no version {version!r} (latest is {latest})",
                whole=True,
                at_least=0,
                at_most=latest,
                reason=Reason.MQRC_UNKNOWN_OBJECT_NAME,
            )
            table.load_as_version(version)
        return repository_of(table)

    def _change(self, apply: Callable[[RepositoryState], RepositoryState]) -> tuple[RepositoryState, bool]:
        """Commit ``apply(repository)`` against the version it was computed from (nothing when it is the
        same); the repository as it now stands, and whether it was committed."""

        def prepare() -> tuple[DeltaTable, pa.Table | None, tuple[RepositoryState, bool]]:
            table = self._table()
            read = repository_of(table)
            changed = apply(read)
            if changed == read:
                return table, None, (read, False)
            committed = dataclasses.replace(changed, version=read.version + 1)
            return table, committed.to_rows(), (committed, True)

        return rewrite_until_landed(prepare, f"cluster repository at {self.root}")

    def _update_member(self, qmgr: str | Queues | HoldsQueues, update: Callable[[Member], Member]) -> Member:
        name = _qmgr_name(qmgr)
        repository, _ = self._change(lambda repository: repository.with_member(update(repository.member(name))))
        return repository.members[name]


def _open_table(root: str, storage_options: store.StorageOptions) -> DeltaTable:
    table = store.open_table(f"{root}/{CLUSTER_DIR}", storage_options)
    if table is None:
        raise MQError(f"no cluster repository at {root}", Reason.MQRC_UNKNOWN_OBJECT_NAME)
    return table


@dataclass(frozen=True)
class _Probe:
    """What the health check found at a member's root: its advertised queues' local definitions (None: gone)."""

    root: str
    reachable: bool
    active: bool
    queues: dict[str, QueueDefinition | None]


def _health_state(previous: str, probe: _Probe) -> str:
    if probe.reachable:
        return "running" if probe.active else "stopped"
    return "retrying" if previous in ("running", "stopped") else "unavailable"


def _advertised(cluster: str, qmgr: str, definition: QueueDefinition) -> AdvertisedQueue:
    return AdvertisedQueue(
        cluster,
        qmgr,
        definition.name,
        definition.type,
        definition.default_bind,
        definition.default_priority,
        definition.put_inhibited,
        definition.description,
    )


def _qmgr_name(qmgr: str | Queues | HoldsQueues) -> str:
    return validate_name(qmgr if isinstance(qmgr, str) else queues_of(qmgr).name, "queue manager")


def _check_producer(producer: Any) -> None:
    if not isinstance(producer, str) or not producer:
        raise MQValidationError(f"producer must be a non-empty string, got {producer!r}")


def _check_batch_id(batch_id: Any) -> None:
    if batch_id is not None:
        check_number(
            batch_id, f"batch_id must be a whole number >= 0 or None, got {batch_id!r}", whole=True, at_least=0
        )
