"""What the console's pages and its REST API show, as JSON-ready values: the queue managers, their
queues with depth (CURDEPTH) and oldest age, a queue's attributes and consumer groups, and its
messages in logical order. The answers many clients poll are kept fresh in the background and
served at once (:mod:`mqspark.console.snapshots`)."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from mqspark.cluster.repository import Cluster
from mqspark.console.managers import Managers
from mqspark.console.snapshots import Snapshots
from mqspark.engine.ordering import ORDERS, DeliveryOptions
from mqspark.errors import MQError, MQValidationError
from mqspark.qmgr import QueueManager
from mqspark.services.instances import instances
from mqspark.services.monitor import history_points
from mqspark.status import depths, holds_failed_messages, payload_view, rounded

# How often an answer clients keep polling is computed again: as often as the overview page asks,
# and RabbitMQ's management statistics interval; and how long one nobody asks for is kept.
REFRESH_SECONDS = 5.0
IDLE_SECONDS = 30.0
# Browse pages: the default and the largest number of messages per page.
PAGE = 50
MAX_PAGE = 500
# A payload shown in a list is cut to this many bytes; a message's own page shows up to PREVIEW_BYTES.
LIST_PAYLOAD_BYTES = 120
PREVIEW_BYTES = 64 * 1024
_T = TypeVar("_T")
# What the charts draw from the monitor history, and how far back they may look.
HISTORY_SERIES = ("depth", "oldest_claimable_age_s", "rate_per_s")
MAX_HISTORY_MINUTES = 7 * 24 * 60


@dataclasses.dataclass(frozen=True)
class MessageFilter:
    """Which messages a browse shows: the CLI's browse selectors, a priority and a put-time window."""

    order: str = "logical"
    msg_id: str | None = None
    correl_id: str | None = None
    group_id: str | None = None
    msg_seq_number: int | None = None
    priority: int | None = None
    put_after: datetime | None = None
    put_before: datetime | None = None
    complete_message: bool = False
    all_messages_available: bool = False

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise MQValidationError(f"option order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.priority is not None and not 0 <= self.priority <= 9:
            raise MQValidationError(f"option priority must be 0-9, got {self.priority!r}")

    def options(self) -> DeliveryOptions:
        return DeliveryOptions(
            self.order,
            self.all_messages_available,
            self.complete_message,
            self.msg_id,
            self.correl_id,
            self.group_id,
            self.msg_seq_number,
        )


class Reads:
    """The reads of the queue managers ``managers`` serves, the polled ones cached."""

    def __init__(self, managers: Managers) -> None:
        self.managers = managers
        self._snapshots = Snapshots(REFRESH_SECONDS, IDLE_SECONDS)

    def _cached(self, key: tuple, compute: Callable[[], _T]) -> _T:
        """The newest answer of ``compute()`` (see :class:`Snapshots`); ``key`` names the queue
        manager second, where it has one."""
        return self._snapshots.get(key, compute)

    def changed(self, qmgr: str) -> None:
        """The console changed ``qmgr`` (a put, a get, an admin action, a redrive): the next client
        waits for answers that show it."""
        self._snapshots.forget(lambda key: key[0] == "qmgrs" or (len(key) > 1 and key[1] == qmgr))

    def close(self) -> None:
        """Stop refreshing answers."""
        self._snapshots.close()

    def qmgrs(self) -> list[dict[str, Any]]:
        """Every queue manager served, with its dead-letter queue and how many queues it has."""

        def compute() -> list[dict[str, Any]]:
            rows = []
            for name in self.managers.names:
                qm = self.managers.get(name)
                rows.append({"name": name, "dead_letter_queue": qm.dead_letter_queue, "queues": len(qm.queues())})
            return rows

        return self._cached(("qmgrs",), compute)

    def queues(self, qmgr: str) -> list[dict[str, Any]]:
        """Every queue of ``qmgr``: type, depth (every committed message waiting, CURDEPTH), oldest
        message age, whether puts and gets are inhibited, description."""

        def compute() -> list[dict[str, Any]]:
            qm = self.managers.get(qmgr)
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

        return self._cached(("queues", qmgr), compute)

    def queue(self, qmgr: str, queue: str) -> dict[str, Any]:
        """Queue ``queue`` of ``qmgr``: its attributes; for a local queue, its depth, each consumer
        group's depth and health, and its failed messages waiting on its failure queues."""

        def compute() -> dict[str, Any]:
            qm = self.managers.get(qmgr)
            definition = qm.inquire_queue(queue)
            attributes = _json_record(definition)
            if getattr(definition, "type", None) != "local":
                return {"qmgr": qmgr, "name": definition.name, "attributes": attributes, "depth": None, "groups": []}
            rows = depths(qm, definition.name)
            total, groups = rows[0], rows[1:]
            failures = {key: total[key] for key in ("backout_queue", "backed_out", "error_queue", "errors")}
            failures["dead_letter_queue"] = qm.dead_letter_queue
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
                        "instances": [info.as_dict() for info in instances(qm, definition.name, row["consumer"])],
                    }
                    for row in groups
                ],
                "failures": failures,
            }

        return self._cached(("queue", qmgr, queue), compute)

    def history(self, qmgr: str, queue: str, minutes: int) -> dict[str, Any]:
        """The monitor history of ``queue`` over the last ``minutes``, per consumer group, as the
        charts draw it: the points' times (epoch seconds) and depth, oldest claimable age and rate,
        and the times of the warn and abort verdicts."""
        if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= MAX_HISTORY_MINUTES:
            raise MQValidationError(f"option minutes must be 1-{MAX_HISTORY_MINUTES}, got {minutes!r}")

        def compute() -> dict[str, Any]:
            qm = self.managers.get(qmgr)
            name = qm.resolve(queue).name
            since = datetime.now(UTC) - timedelta(minutes=minutes)
            points = history_points(qm, name, since, [*HISTORY_SERIES, "verdict"])
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
            return {"qmgr": qmgr, "queue": name, "minutes": minutes, "groups": groups}

        return self._cached(("history", qmgr, queue, minutes), compute)

    def instances(self, qmgr: str) -> list[dict[str, Any]]:
        """The instances of every consumer group's service of ``qmgr``'s local queues (active and
        standby, with their last heartbeat), by queue and group; groups without instances left out."""

        def compute() -> list[dict[str, Any]]:
            qm = self.managers.get(qmgr)
            rows = []
            for definition in qm.queues():
                if definition.type != "local":
                    continue
                for consumer in qm.consumers(definition.name):
                    found = [info.as_dict() for info in instances(qm, definition.name, consumer)]
                    if found:
                        rows.append({"queue": definition.name, "consumer": consumer, "instances": found})
            return rows

        return self._cached(("instances", qmgr), compute)

    def clusters(self, qmgr: str) -> list[dict[str, Any]]:
        """The clusters ``qmgr`` joined: their members (replicas) with route state and last use, the
        queues they advertise with each replica's depth, and the routing bindings."""

        def compute() -> list[dict[str, Any]]:
            qm = self.managers.get(qmgr)
            found = []
            for root in qm.cluster_roots():
                snapshot = Cluster.open(root, storage_options=qm.storage_options).snapshot()
                roots = {member.qmgr: member.root for member in snapshot.members}
                found.append(
                    {
                        "cluster": snapshot.cluster,
                        "version": snapshot.version,
                        "members": [_json_record(member) for member in snapshot.members],
                        "queues": [
                            {**_json_record(queue), "depth": _replica_depth(roots.get(queue.qmgr), queue.name, qm)}
                            for queue in snapshot.queues
                        ],
                        "bindings": [_json_record(binding) for binding in snapshot.bindings],
                    }
                )
            return found

        return self._cached(("clusters", qmgr), compute)

    def failure_queues(self, qmgr: str) -> list[dict[str, Any]]:
        """The queues failed messages of ``qmgr`` go to: its dead-letter queue, and every queue some
        queue names as its backout or error queue, each with its role and depth."""

        def compute() -> list[dict[str, Any]]:
            qm = self.managers.get(qmgr)
            defined = {q.name: q for q in qm.queues()}
            roles: dict[str, list[str]] = {qm.dead_letter_queue: ["dead-letter queue"]}
            for definition in defined.values():
                for attribute, role in (("backout_queue", "backout queue"), ("error_queue", "error queue")):
                    target = getattr(definition, attribute, None)
                    if target:
                        roles.setdefault(target, []).append(f"{role} of {definition.name}")
            return [
                {"name": name, "roles": roles[name], "depth": qm.depth(name) if name in defined else None}
                for name in sorted(roles)
            ]

        return self._cached(("failure_queues", qmgr), compute)

    def messages(
        self, qmgr: str, queue: str, selected: MessageFilter, offset: int = 0, limit: int = PAGE
    ) -> dict[str, Any]:
        """One page of ``queue``'s messages in delivery order (``offset`` of them skipped), as
        :meth:`message_rows` shows them; ``more`` says whether more follow."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise MQValidationError(f"option offset must be a whole number >= 0, got {offset!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise MQValidationError(f"option limit must be 1-{MAX_PAGE}, got {limit!r}")
        qm = self.managers.get(qmgr)
        browsed = qm.browse_with(queue, selected.options())
        browsed = _narrowed(browsed, selected)
        page = browsed.slice(offset, limit)
        header = holds_failed_messages(qm, queue, page)
        return {
            "qmgr": qmgr,
            "queue": qm.inquire_queue(queue).name,
            "offset": offset,
            "limit": limit,
            "total": browsed.num_rows,
            "more": offset + page.num_rows < browsed.num_rows,
            "dead_letter_header": header,
            "messages": message_rows(page, LIST_PAYLOAD_BYTES),
        }


def _json_record(record: Any) -> dict[str, Any]:
    return {key: _json(value) for key, value in dataclasses.asdict(record).items()}


def _replica_depth(root: str | None, queue: str, local: QueueManager) -> int | str | None:
    """How many messages wait on a replica of a cluster queue: what it took and still holds; the
    error's text when its queue manager cannot be read from here."""
    if root is None:
        return None
    try:
        qm = local if root == local.root else QueueManager.open(root, storage_options=local.storage_options)
        return qm.depth(queue)
    except (MQError, OSError) as error:
        return f"unreadable: {error}"


