"""What waits on a queue: its live messages' identities, and which consumer groups still wait for them.

- **CURDEPTH** (``qm.depth(queue)``): the live messages still waiting for at least one counted
  consumer group, expired ones left out. With no counted group, every live message waits (for the
  first group to come).
- **A group's depth**: the live messages the group has not consumed, expired ones left out.
- **Counted groups** are those with records in the queue's state table: every group that has read
  the queue, and groups declared on it before they first read. Deleting a group releases its
  messages.
- A copy that redrive put back for one group (``redriven_for``) waits for that group only: every
  other group counts it as consumed (see :func:`meant_for`).

A put checks ``max_depth`` against CURDEPTH. It reads only file statistics while the queue's live
messages (consumed or not) fit under ``max_depth``; otherwise it computes CURDEPTH exactly.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from mqspark import store
from mqspark.engine.state_reads import GroupsSnapshot
from mqspark.model.messages import MESSAGE_SCHEMA, TIMESTAMP, origins
from mqspark.model.ranges import (
    KEY_COLUMNS,
    expand_ranges,
    in_ranges,
    intersect_ranges,
    merge_ranges,
    overlap_counts,
    single_ranges,
    subtract_ranges,
)


def live_messages(
    table: DeltaTable, extra: list[str] | None = None, reads: MutableMapping[tuple, pa.Table] | None = None
) -> tuple[pa.Table, pa.Table]:
    """The live files of ``table``'s version (see :func:`store.live_files`) and every live message:
    ``file`` (its number in that list), ``origin`` and ``row`` (its identity), ``expiry``,
    ``redriven_for``, and the ``extra`` columns, in file order.

    Files a put wrote whose rows are consecutive in one origin, never expire and hold no redriven copy
    are described by their statistics alone; the others are read (only the columns needed), or taken
    from ``reads``, which keeps what was read by file (a data file never changes once written).
    """
    extra = extra or []
    files = store.live_files(table)
    simple = put_files(files) if not extra else np.zeros(files.num_rows, dtype=bool)
    pieces = []
    if simple.any():
        chosen = np.flatnonzero(simple)
        count = files["rows"].to_numpy()[chosen]
        low = files["min_put_seq"].to_numpy(zero_copy_only=False)[chosen]
        version = files["version"].to_numpy(zero_copy_only=False)[chosen].astype(np.int64)
        pieces.append(
            _identities(
                np.repeat(chosen, count),
                np.repeat(version, count),
                expand_ranges(low, count),
                pa.nulls(int(count.sum()), TIMESTAMP),
                pa.nulls(int(count.sum()), pa.string()),
            )
        )
    pieces += _read_identities(table, files, np.flatnonzero(~simple), extra, reads)
    return files, pa.concat_tables(pieces) if pieces else _no_identities(extra)


def _no_identities(extra: list[str]) -> pa.Table:
    empty = _identities(
        np.array([], np.int64),
        np.array([], np.int64),
        np.array([], np.int64),
        pa.array([], TIMESTAMP),
        pa.array([], pa.string()),
    )
    for name in extra:
        empty = empty.append_column(name, pa.array([], MESSAGE_SCHEMA.field(name).type))
    return empty


def put_files(files: pa.Table) -> np.ndarray:
    """Which of the live ``files`` a put wrote with rows consecutive in one origin, no expiry and no
    redriven copy: their statistics describe their messages, one range of identities each, waiting
    for every group (see :func:`file_ranges`)."""
    if not files.num_rows:
        return np.zeros(0, dtype=bool)
    low = pc.fill_null(files["min_put_seq"], -1).to_numpy()
    high = pc.fill_null(files["max_put_seq"], -2).to_numpy()
    return (
        pc.is_valid(files["version"]).to_numpy(zero_copy_only=False)
        & pc.fill_null(files["never_expire"], False).to_numpy(zero_copy_only=False)
        & pc.fill_null(files["never_redriven"], False).to_numpy(zero_copy_only=False)
        & (high - low + 1 == files["rows"].to_numpy())
        & (low >> 32 == high >> 32)
    )


def file_ranges(files: pa.Table, chosen: np.ndarray) -> pa.Table:
    """The identities of the messages of the ``chosen`` :func:`put_files`, one ``origin``/``row``/``count``
    range per file."""
    low = files["min_put_seq"].to_numpy(zero_copy_only=False)[chosen].astype(np.int64)
    version = files["version"].to_numpy(zero_copy_only=False)[chosen].astype(np.int64)
    origin, row = identity_columns(version, low)
    return pa.table({"origin": origin, "row": row, "count": pa.array(files["rows"].to_numpy()[chosen])})


def _read_identities(
    table: DeltaTable,
    files: pa.Table,
    numbers: np.ndarray,
    extra: list[str],
    reads: MutableMapping[tuple, pa.Table] | None = None,
) -> list[pa.Table]:
    """The messages of the live files ``numbers``, read (or found in ``reads``): as
    :func:`live_messages` gives them."""
    paths = files["path"].to_pylist()
    versions = files["version"].to_pylist()
    columns = _IDENTITY_COLUMNS + extra
    pieces = []
    for number in numbers:
        key = read_key(table.table_uri, paths[number], versions[number], extra)
        data = reads.get(key) if reads is not None else None
        if data is None:
            data = store.read_messages(table.table_uri, paths[number], versions[number], columns)
            if reads is not None:
                reads[key] = data
        piece = _identities(
            np.full(data.num_rows, number),
            data["commit_version"].to_numpy(),
            data["put_seq"].to_numpy(),
            data["expiry"],
            data["redriven_for"],
        )
        for name in extra:
            piece = piece.append_column(name, data[name])
        pieces.append(piece)
    return pieces


# What a file's messages are read for in live_messages, besides the ``extra`` columns.
_IDENTITY_COLUMNS = ["put_seq", "expiry", "redriven_for"]


def read_key(location: str, path: str, version: int | None, extra: list[str]) -> tuple:
    """Where ``live_messages(..., extra, reads)`` keeps or finds the read of one data file in ``reads``:
    a table with at least those columns and ``commit_version``."""
    return (location, path, version, *_IDENTITY_COLUMNS, *extra)


def _identities(
    file: np.ndarray,
    commit_version: np.ndarray,
    put_seq: np.ndarray,
    expiry: pa.Array | pa.ChunkedArray,
    redriven_for: pa.Array | pa.ChunkedArray,
) -> pa.Table:
    origin, row = identity_columns(commit_version, put_seq)
    return pa.table(
        {
            "file": pa.array(np.asarray(file, dtype=np.int32)),
            "origin": origin,
            "row": row,
            "expiry": expiry.cast(TIMESTAMP),
            "redriven_for": redriven_for.cast(pa.string()),
        }
    )


def identity_columns(commit_version: np.ndarray, put_seq: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """The ``origin`` and ``row`` columns of messages' identities (see :func:`mqspark.model.messages.origins`)."""
    names, number, row = origins(commit_version, put_seq)
    origin = pa.DictionaryArray.from_arrays(pa.array(number), pa.array(names, pa.string())).cast(pa.string())
    return origin, pa.array(row)


