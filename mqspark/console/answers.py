"""The answers the console's clients poll, each computed from the queue managers' tables as JSON-ready
values: the queue managers served, their queues with depth (CURDEPTH) and oldest age, a queue's
attributes, consumer groups and failed messages, its monitor history, the instances and clusters,
and the failure queues. :mod:`mqspark.console.reader` computes them in a process of their own."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow.compute as pc

from mqspark.cluster.repository import Cluster
from mqspark.console.managers import Managers
from mqspark.errors import MQError
from mqspark.qmgr import QueueManager, engine
from mqspark.services.instances import instances as group_instances
from mqspark.services.monitor import history_points
from mqspark.status import depths, rounded

# What the charts draw from the monitor history.
HISTORY_SERIES = ("depth", "oldest_claimable_age_s", "rate_per_s")


def qmgrs(managers: Managers) -> list[dict[str, Any]]:
    """Every queue manager served, with its dead-letter queue and how many queues it has."""
    rows = []
    for name in managers.names:
        qm = managers.get(name)
        rows.append({"name": name, "dead_letter_queue": engine(qm).dead_letter_queue, "queues": len(qm.queues())})
    return rows


def queues(managers: Managers, qmgr: str) -> list[dict[str, Any]]:
    """Every queue of ``qmgr``: type, depth (every committed message waiting, CURDEPTH), oldest
    message age, whether puts and gets are inhibited, description."""
    qm = managers.get(qmgr)
    now = datetime.now(UTC)
    rows = []
    for definition in qm.queues():
        row: dict[str, Any] = {
            "name": definition.name,
            "type": definition.type,
            "depth": None,
            "oldest_age_s": None,
            "put_inhibited": definition.put_inhibited,
            "get_inhibited": definition.get_inhibited,
            "description": definition.description,
        }
        if definition.type == "local":
            backlog = qm.backlog(definition.name)
            row.update(depth=backlog.depth, oldest_age_s=rounded(backlog.oldest_age(now)))
        rows.append(row)
    return rows


def queue(managers: Managers, qmgr: str, name: str) -> dict[str, Any]:
    """Queue ``name`` of ``qmgr``: its attributes; for a local queue, its depth, each consumer
    group's depth and health, and its failed messages waiting on its failure queues."""
    qm = managers.get(qmgr)
    definition = qm.inquire_queue(name)
    attributes = json_record(definition)
    if getattr(definition, "type", None) != "local":
        return {"qmgr": qmgr, "name": definition.name, "attributes": attributes, "depth": None, "groups": []}
    rows = depths(qm, definition.name)
    total, groups = rows[0], rows[1:]
    failures = {key: total[key] for key in ("backout_queue", "backed_out", "error_queue", "errors")}
    failures["dead_letter_queue"] = engine(qm).dead_letter_queue
    failures["dead_letters"] = total["dead_letters"]
    return {
        "qmgr": qmgr,
        "name": definition.name,
        "attributes": attributes,
        "depth": total["depth"],
        "oldest_age_s": total["oldest_age_s"],
        "groups": [
            {
                **{key: value for key, value in row.items() if key not in failures},
                "instances": [info.as_dict() for info in group_instances(qm, definition.name, row["consumer"])],
            }
            for row in groups
        ],
        "failures": failures,
    }


def history(managers: Managers, qmgr: str, name: str, minutes: int) -> dict[str, Any]:
    """The monitor history of queue ``name`` over the last ``minutes``, per consumer group, as the
    charts draw it: the points' times (epoch seconds) and depth, oldest claimable age and rate,
    and the times of the warn and abort verdicts."""
    queues = engine(managers.get(qmgr))
    resolved = queues.resolve(name).name
    since = datetime.now(UTC) - timedelta(minutes=minutes)
    points = history_points(queues, resolved, since, [*HISTORY_SERIES, "verdict"])
    groups: dict[str, Any] = {}
    for consumer in sorted(set(points["consumer"].to_pylist())):
        mine = points.filter(pc.equal(points["consumer"], consumer))
        at = [moment.timestamp() for moment in mine["at"].to_pylist()]
        verdicts = mine["verdict"].to_pylist()
        groups[consumer] = {
            "at": at,
            **{series: mine[series].to_pylist() for series in HISTORY_SERIES},
            **{kind: [t for t, v in zip(at, verdicts, strict=True) if v == kind] for kind in ("warn", "abort")},
        }
    return {"qmgr": qmgr, "queue": resolved, "minutes": minutes, "groups": groups}


