"""The message: its table schema, and turning what a producer gives into validated rows (spec sections 2-3).

Every put path (``QueueManager.put`` and the Spark sinks) goes through :func:`prepare_put`, so defaults,
validation and segmentation are written once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .definitions import QueueDefinition
from .errors import MQValidationError, Reason

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
        # The dead-letter header, set only on a message put to a dead-letter queue (spec section 9).
        pa.field("dlq_reason", pa.int32()),
        pa.field("dlq_reason_text", pa.string()),
        pa.field("dlq_original_queue", pa.string()),
        pa.field("dlq_original_qmgr", pa.string()),
        pa.field("dlq_time", TIMESTAMP),
    ]
)
# The queue table adds ``commit_version``: null in the files a put writes (the version of the commit that
# added the file applies), and stamped by maintenance when it rewrites rows into new files, so that
# physical order and a message's identity (see :func:`origins`) survive the rewrite.
QUEUE_TABLE_SCHEMA = pa.schema([*MESSAGE_SCHEMA, pa.field("commit_version", pa.int64())])
DEAD_LETTER_FIELDS = ("dlq_reason", "dlq_reason_text", "dlq_original_queue", "dlq_original_qmgr", "dlq_time")

# What a producer may give; the rest is stamped by the put.
PRODUCER_FIELDS = tuple(
    name for name in MESSAGE_SCHEMA.names if name not in ("put_time", "put_seq", *DEAD_LETTER_FIELDS)
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


def origin_versions(names: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The commit version each origin name starts with."""
    return pc.list_element(pc.split_pattern(names, ":"), 0).cast(pa.int64())


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
_INTEGER_FIELDS = ("priority", "msg_seq_number", "offset", "backout_count")


def _error(queue: str, message: str, reason: Reason | None = None) -> MQValidationError:
    return MQValidationError(f"queue {queue}: {message}", reason)