def consumed_by(live: pa.Table, ranges: pa.Table) -> np.ndarray:
    """Which of the ``live`` messages lie in the ``origin``/``row``/``count`` ranges."""
    return in_ranges(live["origin"], live["row"], ranges).to_numpy(zero_copy_only=False)


def expired(live: pa.Table, at: datetime) -> np.ndarray:
    return pc.fill_null(pc.less_equal(live["expiry"], pa.scalar(at, TIMESTAMP)), False).to_numpy(zero_copy_only=False)


def meant_for(live: pa.Table, consumer: str) -> np.ndarray:
    """Which of the ``live`` messages are for group ``consumer``: all but the copies redrive put back
    for another group (the group that failed the message and moved it)."""
    return pc.fill_null(pc.equal(live["redriven_for"], consumer), True).to_numpy(zero_copy_only=False)


def waiting(live: pa.Table, groups: GroupsSnapshot, now: datetime, consumer: str | None = None) -> np.ndarray:
    """Which of the ``live`` messages wait: for ``consumer``, or (None) for at least one counted group."""
    unexpired = ~expired(live, now)
    if consumer is not None:
        consumed = groups.consumed.get(consumer)
        mine = unexpired & meant_for(live, consumer)
        return mine if consumed is None else mine & ~consumed_by(live, consumed)
    if not groups.groups:
        return unexpired
    for_someone = np.zeros(live.num_rows, dtype=bool)
    for name in groups.groups:
        for_someone |= ~consumed_by(live, groups.consumed[name]) & meant_for(live, name)
    return unexpired & for_someone


