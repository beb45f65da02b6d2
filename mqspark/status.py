"""What an operator looks at first, shared by the ``mqspark depth`` command and the console: each
queue's depth and oldest message age, in all and per consumer group, with each group's health, and
how many of each source queue's failed messages wait on its backout, error and dead-letter queues."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mqspark.qmgr import QueueManager
from mqspark.services.monitor import group_health

# Beside each source queue: its failure queues and its failed messages waiting there.
FAILURE_KEYS = ("backout_queue", "backed_out", "error_queue", "errors", "dead_letters")
# Beside each consumer group: its health (see :func:`mqspark.services.monitor.group_health`).
HEALTH_KEYS = ("status", "claimable_age_s", "rate_per_s", "held_by")


def depths(qm: QueueManager, queue: str | None = None, now: datetime | None = None) -> list[dict[str, Any]]:
    """One row per local queue (or only ``queue``) and one per consumer group of it: the depth and
    oldest age (``consumer`` None: every committed message), each group's health (status, oldest
    claimable age, rate, who holds its lease) and, on a source queue's row, its failure queues and
    how many of its failed messages wait on each. Every row has every key."""
    queues = {q.name: q for q in qm.queues() if q.type == "local"}
    names = [queue] if queue else list(queues)
    from_queue: dict[str, dict[str, int]] = {}

    def failed_on(failure_queue: str | None, source: str) -> int | None:
        if failure_queue is None or failure_queue not in queues:
            return None
        if failure_queue not in from_queue:
            from_queue[failure_queue] = qm.depth_by_original_queue(failure_queue)
        return from_queue[failure_queue].get(source, 0)

    rows = []
    now = now or datetime.now(UTC)
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
            if consumer is None and definition is not None and name != qm.dead_letter_queue:
                row.update(
                    {
                        "backout_queue": definition.backout_queue,
                        "backed_out": failed_on(definition.backout_queue, name),
                        "error_queue": definition.error_queue,
                        "errors": failed_on(definition.error_queue, name),
                        "dead_letters": failed_on(qm.dead_letter_queue, name),
                    }
                )
            rows.append(row)
    return rows


def rounded(value: float | None) -> float | None:
    """A duration or rate to one decimal, as reports show them."""
    return None if value is None else round(value, 1)
