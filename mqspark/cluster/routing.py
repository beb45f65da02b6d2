"""Cluster workload routing (spec section 7): which replica of a cluster queue each message goes to.

This module owns the routing decision alone: the workload algorithm over a producer's cluster snapshots,
the bind options, and the dead-letter reason when no replica qualifies. It reads and returns Arrow
columns and has no Spark, storage or clock in it; callers write the messages, record the bindings it
makes and drops, and stamp ``last_used`` on the queue managers it used.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark.cluster.records import ROUTE_STATES, Binding, ClusterSnapshot
from mqspark.errors import MQValidationError, Reason
from mqspark.model.definitions import BINDS

BIND_MODES = ("as_q_def", *BINDS)

# Step 4 ranks route states in classes: a stopped channel is started on demand, so it ranks with running.
_STATE_CLASS = {"running": 0, "stopped": 0, "retrying": 1, "unavailable": 2}


def check_bind(bind: str) -> str:
    """``bind`` when it is one of :data:`BIND_MODES`, else an error naming the option and the value."""
    if bind not in BIND_MODES:
        raise MQValidationError(f"option bind must be one of {', '.join(BIND_MODES)}; got {bind!r}")
    return bind


@dataclass(frozen=True)
class RouteRequest:
    """Who puts to which cluster queue, and how: ``bind`` is one of :data:`BIND_MODES`."""

    queue: str
    from_qmgr: str
    producer: str
    bind: str = "as_q_def"
    qmgr: str | None = None

    def __post_init__(self) -> None:
        check_bind(self.bind)


@dataclass(frozen=True)
class Routing:
    """Each row's target (or dead-letter reason), and what the caller must record after writing the rows."""

    target_qmgr: pa.Array
    target_cluster: pa.Array
    reason: pa.Array
    reason_text: pa.Array
    bindings: tuple[Binding, ...]
    finished_groups: tuple[str, ...]
    used: tuple[str, ...]


@dataclass(frozen=True)
class _Route:
    """A (cluster, member) route to a replica of the queue, with what the workload steps look at."""

    cluster: str
    qmgr: str
    put_inhibited: bool
    suspended: bool
    state_class: int
    network_priority: int
    last_used: datetime | None
    default_bind: str


# (target qmgr, target cluster, reason, reason text): a route has the first two, a dead letter the last two.
_Outcome = tuple[str | None, str | None, int | None, str | None]


def route_messages(
    messages: pa.Table,
    snapshots: Sequence[ClusterSnapshot],
    request: RouteRequest,
    *,
    rotation: int = 0,
    hash_groups: bool = False,
) -> Routing:
    """Choose a replica for every row of ``messages`` (in put order) by the workload algorithm of spec section 7.

    ``snapshots`` holds one snapshot per cluster the producer routes through. Fresh choices go round robin
    from position ``rotation`` of the least-recently-used order, except ``on_open``, whose single choice
    is the head of that order so that every partition of a batch agrees, and, with ``hash_groups``, the
    groups of ``on_group``, placed by a hash of their group id so that a group spread over several
    partitions still goes to one replica. Rows that cannot be routed get
    a null target and the MQ reason; bound rows are never rebound. Raises :class:`MQValidationError` for
    a bad route state, a cluster given twice, or a bad default bind on the queue.
    """
    _check_snapshots(snapshots)
    router = _Router(snapshots, request)
    bind = router.bind()
    groups = _groups(messages)
    unit_of_row, units, unit_of_group = _units(messages, groups, bind)

    unit_outcome = np.zeros(units, dtype=np.int64)
    fresh = np.ones(units, dtype=bool)
    if bind == "on_open" and units and None in router.bindings:
        unit_outcome[0] = router.bound(router.bindings[None], None)
        fresh[0] = False
    group_bindings = {key: value for key, value in router.bindings.items() if key is not None}
    if bind == "on_group" and group_bindings:
        bound = pc.is_in(groups.ids, value_set=pa.array(list(group_bindings), pa.string()))
        for code in np.flatnonzero(bound.to_numpy(zero_copy_only=False)):
            group = groups.ids[code].as_py()
            unit_outcome[unit_of_group[code]] = router.bound(group_bindings[group], group)
            fresh[unit_of_group[code]] = False
    start = 0 if bind == "on_open" else rotation % len(router.fresh)
    picks = np.cumsum(fresh) - 1
    unit_outcome[fresh] = router.fresh[(start + picks[fresh]) % len(router.fresh)]
    if hash_groups and bind == "on_group" and len(unit_of_group):
        # Tasks that each hold part of a group must agree without talking: its id decides.
        spread = np.array([zlib.crc32(group.encode()) for group in groups.ids.to_pylist()], dtype=np.int64)
        chosen = router.fresh[spread % len(router.fresh)]
        new_groups = fresh[unit_of_group]
        unit_outcome[unit_of_group[new_groups]] = chosen[new_groups]
    row_outcome = unit_outcome[unit_of_row]

    routed_outcome = np.array([qmgr is not None for qmgr, *_ in router.outcomes])
    bindings: list[Binding] = []
    finished = np.zeros(0, dtype=np.int64)
    if bind == "on_open" and units and fresh[0] and routed_outcome[unit_outcome[0]]:
        bindings.append(router.binding(unit_outcome[0], None))
    if bind == "on_group":
        last_item = pc.and_(
            messages["last_in_group"], pc.or_(pc.invert(messages["segmented"]), messages["last_segment"])
        ).to_numpy(zero_copy_only=False)
        finished = np.unique(groups.codes[(last_item & routed_outcome[row_outcome])[groups.rows]])
        # A group that ends in this call needs no binding: no later item will look for it.
        new = fresh[unit_of_group] & routed_outcome[unit_outcome[unit_of_group]]
        new[finished] = False
        for code in np.flatnonzero(new):
            bindings.append(router.binding(unit_outcome[unit_of_group[code]], groups.ids[code].as_py()))

    qmgrs, clusters, reasons, texts = zip(*router.outcomes, strict=True)
    indices = pa.array(row_outcome)
    return Routing(
        target_qmgr=pa.array(qmgrs, pa.string()).take(indices),
        target_cluster=pa.array(clusters, pa.string()).take(indices),
        reason=pa.array(reasons, pa.int32()).take(indices),
        reason_text=pa.array(texts, pa.string()).take(indices),
        bindings=tuple(bindings),
        finished_groups=tuple(groups.ids.take(pa.array(finished)).to_pylist()),
        used=_used(router.outcomes, row_outcome),
    )