def waiting_and_depth(live: pa.Table, groups: GroupsSnapshot, now: datetime, consumer: str) -> tuple[np.ndarray, int]:
    """:func:`waiting` for ``consumer``, and CURDEPTH (how many wait for at least one counted
    group), matching each group's consumption against the live messages once."""
    unexpired = ~expired(live, now)
    left = {name: ~consumed_by(live, groups.consumed[name]) & meant_for(live, name) for name in groups.groups}
    if consumer not in left and groups.consumed.get(consumer) is not None:
        left[consumer] = ~consumed_by(live, groups.consumed[consumer]) & meant_for(live, consumer)
    mine = unexpired & (left[consumer] if consumer in left else meant_for(live, consumer))
    if not groups.groups:
        return mine, int(unexpired.sum())
    for_someone = np.logical_or.reduce([left[name] for name in groups.groups])
    return mine, int((unexpired & for_someone).sum())


def count_waiting(table: DeltaTable, groups: GroupsSnapshot, now: datetime, consumer: str | None = None) -> int:
    """How many live messages wait, as :func:`waiting` decides, without listing them: the messages of
    :func:`put_files` are counted from their files' ranges and the groups' consumed ranges, so the cost
    follows the files and ranges, not the messages; only the other files are read."""
    files = store.live_files(table)
    simple = put_files(files)
    count = _count_ranges(file_ranges(files, np.flatnonzero(simple)), _consumed(groups, consumer))
    others = _read_identities(table, files, np.flatnonzero(~simple), [])
    if others:
        count += int(waiting(pa.concat_tables(others), groups, now, consumer).sum())
    return count


@dataclass(frozen=True)
class OldestWaiting:
    """How many messages wait (``count``) and the put time of the oldest (``put_time``), on one
    version of a queue table for one :class:`GroupsSnapshot`; ``until`` is the earliest expiry still
    to come of a message they may count, before which only a commit changes them (None: none)."""

    count: int
    put_time: datetime | None
    until: datetime | None


def oldest_waiting(
    table: DeltaTable,
    groups: GroupsSnapshot,
    now: datetime,
    consumer: str | None = None,
    reads: MutableMapping[tuple, pa.Table] | None = None,
) -> OldestWaiting:
    """How many live messages wait, as :func:`waiting` decides, and the put time of the oldest of
    them, without listing them: the messages of :func:`put_files` are counted from ranges (see
    :func:`count_waiting`) and their oldest found from statistics first (see :func:`_oldest`); only the
    other files are read, or taken from ``reads`` (see :func:`live_messages`)."""
    files = store.live_files(table)
    simple = put_files(files)
    chosen = np.flatnonzero(simple)
    ranges = file_ranges(files, chosen)
    consumed = _consumed(groups, consumer)
    left = subtract_ranges(ranges, intersect_ranges(consumed)) if consumed else merge_ranges(ranges)
    others = _read_identities(table, files, np.flatnonzero(~simple), ["put_time"], reads)
    listed = pa.concat_tables(others) if others else _no_identities(["put_time"])
    to_come = listed["expiry"].filter(pc.greater(listed["expiry"], pa.scalar(now, TIMESTAMP)))
    listed = listed.filter(pa.array(waiting(listed, groups, now, consumer)))
    oldest = [pc.min(listed["put_time"]).as_py(), _oldest(table.table_uri, files.take(chosen), ranges, left)]
    count = int(pc.sum(left["count"]).as_py() or 0) + listed.num_rows
    return OldestWaiting(
        count, min((stamp for stamp in oldest if stamp is not None), default=None), pc.min(to_come).as_py()
    )


def _consumed(groups: GroupsSnapshot, consumer: str | None) -> list[pa.Table]:
    """The consumed ranges whose intersection a message must lie in to wait for nobody: ``consumer``'s,
    or (None) every counted group's."""
    if consumer is not None:
        return [] if groups.consumed.get(consumer) is None else [groups.consumed[consumer]]
    return [groups.consumed[name] for name in groups.groups]


def _count_ranges(ranges: pa.Table, consumed: list[pa.Table]) -> int:
    """How many identities of ``ranges`` (one origin each) lie outside the intersection of ``consumed``."""
    count = int(pc.sum(ranges["count"]).as_py() or 0)
    if consumed and ranges.num_rows:
        count -= int(overlap_counts(ranges, intersect_ranges(consumed)).sum())
    return count


