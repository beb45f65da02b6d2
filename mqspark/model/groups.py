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

    ``items`` has the :data:`GROUP_COLUMNS` (and priority, for one put). Where several items break a
    rule, the error names the one that comes first in ``items``. Counted with numpy on keys numbered
    by first appearance: a put checks its groups twice, and each Acero aggregation costs about 0.3 ms.
    """
    rows = _GroupRows(items)
    _check_messages_of_groups(queue, rows)
    item, first = _keys(rows.group, rows.seq, rows.offset)
    twice = np.flatnonzero(np.bincount(item) > 1)
    if len(twice):
        at = first[twice[0]]
        what = f"msg_seq_number {rows.seq[at]}" + (f" offset {rows.offset[at]}" if rows.offset[at] else "")
        raise field_error(
            queue, f"field msg_seq_number: group {rows.name(at)} has {what} twice", Reason.MQRC_MSG_SEQ_NUMBER_ERROR
        )
    group, first = _keys(rows.group)
    if "priority" in items.column_names:
        priority = items["priority"].to_numpy()
        lowest, highest = _minimum(group, priority, len(first)), _maximum(group, priority, len(first))
        mixed = np.flatnonzero(lowest != highest)
        if len(mixed):
            raise field_error(
                queue,
                f"field priority: group {rows.name(first[mixed[0]])} mixes priorities "
                f"{lowest[mixed[0]]} and {highest[mixed[0]]}",
                Reason.MQRC_PRIORITY_ERROR,
            )
    last = rows.last_in_group
    if not last.any():
        return
    # The distinct msg_seq_numbers of each group's last items.
    _, last_first = _keys(group[last], rows.seq[last])
    numbers = np.bincount(group[last][last_first], minlength=len(first))
    several = np.flatnonzero(numbers > 1)
    if len(several):
        raise field_error(
            queue,
            f"field last_in_group: group {rows.name(first[several[0]])} has more than one last message",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        )
    highest = _maximum(group, rows.seq, len(first))
    last_number = _minimum(group[last], rows.seq[last], len(first))
    beyond = np.flatnonzero((numbers > 0) & (highest > last_number))
    if len(beyond):
        at = beyond[0]
        raise field_error(
            queue,
            f"field msg_seq_number: group {rows.name(first[at])} has msg_seq_number {highest[at]} after its last "
            f"message {last_number[at]}",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        )


class _GroupRows:
    """The group columns of group items as numpy arrays, each group as a number."""

    def __init__(self, items: pa.Table) -> None:
        encoded = pc.dictionary_encode(items["group_id"].combine_chunks())
        self.group = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        self._names = encoded.dictionary
        self.seq = items["msg_seq_number"].to_numpy().astype(np.int64)
        self.offset = items["offset"].to_numpy().astype(np.int64)
        self.last_in_group = items["last_in_group"].to_numpy()
        self.segmented = items["segmented"].to_numpy()
        self.last_segment = items["last_segment"].to_numpy()

    def name(self, row: int) -> str:
        return self._names[self.group[row]].as_py()


def _keys(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's key (the values of ``columns`` together), numbered by first appearance, and each
    key's first row."""
    if not len(columns[0]):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort(columns[::-1]) if len(columns) > 1 else np.argsort(columns[0], kind="stable")
    starts = np.zeros(len(order), dtype=bool)
    starts[0] = True
    for column in columns:
        ordered = column[order]
        starts[1:] |= ordered[1:] != ordered[:-1]
    run = np.cumsum(starts) - 1
    firsts = np.minimum.reduceat(order, np.flatnonzero(starts))
    by_appearance = np.argsort(firsts, kind="stable")
    number = np.empty(len(firsts), np.int64)
    number[by_appearance] = np.arange(len(firsts))
    keys = np.empty(len(order), np.int64)
    keys[order] = number[run]
    return keys, firsts[by_appearance]


def _maximum(keys: np.ndarray, values: np.ndarray, count: int) -> np.ndarray:
    """Each of ``count`` keys' largest value (the smallest int64 for a key without values)."""
    result = np.full(count, np.iinfo(np.int64).min)
    np.maximum.at(result, keys, values)
    return result


def _minimum(keys: np.ndarray, values: np.ndarray, count: int) -> np.ndarray:
    """Each of ``count`` keys' smallest value (the largest int64 for a key without values)."""
    result = np.full(count, np.iinfo(np.int64).max)
    np.minimum.at(result, keys, values)
    return result


def _check_messages_of_groups(queue: str, rows: _GroupRows) -> None:
    """Each logical message of a group is either one whole item or segments ending at one last segment."""
    message, first = _keys(rows.group, rows.seq)
    count = len(first)
    items = np.bincount(message, minlength=count)
    segmented = np.bincount(message, weights=rows.segmented, minlength=count)
    last_in_group = np.bincount(message, weights=rows.last_in_group, minlength=count)
    rules = [
        (
            (segmented > 0) & (segmented < items),
            "is both a whole message and segments",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        ),
        (
            (last_in_group > 0) & (last_in_group < items),
            "has segments that disagree on last_in_group",
            Reason.MQRC_MSG_SEQ_NUMBER_ERROR,
        ),
        (
            np.bincount(message, weights=rows.last_segment, minlength=count) > 1,
            "has more than one last segment",
            Reason.MQRC_OFFSET_ERROR,
        ),
    ]
    for bad, text, reason in rules:
        if bad.any():
            at = first[np.flatnonzero(bad)[0]]
            raise field_error(queue, f"group {rows.name(at)}: message {rows.seq[at]} {text}", reason)
    ends = rows.last_segment
    if not ends.any():
        return
    highest = _maximum(message, rows.offset, count)
    last = _minimum(message[ends], rows.offset[ends], count)
    beyond = np.flatnonzero(highest > last)
    if len(beyond):
        at = beyond[0]
        raise field_error(
            queue,
            f"group {rows.name(first[at])}: message {rows.seq[first[at]]} has a segment at offset {highest[at]} "
            f"after its last segment at offset {last[at]}",
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
