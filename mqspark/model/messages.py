"""The message (spec section 2): the message table's schema, the dead-letter header's fields, a
message's identity (its origin and row) and new msg_ids.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark.errors import MQValidationError, Reason

TIMESTAMP = pa.timestamp("us", tz="UTC")
PROPERTIES = pa.map_(pa.string(), pa.string())

# ``put_seq`` is the row's position inside its put; with the Delta commit version it gives physical order.
# ``top_of_queue`` and ``before_msg_id`` are Tuxedo's ordering overrides (TPQTOP, TPQBEFOREMSGID).
MESSAGE_SCHEMA = pa.schema(
    [
        pa.field("msg_id", pa.string(), nullable=False),
        pa.field("correl_id", pa.string()),
        pa.field("priority", pa.int32(), nullable=False),
        pa.field("group_id", pa.string()),
        pa.field("msg_seq_number", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("last_in_group", pa.bool_(), nullable=False),
        pa.field("segmented", pa.bool_(), nullable=False),
        pa.field("last_segment", pa.bool_(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("properties", PROPERTIES),
        pa.field("reply_to_queue", pa.string()),
        pa.field("reply_to_qmgr", pa.string()),
        # Tuxedo: where a forwarding service puts the request when processing it finally fails.
        pa.field("failure_queue", pa.string()),
        pa.field("put_time", TIMESTAMP, nullable=False),
        pa.field("expiry", TIMESTAMP),
        pa.field("available_at", TIMESTAMP),
        pa.field("backout_count", pa.int32(), nullable=False),
        pa.field("top_of_queue", pa.bool_(), nullable=False),
        pa.field("before_msg_id", pa.string()),
        pa.field("put_seq", pa.int64(), nullable=False),
        # Set only by redrive: the one consumer group this copy is for (null: every group of the queue).
        pa.field("redriven_for", pa.string()),
        # The dead-letter header, set only on a message put to a dead-letter queue (spec section 9).
        pa.field("dlq_reason", pa.int32()),
        pa.field("dlq_reason_text", pa.string()),
        pa.field("dlq_original_queue", pa.string()),
        pa.field("dlq_original_qmgr", pa.string()),
        # The consumer group of ``dlq_original_queue`` that moved the message here (null: no group did).
        pa.field("dlq_consumer_group", pa.string()),
        pa.field("dlq_time", TIMESTAMP),
    ]
)
# The queue table adds ``commit_version``: null in the files a put writes (the version of the commit that
# added the file applies), and stamped by maintenance when it rewrites rows into new files, so that
# physical order and a message's identity (see :func:`origins`) survive the rewrite.
QUEUE_TABLE_SCHEMA = pa.schema([*MESSAGE_SCHEMA, pa.field("commit_version", pa.int64())])
DEAD_LETTER_FIELDS = (
    "dlq_reason",
    "dlq_reason_text",
    "dlq_original_queue",
    "dlq_original_qmgr",
    "dlq_consumer_group",
    "dlq_time",
)
# What only mqspark stamps: null on a producer's put.
STAMPED_NULL_FIELDS = ("redriven_for", *DEAD_LETTER_FIELDS)

# What a producer may give; the rest is stamped by the put.
PRODUCER_FIELDS = tuple(
    name for name in MESSAGE_SCHEMA.names if name not in ("put_time", "put_seq", *STAMPED_NULL_FIELDS)
)

# put_seq is (task partition << 32) + position on the Spark paths, the position on the others.
_PART_SHIFT = 32


def origins(commit_version: np.ndarray, put_seq: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Each message's identity, stable for its whole life: its origin (the put, and the Spark task
    that wrote it, as ``"<commit version>:<task>"``) and its row within that origin.

    Returns the distinct origins, each message's number in that list, and its row. Rows of one
    origin are numbered consecutively in physical order, so runs of messages form short ranges.
    """
    commit_version = np.asarray(commit_version, dtype=np.int64)
    put_seq = np.asarray(put_seq, dtype=np.int64)
    part = put_seq >> _PART_SHIFT
    # A commit version below 2**32 and a task number below 2**31 share one int64.
    pair = pc.dictionary_encode(pa.array(commit_version << 31 | part))
    names = [f"{value >> 31}:{value & 0x7FFFFFFF}" for value in pair.dictionary.to_pylist()]
    return names, pair.indices.to_numpy(), put_seq & 0xFFFFFFFF


def replace_column(messages: pa.Table, name: str, column: pa.Array) -> pa.Table:
    """``messages`` (in :data:`MESSAGE_SCHEMA`) with column ``name`` replaced by ``column``, cast to its type."""
    index = MESSAGE_SCHEMA.get_field_index(name)
    return messages.set_column(index, MESSAGE_SCHEMA.field(index), column.cast(MESSAGE_SCHEMA.field(index).type))


def origin_versions(names: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The commit version each origin name starts with."""
    return pc.list_element(pc.split_pattern(names, ":"), 0).cast(pa.int64())


def field_error(queue: str, message: str, reason: Reason | None = None) -> MQValidationError:
    return MQValidationError(f"queue {queue}: {message}", reason)


def first_bad(table: pa.Table, mask: pa.ChunkedArray, column: str) -> tuple[int, Any]:
    index = pc.index(pc.fill_null(mask, False), True).as_py()
    return index, table.column(column)[index].as_py()


def new_ids(count: int) -> pa.Array:
    """``count`` random 128-bit ids as 32 hex characters, made without a Python loop per id."""
    text = os.urandom(16 * count).hex().encode()
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), count, [None, pa.py_buffer(text)]).cast(pa.string())


# What a get or browse returns: the message columns, where it was read, and its logical position.
BROWSE_SCHEMA = pa.schema(
    [
        *MESSAGE_SCHEMA,
        pa.field("queue", pa.string(), nullable=False),
        pa.field("qmgr", pa.string(), nullable=False),
        pa.field("delivery_seq", pa.int64(), nullable=False),
    ]
)