def _narrowed(browsed: pa.Table, selected: MessageFilter) -> pa.Table:
    """``browsed`` with only the messages of the selected priority and put-time window."""
    mask = pa.array([True] * browsed.num_rows, pa.bool_())
    if selected.priority is not None:
        mask = pc.and_(mask, pc.equal(browsed["priority"], selected.priority))
    if selected.put_after is not None:
        mask = pc.and_(mask, pc.greater_equal(browsed["put_time"], pa.scalar(selected.put_after)))
    if selected.put_before is not None:
        mask = pc.and_(mask, pc.less(browsed["put_time"], pa.scalar(selected.put_before)))
    return browsed.filter(mask)


def message_rows(table: pa.Table, payload_bytes: int, view: str = "text") -> list[dict[str, Any]]:
    """``table``'s messages as JSON objects: every column, the payload cut to ``payload_bytes`` and
    shown as ``view`` says (text that is not UTF-8 is base64), with ``payload_encoding``,
    ``payload_length`` and ``payload_truncated``."""
    payloads = table["payload"].to_pylist()
    shown, encodings = payload_view([None if p is None else p[:payload_bytes] for p in payloads], view, True)
    rows = []
    for row, payload, text, encoding in zip(
        table.drop_columns(["payload"]).to_pylist(), payloads, shown.to_pylist(), encodings.to_pylist(), strict=True
    ):
        row = {key: _json(value) for key, value in row.items()}
        row.update(
            payload=text,
            payload_encoding=encoding,
            payload_length=None if payload is None else len(payload),
            payload_truncated=payload is not None and len(payload) > payload_bytes,
        )
        rows.append(row)
    return rows


def _json(value: Any) -> Any:
    """A column value as JSON shows it: times in ISO 8601, bytes in base64, maps as objects."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, tuple):
        return [_json(item) for item in value]
    if isinstance(value, list) and value and all(isinstance(item, tuple) and len(item) == 2 for item in value):
        return {key: _json(item) for key, item in value}
    return value
