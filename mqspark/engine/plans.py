"""The shape of a plan: how many messages a batch admits (its message, byte and group limits), the
ranges a plan records, and where its messages lie in the queue table's files.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark.engine.ordering import DeliveryOptions, same_group_as_previous
from mqspark.engine.pending import PendingMessages
from mqspark.model.ranges import expand_ranges, single_ranges

# Planned messages are split into partitions of about this many payload bytes.
PARTITION_BYTES = 64 * 1024 * 1024


def admit(
    candidates: pa.Table,
    max_messages: int | None,
    max_bytes: int | None,
    first_seq: int,
    delivery: DeliveryOptions,
    max_units: int | None = None,
) -> tuple[pa.Table, int]:
    """The prefix of ``candidates`` a plan delivers, with delivery_seq and partition, and the next
    delivery_seq. Limits count delivered messages and payload bytes; at least one unit goes."""
    count = candidates.num_rows
    if count == 0:
        return candidates.append_column("delivery_seq", pa.array([], pa.int64())).append_column(
            "partition", pa.array([], pa.int32())
        ), first_seq
    seq = candidates["msg_seq_number"].to_numpy()
    segmented = candidates["segmented"].to_numpy(zero_copy_only=False)
    same_group = same_group_as_previous(candidates["group_id"])
    same_message = np.zeros(count, dtype=bool)
    same_message[1:] = same_group[1:] & (seq[1:] == seq[:-1]) & segmented[1:] & segmented[:-1]
    unit_start = ~(same_group if delivery.all_messages_available else same_message)
    message_start = ~same_message if delivery.complete_message else np.ones(count, dtype=bool)
    messages = np.cumsum(message_start)
    size = np.cumsum(candidates["payload_length"].to_numpy())
    unit_end = np.append(unit_start[1:], True)
    ends = np.flatnonzero(unit_end)
    fits = np.ones(len(ends), dtype=bool)
    if max_messages is not None:
        fits &= messages[ends] <= max_messages
    if max_bytes is not None:
        fits &= size[ends] <= max_bytes
    # Whole units are taken while they fit; the first always goes, so a big message cannot stall.
    units = len(ends) if fits.all() else max(1, int(np.argmin(fits)))
    if max_units is not None:
        units = min(units, max_units)
    stop = int(ends[units - 1]) + 1
    taken = candidates.slice(0, stop)
    total = int(size[stop - 1])
    parts = max(1, min(units, math.ceil(total / PARTITION_BYTES)))
    length = candidates["payload_length"].to_numpy()[:stop]
    file = candidates["file"].to_numpy()[:stop]
    # Partitions of about total / parts bytes, cut only where a unit starts in another data file
    # than the row before, so that a file is read by one task where the order allows it.
    cut = unit_start[:stop].copy()
    cut[1:] &= file[1:] != file[:-1]
    wanted = np.where(cut, (size[:stop] - length) * parts // max(total, 1), 0)
    # Non-decreasing, so codes in order of first appearance number the partitions in order.
    partition = pc.dictionary_encode(pa.array(np.maximum.accumulate(wanted))).indices
    delivery_seq = first_seq + messages[:stop] - 1
    taken = taken.append_column("delivery_seq", pa.array(delivery_seq, pa.int64()))
    taken = taken.append_column("partition", partition)
    return taken, int(first_seq + messages[stop - 1])


def keys_of(pending: PendingMessages, messages: pa.Table) -> np.ndarray:
    """The pending-index keys of ``origin``/``row`` identities."""
    if messages.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    return pending.range_keys(single_ranges(messages))


def plan_ranges(taken: pa.Table, origins: list[str]) -> pa.Table:
    """A plan as ranges of message identities: one range per run of consecutive rows of one origin, in
    one partition, with consecutive delivery_seq (or all discarded, delivery_seq null)."""
    origin = taken["origin"].to_numpy()
    row = taken["row"].to_numpy()
    partition = pc.fill_null(taken["partition"], -1).to_numpy()
    delivered = pc.is_valid(taken["delivery_seq"]).to_numpy(zero_copy_only=False)
    delivery_seq = pc.fill_null(taken["delivery_seq"], -1).to_numpy()
    starts = np.ones(len(row), dtype=bool)
    starts[1:] = (
        (origin[1:] != origin[:-1])
        | (row[1:] != row[:-1] + 1)
        | (partition[1:] != partition[:-1])
        | (delivered[1:] != delivered[:-1])
        | (delivered[1:] & (delivery_seq[1:] != delivery_seq[:-1] + 1))
    )
    first = np.flatnonzero(starts)
    first_taken = pa.array(first)
    return pa.table(
        {
            "origin": pa.DictionaryArray.from_arrays(pa.array(origin[first]), pa.array(origins, pa.string())).cast(
                pa.string()
            ),
            "row": pa.array(row[first]),
            "count": pa.array(np.diff(np.append(first, len(row)))),
            "delivery_seq": taken["delivery_seq"].take(first_taken),
            "partition": taken["partition"].take(first_taken),
        }
    )


def locate_plan(delivered: pa.Table, pending: PendingMessages) -> dict[str, np.ndarray]:
    """Where the messages of a plan's delivered ranges (in delivery order) lie now, as runs of
    consecutive rows of one data file: ``file`` (numbers into ``pending.files``), ``file_row``,
    ``count``, ``delivery_seq`` and ``partition`` of each run.

    Maintenance may have moved them to other files since the plan was made; only a purge removes
    planned messages, and those are left out."""
    count = delivered["count"].to_numpy()
    file, file_row = pending.locate(pending.range_keys(delivered))
    delivery_seq = expand_ranges(delivered["delivery_seq"].to_numpy(), count)
    partition = np.repeat(delivered["partition"].to_numpy(), count)
    found = file >= 0
    return file_runs(file[found], file_row[found], delivery_seq[found], partition[found])


def file_runs(
    file: np.ndarray, file_row: np.ndarray, delivery_seq: np.ndarray, partition: np.ndarray
) -> dict[str, np.ndarray]:
    """Messages in delivery order (data file numbers, rows in them, delivery_seq, partition) as runs
    of consecutive rows of one data file in one partition, with consecutive delivery_seq."""
    starts = np.ones(len(file), dtype=bool)
    starts[1:] = (
        (file[1:] != file[:-1])
        | (file_row[1:] != file_row[:-1] + 1)
        | (partition[1:] != partition[:-1])
        | (delivery_seq[1:] != delivery_seq[:-1] + 1)
    )
    first = np.flatnonzero(starts)
    return {
        "file": file[first],
        "file_row": file_row[first],
        "count": np.diff(np.append(first, len(file))),
        "delivery_seq": delivery_seq[first],
        "partition": partition[first],
    }
