"""The dead-letter header (MQDLH, spec section 9): why a message could not be put where it was sent,
where that was, and when.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from mqspark.model.messages import MESSAGE_SCHEMA, TIMESTAMP


def dead_letter(
    messages: pa.Table,
    reason: pa.Array,
    reason_text: pa.Array,
    queue: str,
    qmgr: str,
    at: datetime,
    consumer_group: str | None = None,
) -> pa.Table:
    """``messages`` (prepared rows) with their dead-letter header: why each could not be put to ``queue``
    of ``qmgr``, when it was dead-lettered, and the ``consumer_group`` of ``queue`` that moved it
    there (None: it was never on ``queue``, or every group's)."""
    rows = messages.num_rows
    header = {
        "dlq_reason": reason,
        "dlq_reason_text": reason_text,
        "dlq_original_queue": pa.repeat(queue, rows),
        "dlq_original_qmgr": pa.repeat(qmgr, rows),
        "dlq_consumer_group": pa.repeat(pa.scalar(consumer_group, pa.string()), rows),
        "dlq_time": pa.repeat(pa.scalar(at, TIMESTAMP), rows),
    }
    for name, column in header.items():
        index = MESSAGE_SCHEMA.get_field_index(name)
        messages = messages.set_column(
            index, MESSAGE_SCHEMA.field(index), column.cast(MESSAGE_SCHEMA.field(index).type)
        )
    return messages
