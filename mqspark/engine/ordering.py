"""The ordering engine: which committed messages are deliverable, and in which order (spec section 4).

One engine serves every reader (``qm.browse``, ``spark.read.format("mq")``, the streaming get):

- **Physical order** is the Delta commit order, then ``put_seq`` (the row's position in its put).
  Under ``priority`` delivery each priority is a lane, highest first; under ``fifo`` there is one lane.
  Tuxedo's overrides move a message: ``top_of_queue`` to the head of its lane, ``before_msg_id``
  to just before the named message.
- **Logical order** places a group at the physical position of its first item (``msg_seq_number`` 1,
  ``offset`` 0), in the lane of that item's priority, followed by all its items in
  (``msg_seq_number``, ``offset``) order. Ungrouped messages keep their physical position. A group
  whose first item is not there is not deliverable, and the messages behind it flow past.
- Items are delivered as a gap-free prefix: item k+1 waits for item k, a segment waits for the one
  before it. ``all_messages_available`` delivers a group only once it is complete;
  ``complete_message`` delivers only whole logical messages, with segments joined into one payload.
- A copy redrive put back for the group that failed the item (``redriven_for``) is exempt from the
  sequence rule: its group's items before it were delivered to that group already (and may be gone
  from the queue), so it may begin the group's run and follows whichever item is before it, just
  after the original of the same number; the items after it follow it as they would the original.
  Several redriven items of a group so keep their order, and a group whose remaining items are
  redriven copies counts as complete. A copy is a new put: once the group's original items are
  finished, a consumer group's index no longer holds them (:func:`mqspark.model.groups.finished_items`),
  and the copies are placed by the first of them, as MQ places a group by its first item's put.
- Expired messages (``expiry`` <= now) are discarded and counted; messages with ``available_at`` >
  now are treated as not there yet. Both are judged at one fixed ``now``.

Everything works on Arrow columns and numpy arrays; no Python loop runs per message.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark.errors import MQValidationError
from mqspark.model.messages import TIMESTAMP

ORDERS = ("logical", "physical")


@dataclass(frozen=True)
class DeliveryOptions:
    """How a reader wants the queue: order, group/segment options and match selectors."""

    order: str = "logical"
    all_messages_available: bool = False
    complete_message: bool = False
    msg_id: str | None = None
    correl_id: str | None = None
    group_id: str | None = None
    msg_seq_number: int | None = None

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise MQValidationError(f"option order must be one of {', '.join(ORDERS)}; got {self.order!r}")
        if self.order == "physical" and (self.all_messages_available or self.complete_message):
            raise MQValidationError("options allMessagesAvailable and completeMessage need order logical")
        if self.msg_seq_number is not None and self.group_id is None:
            raise MQValidationError(f"option msgSeqNumber ({self.msg_seq_number}) needs groupId")


@dataclass(frozen=True)
class Delivery:
    """The deliverable messages in delivery order, and how many expired messages were discarded.

    ``exact``: how many of the first ``messages`` are those of the whole queue's order. All of them,
    unless :func:`deliver` ordered only a head; the rows after them may be missing some that come
    between, and a caller that needs more orders a longer head."""

    messages: pa.Table
    expired: int
    exact: int


def deliver(
    messages: pa.Table,
    delivery_sequence: str,
    options: DeliveryOptions,
    now: datetime,
    *,
    join: bool = True,
    head: int | None = None,
) -> Delivery:
    """Order ``messages`` (message columns plus ``commit_version``) for delivery at ``now``.

    ``messages`` may carry ``payload_length`` instead of ``payload`` (the streaming get plans on an
    index without payloads); then ``join`` must be false and segments are joined when they are read.
    Columns other than the message columns travel along with their rows.

    With ``head``, only the first ``head`` messages in physical order (at least; ties go together)
    and every item of the groups they hold an item of are ordered: the cost of sorting follows the
    head, not the queue. ``Delivery.exact`` says how much of the result holds for the whole queue.
    """
    moment = pa.scalar(now, TIMESTAMP)
    expired = pc.fill_null(pc.less_equal(messages["expiry"], moment), False)
    waiting = pc.fill_null(pc.greater(messages["available_at"], moment), False)
    expired_count = pc.sum(expired).as_py() or 0
    present = keep_rows(messages, pc.invert(pc.or_(expired, waiting)))
    keys = _physical_keys(present, delivery_sequence)
    in_head = None
    if head is not None and head < present.num_rows:
        in_head = head_rows(keys, head)
        chosen = in_head | _groups_of(present, in_head)
        keys = [key[chosen] for key in keys]
        in_head = in_head[chosen]
        present = present.filter(pa.array(chosen)).append_column(_IN_HEAD, pa.array(in_head))
    if options.order == "physical":
        ordered = take_rows(present, sort_order(keys))
    else:
        ordered = _logical(present, keys, options, join)
    if in_head is None:
        matched = _match(ordered, options)
        return Delivery(matched, expired_count, matched.num_rows)
    exact = _exact_prefix(ordered, options.order == "logical")
    matched = _match(ordered.slice(0, exact).drop_columns([_IN_HEAD]), options)
    rest = _match(ordered.slice(exact).drop_columns([_IN_HEAD]), options)
    return Delivery(pa.concat_tables([matched, rest]), expired_count, matched.num_rows)


# The fewest messages, in physical order, a reader with a limit orders at first (see deliver's head).
HEAD = 1024
# A column that travels with the rows of a head: whether the row is in the head itself.
_IN_HEAD = "__in_head"


def head_rows(keys: list[np.ndarray], at_least: int) -> np.ndarray:
    """Which rows sort at or before a threshold (``keys`` most significant first) chosen so that at
    least ``at_least`` rows do: every row left out sorts after every row kept. Selects key by key
    (``np.partition``), without sorting."""
    inside = np.zeros(len(keys[0]), dtype=bool)
    # None: every row is undecided, without listing them (a queue's whole index would be).
    undecided: np.ndarray | None = None
    need = at_least
    for key in keys:
        values = key if undecided is None else key[undecided]
        if len(values) <= need:
            break
        threshold = np.partition(values, need - 1)[need - 1]
        below, ties = values < threshold, values == threshold
        if undecided is None:
            inside, undecided = below, np.flatnonzero(ties)
        else:
            inside[undecided[below]] = True
            undecided = undecided[ties]
        need -= int(below.sum())
    # Rows that tie on every key with the last one kept go with it.
    inside[slice(None) if undecided is None else undecided] = True
    return inside


def _groups_of(table: pa.Table, rows: np.ndarray) -> np.ndarray:
    """Every row of the groups that hold one of ``rows``."""
    group_id = table["group_id"]
    held = pc.unique(group_id.filter(pa.array(rows)).drop_null())
    return pc.fill_null(pc.is_in(group_id, value_set=held), False).to_numpy(zero_copy_only=False)


def _exact_prefix(ordered: pa.Table, logical: bool) -> int:
    """How many of the first rows of a head's delivery order hold for the whole queue: those placed by
    a row of the head itself (in logical order, an ungrouped row or a group's first item). A row left
    out of the head sorts after every head row, and so does any group it begins."""
    count = ordered.num_rows
    if count == 0:
        return 0
    in_head = ordered[_IN_HEAD].to_numpy(zero_copy_only=False)
    if not logical:
        outside = np.flatnonzero(~in_head)
        return int(outside[0]) if len(outside) else count
    # A group's delivered items are one run, its first item first: that item placed the run.
    starts = ~same_group_as_previous(ordered["group_id"])
    placed = in_head[np.maximum.accumulate(np.where(starts, np.arange(count), 0))]
    outside = np.flatnonzero(~placed)
    return int(outside[0]) if len(outside) else count


def same_group_as_previous(group_id: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """For each row, whether it is an item of the same group as the row before it."""
    grouped = pc.is_valid(group_id).to_numpy(zero_copy_only=False)
    codes = pc.dictionary_encode(pc.fill_null(group_id, "")).combine_chunks().indices.to_numpy()
    same = np.zeros(len(codes), dtype=bool)
    same[1:] = grouped[1:] & grouped[:-1] & (codes[1:] == codes[:-1])
    return same


_LAST = np.iinfo(np.int64).max


def _physical_keys(table: pa.Table, delivery_sequence: str) -> list[np.ndarray]:
    """Each row's physical position as sort keys, most significant first.

    (lane, top class, version, put_seq, insert version, insert put_seq): the lane is ``-priority``
    under ``priority`` delivery. A ``top_of_queue`` message goes ahead of its lane, the latest put
    first. A ``before_msg_id`` message takes its target's position and sorts just before it, later
    inserts closer to the target; when the target is not there it keeps its own position. Keys that
    are the same for every row (one lane, no top or insert) are left out: they order nothing.
    """
    rows = table.num_rows
    version = table["commit_version"].to_numpy().astype(np.int64, copy=False)
    put_seq = table["put_seq"].to_numpy().astype(np.int64, copy=False)
    keys = []
    if delivery_sequence == "priority" and pc.count_distinct(table["priority"]).as_py() > 1:
        keys.append(-table["priority"].to_numpy().astype(np.int64))
    if pc.any(table["top_of_queue"]).as_py():
        top = table["top_of_queue"].to_numpy(zero_copy_only=False)
        keys += [np.where(top, 0, 1), np.where(top, -version, version)]
    else:
        keys.append(version)
    keys.append(put_seq)
    before = table["before_msg_id"]
    if before.null_count < rows:
        keys = [key.copy() for key in keys]
        candidates = np.flatnonzero(
            pc.and_(pc.is_null(table["group_id"]), pc.is_null(before)).to_numpy(zero_copy_only=False)
        )
        # When msg_ids repeat, the target is the earliest committed of them, and only if it was
        # committed before the message placed in front of it (as the put checked).
        candidates = candidates[np.lexsort((put_seq[candidates], version[candidates]))]
        found = pc.index_in(before, value_set=table["msg_id"].take(candidates)).to_numpy(zero_copy_only=False)
        inserted = np.flatnonzero(~np.isnan(found.astype(float)))
        targets = candidates[found[inserted].astype(np.int64)]
        earlier = version[targets] < version[inserted]
        inserted, targets = inserted[earlier], targets[earlier]
        for key in keys:
            key[inserted] = key[targets]
        insert_version, insert_seq = np.full(rows, _LAST), np.full(rows, _LAST)
        insert_version[inserted], insert_seq[inserted] = version[inserted], put_seq[inserted]
        keys += [insert_version, insert_seq]
    return keys


def _logical(table: pa.Table, keys: list[np.ndarray], options: DeliveryOptions, join: bool) -> pa.Table:
    if table.num_rows == 0:
        return table
    grouped = pc.is_valid(table["group_id"]).to_numpy(zero_copy_only=False)
    if not grouped.any():
        # Without groups the logical order is the physical one (segments by offset).
        result = take_rows(table, sort_order([*keys, table["offset"].to_numpy()]))
        return join_segments(result) if options.complete_message and join else result
    group = pc.dictionary_encode(pc.fill_null(table["group_id"], "")).combine_chunks().indices.to_numpy()
    seq = table["msg_seq_number"].to_numpy().astype(np.int64)
    offset = table["offset"].to_numpy()
    segmented = table["segmented"].to_numpy(zero_copy_only=False)
    last_segment = table["last_segment"].to_numpy(zero_copy_only=False)
    last_in_group = table["last_in_group"].to_numpy(zero_copy_only=False)
    length = payload_lengths(table)
    redriven = pc.is_valid(table["redriven_for"]).to_numpy(zero_copy_only=False)

    # Walk each group's items in (msg_seq_number, offset) order, a redriven copy after the original of
    # its number; ungrouped rows sort last, unused.
    order = np.lexsort((redriven, offset, seq, group, ~grouped))
    rows = order[grouped[order]]
    g, s, o = group[rows], seq[rows], offset[rows]
    first_of_group = np.ones(len(rows), dtype=bool)
    first_of_group[1:] = g[1:] != g[:-1]
    # Is each item the one expected right after the item before it in its group?
    previous = np.roll(rows, 1)
    ends_message = ~segmented[previous] | last_segment[previous]
    same_message = (
        (s == seq[previous])
        & segmented[previous]
        & ~last_segment[previous]
        & segmented[rows]
        & (o == offset[previous] + length[previous])
    )
    next_message = (s == seq[previous] + 1) & ends_message & (o == 0) & ~last_in_group[previous]
    copy = redriven[rows] & (o == 0)
    follows = np.where(first_of_group, ((s == 1) | copy) & (o == 0), same_message | next_message | copy & ends_message)
    # The deliverable prefix of a group ends at its first gap.
    breaks = np.cumsum(~follows)
    group_start = np.maximum.accumulate(np.where(first_of_group, np.arange(len(rows)), 0))
    in_prefix = breaks == (breaks[group_start] - (~follows[group_start]).astype(np.int64))
    in_prefix &= follows[group_start]

    # The last prefix item of each group tells whether its logical message and the group are complete.
    prefix_rows = rows[in_prefix]
    prefix_group = group[prefix_rows]
    last_of_prefix = np.ones(len(prefix_rows), dtype=bool)
    last_of_prefix[:-1] = prefix_group[:-1] != prefix_group[1:]
    tail = prefix_rows[last_of_prefix]
    tail_message_complete = ~segmented[tail] | last_segment[tail]
    keep = np.ones(len(prefix_rows), dtype=bool)
    if options.all_messages_available:
        complete_groups = group[tail][tail_message_complete & (last_in_group[tail] | redriven[tail])]
        keep &= np.isin(prefix_group, complete_groups)
    if options.complete_message:
        incomplete = tail[~tail_message_complete]
        # Only a group's trailing message can be incomplete: drop the rows of that (group, number).
        keep &= ~_pairs_in(prefix_group, seq[prefix_rows], group[incomplete], seq[incomplete])
    delivered_grouped = prefix_rows[keep]

    # A group sorts at its first item's physical position and lane.
    anchor_of_group = np.full(group.max() + 1, -1, dtype=np.int64)
    firsts = rows[first_of_group & in_prefix]
    anchor_of_group[group[firsts]] = firsts
    anchors = anchor_of_group[group[delivered_grouped]]
    ungrouped = np.flatnonzero(~grouped)
    chosen = np.concatenate([ungrouped, delivered_grouped])
    anchor = np.concatenate([ungrouped, anchors])
    position = [key[anchor] for key in keys] + [np.where(grouped[chosen], seq[chosen], 0), offset[chosen]]
    result = take_rows(table, chosen[sort_order(position)])
    return join_segments(result) if options.complete_message and join else result


def sort_order(keys: list[np.ndarray]) -> np.ndarray:
    """``np.lexsort`` of ``keys`` given most significant first (stable). Rows already in that order,
    as a queue put in order without priorities or inserts to sort, are recognised in one pass
    instead of being sorted."""
    count = len(keys[0])
    if count > 1:
        less = np.zeros(count - 1, dtype=bool)
        equal = np.ones(count - 1, dtype=bool)
        for key in keys:
            less |= equal & (key[:-1] < key[1:])
            equal &= key[:-1] == key[1:]
        if (less | equal).all():
            return np.arange(count)
    return np.lexsort(keys[::-1])


def keep_rows(table: pa.Table, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
    """``table.filter(mask)``, without copying every column when every row is kept."""
    return table if pc.all(mask).as_py() is not False else table.filter(mask)


def take_rows(table: pa.Table, indices: np.ndarray) -> pa.Table:
    """``table.take(indices)``, without copying every column when the rows are already in that order
    (a queue without groups or priorities to sort is, and the index it sorts is wide)."""
    if len(indices) == table.num_rows and np.array_equal(indices, np.arange(table.num_rows)):
        return table
    return table.take(indices)


def payload_lengths(table: pa.Table) -> np.ndarray:
    """Each row's payload length in bytes, from ``payload_length`` when the payloads were left out."""
    if "payload_length" in table.column_names:
        return table["payload_length"].to_numpy().astype(np.int64)
    return pc.binary_length(table["payload"]).to_numpy().astype(np.int64)


def _pairs_in(
    groups: np.ndarray, numbers: np.ndarray, wanted_groups: np.ndarray, wanted_numbers: np.ndarray
) -> np.ndarray:
    pairs = groups.astype(np.int64) << 32 | numbers
    wanted = wanted_groups.astype(np.int64) << 32 | wanted_numbers
    return np.isin(pairs, wanted)


def join_segments(table: pa.Table) -> pa.Table:
    """Replace each segmented logical message (adjacent rows, in offset order) by one whole message.

    Other columns keep the value of the message's first segment.
    """
    segmented = table["segmented"].to_numpy(zero_copy_only=False)
    if not segmented.any():
        return table
    offset = table["offset"].to_numpy()
    # A new logical message starts at every unsegmented row and at every offset 0.
    starts = np.flatnonzero(~segmented | (offset == 0))
    bounds = np.append(starts, table.num_rows).astype(np.int32)
    payload = table["payload"].combine_chunks()
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(bounds), payload), b"")
    whole = table.take(starts)
    replaced = {
        "payload": joined.cast(pa.binary()),
        "last_in_group": table["last_in_group"].take(pa.array(bounds[1:] - 1)),
        "segmented": pa.array(np.zeros(len(starts), dtype=bool)),
        "last_segment": pa.array(np.zeros(len(starts), dtype=bool)),
    }
    for name, column in replaced.items():
        index = whole.schema.get_field_index(name)
        whole = whole.set_column(index, whole.schema.field(index), column)
    return whole


def _match(table: pa.Table, options: DeliveryOptions) -> pa.Table:
    selectors = {
        "msg_id": options.msg_id,
        "correl_id": options.correl_id,
        "group_id": options.group_id,
        "msg_seq_number": options.msg_seq_number,
    }
    for column, value in selectors.items():
        if value is not None:
            table = table.filter(pc.equal(table[column], pa.scalar(value, table.schema.field(column).type)))
    return table
