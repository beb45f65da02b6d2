"""The messages waiting on a queue, read through :class:`~mqspark.engine.queues.Queues`: the messages
themselves (for checks and the console's redrive), and how many of a failure queue's came from each
source queue (the depth report's failed messages).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.engine.depth import waiting
from mqspark.engine.queues import Queues
from mqspark.model.definitions import validate_name


@store.connected
def waiting_messages(qm: Queues, queue: str, consumer: str | None = None, columns: Sequence[str] = ()) -> pa.Table:
    """The live messages of ``queue`` that wait, as the queue manager's depth counts them (with
    ``consumer``, those waiting for that group): their identity (``origin``, ``row``), ``expiry``
    and ``columns``."""
    local = qm.resolve(queue).name
    if consumer is not None:
        validate_name(consumer, "consumer group")
    groups = qm.consumer_state(local).all_groups()
    if consumer is not None:
        groups.require(local, consumer)
    _, live = qm.live_messages(local, columns)
    return live.filter(pa.array(waiting(live, groups, qm.clock.now(), consumer)))


def depth_by_original_queue(qm: Queues, queue: str) -> dict[str, int]:
    """How many of the messages waiting on ``queue`` (as depth counts them) came from each queue, by
    their dead-letter header's ``dlq_original_queue``: for a backout, error or dead-letter queue.
    Messages without a header are not counted."""
    local = qm.resolve(queue).name
    _, live = qm.live_messages(local, ["dlq_original_queue"])
    mask = waiting(live, qm.consumer_state(local).all_groups(), qm.clock.now())
    counts = pc.value_counts(live["dlq_original_queue"].filter(pa.array(mask)).drop_null())
    return {item["values"].as_py(): item["counts"].as_py() for item in counts}
