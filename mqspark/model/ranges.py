"""Ranges of message identities: ``count`` messages of origin ``origin`` from ``row`` on. Plans,
consumption and reply records are kept as ranges; this module merges, subtracts and tests them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

RANGE_COLUMNS = ["origin", "row", "count"]
KEY_COLUMNS = ["origin", "row"]
# No identities at all, as a range table.
NO_RANGES = pa.table(
    {"origin": pa.array([], pa.string()), "row": pa.array([], pa.int64()), "count": pa.array([], pa.int64())}
)


def merge_ranges(ranges: pa.Table) -> pa.Table:
    """``origin``/``row``/``count`` ranges with duplicates and empty ones dropped and overlapping or
    adjacent ones joined, in origin order (a checkpoint row that only holds a position has none)."""
    names, [(start, end)] = _keyed([ranges])
    return _ranges_of(names, start, end)


def subtract_messages(ranges: pa.Table, messages: pa.Table) -> pa.Table:
    """``origin``/``row``/``count`` ranges without the single messages ``messages`` (``origin``, ``row``),
    merged as :func:`merge_ranges` leaves them."""
    names, [(starts, ends)] = _keyed([ranges])
    if messages.num_rows == 0 or not len(starts):
        return _ranges_of(names, starts, ends)
    point_number = pc.fill_null(pc.index_in(messages["origin"], value_set=names), -1).to_numpy().astype(np.int64)
    points = np.unique((point_number << 32 | messages["row"].to_numpy())[point_number >= 0])
    at = np.searchsorted(starts, points, side="right") - 1
    inside = points[(at >= 0) & (points < ends[np.maximum(at, 0)])]
    # Ranges are disjoint and sorted: each message inside one ends a piece and starts the next.
    new_starts = np.sort(np.concatenate([starts, inside + 1]))
    new_ends = np.sort(np.concatenate([ends, inside]))
    keep = new_ends > new_starts
    return _ranges_of(names, new_starts[keep], new_ends[keep])


def single_ranges(messages: pa.Table) -> pa.Table:
    """``origin``/``row`` identities as ``origin``/``row``/``count`` ranges of one message each."""
    return pa.table(
        {
            "origin": messages["origin"],
            "row": messages["row"],
            "count": pa.array(np.ones(messages.num_rows, dtype=np.int64)),
        }
    )


def expand_ranges(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Every value of the ranges ``first`` .. ``first + count - 1``, range after range."""
    count = np.asarray(count, dtype=np.int64)
    within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(np.asarray(first, dtype=np.int64), count) + within


def in_ranges(
    origin: pa.ChunkedArray | pa.Array,
    row: pa.ChunkedArray | pa.Array,
    ranges: pa.Table,
    count: pa.ChunkedArray | pa.Array | None = None,
) -> pa.Array:
    """Whether each ``origin``/``row`` lies in one of the ``origin``/``row``/``count`` ranges; with
    ``count``, whether each of the ``count`` messages from ``row`` on does."""
    names, [(first, ends)] = _keyed([ranges])
    if not len(first):
        return pa.array(np.zeros(len(row), dtype=bool))
    number = pc.fill_null(pc.index_in(origin, value_set=names), -1).to_numpy().astype(np.int64)
    key = number << 32 | np.asarray(row, dtype=np.int64)
    at = np.searchsorted(first, key, side="right") - 1
    # Merged ranges are disjoint and never adjacent: a run lies in one of them or not in all of them.
    last = key if count is None else key + np.asarray(count, dtype=np.int64) - 1
    return pa.array((number >= 0) & (at >= 0) & (last < ends[np.maximum(at, 0)]))