@dataclass(frozen=True)
class GroupBacklog:
    """What waits for one consumer group at one moment: its waiting messages as merged
    ``origin``/``row``/``count`` ranges and their ``count``, CURDEPTH (``depth``), how many are
    ``claimable`` (neither delayed by ``available_at`` nor parked after a failure) and the put time of
    the oldest claimable one. ``until`` is the earliest moment still to come at which a message it
    counts expires or stops being delayed, before which only a commit changes it (None: none)."""

    waiting: pa.Table
    count: int
    depth: int
    claimable: int
    oldest_claimable: datetime | None
    until: datetime | None = None


# What the claimable count and age need of the messages that file statistics do not describe.
_CLAIM_COLUMNS = ["put_time", "available_at"]


_Answer = TypeVar("_Answer", OldestWaiting, GroupBacklog)


@dataclass(frozen=True)
class KeptAnswer(Generic[_Answer]):
    """An answer counted on one version of a queue table (``version``: the version and its log
    entry's stamp) for one :class:`GroupsSnapshot` (and, for a group's backlog, its ``parked``
    messages) at the moment ``counted_at``. Pollers (a console, a monitor) ask again mostly before
    any of these changes: the answer holds for any later moment before its ``until``."""

    version: tuple[int, int]
    groups: GroupsSnapshot
    parked: pa.Table | None
    counted_at: datetime
    answer: _Answer

    def holds(self, version: tuple[int, int], groups: GroupsSnapshot, parked: pa.Table | None, now: datetime) -> bool:
        """Whether the answer is the one counting again would give for these and ``now``."""
        same_parked = self.parked is None if parked is None else self.parked is not None and self.parked.equals(parked)
        return (
            self.version == version
            and self.groups is groups
            and same_parked
            and self.counted_at <= now
            and (self.answer.until is None or now < self.answer.until)
        )


def kept_or_counted(
    kept: MutableMapping[tuple, KeptAnswer[Any]],
    key: tuple,
    version: tuple[int, int] | None,
    groups: GroupsSnapshot,
    parked: pa.Table | None,
    now: datetime,
    count: Callable[[], _Answer],
) -> _Answer:
    """The answer ``kept`` under ``key`` while it holds (see :meth:`KeptAnswer.holds`), else
    ``count()``, kept in its place; nothing is kept without a ``version`` (its log entry's stamp
    unknown)."""
    held = kept.get(key)
    if version is not None and held is not None and held.holds(version, groups, parked, now):
        return held.answer
    answer = count()
    if version is not None:
        kept[key] = KeptAnswer(version, groups, parked, now, answer)
    return answer


def group_backlog(
    table: DeltaTable,
    groups: GroupsSnapshot,
    now: datetime,
    consumer: str,
    parked: pa.Table,
    reads: MutableMapping[tuple, pa.Table] | None = None,
) -> GroupBacklog:
    """Group ``consumer``'s :class:`GroupBacklog` on ``table``'s version, ``parked`` being the ranges of
    messages waiting out a retry delay. The files a put wrote without expiry or delay are counted
    from their ranges (see :func:`count_waiting`); of those only the ``put_time`` of the files holding
    claimable messages is read. The other files are read whole (only the columns needed), or taken
    from ``reads`` (see :func:`live_messages`)."""
    files = store.live_files(table)
    described = put_files(files) & pc.fill_null(files["never_delayed"], False).to_numpy(zero_copy_only=False)
    chosen = np.flatnonzero(described)
    ranges = file_ranges(files, chosen)
    mine = _consumed(groups, consumer)
    others = _read_identities(table, files, np.flatnonzero(~described), _CLAIM_COLUMNS, reads)
    listed = pa.concat_tables(others) if others else _no_identities(_CLAIM_COLUMNS)
    moments = pa.chunked_array(
        [*listed["expiry"].cast(TIMESTAMP).chunks, *listed["available_at"].cast(TIMESTAMP).chunks], TIMESTAMP
    )
    to_come = moments.filter(pc.greater(moments, pa.scalar(now, TIMESTAMP)))
    listed_mine, listed_depth = waiting_and_depth(listed, groups, now, consumer)
    listed = listed.filter(pa.array(listed_mine))
    free = pc.invert(pc.fill_null(pc.greater(listed["available_at"], pa.scalar(now, TIMESTAMP)), False))
    free = pc.and_(free, pc.invert(in_ranges(listed["origin"], listed["row"], parked)))
    mine_ranges = subtract_ranges(ranges, mine[0]) if mine else merge_ranges(ranges)
    claimable = subtract_ranges(mine_ranges, parked)
    oldest = [
        pc.min(listed["put_time"].filter(free)).as_py(),
        _oldest(table.table_uri, files.take(chosen), ranges, claimable),
    ]
    return GroupBacklog(
        waiting=merge_ranges(pa.concat_tables([mine_ranges, single_ranges(listed.select(KEY_COLUMNS))])),
        count=int(pc.sum(mine_ranges["count"]).as_py() or 0) + listed.num_rows,
        depth=_count_ranges(ranges, _consumed(groups, None)) + listed_depth,
        claimable=int(pc.sum(claimable["count"]).as_py() or 0) + int(pc.sum(free).as_py() or 0),
        oldest_claimable=min((stamp for stamp in oldest if stamp is not None), default=None),
        until=pc.min(to_come).as_py(),
    )