class _Groups(NamedTuple):
    """The grouped rows of a call and their groups."""

    rows: np.ndarray  # positions of the rows that have a group_id
    codes: np.ndarray  # each of those rows' group, numbered in order of first appearance
    ids: pa.Array  # the group ids by number


def _groups(messages: pa.Table) -> _Groups:
    group_id = messages["group_id"].cast(pa.string())
    grouped = pc.is_valid(group_id).to_numpy(zero_copy_only=False)
    # dictionary_encode lists values in order of first appearance, so codes number groups that way.
    encoded = group_id.filter(pa.array(grouped)).combine_chunks().dictionary_encode()
    return _Groups(np.flatnonzero(grouped), encoded.indices.to_numpy().astype(np.int64), encoded.dictionary)


def _units(messages: pa.Table, groups: _Groups, bind: str) -> tuple[np.ndarray, int, np.ndarray]:
    """Each row's unit, what one choice covers, numbered in order of first appearance; and each group's unit.

    A unit is the whole call under on_open, a group under on_group, else a logical message: the segments
    of one message share its group_id and msg_seq_number. Rows without group_id are units of their own.
    The units of groups are given under on_group only.
    """
    rows = messages.num_rows
    first = np.arange(rows)
    where = np.zeros(0, dtype=np.int64)
    if bind == "on_open":
        first = np.zeros(rows, dtype=np.int64)
    elif len(groups.rows):
        key = groups.codes
        if bind == "not_fixed":
            seq = pc.fill_null(messages["msg_seq_number"], 0).to_numpy().astype(np.int64)[groups.rows]
            key = key << 32 | (seq & 0xFFFFFFFF)
        _, where, inverse = np.unique(key, return_index=True, return_inverse=True)
        first[groups.rows] = groups.rows[where[inverse]]
    starts = first == np.arange(rows)
    unit_of_row = (np.cumsum(starts) - 1)[first]
    unit_of_group = unit_of_row[groups.rows[where]] if bind == "on_group" else np.zeros(0, dtype=np.int64)
    return unit_of_row, int(starts.sum()), unit_of_group


def _check_snapshots(snapshots: Sequence[ClusterSnapshot]) -> None:
    versions: dict[str, int] = {}
    for snapshot in snapshots:
        if snapshot.cluster in versions:
            raise MQValidationError(
                f"cluster {snapshot.cluster} is given twice (versions {versions[snapshot.cluster]} and "
                f"{snapshot.version}); give one snapshot per cluster"
            )
        versions[snapshot.cluster] = snapshot.version
        for member in snapshot.members:
            if member.route_state not in ROUTE_STATES:
                raise MQValidationError(
                    f"cluster {snapshot.cluster}: route_state of member {member.qmgr} must be one of "
                    f"{', '.join(ROUTE_STATES)}; got {member.route_state!r}"
                )


def _is_member(snapshot: ClusterSnapshot, qmgr: str) -> bool:
    return any(member.qmgr == qmgr and member.cluster == snapshot.cluster for member in snapshot.members)


