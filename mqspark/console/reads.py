"""What the console's pages and its REST API show, as JSON-ready values: the answers many clients
poll (:mod:`mqspark.console.answers`), computed by the reader process
(:mod:`mqspark.console.reader`), kept fresh in the background and served at once
(:mod:`mqspark.console.snapshots`); and a queue's messages in logical order, paged and filtered."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mqspark.console.answers import json_value
from mqspark.console.machine import MachineLoad
from mqspark.console.managers import Managers
from mqspark.console.reader import Reader
from mqspark.console.snapshots import Dated, Snapshots
from mqspark.engine.browse import browse_queue
from mqspark.engine.ordering import ORDERS, DeliveryOptions
from mqspark.errors import MQValidationError
from mqspark.model.numbers import check_number
from mqspark.qmgr import engine
from mqspark.status import holds_failed_messages, payload_view

# How often an answer clients keep polling is computed again: as often as the overview page asks,
# and RabbitMQ's management statistics interval; and how long one nobody asks for is kept.
REFRESH_SECONDS = 5.0
IDLE_SECONDS = 30.0
# How often while the machine is busy with other work (a streaming get, say).
BUSY_REFRESH_SECONDS = 30.0
# Browse pages: the default and the largest number of messages per page.
PAGE = 50
MAX_PAGE = 500
# A payload shown in a list is cut to this many bytes; a message's own page shows up to PREVIEW_BYTES.
LIST_PAYLOAD_BYTES = 120
PREVIEW_BYTES = 64 * 1024
# How far back the charts may look.
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
        self._reader = Reader(list(managers.roots.values()))
        self._snapshots = Snapshots(REFRESH_SECONDS, IDLE_SECONDS, MachineLoad().busy, BUSY_REFRESH_SECONDS)

    def _cached(self, answer: str, *args: Any) -> Dated[Any]:
        """The newest value of ``answer`` for ``args``, dated, computed by the reader process (see
        :class:`Snapshots`); the queue manager comes first in ``args``, where there is one."""
        return self._snapshots.get((answer, *args), lambda: self._reader.read(answer, *args))

    def changed(self, qmgr: str) -> None:
        """The console changed ``qmgr`` (a put, a get, an admin action, a redrive): the next client
        waits for answers that show it."""
        self._snapshots.forget(lambda key: key[0] == "qmgrs" or (len(key) > 1 and key[1] == qmgr))

    def close(self) -> None:
        """Stop refreshing answers, and the reader process."""
        self._snapshots.close()
        self._reader.close()

    def qmgrs(self) -> Dated[list[dict[str, Any]]]:
        """Every queue manager served (:func:`~mqspark.console.answers.qmgrs`)."""
        return self._cached("qmgrs")

    def queues(self, qmgr: str) -> Dated[list[dict[str, Any]]]:
        """Every queue of ``qmgr`` with its depth (:func:`~mqspark.console.answers.queues`)."""
        return self._cached("queues", qmgr)

    def queue(self, qmgr: str, queue: str) -> Dated[dict[str, Any]]:
        """Queue ``queue`` of ``qmgr`` (:func:`~mqspark.console.answers.queue`)."""
        return self._cached("queue", qmgr, queue)

    def history(self, qmgr: str, queue: str, minutes: int) -> Dated[dict[str, Any]]:
        """The monitor history of ``queue`` over the last ``minutes``
        (:func:`~mqspark.console.answers.history`)."""
        error = f"option minutes must be 1-{MAX_HISTORY_MINUTES}, got {minutes!r}"
        check_number(minutes, error, whole=True, at_least=1, at_most=MAX_HISTORY_MINUTES)
        return self._cached("history", qmgr, queue, minutes)

    def instances(self, qmgr: str) -> Dated[list[dict[str, Any]]]:
        """The instances of ``qmgr``'s consumer groups (:func:`~mqspark.console.answers.instances`)."""
        return self._cached("instances", qmgr)

    def clusters(self, qmgr: str) -> Dated[list[dict[str, Any]]]:
        """The clusters ``qmgr`` joined (:func:`~mqspark.console.answers.clusters`)."""
        return self._cached("clusters", qmgr)

    def failure_queues(self, qmgr: str) -> Dated[list[dict[str, Any]]]:
        """The queues failed messages of ``qmgr`` go to (:func:`~mqspark.console.answers.failure_queues`)."""
        return self._cached("failure_queues", qmgr)

    def messages(
        self, qmgr: str, queue: str, selected: MessageFilter, offset: int = 0, limit: int = PAGE
    ) -> dict[str, Any]:
        """One page of ``queue``'s messages in delivery order (``offset`` of them skipped), as
        :meth:`message_rows` shows them; ``more`` says whether more follow."""
        check_number(offset, f"option offset must be a whole number >= 0, got {offset!r}", whole=True, at_least=0)
        check_number(
            limit, f"option limit must be 1-{MAX_PAGE}, got {limit!r}", whole=True, at_least=1, at_most=MAX_PAGE
        )
        qm = self.managers.get(qmgr)
        browsed = browse_queue(engine(qm), queue, selected.options())
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
        row = {key: json_value(value) for key, value in row.items()}
        row.update(
            payload=text,
            payload_encoding=encoding,
            payload_length=None if payload is None else len(payload),
            payload_truncated=payload is not None and len(payload) > payload_bytes,
        )
        rows.append(row)
    return rows