def instances(managers: Managers, qmgr: str) -> list[dict[str, Any]]:
    """The instances of every consumer group's service of ``qmgr``'s local queues (active and
    standby, with their last heartbeat), by queue and group; groups without instances left out."""
    qm = managers.get(qmgr)
    rows = []
    for definition in qm.queues():
        if definition.type != "local":
            continue
        for consumer in qm.consumers(definition.name):
            found = [info.as_dict() for info in group_instances(qm, definition.name, consumer)]
            if found:
                rows.append({"queue": definition.name, "consumer": consumer, "instances": found})
    return rows


def clusters(managers: Managers, qmgr: str) -> list[dict[str, Any]]:
    """The clusters ``qmgr`` joined: their members (replicas) with route state and last use, the
    queues they advertise with each replica's depth, and the routing bindings."""
    qm = managers.get(qmgr)
    found = []
    for root in engine(qm).cluster_roots():
        snapshot = Cluster.open(root, storage_options=engine(qm).storage_options).snapshot()
        roots = {member.qmgr: member.root for member in snapshot.members}
        found.append(
            {
                "cluster": snapshot.cluster,
                "version": snapshot.version,
                "members": [json_record(member) for member in snapshot.members],
                "queues": [
                    {**json_record(shared), "depth": _replica_depth(roots.get(shared.qmgr), shared.name, qm)}
                    for shared in snapshot.queues
                ],
                "bindings": [json_record(binding) for binding in snapshot.bindings],
            }
        )
    return found


def failure_queues(managers: Managers, qmgr: str) -> list[dict[str, Any]]:
    """The queues failed messages of ``qmgr`` go to: its dead-letter queue, and every queue some
    queue names as its backout or error queue, each with its role and depth."""
    qm = managers.get(qmgr)
    defined = {q.name: q for q in qm.queues()}
    roles: dict[str, list[str]] = {engine(qm).dead_letter_queue: ["dead-letter queue"]}
    for definition in defined.values():
        for attribute, role in (("backout_queue", "backout queue"), ("error_queue", "error queue")):
            target = getattr(definition, attribute, None)
            if target:
                roles.setdefault(target, []).append(f"{role} of {definition.name}")
    return [
        {"name": name, "roles": roles[name], "depth": qm.depth(name) if name in defined else None}
        for name in sorted(roles)
    ]


# Each answer by the name a reader is asked for it with.
ANSWERS: dict[str, Callable[..., Any]] = {
    answer.__name__: answer for answer in (qmgrs, queues, queue, history, instances, clusters, failure_queues)
}


def json_record(record: Any) -> dict[str, Any]:
    """A dataclass record as a JSON object."""
    return {key: json_value(value) for key, value in dataclasses.asdict(record).items()}


def json_value(value: Any) -> Any:
    """A column value as JSON shows it: times in ISO 8601, bytes in base64, maps as objects."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, tuple):
        return [json_value(item) for item in value]
    if isinstance(value, list) and value and all(isinstance(item, tuple) and len(item) == 2 for item in value):
        return {key: json_value(item) for key, item in value}
    return value


def _replica_depth(root: str | None, queue: str, local: QueueManager) -> int | str | None:
    """How many messages wait on a replica of a cluster queue: what it took and still holds; the
    error's text when its queue manager cannot be read from here."""
    if root is None:
        return None
    try:
        qm = local if root == local.root else QueueManager.open(root, storage_options=engine(local).storage_options)
        return qm.depth(queue)
    except (MQError, OSError) as error:
        return f"unreadable: {error}"