def _routes(snapshots: Sequence[ClusterSnapshot], request: RouteRequest) -> list[_Route]:
    """Every route to a replica of the queue: step 1's cluster rules, before any other exclusion."""
    routes = []
    for snapshot in snapshots:
        if not _is_member(snapshot, request.from_qmgr):
            continue
        # Only this cluster's own member rows are routes in it: a channel of another cluster does not count.
        members = {member.qmgr: member for member in snapshot.members if member.cluster == snapshot.cluster}
        for advertised in snapshot.queues:
            member = members.get(advertised.qmgr)
            if advertised.name != request.queue or advertised.cluster != snapshot.cluster or member is None:
                continue
            routes.append(
                _Route(
                    cluster=snapshot.cluster,
                    qmgr=advertised.qmgr,
                    put_inhibited=advertised.put_inhibited,
                    suspended=member.suspended,
                    state_class=_STATE_CLASS[member.route_state],
                    network_priority=member.network_priority,
                    last_used=member.last_used,
                    default_bind=advertised.default_bind,
                )
            )
    return sorted(routes, key=lambda route: (route.cluster, route.qmgr))


def _narrow(routes: list[_Route], local: str) -> list[_Route]:
    """Steps 2-5 over routes that passed step 1: the routes still tied, one per queue manager."""
    local_routes = [route for route in routes if route.qmgr == local]
    if local_routes:
        return [min(local_routes, key=lambda route: (-route.network_priority, route.cluster))]
    routes = [route for route in routes if not route.suspended] or routes
    if routes:
        best = min(route.state_class for route in routes)
        routes = [route for route in routes if route.state_class == best]
    per_qmgr: dict[str, _Route] = {}
    for route in sorted(routes, key=lambda route: (route.qmgr, -route.network_priority, route.cluster)):
        per_qmgr.setdefault(route.qmgr, route)
    return list(per_qmgr.values())


def _least_recently_used(routes: list[_Route]) -> list[_Route]:
    """Step 6: never used first, then oldest use first; the queue-manager name breaks ties."""
    never = sorted((route for route in routes if route.last_used is None), key=lambda route: route.qmgr)
    used = [route for route in routes if route.last_used is not None]
    return never + sorted(used, key=lambda route: (route.last_used, route.qmgr))


def _clusters(names: Sequence[str]) -> str:
    names = sorted(set(names))
    if not names:
        return "any cluster"
    return ("cluster " if len(names) == 1 else "clusters ") + ", ".join(names)


def _used(outcomes: list[_Outcome], row_outcome: np.ndarray) -> tuple[str, ...]:
    """The queue managers rows went to, ordered by the last row that went to each."""
    names = sorted({qmgr for qmgr, *_ in outcomes if qmgr is not None})
    # Dead letters map to the extra slot past the names.
    slot = np.array([len(names) if qmgr is None else names.index(qmgr) for qmgr, *_ in outcomes], dtype=np.int64)
    last = np.full(len(names) + 1, -1, dtype=np.int64)
    np.maximum.at(last, slot[row_outcome], np.arange(len(row_outcome)))
    return tuple(names[index] for index in np.argsort(last[:-1]) if last[index] >= 0)


