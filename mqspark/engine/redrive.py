"""Redrive: moving messages of a backout, error or dead-letter queue back to the queues they came
from, exactly once, with the dead-letter header cleared and the backout count reset.

A copy that a consumer group moved (``dlq_consumer_group``) goes back for that group only: the
copy put back names it in ``redriven_for``, and every other group of the queue takes it as consumed
(see :mod:`mqspark.engine.depth` and :mod:`mqspark.engine.ordering`). A copy whose group the
original queue no longer has stays, as a message whose original queue is no longer defined does.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.errors import MQValidationError
from mqspark.model.messages import DEAD_LETTER_FIELDS, MESSAGE_SCHEMA, replace_column
from mqspark.model.ranges import single_ranges

if TYPE_CHECKING:
    from mqspark.engine.pending import PendingMessages
    from mqspark.engine.queues import Queues
from mqspark.engine.backout import IDENTITY_SCHEMA, Transfer

# The consumer group under which redrive takes messages off a backout, error or dead-letter queue.
REDRIVER = "mqspark.redrive"
_log = logging.getLogger("mqspark.engine.redrive")


def redrive(
    qm: Queues,
    queue: str,
    msg_ids: Sequence[str] | None = None,
    correl_ids: Sequence[str] | None = None,
    reasons: Sequence[int] | None = None,
    lease_timeout: timedelta = timedelta(seconds=30),
) -> dict[str, int]:
    """Move messages of ``queue`` (a backout, error or dead-letter queue) back to the queues they came
    from (``dlq_original_queue``), with their dead-letter header cleared and ``backout_count`` reset,
    in the order they arrived, exactly once. All of them, or those matching every selector given.
    A copy a consumer group moved goes back for that group only. Returns how many went back to each
    queue. Messages without an original queue, whose original queue is no longer defined here, or
    whose group that queue no longer has, stay."""
    from mqspark.engine.pending import PendingMessages

    definition = qm.resolve_for_get(queue)
    local = definition.name
    for name, values in (("msg_ids", msg_ids), ("correl_ids", correl_ids), ("reasons", reasons)):
        if values is not None and (isinstance(values, str | bytes) or not values):
            raise MQValidationError(f"redrive: queue {local}: {name} must be a non-empty list, got {values!r}")
    state = ConsumerState(qm.root, local, qm.storage_options)
    owner = uuid.uuid4().hex
    state.acquire(REDRIVER, owner, lease_timeout)
    try:
        pending = PendingMessages(store.queue_location(qm.root, local), qm.storage_options, consumer=REDRIVER)
        pending.load(state.consumed_ranges(REDRIVER))
        app_id = f"mqspark.redrive/{qm.name}/{local}"
        transfer = Transfer(qm, local, state, REDRIVER, owner, app_id, _without_header, group_rules=True)
        pending.mark_consumed(pending.range_keys(single_ranges(transfer.finish_pending(pending))))
        waiting = pending.rows.filter(pc.invert(pending.rows["consumed"]))
        headers = _headers(pending, waiting)
        keep = pc.is_valid(headers["dlq_original_queue"])
        for values, column in ((msg_ids, "msg_id"), (correl_ids, "correl_id"), (reasons, "dlq_reason")):
            if values is not None:
                keep = pc.and_(keep, pc.fill_null(pc.is_in(headers[column], pa.array(list(values))), False))
        chosen = headers.filter(keep)
        chosen = chosen.take(pc.sort_indices(chosen, [("commit_version", "ascending"), ("put_seq", "ascending")]))
        known = {q.name for q in qm.queues()}
        moved: dict[str, int] = {}
        for target in sorted(pc.unique(chosen["dlq_original_queue"]).to_pylist()):
            if target not in known:
                continue
            local_target = qm.resolve_for_put(target).name
            mine = _with_known_groups(
                qm, local, local_target, chosen.filter(pc.equal(chosen["dlq_original_queue"], target))
            )
            if mine.num_rows:
                transfer.transfer(mine.select(IDENTITY_SCHEMA.names), local_target, pending)
                moved[target] = mine.num_rows
        return moved
    finally:
        state.release(REDRIVER, owner)


def _with_known_groups(qm: Queues, queue: str, target: str, chosen: pa.Table) -> pa.Table:
    """The ``chosen`` messages (going back to ``target``) moved by no group, or by a group ``target``
    still has; those of a group since deleted stay on ``queue``, with a warning naming them."""
    groups = pa.array(ConsumerState(qm.root, target, qm.storage_options).groups(), pa.string())
    moved_by = chosen["dlq_consumer_group"]
    known = pc.or_(pc.is_null(moved_by), pc.fill_null(pc.is_in(moved_by, value_set=groups), False))
    gone = chosen.filter(pc.invert(known))
    for group in sorted(pc.unique(gone["dlq_consumer_group"]).to_pylist()):
        count = pc.sum(pc.equal(gone["dlq_consumer_group"], group)).as_py()
        _log.warning(
            "redrive: queue %s: %d message(s) stay: consumer group %r of queue %s, which moved them, no longer exists",
            queue,
            count,
            group,
            target,
        )
    return chosen.filter(known)


def _headers(pending: PendingMessages, waiting: pa.Table) -> pa.Table:
    """Identity, physical order, selectors, original queue and consumer group of the ``waiting`` index rows."""
    columns = ["msg_id", "correl_id", "dlq_reason", "dlq_original_queue", "dlq_consumer_group"]
    data = pending.read_columns(waiting, columns)
    return pa.table(
        {
            "origin": pa.array(pending.origins, pa.string()).take(waiting["origin"]),
            "row": waiting["row"],
            "commit_version": waiting["commit_version"],
            "put_seq": waiting["put_seq"],
            **{name: data[name] for name in data.column_names},
        }
    )


def _without_header(messages: pa.Table, move: pa.Table) -> pa.Table:
    """A redriven copy: for the group that moved it (every group when none did), no dead-letter
    header, backout count 0."""
    count = messages.num_rows
    messages = replace_column(messages, "redriven_for", messages["dlq_consumer_group"])
    for name in DEAD_LETTER_FIELDS:
        messages = replace_column(messages, name, pa.nulls(count, MESSAGE_SCHEMA.field(name).type))
    return replace_column(messages, "backout_count", pa.array(np.zeros(count, dtype=np.int32)))
