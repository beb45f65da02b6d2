"""Browse (MQGMO_BROWSE): a queue's committed messages in delivery order, without removing any.

A browse orders the index columns of every live message (:class:`~mqspark.engine.pending.PendingMessages`,
without payloads or ``msg_id``) and reads the whole rows of only the messages it returns. With a
``limit`` it orders a head of the queue (see :func:`~mqspark.engine.ordering.deliver`), a longer one
when the head held too few: a browse of ten costs what its head costs, plus one pass over the index.
:func:`browse_queue` is the browse of a queue by name, with the columns the facade's browse returns.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from mqspark import store
from mqspark.engine.ordering import HEAD, Delivery, DeliveryOptions, deliver, join_segments
from mqspark.engine.pending import PendingMessages
from mqspark.engine.queues import Queues
from mqspark.model.messages import BROWSE_SCHEMA, MESSAGE_SCHEMA
from mqspark.model.numbers import check_number
from mqspark.model.ranges import NO_RANGES


@store.connected
def browse_queue(
    qm: Queues,
    queue: str,
    options: DeliveryOptions,
    *,
    limit: int | None = None,
    now: datetime | None = None,
    version: int | None = None,
) -> pa.Table:
    """The browse of ``queue`` (its target, for an alias) with its options as one value, at queue
    table ``version`` (default: latest): the message columns plus ``queue``, ``qmgr`` and
    ``delivery_seq``, the number of expired messages left out in the schema metadata under
    ``mqspark.expired``."""
    if limit is not None:
        check_number(limit, f"option limit must be a whole number >= 0, got {limit!r}", whole=True, at_least=0)
    definition = qm.resolve(queue)
    moment = now or qm.clock.now()
    delivered, expired = qm.with_snapshot(
        definition.name,
        lambda table: browse_messages(
            table, qm.storage_options, definition.delivery_sequence, options, moment, limit, version
        ),
        retry=version is None,
    )
    rows = delivered.num_rows
    delivered = delivered.append_column(BROWSE_SCHEMA.field("queue"), pa.repeat(definition.name, rows))
    delivered = delivered.append_column(BROWSE_SCHEMA.field("qmgr"), pa.repeat(qm.name, rows))
    delivered = delivered.append_column(BROWSE_SCHEMA.field("delivery_seq"), pa.array(np.arange(rows, dtype=np.int64)))
    return delivered.cast(BROWSE_SCHEMA).replace_schema_metadata({"mqspark.expired": str(expired)})


def browse_messages(
    table: DeltaTable,
    storage_options: store.StorageOptions,
    delivery_sequence: str,
    options: DeliveryOptions,
    now: datetime,
    limit: int | None,
    version: int | None = None,
) -> tuple[pa.Table, int]:
    """The first ``limit`` (None: all) messages of ``table`` at ``version`` (default: its newest) in
    delivery order at ``now``, in :data:`~mqspark.model.messages.MESSAGE_SCHEMA`, segments joined with
    ``complete_message``; and how many expired messages were left out."""
    pending = PendingMessages(table.table_uri, storage_options)
    try:
        # Without a version the index takes the newest snapshot itself, and a newer one again when
        # maintenance cleans up a log entry it needed meanwhile.
        # A selector by msg_id or correl_id looks at every message: then every file is read at once.
        everything = limit is None or options.msg_id is not None or options.correl_id is not None
        pending.load(NO_RANGES, up_to=version, lanes=None if everything else delivery_sequence)
        if options.msg_id is not None and not pending.msg_ids:
            pending.read_msg_ids()
        if options.correl_id is not None:
            rows = pending.rows
            rows = rows.append_column("correl_id", pending.read_columns(rows, ["correl_id"])["correl_id"])
            delivery, end = _ordered(rows, delivery_sequence, options, now, limit)
        else:
            delivery, end = _ordered_lazily(pending, delivery_sequence, options, now, limit)
        chosen = delivery.messages.slice(0, end)
        messages = pending.read_columns(chosen, MESSAGE_SCHEMA.names)
    except FileNotFoundError as error:
        # Maintenance removed and deleted a file of this snapshot meanwhile: a newer one does not name it.
        at = version if version is not None else pending.version
        raise store.LogEntryGone(
            f"table {table.table_uri}: a data file of version {at} was deleted: {error}"
        ) from error
    if options.complete_message:
        messages = join_segments(messages)
    return messages, delivery.expired


def _ordered(
    rows: pa.Table, delivery_sequence: str, options: DeliveryOptions, now: datetime, limit: int | None
) -> tuple[Delivery, int]:
    """The delivery of ``rows`` and how many of its first rows make its first ``limit`` messages,
    ordering heads that grow fourfold until one holds them."""
    head = None if limit is None else max(4 * limit, HEAD)
    while True:
        if head is not None and head >= rows.num_rows:
            head = None
        delivery = deliver(rows, delivery_sequence, options, now, join=False, head=head)
        exact = delivery.messages.slice(0, delivery.exact)
        end = _rows_of_messages(exact, options.complete_message, limit, whole=head is None)
        if end is not None:
            return delivery, end
        assert head is not None, "the whole queue's order holds every message"
        head *= 4


def _ordered_lazily(
    pending: PendingMessages, delivery_sequence: str, options: DeliveryOptions, now: datetime, limit: int | None
) -> tuple[Delivery, int]:
    """:func:`_ordered` on an index that reads files only while a head needs them."""
    head = None if limit is None else max(4 * limit, HEAD)
    while True:
        if head is None or not pending.ensure(head, now):
            pending.read_all()
            return _ordered(pending.rows, delivery_sequence, options, now, limit)
        delivery = deliver(pending.rows, delivery_sequence, options, now, join=False, head=head)
        exact = delivery.messages.slice(0, delivery.exact)
        end = _rows_of_messages(exact, options.complete_message, limit, whole=False)
        if end is not None:
            return replace(delivery, expired=delivery.expired + pending.unread.expired(now)), end
        head *= 4


def _rows_of_messages(ordered: pa.Table, complete_message: bool, limit: int | None, whole: bool) -> int | None:
    """How many first rows of ``ordered`` hold its first ``limit`` (None: all) messages, segments
    joined with ``complete_message``; None when they may not all be there yet (``ordered`` is the
    exact part of a head's order, not the ``whole`` queue's)."""
    if limit is None:
        return ordered.num_rows
    if complete_message:
        segmented = ordered["segmented"].to_numpy(zero_copy_only=False)
        starts = np.flatnonzero(~segmented | (ordered["offset"].to_numpy() == 0))
    else:
        starts = np.arange(ordered.num_rows)
    if len(starts) > limit:
        # The message after the last one wanted has begun: the last one wanted is whole.
        return int(starts[limit])
    return ordered.num_rows if whole else None
