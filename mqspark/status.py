"""What an operator looks at, shared by the CLI and the console: each queue's depth and oldest
message age, in all and per consumer group, with each group's health, and how many of each source
queue's failed messages wait on its backout, error and dead-letter queues; and how messages are
shown (payloads as text, hex or base64; the dead-letter header where it applies)."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

import pyarrow as pa

from mqspark.engine.waiting import depth_by_original_queue
from mqspark.qmgr import QueueManager, engine
from mqspark.services.monitor import group_health

# Beside each source queue: its failure queues and its failed messages waiting there.
FAILURE_KEYS = ("backout_queue", "backed_out", "error_queue", "errors", "dead_letters")
# How payloads are shown: as UTF-8 text, in hex or in base64.
PAYLOAD_VIEWS = ("text", "hex", "base64")
# Beside each consumer group: its health (see :func:`mqspark.services.monitor.group_health`).
HEALTH_KEYS = ("status", "claimable_age_s", "rate_per_s", "held_by")


def depths(qm: QueueManager, queue: str | None = None, now: datetime | None = None) -> list[dict[str, Any]]:
    """One row per local queue (or only ``queue``) and one per consumer group of it: the depth and
    oldest age (``consumer`` None: every committed message), each group's health (status, oldest
    claimable age, rate, who holds its lease) and, on a source queue's row, its failure queues and
    how many of its failed messages wait on each. Every row has every key."""
    queues = {q.name: q for q in qm.queues() if q.type == "local"}
    names = [queue] if queue else list(queues)
    dead_letter_queue = engine(qm).dead_letter_queue
    from_queue: dict[str, dict[str, int]] = {}

    def failed_on(failure_queue: str | None, source: str) -> int | None:
        if failure_queue is None or failure_queue not in queues:
            return None
        if failure_queue not in from_queue:
            from_queue[failure_queue] = depth_by_original_queue(engine(qm), failure_queue)
        return from_queue[failure_queue].get(source, 0)

    rows = []
    now = now or engine(qm).clock.now()
    for name in names:
        definition = queues.get(name)
        for consumer in [None, *qm.consumers(name)]:
            backlog = qm.backlog(name, consumer)
            row = {
                "queue": name,
                "consumer": consumer,
                "depth": backlog.depth,
                "oldest_age_s": rounded(backlog.oldest_age(now)),
                **dict.fromkeys(HEALTH_KEYS),
                **dict.fromkeys(FAILURE_KEYS),
            }
            if consumer is not None:
                health = group_health(qm, name, consumer, now)
                row.update(
                    {
                        "status": None if health.status is None else health.status.value,
                        "claimable_age_s": rounded(health.oldest_claimable_age_s),
                        "rate_per_s": rounded(health.rate_per_s),
                        "held_by": health.held_by,
                    }
                )
            if consumer is None and definition is not None and name != dead_letter_queue:
                row.update(
                    {
                        "backout_queue": definition.backout_queue,
                        "backed_out": failed_on(definition.backout_queue, name),
                        "error_queue": definition.error_queue,
                        "errors": failed_on(definition.error_queue, name),
                        "dead_letters": failed_on(dead_letter_queue, name),
                    }
                )
            rows.append(row)
    return rows


def rounded(value: float | None) -> float | None:
    """A duration or rate to one decimal, as reports show them."""
    return None if value is None else round(value, 1)


def payload_view(payloads: list[bytes | None], view: str, lossless: bool) -> tuple[pa.Array, pa.Array]:
    """``payloads`` as text for printing, and each one's encoding: ``hex``, ``base64``, or ``text``
    (UTF-8; one that is not UTF-8 is base64 when ``lossless``, else text with its bytes escaped)."""
    texts: list[str | None] = []
    encodings: list[str | None] = []
    for payload in payloads:
        text: str | None
        encoding: str | None = view
        if payload is None:
            text, encoding = None, None
        elif view == "hex":
            text = payload.hex()
        elif view == "base64":
            text = base64.b64encode(payload).decode("ascii")
        else:
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError:
                encoding = "base64" if lossless else "text"
                escaped = payload.decode("utf-8", "backslashreplace")
                text = base64.b64encode(payload).decode("ascii") if lossless else escaped
        texts.append(text)
        encodings.append(encoding)
    return pa.array(texts, pa.string()), pa.array(encodings, pa.string())


def holds_failed_messages(qm: QueueManager, queue: str, browsed: pa.Table) -> bool:
    """Whether browse shows the dead-letter header: for the dead-letter queue, a queue some queue
    names as its backout or error queue, and any queue holding messages that carry a header."""
    queues = qm.queues()
    failure_queues = {engine(qm).dead_letter_queue}
    failure_queues |= {q.backout_queue for q in queues if q.backout_queue}
    failure_queues |= {q.error_queue for q in queues if q.error_queue}
    return qm.inquire_queue(queue).name in failure_queues or browsed["dlq_reason"].null_count < browsed.num_rows
