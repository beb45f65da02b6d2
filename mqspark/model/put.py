"""What a put accepts (spec section 3): turning what a producer gives into validated message rows,
with defaults, checks of every field, the group rules and segmentation.

Every put path (``QueueManager.put`` and the Spark sinks) goes through :func:`prepare_put`, so defaults,
validation and segmentation are written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark.errors import Reason
from mqspark.model.definitions import QueueDefinition
from mqspark.model.groups import check_groups, segment_payloads
from mqspark.model.messages import (
    MESSAGE_SCHEMA,
    PRODUCER_FIELDS,
    STAMPED_NULL_FIELDS,
    TIMESTAMP,
    field_error,
    first_bad,
    new_ids,
)

_STRING_FIELDS = (
    "msg_id",
    "correl_id",
    "group_id",
    "reply_to_queue",
    "reply_to_qmgr",
    "failure_queue",
    "before_msg_id",
)
_BOOLEAN_FIELDS = ("last_in_group", "segmented", "last_segment", "top_of_queue")
_TIME_FIELDS = ("expiry", "available_at")


def rows_to_table(queue: str, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Turn a list of dicts into an Arrow table of producer fields (types are checked by :func:`prepare_put`)."""
    rows = list(rows)
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise field_error(queue, f"message {index} must be a dict of fields, got {type(row).__name__} {row!r}")
        unknown = sorted(set(row) - set(PRODUCER_FIELDS))
        if unknown:
            raise field_error(
                queue, f"unknown field {unknown[0]!r} in message {index}; fields are {', '.join(PRODUCER_FIELDS)}"
            )
    names = [name for name in PRODUCER_FIELDS if any(name in row for row in rows)]
    if not rows:
        names = ["payload"]
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        if name == "payload":
            values = [value.encode() if isinstance(value, str) else value for value in values]
        if name == "properties":
            values = [list(value.items()) if isinstance(value, Mapping) else value for value in values]
        target = MESSAGE_SCHEMA.field(name).type
        if pa.types.is_integer(target):
            # Wide enough for any Python int the range checks should see and name.
            target = pa.int64()
        try:
            columns[name] = pa.array(values, type=target)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, ValueError):
            bad = next((i, v) for i, v in enumerate(values) if not _converts(v, target))
            raise field_error(
                queue, f"field {name} has value {bad[1]!r} in message {bad[0]}, which is not {target}"
            ) from None
    return pa.table(columns)


def _converts(value: Any, target: pa.DataType) -> bool:
    try:
        pa.array([value], type=target)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, ValueError):
        return False


def _column(queue: str, table: pa.Table, name: str, target: pa.DataType, default: Any) -> pa.ChunkedArray:
    """The column cast to the schema type with nulls replaced by ``default`` (None keeps them)."""
    length = table.num_rows
    if name not in table.column_names:
        return pa.chunked_array([pa.nulls(length, target) if default is None else pa.array([default] * length, target)])
    column = table.column(name)
    source = column.type
    if name == "payload":
        allowed = (
            pa.types.is_binary(source)
            or pa.types.is_large_binary(source)
            or pa.types.is_string(source)
            or pa.types.is_large_string(source)
            or pa.types.is_binary_view(source)
            or pa.types.is_string_view(source)
        )
    elif target == TIMESTAMP:
        allowed = pa.types.is_timestamp(source) or pa.types.is_null(source)
    elif pa.types.is_integer(target):
        allowed = pa.types.is_integer(source) or pa.types.is_null(source)
    else:
        allowed = (
            source == target
            or pa.types.is_null(source)
            or (pa.types.is_string(target) and (pa.types.is_large_string(source) or pa.types.is_string_view(source)))
            or (pa.types.is_map(target) and pa.types.is_map(source))
        )
    if not allowed:
        raise field_error(queue, f"field {name} has type {source}, expected {target}")
    if pa.types.is_timestamp(source) and source.tz is None:
        column = pc.assume_timezone(column, "UTC")
    if pa.types.is_integer(target) and pa.types.is_integer(source):
        limits = np.iinfo(np.int32 if target == pa.int32() else np.int64)
        out_of_range = pc.or_(pc.less(column, limits.min), pc.greater(column, limits.max))
        if pc.any(out_of_range).as_py():
            index, value = first_bad(table, out_of_range, name)
            reason = Reason.MQRC_PRIORITY_ERROR if name == "priority" else None
            raise field_error(queue, f"field {name} has value {value} in message {index}, out of range", reason)
    try:
        column = column.cast(target)
    except pa.ArrowInvalid as error:
        raise field_error(queue, f"field {name} of type {source} cannot be stored as {target}: {error}") from None
    return column if default is None else pc.fill_null(column, pa.scalar(default, target))