class _Router:
    """The workload decision for one request against one set of snapshots.

    Every row ends in one of a few outcomes (a route, or a dead letter with its reason); rows hold indices
    into :attr:`outcomes`, so each Arrow column is built with one ``take``.
    """

    def __init__(self, snapshots: Sequence[ClusterSnapshot], request: RouteRequest) -> None:
        self.request = request
        self.given = [snapshot.cluster for snapshot in snapshots]
        self.joined = [snapshot.cluster for snapshot in snapshots if _is_member(snapshot, request.from_qmgr)]
        self.routes = _routes(snapshots, request)
        self.outcomes: list[_Outcome] = []
        self._index: dict[_Outcome, int] = {}
        eligible = [route for route in self.routes if self._passes(route)]
        order = _least_recently_used(_narrow(eligible, request.from_qmgr))
        # Fresh choices index this array round robin; with no route it holds the one dead letter they all get.
        choices = [self._routed(route) for route in order] or [self._dead(*self._no_route())]
        self.fresh = np.array(choices, dtype=np.int64)
        self.bindings: dict[str | None, Binding] = {}
        matching = (
            binding
            for snapshot in snapshots
            for binding in snapshot.bindings
            if binding.queue == request.queue and binding.producer == request.producer
        )
        # Two bindings for one producer or group should not exist; if they do, the one that wins must not
        # depend on the order the snapshots came in.
        for binding in sorted(matching, key=lambda binding: (binding.cluster, binding.qmgr)):
            self.bindings.setdefault(binding.group_id, binding)

    def _passes(self, route: _Route) -> bool:
        """Step 1's own exclusions: put-inhibited replicas, and every queue manager but the one named."""
        return not route.put_inhibited and self.request.qmgr in (None, route.qmgr)

    def _add(self, outcome: _Outcome) -> int:
        if outcome not in self._index:
            self._index[outcome] = len(self.outcomes)
            self.outcomes.append(outcome)
        return self._index[outcome]

    def _routed(self, route: _Route) -> int:
        return self._add((route.qmgr, route.cluster, None, None))

    def _dead(self, reason: Reason, detail: str) -> int:
        return self._add((None, None, int(reason), f"{reason.name} ({reason.value}): {detail}"))

    def bind(self) -> str:
        """The bind option in force: the request's, or the queue's default bind for ``as_q_def``."""
        if self.request.bind != "as_q_def":
            return self.request.bind
        if not self.routes:
            # No replica to read a default bind from, so no binding applies either: every row gets the
            # resolution error on its own.
            return "not_fixed"
        local = [route for route in self.routes if route.qmgr == self.request.from_qmgr]
        source = local[0] if local else min(self.routes, key=lambda route: (route.qmgr, route.cluster))
        if source.default_bind not in BINDS:
            raise MQValidationError(
                f"cluster {source.cluster}: default_bind of queue {self.request.queue} on {source.qmgr} must be "
                f"one of {', '.join(BINDS)}; got {source.default_bind!r}"
            )
        return source.default_bind

    def bound(self, binding: Binding, group_id: str | None) -> int:
        """The outcome for rows bound to ``binding.qmgr``: its best route, or a dead letter, never another QM."""
        request, qmgr = self.request, binding.qmgr
        passing = [route for route in self.routes if route.qmgr == qmgr and self._passes(route)]
        if passing:
            return self._routed(_narrow(passing, request.from_qmgr)[0])
        if group_id is None:
            holder = f"producer {request.producer} is bound to {qmgr} on open"
        else:
            holder = f"group {group_id} of producer {request.producer} is bound to {qmgr}"
        queue, kept = f"cluster queue {request.queue}", f"{holder}, so the message is not rebound"
        hosted = [route for route in self.routes if route.qmgr == qmgr]
        if not hosted:
            where = _clusters(self.given)
            detail = f"queue manager {qmgr} no longer hosts a replica reachable from {request.from_qmgr} in {where}"
            return self._dead(Reason.MQRC_NO_DESTINATIONS_AVAILABLE, f"{queue}: {detail}; {kept}")
        if all(route.put_inhibited for route in hosted):
            where = _clusters([route.cluster for route in hosted])
            detail = f"its replica on queue manager {qmgr} is put-inhibited in {where}"
            return self._dead(Reason.MQRC_PUT_INHIBITED, f"{queue}: {detail}; {kept}")
        detail = f"the put names queue manager {request.qmgr}"
        return self._dead(Reason.MQRC_NO_DESTINATIONS_AVAILABLE, f"{queue}: {detail}; {kept}")

    def binding(self, outcome: int, group_id: str | None) -> Binding:
        """The binding to ``outcome``, which must be a route (callers bind only routed outcomes)."""
        qmgr, cluster, *_ = self.outcomes[outcome]
        assert qmgr is not None and cluster is not None, f"outcome {outcome} is a dead letter, not a route"
        return Binding(cluster, self.request.queue, self.request.producer, group_id, qmgr)

    def _no_route(self) -> tuple[Reason, str]:
        """Why no route passed step 1, as the reason every fresh choice is dead-lettered with."""
        request, queue = self.request, f"cluster queue {self.request.queue}"
        if not self.routes:
            if not self.joined:
                detail = f"queue manager {request.from_qmgr} is not a member of {_clusters(self.given)}"
            else:
                detail = f"no member of {_clusters(self.joined)} advertises it"
            return Reason.MQRC_CLUSTER_RESOLUTION_ERROR, f"{queue}: {detail}"
        if all(route.put_inhibited for route in self.routes):
            qmgrs = ", ".join(sorted({route.qmgr for route in self.routes}))
            where = _clusters([route.cluster for route in self.routes])
            return Reason.MQRC_CLUSTER_PUT_INHIBITED, f"{queue}: every replica is put-inhibited ({qmgrs}) in {where}"
        named = [route.cluster for route in self.routes if route.qmgr == request.qmgr]
        if named:
            detail = f"its replica on queue manager {request.qmgr}, named by the put, is put-inhibited in "
            return Reason.MQRC_NO_DESTINATIONS_AVAILABLE, f"{queue}: {detail}{_clusters(named)}"
        detail = f"queue manager {request.qmgr}, named by the put, hosts no replica in {_clusters(self.joined)}"
        return Reason.MQRC_NO_DESTINATIONS_AVAILABLE, f"{queue}: {detail}"