def _oldest(location: str, files: pa.Table, ranges: pa.Table, claimable: pa.Table) -> datetime | None:
    """The oldest ``put_time`` of the ``claimable`` identities in the described ``files``, whose
    identities are ``ranges`` (one per file, see :func:`file_ranges`).

    Files and row groups are taken best first by their smallest ``put_time``: a file's from its Delta
    statistics (rounded down), a row group's from its file's Parquet footer, read when the file is
    taken. A taken row group's claimable rows are read. It stops when the next cannot be older; what
    has no statistic comes first, since any of it may hold the oldest."""
    if not claimable.num_rows:
        return None
    lower = files["min_put_time"].to_pylist()
    paths = files["path"].to_pylist()
    heap: list[tuple[tuple[bool, Any], int, Any]] = []
    order = itertools.count()
    for index in np.flatnonzero(overlap_counts(ranges, claimable)):
        heapq.heappush(heap, (_smallest_first(lower[index]), next(order), int(index)))
    oldest = None
    while heap and (oldest is None or not heap[0][0][0] or heap[0][0][1] < oldest):
        _, _, taken = heapq.heappop(heap)
        if isinstance(taken, int):
            for group in _claimable_row_groups(location, paths[taken], ranges.slice(taken, 1), claimable):
                heapq.heappush(heap, (_smallest_first(group[0]), next(order), group))
            continue
        _, path, starts, ends = taken
        rows = expand_ranges(starts, ends - starts)
        data = store.read_data_rows(location, path, int(rows[0]), int(rows[-1] + 1), ["put_time"])
        stamp = pc.min(data["put_time"].take(pa.array(rows - rows[0]))).as_py()
        oldest = stamp if oldest is None or stamp < oldest else oldest
    return oldest


def _smallest_first(smallest: Any) -> tuple[bool, Any]:
    """A heap key: no statistic sorts before every value."""
    return (smallest is not None, smallest if smallest is not None else 0)


def _claimable_row_groups(
    location: str, path: str, file_range: pa.Table, claimable: pa.Table
) -> list[tuple[Any, str, np.ndarray, np.ndarray]]:
    """The row groups of the file ``path`` holding ``claimable`` identities, its identities being
    ``file_range`` (a put writes its rows in ``put_seq`` order, so a row's place in its file follows
    from its identity): each one's smallest ``put_time`` (footer statistics, None without), ``path``,
    and where its stretches of claimable rows start and end (row numbers)."""
    inside = intersect_ranges([file_range, claimable])
    first = inside["row"].to_numpy() - file_range["row"][0].as_py()
    end = first + inside["count"].to_numpy()
    bounds, minima = store.row_group_minima(location, path, "put_time")
    # The first claimable stretch ending after each row group's start begins before its end.
    after = np.searchsorted(end, bounds[:-1], side="right")
    groups = []
    for number in np.flatnonzero((after < len(first)) & (first[np.minimum(after, len(first) - 1)] < bounds[1:])):
        span = slice(after[number], np.searchsorted(first, bounds[number + 1]))
        low, high = bounds[number : number + 2]
        groups.append((minima[number], path, np.maximum(first[span], low), np.minimum(end[span], high)))
    return groups