class PreparedPut(NamedTuple):
    """Rows ready to commit, and the msg_id of each message the producer gave (one per message, not segment)."""

    messages: pa.Table
    msg_ids: list[str]


def prepare_put(
    queue: QueueDefinition,
    data: pa.Table,
    *,
    segmentation: bool = False,
    now: datetime | None = None,
) -> PreparedPut:
    """Validate a producer's messages for ``queue`` and return rows in :data:`MESSAGE_SCHEMA`.

    Fills defaults (msg_id, priority from the queue, put_time), checks every field and the group rules
    inside this put, and splits payloads longer than the queue's max message length into segments when
    ``segmentation`` is allowed. ``now`` is the put time (default: the system's). Raises
    :class:`MQValidationError` naming the queue, field and value.
    """
    name = queue.name
    unknown = sorted(set(data.column_names) - set(PRODUCER_FIELDS))
    if unknown:
        raise field_error(name, f"unknown field {unknown[0]!r}; fields are {', '.join(PRODUCER_FIELDS)}")
    if "payload" not in data.column_names:
        raise field_error(name, "field payload is required")
    payload = _column(name, data, "payload", pa.binary(), None)
    if payload.null_count:
        raise field_error(
            name, f"field payload is null in message {first_bad(data, pc.is_null(payload), 'payload')[0]}"
        )

    columns: dict[str, Any] = {"payload": payload}
    for field_name in _STRING_FIELDS + ("properties",):
        columns[field_name] = _column(name, data, field_name, MESSAGE_SCHEMA.field(field_name).type, None)
    for field_name in _TIME_FIELDS:
        columns[field_name] = _column(name, data, field_name, TIMESTAMP, None)
    for field_name in _BOOLEAN_FIELDS:
        columns[field_name] = _column(name, data, field_name, pa.bool_(), False)
    columns["priority"] = _column(name, data, "priority", pa.int32(), queue.default_priority)
    columns["msg_seq_number"] = _column(name, data, "msg_seq_number", pa.int32(), None)
    columns["offset"] = _column(name, data, "offset", pa.int64(), 0)
    columns["backout_count"] = _column(name, data, "backout_count", pa.int32(), 0)
    table = pa.table(columns)

    _check_values(name, table, set(data.column_names))
    grouped = pc.is_valid(table.column("group_id"))
    table = table.set_column(
        table.schema.get_field_index("msg_seq_number"),
        "msg_seq_number",
        pc.if_else(grouped, table.column("msg_seq_number"), pa.scalar(1, pa.int32())),
    )
    msg_ids = table.column("msg_id")
    if msg_ids.null_count:
        generated = new_ids(table.num_rows)
        table = table.set_column(table.schema.get_field_index("msg_id"), "msg_id", pc.coalesce(msg_ids, generated))
    msg_ids = table.column("msg_id").to_pylist()
    table = segment_payloads(queue, table, segmentation)
    check_groups(name, table)

    stamp = now or datetime.now(UTC)
    table = table.append_column("put_time", pa.repeat(pa.scalar(stamp, TIMESTAMP), table.num_rows))
    table = table.append_column("put_seq", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    for field_name in STAMPED_NULL_FIELDS:
        table = table.append_column(field_name, pa.nulls(table.num_rows, MESSAGE_SCHEMA.field(field_name).type))
    return PreparedPut(table.select(MESSAGE_SCHEMA.names).cast(MESSAGE_SCHEMA), msg_ids)


# Each check of a put's fields: the field it names, the fields it reads, the rows it refuses, the text
# and the reason code. A check whose fields the producer gave none of passes on the defaults, and is
# skipped: a put of payloads alone builds no mask at all.
_CHECKS: tuple[tuple[str, tuple[str, ...], Callable[[pa.Table], Any], str, Reason | None], ...] = (
    (
        "group_id",
        ("group_id",),
        lambda t: pc.equal(pc.utf8_length(t["group_id"]), 0),
        "must not be empty",
        Reason.MQRC_GROUP_ID_ERROR,
    ),
    (
        "priority",
        ("priority",),
        lambda t: pc.or_(pc.less(t["priority"], 0), pc.greater(t["priority"], 9)),
        "must be 0-9",
        Reason.MQRC_PRIORITY_ERROR,
    ),
    (
        "msg_seq_number",
        ("group_id",),
        lambda t: pc.and_(pc.is_valid(t["group_id"]), pc.is_null(t["msg_seq_number"])),
        "is missing for a message in group {group_id}",
        Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
    ),
    (
        "msg_seq_number",
        ("msg_seq_number",),
        lambda t: pc.less(t["msg_seq_number"], 1),
        "must be 1 or more",
        Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
    ),
    (
        "msg_seq_number",
        ("msg_seq_number",),
        lambda t: pc.and_(pc.is_null(t["group_id"]), pc.not_equal(t["msg_seq_number"], 1)),
        "is given without group_id",
        Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
    ),
    (
        "last_in_group",
        ("last_in_group",),
        lambda t: pc.and_(pc.is_null(t["group_id"]), t["last_in_group"]),
        "is set without group_id",
        Reason.MQRC_GROUP_ID_ERROR,
    ),
    (
        "segmented",
        ("segmented",),
        lambda t: pc.and_(pc.is_null(t["group_id"]), t["segmented"]),
        "is set without group_id (segments of one message share a group_id)",
        Reason.MQRC_GROUP_ID_ERROR,
    ),
    ("offset", ("offset",), lambda t: pc.less(t["offset"], 0), "must be 0 or more", Reason.MQRC_OFFSET_ERROR),
    (
        "offset",
        ("offset",),
        lambda t: pc.and_(pc.invert(t["segmented"]), pc.not_equal(t["offset"], 0)),
        "must be 0 for a message that is not a segment",
        Reason.MQRC_OFFSET_ERROR,
    ),
    (
        "last_segment",
        ("last_segment",),
        lambda t: pc.and_(pc.invert(t["segmented"]), t["last_segment"]),
        "is set on a message that is not a segment",
        Reason.MQRC_OFFSET_ERROR,
    ),
    ("backout_count", ("backout_count",), lambda t: pc.less(t["backout_count"], 0), "must be 0 or more", None),
    (
        "top_of_queue",
        ("top_of_queue", "before_msg_id"),
        lambda t: pc.and_(t["top_of_queue"], pc.is_valid(t["before_msg_id"])),
        "cannot go with before_msg_id",
        None,
    ),
    (
        "top_of_queue",
        ("top_of_queue", "group_id"),
        lambda t: pc.and_(t["top_of_queue"], pc.is_valid(t["group_id"])),
        "is only for messages outside groups",
        Reason.MQRC_GROUP_ID_ERROR,
    ),
    (
        "before_msg_id",
        ("before_msg_id", "group_id"),
        lambda t: pc.and_(pc.is_valid(t["before_msg_id"]), pc.is_valid(t["group_id"])),
        "is only for messages outside groups",
        Reason.MQRC_GROUP_ID_ERROR,
    ),
)


def _check_values(queue: str, table: pa.Table, given: set[str]) -> None:
    """Every check of :data:`_CHECKS` that reads a field in ``given`` (the fields the producer gave)."""
    for field_name, reads, refused, text, reason in _CHECKS:
        if given.isdisjoint(reads):
            continue
        mask = refused(table)
        if pc.any(pc.fill_null(mask, False)).as_py():
            index, value = first_bad(table, mask, field_name)
            text = text.format(group_id=table["group_id"][index].as_py())
            raise field_error(queue, f"field {field_name} has value {value!r} in message {index}: {text}", reason)