def _keyed(sets: list[pa.Table]) -> tuple[pa.Array, list[tuple[np.ndarray, np.ndarray]]]:
    """The origins of ``sets`` (sorted), and each set's ranges merged (see :func:`merge_ranges`) as
    sorted, disjoint, never adjacent ``[start, end)`` keys (origin number << 32 | row)."""
    names = pc.unique(pa.chunked_array([chunk for ranges in sets for chunk in ranges["origin"].chunks], pa.string()))
    names = names.take(pc.sort_indices(names)).drop_null()
    keyed = []
    for ranges in sets:
        number = pc.fill_null(pc.index_in(ranges["origin"], value_set=names), -1).to_numpy().astype(np.int64)
        # A checkpoint row holding only a position has no origin, row or count.
        count = pc.fill_null(ranges["count"], 0).to_numpy().astype(np.int64)
        # An empty range would split a stretch of the others in two.
        kept = (number >= 0) & (count > 0)
        start = (number << 32 | pc.fill_null(ranges["row"], 0).to_numpy().astype(np.int64))[kept]
        order = np.argsort(start, kind="stable")
        start, end = start[order], start[order] + count[kept][order]
        if not len(start):
            keyed.append((start, end))
            continue
        reach = np.maximum.accumulate(end)
        # A range starting at or before the reach of those before it joins them.
        first = np.flatnonzero(np.append(True, start[1:] > reach[:-1]))
        keyed.append((start[first], reach[np.append(first[1:], len(start)) - 1]))
    return names, keyed


def _ranges_of(names: pa.Array, start: np.ndarray, end: np.ndarray) -> pa.Table:
    """The ``[start, end)`` keys of :func:`_keyed` as an ``origin``/``row``/``count`` range table."""
    return pa.table(
        {
            "origin": names.take(pa.array(start >> 32, pa.int64())),
            "row": pa.array(start & 0xFFFFFFFF, pa.int64()),
            "count": pa.array(end - start, pa.int64()),
        }
    )


def intersect_ranges(sets: list[pa.Table]) -> pa.Table:
    """The identities that lie in every one of the ``origin``/``row``/``count`` range tables ``sets``
    (at least one), as merged ranges."""
    return _sweep(sets, [])


def subtract_ranges(ranges: pa.Table, minus: pa.Table) -> pa.Table:
    """The identities of the ``origin``/``row``/``count`` ``ranges`` that lie in none of ``minus``, as
    merged ranges."""
    return _sweep([ranges], [minus])


def _sweep(within: list[pa.Table], outside: list[pa.Table]) -> pa.Table:
    """The identities in every range table of ``within`` and in none of ``outside``: one pass over the
    ranges' ends in order, counting how many sets of each kind cover each stretch."""
    names, keyed = _keyed([*within, *outside])
    ends = [
        (key, sign, number < len(within))
        for number, (start, end) in enumerate(keyed)
        for key, sign in ((start, 1), (end, -1))
    ]
    position = np.concatenate([key for key, _, _ in ends])
    step = np.concatenate([np.full(len(key), sign) for key, sign, _ in ends])
    of_within = np.concatenate([np.full(len(key), kind) for key, _, kind in ends])
    # At one position a range that ends comes before one that starts: ranges are half-open.
    order = np.lexsort((step, position))
    position, step, of_within = position[order], step[order], of_within[order]
    inside = np.cumsum(np.where(of_within, step, 0))
    excluded = np.cumsum(np.where(of_within, 0, step))
    segment = np.flatnonzero((inside[:-1] == len(within)) & (excluded[:-1] == 0) & (position[1:] > position[:-1]))
    return _ranges_of(names, position[segment], position[segment + 1])


def overlap_counts(ranges: pa.Table, within: pa.Table) -> np.ndarray:
    """For each of the ``origin``/``row``/``count`` ``ranges`` (one origin each), how many of its
    identities lie in the ranges ``within``: arithmetic on the ranges, whatever their lengths."""
    names, [(start, end)] = _keyed([within])
    number = pc.fill_null(pc.index_in(ranges["origin"], value_set=names), -1).to_numpy().astype(np.int64)
    first = number << 32 | ranges["row"].to_numpy()
    length = end - start
    before = np.concatenate([[0], np.cumsum(length)])

    def covered(key: np.ndarray) -> np.ndarray:
        """How many identities of ``within`` lie below each key."""
        at = np.searchsorted(start, key, side="right") - 1
        partial = np.clip(key - start[np.maximum(at, 0)], 0, length[np.maximum(at, 0)]) if len(start) else 0
        return np.where(at >= 0, before[np.maximum(at, 0)] + partial, 0)

    counts = covered(first + ranges["count"].to_numpy()) - covered(first)
    return np.where(number >= 0, counts, 0)