def rows_to_table(queue: str, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Turn a list of dicts into an Arrow table of producer fields (types are checked by :func:`prepare_put`)."""
    rows = list(rows)
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise _error(queue, f"message {index} must be a dict of fields, got {type(row).__name__} {row!r}")
        unknown = sorted(set(row) - set(PRODUCER_FIELDS))
        if unknown:
            raise _error(
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
            raise _error(
                queue, f"field {name} has value {bad[1]!r} in message {bad[0]}, which is not {target}"
            ) from None
    return pa.table(columns)


def _converts(value: Any, target: pa.DataType) -> bool:
    try:
        pa.array([value], type=target)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, ValueError):
        return False


def _first_bad(table: pa.Table, mask: pa.ChunkedArray, column: str) -> tuple[int, Any]:
    index = pc.index(pc.fill_null(mask, False), True).as_py()
    return index, table.column(column)[index].as_py()


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
        raise _error(queue, f"field {name} has type {source}, expected {target}")
    if pa.types.is_timestamp(source) and source.tz is None:
        column = pc.assume_timezone(column, "UTC")
    if pa.types.is_integer(target) and pa.types.is_integer(source):
        limits = np.iinfo(np.int32 if target == pa.int32() else np.int64)
        out_of_range = pc.or_(pc.less(column, limits.min), pc.greater(column, limits.max))
        if pc.any(out_of_range).as_py():
            index, value = _first_bad(table, out_of_range, name)
            reason = Reason.MQRC_PRIORITY_ERROR if name == "priority" else None
            raise _error(queue, f"field {name} has value {value} in message {index}, out of range", reason)
    try:
        column = column.cast(target)
    except pa.ArrowInvalid as error:
        raise _error(queue, f"field {name} of type {source} cannot be stored as {target}: {error}") from None
    return column if default is None else pc.fill_null(column, pa.scalar(default, target))


def new_ids(count: int) -> pa.Array:
    """``count`` random 128-bit ids as 32 hex characters, made without a Python loop per id."""
    text = os.urandom(16 * count).hex().encode()
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(32), count, [None, pa.py_buffer(text)]).cast(pa.string())


class PreparedPut(NamedTuple):
    """Rows ready to commit, and the msg_id of each message the producer gave (one per message, not segment)."""

    messages: pa.Table
    msg_ids: list[str]


def prepare_put(
    queue: QueueDefinition,
    data: pa.Table,
    *,
    segmentation: bool = False,
    put_time: datetime | None = None,
) -> PreparedPut:
    """Validate a producer's messages for ``queue`` and return rows in :data:`MESSAGE_SCHEMA`.

    Fills defaults (msg_id, priority from the queue, put_time), checks every field and the group rules
    inside this put, and splits payloads longer than the queue's max message length into segments when
    ``segmentation`` is allowed. Raises :class:`MQValidationError` naming the queue, field and value.
    """
    name = queue.name
    unknown = sorted(set(data.column_names) - set(PRODUCER_FIELDS))
    if unknown:
        raise _error(name, f"unknown field {unknown[0]!r}; fields are {', '.join(PRODUCER_FIELDS)}")
    if "payload" not in data.column_names:
        raise _error(name, "field payload is required")
    payload = _column(name, data, "payload", pa.binary(), None)
    if payload.null_count:
        raise _error(name, f"field payload is null in message {_first_bad(data, pc.is_null(payload), 'payload')[0]}")

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

    _check_values(name, table)
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
    table = _segment(queue, table, segmentation)
    _check_groups(name, table)

    stamp = put_time or datetime.now(UTC)
    table = table.append_column("put_time", pa.repeat(pa.scalar(stamp, TIMESTAMP), table.num_rows))
    table = table.append_column("put_seq", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    for field_name in DEAD_LETTER_FIELDS:
        table = table.append_column(field_name, pa.nulls(table.num_rows, MESSAGE_SCHEMA.field(field_name).type))
    return PreparedPut(table.select(MESSAGE_SCHEMA.names).cast(MESSAGE_SCHEMA), msg_ids)


def dead_letter(
    messages: pa.Table, reason: pa.Array, reason_text: pa.Array, queue: str, qmgr: str, at: datetime
) -> pa.Table:
    """``messages`` (prepared rows) with their dead-letter header: why each could not be put to ``queue``
    of ``qmgr``, and when it was dead-lettered."""
    rows = messages.num_rows
    header = {
        "dlq_reason": reason,
        "dlq_reason_text": reason_text,
        "dlq_original_queue": pa.repeat(queue, rows),
        "dlq_original_qmgr": pa.repeat(qmgr, rows),
        "dlq_time": pa.repeat(pa.scalar(at, TIMESTAMP), rows),
    }
    for name, column in header.items():
        index = MESSAGE_SCHEMA.get_field_index(name)
        messages = messages.set_column(
            index, MESSAGE_SCHEMA.field(index), column.cast(MESSAGE_SCHEMA.field(index).type)
        )
    return messages


def _check_values(queue: str, table: pa.Table) -> None:
    checks = [
        ("group_id", pc.equal(pc.utf8_length(table["group_id"]), 0), "must not be empty", Reason.MQRC_GROUP_ID_ERROR),
        (
            "priority",
            pc.or_(pc.less(table["priority"], 0), pc.greater(table["priority"], 9)),
            "must be 0-9",
            Reason.MQRC_PRIORITY_ERROR,
        ),
        (
            "msg_seq_number",
            pc.and_(pc.is_valid(table["group_id"]), pc.is_null(table["msg_seq_number"])),
            "is missing for a message in group {group_id}",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        ),
        ("msg_seq_number", pc.less(table["msg_seq_number"], 1), "must be 1 or more", Reason.MQRC_MSG_SEQ_NUMBER_ERROR),
        (
            "msg_seq_number",
            pc.and_(pc.is_null(table["group_id"]), pc.not_equal(table["msg_seq_number"], 1)),
            "is given without group_id",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        ),
        (
            "last_in_group",
            pc.and_(pc.is_null(table["group_id"]), table["last_in_group"]),
            "is set without group_id",
            Reason.MQRC_GROUP_ID_ERROR,
        ),
        (
            "segmented",
            pc.and_(pc.is_null(table["group_id"]), table["segmented"]),
            "is set without group_id (segments of one message share a group_id)",
            Reason.MQRC_GROUP_ID_ERROR,
        ),
        ("offset", pc.less(table["offset"], 0), "must be 0 or more", Reason.MQRC_OFFSET_ERROR),
        (
            "offset",
            pc.and_(pc.invert(table["segmented"]), pc.not_equal(table["offset"], 0)),
            "must be 0 for a message that is not a segment",
            Reason.MQRC_OFFSET_ERROR,
        ),
        (
            "last_segment",
            pc.and_(pc.invert(table["segmented"]), table["last_segment"]),
            "is set on a message that is not a segment",
            Reason.MQRC_OFFSET_ERROR,
        ),
        ("backout_count", pc.less(table["backout_count"], 0), "must be 0 or more", None),
        (
            "top_of_queue",
            pc.and_(table["top_of_queue"], pc.is_valid(table["before_msg_id"])),
            "cannot go with before_msg_id",
            None,
        ),
        (
            "top_of_queue",
            pc.and_(table["top_of_queue"], pc.is_valid(table["group_id"])),
            "is only for messages outside groups",
            Reason.MQRC_GROUP_ID_ERROR,
        ),
        (
            "before_msg_id",
            pc.and_(pc.is_valid(table["before_msg_id"]), pc.is_valid(table["group_id"])),
            "is only for messages outside groups",
            Reason.MQRC_GROUP_ID_ERROR,
        ),
    ]
    for field_name, mask, text, reason in checks:
        if pc.any(pc.fill_null(mask, False)).as_py():
            index, value = _first_bad(table, mask, field_name)
            text = text.format(group_id=table["group_id"][index].as_py())
            raise _error(queue, f"field {field_name} has value {value!r} in message {index}: {text}", reason)


def _segment(queue: QueueDefinition, table: pa.Table, segmentation: bool) -> pa.Table:
    """Enforce max message length, splitting long payloads into segments when allowed."""
    lengths = pc.binary_length(table["payload"])
    too_long = pc.greater(lengths, queue.max_message_length)
    if not pc.any(too_long).as_py():
        return table
    refused = too_long if not segmentation else pc.and_(too_long, table["segmented"])
    if pc.any(refused).as_py():
        index, _ = _first_bad(table, refused, "payload")
        length = lengths[index].as_py()
        raise _error(
            queue.name,
            f"field payload of message {index} is {length} bytes, longer than max_message_length "
            f"{queue.max_message_length}" + ("" if segmentation else " (segmentation not allowed)"),
            Reason.MQRC_MSG_TOO_BIG_FOR_Q,
        )
    size = queue.max_message_length
    pieces = []
    for row in table.to_pylist():
        payload = row["payload"]
        if len(payload) <= size:
            pieces.append(row)
            continue
        if row["top_of_queue"] or row["before_msg_id"] is not None:
            field_name = "top_of_queue" if row["top_of_queue"] else "before_msg_id"
            raise _error(
                queue.name,
                f"field {field_name}: message {row['msg_id']} is longer than max_message_length "
                f"{queue.max_message_length} and a message placed by {field_name} cannot be segmented",
                Reason.MQRC_SEGMENTATION_NOT_ALLOWED,
            )
        if row["group_id"] is None:
            row.update(group_id=new_ids(1)[0].as_py(), msg_seq_number=1, last_in_group=True)
        for start in range(0, len(payload), size):
            pieces.append(
                {
                    **row,
                    "payload": payload[start : start + size],
                    "offset": start,
                    "segmented": True,
                    "last_segment": start + size >= len(payload),
                }
            )
    return pa.Table.from_pylist(pieces, schema=table.schema)


# What the group rules are checked on, for a put and for the committed items of its groups.
GROUP_COLUMNS = ["group_id", "msg_seq_number", "offset", "last_in_group", "segmented", "last_segment"]


def group_items(messages: pa.Table, *, with_priority: bool = False) -> pa.Table:
    """The group columns of a put's grouped messages (with priority, for the rules inside one put)."""
    columns = [*GROUP_COLUMNS, "priority"] if with_priority else GROUP_COLUMNS
    return messages.filter(pc.is_valid(messages["group_id"])).select(columns)


def _check_groups(queue: str, table: pa.Table) -> None:
    """Group rules inside one put: unique (msg_seq_number, offset), one priority, one last item."""
    items = group_items(table, with_priority=True)
    if items.num_rows:
        check_group_items(queue, items)


def check_group_items(queue: str, items: pa.Table) -> None:
    """Validate the group items of a put, alone or together with the already committed items of its groups.

    ``items`` has the :data:`GROUP_COLUMNS` (and priority, for one put).
    """
    _check_messages_of_groups(queue, items)
    keys = items.group_by(["group_id", "msg_seq_number", "offset"]).aggregate([([], "count_all")])
    duplicates = keys.filter(pc.greater(keys["count_all"], 1))
    if duplicates.num_rows:
        group_id, seq, offset = (duplicates[c][0].as_py() for c in ("group_id", "msg_seq_number", "offset"))
        what = f"msg_seq_number {seq}" + (f" offset {offset}" if offset else "")
        raise _error(
            queue, f"field msg_seq_number: group {group_id} has {what} twice", Reason.MQRC_MSG_SEQ_NUMBER_ERROR
        )
    aggregates = [("msg_seq_number", "max")]
    if "priority" in items.column_names:
        aggregates += [("priority", "min"), ("priority", "max")]
    per_group = items.group_by("group_id").aggregate(aggregates)
    if "priority" in items.column_names:
        mixed = per_group.filter(pc.not_equal(per_group["priority_min"], per_group["priority_max"]))
        if mixed.num_rows:
            raise _error(
                queue,
                f"field priority: group {mixed['group_id'][0].as_py()} mixes priorities "
                f"{mixed['priority_min'][0].as_py()} and {mixed['priority_max'][0].as_py()}",
                Reason.MQRC_PRIORITY_ERROR,
            )
    last = (
        items.filter(items["last_in_group"])
        .group_by("group_id")
        .aggregate([("msg_seq_number", "min"), ("msg_seq_number", "count_distinct")])
    )
    if last.num_rows == 0:
        return
    several = last.filter(pc.greater(last["msg_seq_number_count_distinct"], 1))
    if several.num_rows:
        raise _error(
            queue,
            f"field last_in_group: group {several['group_id'][0].as_py()} has more than one last message",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        )
    joined = per_group.join(last, "group_id")
    beyond = joined.filter(pc.greater(joined["msg_seq_number_max"], joined["msg_seq_number_min"]))
    if beyond.num_rows:
        group_id, highest, last_number = (
            beyond[column][0].as_py() for column in ("group_id", "msg_seq_number_max", "msg_seq_number_min")
        )
        raise _error(
            queue,
            f"field msg_seq_number: group {group_id} has msg_seq_number {highest} after its last message {last_number}",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        )


def _check_messages_of_groups(queue: str, items: pa.Table) -> None:
    """Each logical message of a group is either one whole item or segments ending at one last segment."""
    flags = items.append_column("last_segment_count", pc.cast(items["last_segment"], pa.int32()))
    per_message = flags.group_by(["group_id", "msg_seq_number"]).aggregate(
        [
            ("segmented", "count_distinct"),
            ("last_in_group", "count_distinct"),
            ("last_segment_count", "sum"),
            ("offset", "max"),
        ]
    )
    rules = [
        ("segmented_count_distinct", "is both a whole message and segments", Reason.MQRC_MSG_SEQ_NUMBER_ERROR),
        (
            "last_in_group_count_distinct",
            "has segments that disagree on last_in_group",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        ),
        ("last_segment_count_sum", "has more than one last segment", Reason.MQRC_OFFSET_ERROR),
    ]
    for column, text, reason in rules:
        bad = per_message.filter(pc.greater(per_message[column], 1))
        if bad.num_rows:
            group_id, seq = bad["group_id"][0].as_py(), bad["msg_seq_number"][0].as_py()
            raise _error(queue, f"group {group_id}: message {seq} {text}", reason)
    ends = items.filter(items["last_segment"]).group_by(["group_id", "msg_seq_number"]).aggregate([("offset", "min")])
    beyond = per_message.join(ends, ["group_id", "msg_seq_number"])
    beyond = beyond.filter(pc.greater(beyond["offset_max"], beyond["offset_min"]))
    if beyond.num_rows:
        group_id, seq = beyond["group_id"][0].as_py(), beyond["msg_seq_number"][0].as_py()
        raise _error(
            queue,
            f"group {group_id}: message {seq} has a segment at offset {beyond['offset_max'][0].as_py()} "
            f"after its last segment at offset {beyond['offset_min'][0].as_py()}",
            Reason.MQRC_OFFSET_ERROR,
        )
