"""The pending messages of a consumer group: the index the streaming get plans its micro-batches on.

It holds, for one queue and one consumer group, every live message the group has not consumed,
without payloads: the columns the ordering engine needs, each message's payload length, its commit
version, its identity (origin and row, see :func:`mqspark.model.messages.origins`) and where it lies now
(data file and row in it). It is built once when a query starts, from the table's snapshot (the
live files only), and then kept current by reading only the log entries of new commits: a put adds
messages; maintenance or purge moves them to other files or removes them. So planning a
micro-batch costs what the backlog and the new data cost, not what the table's history costs.

Consumed items of a group that is still in flight stay in the index, marked consumed: the group's
position in logical order and the next item it expects are decided by its first items. Once the
items its producers put are finished, they go, even while redriven copies of the group wait: a
copy is a new put, placed by the group's first copy (:func:`mqspark.model.groups.finished_items`).

A copy that redrive put back for another group (``redriven_for``) is never in a group's index: it
is not the group's to deliver, nor to wait for.

``msg_id`` is read only once a message of the index names another with ``before_msg_id`` (the only
use the planner has for it): it is most of the cost of reading the index columns.

A reader with a limit loads the index lazily (``lanes``): it reads at first only the files whose
statistics cannot bound their messages' positions, and the others (:mod:`mqspark.engine.unread`)
best first, while the messages it holds that sort before every unread one are fewer than the reader
needs (:meth:`PendingMessages.ensure`). Files whose every message the group consumed, and that hold
no group, are not read at all.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.engine.depth import file_ranges, put_files
from mqspark.engine.unread import Part, UnreadParts
from mqspark.model.groups import finished_items
from mqspark.model.messages import MESSAGE_SCHEMA, TIMESTAMP, origins
from mqspark.model.ranges import NO_RANGES, expand_ranges, overlap_counts

INDEX_COLUMNS = [
    "msg_id",
    "priority",
    "group_id",
    "msg_seq_number",
    "offset",
    "last_in_group",
    "segmented",
    "last_segment",
    "expiry",
    "available_at",
    "top_of_queue",
    "before_msg_id",
    "put_seq",
    "redriven_for",
]
INDEX_SCHEMA = pa.schema(
    [
        *(MESSAGE_SCHEMA.field(name) for name in INDEX_COLUMNS),
        pa.field("payload_length", pa.int64(), nullable=False),
        pa.field("commit_version", pa.int64(), nullable=False),
        pa.field("origin", pa.int32(), nullable=False),
        pa.field("row", pa.int64(), nullable=False),
        pa.field("file", pa.int32(), nullable=False),
        pa.field("file_row", pa.int64(), nullable=False),
        pa.field("consumed", pa.bool_(), nullable=False),
    ]
)


# The index's rows are made one chunk again when they have more than this many.
_CHUNKS = 32
# Snapshots to try when log clean-up removes an entry one of them needed.
_ATTEMPTS = 3


def message_keys(origin: np.ndarray, row: np.ndarray) -> np.ndarray:
    """One int64 per message from its origin number and row (an origin holds fewer than 2**32 rows)."""
    return origin.astype(np.int64) << 32 | row.astype(np.int64, copy=False)


class PendingMessages:
    """The messages of the table at ``location`` not yet consumed by consumer group ``consumer`` (None:
    every live message, for a browse).

    ``payload_length`` is exact for segments (the ordering engine needs it) and, with
    ``exact_lengths``, for every message; otherwise it is the data file's size divided by its rows,
    which is enough to size partitions and spares reading every payload twice.
    """

    def __init__(
        self,
        location: str,
        storage_options: store.StorageOptions = None,
        exact_lengths: bool = False,
        consumer: str | None = None,
    ) -> None:
        self.location = location
        self.consumer = consumer
        self.storage_options = storage_options
        self.exact_lengths = exact_lengths
        self.version = -1
        # Origins (message identity) and data files (where messages lie), numbered as first seen.
        self.origins: list[str] = []
        self._origin_numbers: dict[str, int] = {}
        self.files: list[str] = []
        self._file_numbers: dict[str, int] = {}
        self.rows = INDEX_SCHEMA.empty_table()
        # Whether ``msg_id`` is read (else null): from the first ``before_msg_id`` on.
        self.msg_ids = False
        # How many maintenance or purge commits have moved messages of the index to other files.
        self.moves = 0
        self.unread = UnreadParts(location)
        # The group's consumed ranges, applied to the files read later.
        self._consumed = NO_RANGES
        # Whether maintenance rewrote unread files: the index must be built again.
        self.stale = False
        # How many times parts were read into the index: a copy of its rows is outdated when this moved.
        self.reads = 0

    def load(self, consumed: pa.Table, up_to: int | None = None, lanes: str | None = None) -> None:
        """Read the live messages of the table at version ``up_to`` (default: its latest) and leave out
        ``consumed`` (``origin``/``row``/``count`` ranges of the group's consumed messages). With
        ``lanes`` (the queue's delivery sequence), read only what statistics cannot bound (see
        :meth:`ensure`)."""
        for attempt in range(_ATTEMPTS):
            table = store.open_table(self.location, self.storage_options)
            if table is None:
                return
            if up_to is not None and up_to != table.version():
                table.load_as_version(up_to)
            try:
                live = store.live_files(table)
                break
            except store.LogEntryGone:
                # Maintenance cleaned up the log behind this snapshot; its newer one needs no such entry.
                if up_to is not None or attempt == _ATTEMPTS - 1:
                    raise
        else:
            raise AssertionError("unreachable: the last attempt returns, breaks or raises")
        live = live.filter(pa.array(~_consumed_files(live, consumed)))
        self._consumed = consumed
        if lanes is not None:
            self.unread, read_now = UnreadParts.split(self.location, live, lanes)
            live = live.filter(pa.array(read_now))
        columns = (live[name].to_pylist() for name in ("path", "size", "version", "rows"))
        files = [Part(*file) for file in zip(*columns, strict=True)]
        # Read in the order puts committed them (files maintenance wrote, with older messages, first),
        # so that origins are numbered in physical order and the index's keys come out sorted.
        self.version = table.version()
        self._read_files(sorted(files, key=lambda file: (file.version is not None, file.version or 0)))

    def consume_ranges(self, consumed: pa.Table) -> None:
        """Mark consumed the messages in ``consumed``, the group's whole consumed ranges, also in the
        files read later."""
        self._consumed = consumed
        self.mark_consumed(self._known_keys(consumed))

    def ensure(self, count: int, now: datetime) -> bool:
        """Read unread files, best first, until at least ``count`` messages present at ``now`` sort
        before every unread message, and every group begun among them is whole in the index. False
        when every file is read."""
        while len(self.unread):
            before = self._before(self.unread.bound(), now)
            missing = count - int(before.sum())
            if missing > 0:
                self._read_files(self.unread.take(self.unread.first(missing)))
                continue
            holding = self.unread.holding_groups(self._open_groups(before))
            if not len(holding):
                return True
            self._read_files(self.unread.take(holding))
        return False

    def read_all(self) -> None:
        """Read every unread part."""
        if len(self.unread):
            self._read_files(self.unread.take(np.arange(len(self.unread))))

    def _before(self, bound: tuple[int, int, int], now: datetime) -> np.ndarray:
        """Which messages of the index are present at ``now`` and sort before position ``bound``."""
        rows = self.rows
        lane, version, put_seq = bound
        own_lane = -rows["priority"].to_numpy().astype(np.int64) if self.unread.lanes == "priority" else 0
        commit_version = rows["commit_version"].to_numpy()
        seq = rows["put_seq"].to_numpy()
        top = rows["top_of_queue"].to_numpy(zero_copy_only=False)
        earlier = (commit_version < version) | ((commit_version == version) & (seq < put_seq))
        before = (own_lane < lane) | ((own_lane == lane) & (top | earlier))
        moment = pa.scalar(now, TIMESTAMP)
        absent = pc.or_(
            pc.fill_null(pc.less_equal(rows["expiry"], moment), False),
            pc.fill_null(pc.greater(rows["available_at"], moment), False),
        )
        return before & ~absent.to_numpy(zero_copy_only=False)

    def _open_groups(self, before: np.ndarray) -> pa.Array:
        """The groups with an item among the ``before`` messages that the index may not hold whole:
        it lacks the group's last item, an item between, or the group has segments."""
        rows = self.rows
        grouped = pc.is_valid(rows["group_id"]).to_numpy(zero_copy_only=False)
        chosen = before & grouped
        if not chosen.any():
            return pa.array([], pa.string())
        begun = pc.unique(rows["group_id"].filter(pa.array(chosen)))
        items = rows.filter(pc.fill_null(pc.is_in(rows["group_id"], value_set=begun), False))
        last = pc.and_(items["last_in_group"], pc.invert(items["segmented"]))
        summary = (
            pa.table(
                {
                    "group_id": items["group_id"],
                    "seq": items["msg_seq_number"],
                    "last": last,
                    "segmented": items["segmented"],
                }
            )
            .group_by("group_id")
            .aggregate([("seq", "max"), ("seq", "count_distinct"), ("last", "any"), ("segmented", "any")])
        )
        whole = pc.and_(
            pc.and_(summary["last_any"], pc.invert(summary["segmented_any"])),
            pc.equal(summary["seq_max"], summary["seq_count_distinct"]),
        )
        return summary["group_id"].filter(pc.invert(whole)).combine_chunks()

    def _read_files(self, parts: list[Part]) -> None:
        """Read ``parts`` of data files into the index, without the group's consumed messages."""
        pieces = [self._read(part) for part in parts]
        self.reads += 1
        self._append(pieces)
        if self._consumed.num_rows and pieces:
            # Parts of one file share origins: the ranges of every origin read now apply.
            read = np.unique(np.concatenate([piece["origin"].to_numpy() for piece in pieces]))
            names = self._names().take(pa.array(read))
            self.mark_consumed(
                self._known_keys(self._consumed.filter(pc.is_in(self._consumed["origin"], value_set=names)))
            )

    def range_keys(self, ranges: pa.Table) -> np.ndarray:
        """The keys of every message in ``origin``/``row``/``count`` ranges, the unread parts that may
        hold them read first (-1 as origin number for origins the index has not seen)."""
        holding = self.unread.holding(ranges)
        if len(holding):
            self._read_files(self.unread.take(holding))
        return self._known_keys(ranges)

    def _names(self) -> pa.Array:
        return pa.array(self.origins, pa.string())

    def _known_keys(self, ranges: pa.Table) -> np.ndarray:
        count = ranges["count"].to_numpy()
        origin = pc.fill_null(pc.index_in(ranges["origin"], value_set=self._names()), -1)
        return message_keys(np.repeat(origin.to_numpy(), count), expand_ranges(ranges["row"].to_numpy(), count))

    def behind_clean_up(self) -> bool:
        """Whether maintenance has cleaned up the log entry after the last one read, so the index can
        only be built again from a newer snapshot."""
        return not self.has_news() and store.last_checkpoint(self.location) > self.version

    def has_news(self) -> bool:
        """Whether a commit after the last one read exists: one file lookup."""
        return store.version_exists(self.location, self.version + 1)

    def refresh(self, up_to: int | None = None) -> bool:
        """Read the commits after the last one read (up to ``up_to``); True when any added messages."""
        added = False
        pieces: list[pa.Table] = []
        while (up_to is None or self.version < up_to) and store.version_exists(self.location, self.version + 1):
            entry = store.log_entry(self.location, self.version + 1)
            self.version = entry.version
            if entry.rewrites:
                added |= self._append(pieces)
                pieces = []
                if self.unread.touched(entry.removed):
                    self.stale = True
                    return added
                self._move(entry)
            else:
                pieces.extend(
                    self._read(Part(path, size, entry.version, 0))
                    for path, size in zip(entry.added, entry.sizes, strict=True)
                )
        return self._append(pieces) or added

    def _append(self, pieces: list[pa.Table]) -> bool:
        if not pieces:
            return False
        # Files in physical order where their first rows say so (the log lists them in any order), so
        # the ordering engine mostly finds the index sorted already.
        pieces = sorted(pieces, key=_first_position)
        self.rows = _compacted(pa.concat_tables([self.rows, *pieces]))
        if self.rows["before_msg_id"].null_count < self.rows.num_rows:
            # A message put before another takes that one's place, wherever it lies.
            self.read_all()
            if not self.msg_ids:
                self.read_msg_ids()
        return True

    def read_msg_ids(self) -> None:
        """Read ``msg_id`` of every message of the index, and of every message read from now on."""
        self.msg_ids = True
        msg_id = self.read_columns(self.rows, ["msg_id"])["msg_id"]
        self.rows = self.rows.set_column(INDEX_SCHEMA.get_field_index("msg_id"), INDEX_SCHEMA.field("msg_id"), msg_id)

    def read_columns(self, rows: pa.Table, columns: list[str]) -> pa.Table:
        """``columns`` of the messages at the index ``rows`` (by their ``file`` and ``file_row``), read
        from their data files (only the row groups holding them), in the order of ``rows``."""
        schema = pa.schema([MESSAGE_SCHEMA.field(name) for name in columns])
        file = rows["file"].to_numpy()
        file_row = rows["file_row"].to_numpy()
        order = np.argsort(file, kind="stable")
        pieces = [schema.empty_table()]
        for chosen in np.split(order, np.flatnonzero(np.diff(file[order])) + 1):
            if len(chosen):
                wanted = file_row[chosen]
                low = int(wanted.min())
                data = store.read_data_rows(
                    self.location, self.files[file[chosen[0]]], low, int(wanted.max()) + 1, columns
                )
                pieces.append(data.take(pa.array(wanted - low)).cast(schema))
        return pa.concat_tables(pieces).take(pa.array(np.argsort(order)))

    def _move(self, entry: store.LogEntry) -> None:
        """Follow a maintenance or purge commit: messages of the files it removed now lie in the files
        it added, or are gone. Its files hold no message the index does not already have."""
        removed = pc.is_in(
            self.rows["file"], value_set=pa.array([self._file_numbers.get(p, -1) for p in entry.removed], pa.int32())
        ).to_numpy(zero_copy_only=False)
        if not removed.any():
            return
        self.moves += 1
        moved = [self._read(Part(path, size, None, 0)) for path, size in zip(entry.added, entry.sizes, strict=True)]
        moved_rows = pa.concat_tables(moved) if moved else INDEX_SCHEMA.empty_table()
        found, source = lookup(self.keys(moved_rows), self.keys())
        found &= removed
        for name in ("file", "file_row"):
            column = self.rows[name].to_numpy().copy()
            column[found] = moved_rows[name].to_numpy()[source[found]]
            self.rows = self.rows.set_column(
                INDEX_SCHEMA.get_field_index(name), INDEX_SCHEMA.field(name), pa.array(column)
            )
        gone = removed & ~found
        if gone.any():
            self.rows = _lean(self.rows.filter(pa.array(~gone)))

    def _number(self, names: list[str], numbers: dict[str, int], into: list[str]) -> np.ndarray:
        result = np.empty(len(names), dtype=np.int32)
        for index, name in enumerate(names):
            number = numbers.setdefault(name, len(into))
            if number == len(into):
                into.append(name)
            result[index] = number
        return result

    def _read(self, part: Part) -> pa.Table:
        names = INDEX_COLUMNS if self.msg_ids else [name for name in INDEX_COLUMNS if name != "msg_id"]
        rows = None if part.stop is None else (part.start, part.stop)
        data = store.read_messages(self.location, part.path, part.version, names, rows)
        count = data.num_rows
        columns = {name: data[name].cast(MESSAGE_SCHEMA.field(name).type) for name in names}
        if not self.msg_ids:
            columns["msg_id"] = pa.nulls(count, pa.string())
        if self.exact_lengths or pc.any(data["segmented"]).as_py():
            payload = store.read_data_part(self.location, part.path, rows, ["payload"])["payload"]
            columns["payload_length"] = pc.binary_length(payload).cast(pa.int64())
        else:
            # A part's messages count as its file's size divided by its rows (``rows`` 0: this read's).
            columns["payload_length"] = pa.array(np.full(count, part.size // max(part.rows or count, 1), np.int64))
        commit_version = data["commit_version"].to_numpy()
        names, local, row = origins(commit_version, data["put_seq"].to_numpy())
        columns["commit_version"] = pa.array(commit_version)
        columns["origin"] = pa.array(self._number(names, self._origin_numbers, self.origins)[local])
        columns["row"] = pa.array(row)
        file = self._number([part.path], self._file_numbers, self.files)[0]
        columns["file"] = pa.array(np.full(count, file, np.int32))
        columns["file_row"] = pa.array(np.arange(part.start, part.start + count, dtype=np.int64))
        columns["consumed"] = pa.array(np.zeros(count, dtype=bool))
        rows = pa.table(columns, schema=INDEX_SCHEMA)
        if self.consumer is not None and rows["redriven_for"].null_count < count:
            rows = rows.filter(pc.fill_null(pc.equal(rows["redriven_for"], self.consumer), True))
        return _lean(rows)

    def keys(self, rows: pa.Table | None = None) -> np.ndarray:
        rows = self.rows if rows is None else rows
        return message_keys(rows["origin"].to_numpy(), rows["row"].to_numpy())

    def locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where the messages with ``keys`` lie now: file numbers (into :attr:`files`) and rows, -1 for
        messages the index does not hold."""
        if self.rows.num_rows == 0:
            return np.full(len(keys), -1, dtype=np.int32), np.full(len(keys), -1, dtype=np.int64)
        found, source = lookup(self.keys(), keys)
        file = np.where(found, self.rows["file"].to_numpy()[source], -1).astype(np.int32)
        file_row = np.where(found, self.rows["file_row"].to_numpy()[source], -1)
        return file, file_row

    def mark_consumed(self, keys: np.ndarray) -> None:
        """Mark messages consumed, and forget those no group in flight still needs (see
        :func:`mqspark.model.groups.finished_items`)."""
        if len(keys) == 0:
            return
        index_keys = self.keys()
        # A queue put in order has its index keys sorted: then each key is found by bisection.
        if len(index_keys) and (index_keys[:-1] <= index_keys[1:]).all():
            at = np.minimum(np.searchsorted(index_keys, keys), len(index_keys) - 1)
            hit = np.zeros(len(index_keys), dtype=bool)
            hit[at[index_keys[at] == keys]] = True
        else:
            hit = is_in_runs(index_keys, keys)
        consumed = self.rows["consumed"].to_numpy(zero_copy_only=False) | hit
        self.rows = self.rows.set_column(
            INDEX_SCHEMA.get_field_index("consumed"), INDEX_SCHEMA.field("consumed"), pa.array(consumed)
        )
        grouped = pc.is_valid(self.rows["group_id"]).to_numpy(zero_copy_only=False)
        # Only consumed items of groups in flight stay in the index: few, whatever the queue holds.
        self._drop(consumed & ~grouped | finished_items(self.rows, consumed))

    def _drop(self, drop: np.ndarray) -> None:
        """Remove the rows ``drop`` marks, copying only the stretch from the first to the last of them:
        the consumed messages of a queue read in order are its first rows, and slicing them off copies
        nothing."""
        dropped = np.flatnonzero(drop)
        if not len(dropped):
            return
        first, last = int(dropped[0]), int(dropped[-1]) + 1
        middle = self.rows.slice(first, last - first)
        pieces = [self.rows.slice(0, first), middle.filter(pa.array(~drop[first:last])), self.rows.slice(last)]
        self.rows = _compacted(pa.concat_tables([piece for piece in pieces if piece.num_rows] or [pieces[0]]))


def _consumed_files(live: pa.Table, consumed: pa.Table) -> np.ndarray:
    """Which ``live`` files a put wrote hold no group and only messages in ``consumed``: they need no
    reading."""
    result = np.zeros(live.num_rows, dtype=bool)
    if not consumed.num_rows or not live.num_rows:
        return result
    chosen = np.flatnonzero(put_files(live) & pc.fill_null(live["never_grouped"], False).to_numpy(zero_copy_only=False))
    if len(chosen):
        result[chosen] = overlap_counts(file_ranges(live, chosen), consumed) == live["rows"].to_numpy()[chosen]
    return result


def _compacted(rows: pa.Table) -> pa.Table:
    """``rows`` made one chunk again when they have many (compute kernels pay per chunk, and a queue
    of single puts adds one per message), their columns of nulls only kept lean."""
    return _lean(rows.combine_chunks() if rows.column(0).num_chunks > _CHUNKS else rows)


def _lean(rows: pa.Table) -> pa.Table:
    """``rows`` with each column that holds only nulls (most queues' ``expiry``, ``available_at``,
    ``before_msg_id``) made an array of nulls, whose buffers take next to no memory."""
    for index, column in enumerate(rows.columns):
        if column.null_count == len(column) and column.get_total_buffer_size() > len(column) // 4:
            rows = rows.set_column(index, rows.schema.field(index), pa.nulls(len(column), column.type))
    return rows


def _first_position(piece: pa.Table) -> tuple[int, int]:
    """The physical position (commit version, put_seq) of a piece's first row."""
    if piece.num_rows == 0:
        return (-1, -1)
    return (piece["commit_version"][0].as_py(), piece["put_seq"][0].as_py())


def is_in_runs(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is one of ``keys``, found among the runs of consecutive keys: a
    batch's keys are a few long runs, so this costs far less than hashing or sorting every key."""
    starts = np.flatnonzero(np.append(True, keys[1:] != keys[:-1] + 1))
    first, last = keys[starts], keys[np.append(starts[1:] - 1, len(keys) - 1)]
    order = np.argsort(first, kind="stable")
    # Runs may overlap: a value is in one when the furthest end of the runs starting at or below it reaches it.
    first, last = first[order], np.maximum.accumulate(last[order])
    run = np.searchsorted(first, values, side="right") - 1
    return (run >= 0) & (values <= last[np.maximum(run, 0)])


def lookup(haystack: np.ndarray, needles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``needles``: whether it is in ``haystack``, and its index there (0 when not)."""
    if len(haystack) == 0:
        return np.zeros(len(needles), dtype=bool), np.zeros(len(needles), dtype=np.int64)
    # The index's keys are mostly in order already: checking costs one pass, sorting several.
    order = None if (haystack[:-1] <= haystack[1:]).all() else np.argsort(haystack, kind="stable")
    ordered = haystack if order is None else haystack[order]
    at = np.minimum(np.searchsorted(ordered, needles), len(ordered) - 1)
    return ordered[at] == needles, at if order is None else order[at]
