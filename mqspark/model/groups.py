"""Message groups and segments (spec sections 2 and 3): the group rules a put must keep, across puts
too, and the segmentation of payloads longer than a queue's max message length.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark.errors import Reason
from mqspark.model.definitions import QueueDefinition
from mqspark.model.messages import field_error, first_bad, new_ids


def segment_payloads(queue: QueueDefinition, table: pa.Table, segmentation: bool) -> pa.Table:
    """Enforce max message length, splitting long payloads into segments when allowed."""
    lengths = pc.binary_length(table["payload"])
    too_long = pc.greater(lengths, queue.max_message_length)
    if not pc.any(too_long).as_py():
        return table
    refused = too_long if not segmentation else pc.and_(too_long, table["segmented"])
    if pc.any(refused).as_py():
        index, _ = first_bad(table, refused, "payload")
        length = lengths[index].as_py()
        raise field_error(
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
            raise field_error(
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


def check_groups(queue: str, table: pa.Table) -> None:
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
        raise field_error(
            queue, f"field msg_seq_number: group {group_id} has {what} twice", Reason.MQRC_MSG_SEQ_NUMBER_ERROR
        )
    aggregates = [("msg_seq_number", "max")]
    if "priority" in items.column_names:
        aggregates += [("priority", "min"), ("priority", "max")]
    per_group = items.group_by("group_id").aggregate(aggregates)
    if "priority" in items.column_names:
        mixed = per_group.filter(pc.not_equal(per_group["priority_min"], per_group["priority_max"]))
        if mixed.num_rows:
            raise field_error(
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
        raise field_error(
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
        raise field_error(
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
            raise field_error(queue, f"group {group_id}: message {seq} {text}", reason)
    ends = items.filter(items["last_segment"]).group_by(["group_id", "msg_seq_number"]).aggregate([("offset", "min")])
    beyond = per_message.join(ends, ["group_id", "msg_seq_number"])
    beyond = beyond.filter(pc.greater(beyond["offset_max"], beyond["offset_min"]))
    if beyond.num_rows:
        group_id, seq = beyond["group_id"][0].as_py(), beyond["msg_seq_number"][0].as_py()
        raise field_error(
            queue,
            f"group {group_id}: message {seq} has a segment at offset {beyond['offset_max'][0].as_py()} "
            f"after its last segment at offset {beyond['offset_min'][0].as_py()}",
            Reason.MQRC_OFFSET_ERROR,
        )


def finished_items(items: pa.Table, consumed: np.ndarray) -> np.ndarray:
    """Which rows of ``items`` (with ``group_id``, ``last_in_group``, ``segmented``, ``last_segment``
    and ``redriven_for``) are consumed group items that no longer place their group in logical order,
    and may go: those of a finished group.

    A group's originals (the items its producers put) are finished once their last item (the last
    segment of the last message) is consumed and none of them waits. A move takes a failed item off
    out of order: while items before the moved last item wait, the group is not finished, and its
    consumed first items keep anchoring it. A redriven copy (:mod:`mqspark.engine.ordering`) is a
    new put: once the originals are finished, copies still waiting are a run of their own, placed by
    their first copy, and the consumed originals anchor nothing (as when a get's index dropped them
    before the copies came: an index read afresh must order the same). Consumed copies go once no
    copy of their group waits and the originals are finished (or gone)."""
    group_id = items["group_id"]
    grouped = pc.is_valid(group_id).to_numpy(zero_copy_only=False)
    redriven = pc.is_valid(items["redriven_for"]).to_numpy(zero_copy_only=False)
    original = grouped & ~redriven
    ends = (
        original
        & items["last_in_group"].to_numpy(zero_copy_only=False)
        & (~items["segmented"].to_numpy(zero_copy_only=False) | items["last_segment"].to_numpy(zero_copy_only=False))
        & consumed
    )
    ended = pc.unique(group_id.filter(pa.array(ends)))
    if redriven.any():
        copies = pc.unique(group_id.filter(pa.array(grouped & redriven)))
        originals = pc.unique(group_id.filter(pa.array(original)))
        only_copies = copies.filter(pc.invert(pc.is_in(copies, value_set=originals)))
        ended = pc.unique(pa.concat_arrays([ended, only_copies]))
    finished = np.zeros(items.num_rows, dtype=bool)
    if len(ended) == 0:
        return finished
    # One look-up pass over the rows; only the few rows of the ended groups are looked at further.
    rows = np.flatnonzero(pc.fill_null(pc.is_in(group_id, value_set=ended), False).to_numpy(zero_copy_only=False))
    groups = group_id.take(pa.array(rows))
    waiting = ~consumed[rows]
    waiting_originals = pc.unique(groups.filter(pa.array(waiting & original[rows])))
    waiting_copies = pc.unique(groups.filter(pa.array(waiting & redriven[rows])))
    in_flight = pc.is_in(groups, value_set=waiting_originals).to_numpy(zero_copy_only=False)
    copies_wait = pc.is_in(groups, value_set=waiting_copies).to_numpy(zero_copy_only=False)
    finished[rows] = ~waiting & ~in_flight & (~redriven[rows] | ~copies_wait)
    return finished
