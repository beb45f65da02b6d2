"""The parts of live files a pending index has not read yet, and the bound their statistics put on
their messages.

A reader with a limit needs only the first messages of the delivery order. The pending index
(:mod:`mqspark.engine.pending`) catalogues here the live files whose Delta statistics say enough of
their messages: no ``top_of_queue`` and no ``before_msg_id`` (those move a message ahead of its own
position), and where they start. A large file is catalogued row group by row group, from its
Parquet footer, when the index first needs to read it or to know which of its row groups may hold a
named message; until then the file is one part. Each part has a best position (its lane, from its
highest ``priority``, then its first commit version and ``put_seq``). The index reads parts, best
first, only while the messages it holds that sort before every unread one are fewer than the reader
needs.

A part is also read when something names one of its messages (a plan, a failure, a claim), or when
it may hold items of a group that begins among the messages read: a group is delivered whole, in
logical order.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.model.messages import TIMESTAMP

# A position: (lane, commit version, put_seq), compared as a tuple; the lane is -priority under
# ``priority`` delivery, else 0.
Position = tuple[int, int, int]
# Files with more rows than this are catalogued by row group (one footer read each) once needed.
SPLIT_ROWS = 4 * store.ROW_GROUP_ROWS
# The catalogue's order: best first position first.
_ORDER = [("lane", "ascending"), ("first_version", "ascending"), ("first_put_seq", "ascending")]
# The row within its origin, in a ``put_seq`` (see :func:`mqspark.model.messages.origins`).
_ROWS = 0xFFFFFFFF


class Part(NamedTuple):
    """Rows ``start`` to ``stop`` of a data file (None: all of it) of ``size`` bytes and ``rows`` rows,
    which the commit ``version`` added (None: its rows carry their own)."""

    path: str
    size: int
    version: int | None
    rows: int
    start: int = 0
    stop: int | None = None


_CATALOGUE = pa.schema(
    [
        ("path", pa.string()),
        ("size", pa.int64()),
        ("version", pa.int64()),
        ("rows", pa.int64()),
        ("start", pa.int64()),
        ("stop", pa.int64()),
        ("grouped", pa.bool_()),
        ("expiring", pa.bool_()),
        ("lane", pa.int64()),
        ("first_version", pa.int64()),
        ("first_put_seq", pa.int64()),
        ("min_put_seq", pa.int64()),
        ("max_put_seq", pa.int64()),
        ("low", pa.int64()),
        ("high", pa.int64()),
        ("unsplit", pa.bool_()),
    ]
)


class UnreadParts:
    """The catalogue: one row per unread part (its file's ``path``, ``size``, ``version`` and ``rows``,
    its rows ``start``/``stop``, the first position ``lane``/``first_version``/``first_put_seq``, the
    commit versions ``low``/``high`` its messages came from, and whether it is a large file still to
    be catalogued by row group: ``unsplit``), best first position first."""

    def __init__(self, location: str, parts: pa.Table | None = None, lanes: str | None = None) -> None:
        self.location = location
        self.lanes = lanes
        self.parts = parts if parts is not None else _CATALOGUE.empty_table()
        # group_id values of unread parts, read when first needed.
        self._groups: dict[tuple[str, int], pa.Array] = {}

    @staticmethod
    def split(location: str, live: pa.Table, lanes: str) -> tuple[UnreadParts, np.ndarray]:
        """Catalogue the ``live`` files (see :func:`mqspark.store.live_files`) whose statistics bound
        their messages' positions under delivery sequence ``lanes``; returns the catalogue and which
        files it left out (to read now)."""
        if live.num_rows == 0 or not pc.all(pc.fill_null(live["never_before"], False)).as_py():
            # A message put before another takes that one's place, wherever it lies: read every file.
            return UnreadParts(location, None, lanes), np.ones(live.num_rows, dtype=bool)
        deferrable = (
            _flags(pc.is_valid(live["max_priority"]))
            & _flags(pc.equal(pc.fill_null(live["any_top"], True), False))
            & (
                _flags(pc.and_(pc.is_valid(live["version"]), pc.is_valid(live["min_put_seq"])))
                | _flags(pc.is_valid(live["min_commit_version"]))
            )
        )
        chosen = live.take(pa.array(np.flatnonzero(deferrable)))
        parts = pa.Table.from_pylist([_whole_file(file, lanes) for file in chosen.to_pylist()], schema=_CATALOGUE)
        return UnreadParts(location, parts.sort_by(_ORDER), lanes), ~deferrable

    def __len__(self) -> int:
        return self.parts.num_rows

    def bound(self) -> Position:
        """The best position a message of an unread part can take."""
        first = self.parts.slice(0, 1).to_pylist()[0]
        return first["lane"], first["first_version"], first["first_put_seq"]

    def take(self, chosen: np.ndarray) -> list[Part]:
        """Remove the parts ``chosen`` (row numbers) from the catalogue, and return them."""
        taken = self.parts.take(pa.array(chosen, pa.int64())).to_pylist()
        keep = np.ones(len(self), dtype=bool)
        keep[chosen] = False
        self.parts = self.parts.filter(pa.array(keep))
        result = []
        for row in taken:
            self._groups.pop((row["path"], row["start"]), None)
            whole = row["start"] == 0 and row["stop"] == row["rows"]
            stop = None if whole else row["stop"]
            result.append(Part(row["path"], row["size"], row["version"], row["rows"], row["start"], stop))
        return result

    def touched(self, paths: list[str]) -> bool:
        """Whether any of ``paths`` holds an unread part."""
        return len(self) > 0 and bool(
            pc.any(pc.is_in(self.parts["path"], value_set=pa.array(paths, pa.string()))).as_py()
        )

    def first(self, rows: int) -> np.ndarray:
        """The first parts (at least one) that hold ``rows`` messages between them."""
        while True:
            held = np.cumsum(self.parts["stop"].to_numpy() - self.parts["start"].to_numpy())
            chosen = np.arange(min(int(np.searchsorted(held, rows)) + 1, len(self)))
            if not self._split(chosen):
                return chosen

    def holding(self, ranges: pa.Table) -> np.ndarray:
        """The parts that may hold messages in ``origin``/``row``/``count`` ranges: a part of a put's
        file by its identity range (statistics of ``put_seq``), any other by its commit versions."""
        if not len(self) or not ranges.num_rows:
            return np.zeros(0, dtype=np.int64)
        while True:
            chosen = self._holding(ranges)
            if not self._split(chosen):
                return chosen

    def _split(self, chosen: np.ndarray) -> bool:
        """Catalogue the unsplit files among the parts ``chosen`` by row group; whether there were any."""
        unsplit = chosen[_flags(self.parts["unsplit"].take(pa.array(chosen, pa.int64())))]
        if not len(unsplit):
            return False
        files = self.parts.take(pa.array(unsplit, pa.int64())).to_pylist()
        keep = np.ones(len(self), dtype=bool)
        keep[unsplit] = False
        pieces = [_row_group_parts(self.location, file, self.lanes) for file in files]
        split = pa.Table.from_pylist([part for piece in pieces for part in piece], schema=_CATALOGUE)
        self.parts = pa.concat_tables([self.parts.filter(pa.array(keep)), split]).sort_by(_ORDER)
        return True

    def _holding(self, ranges: pa.Table) -> np.ndarray:
        names = pc.split_pattern(ranges["origin"], ":")
        version = pc.list_element(names, 0).cast(pa.int64()).to_numpy()[None, :]
        task = pc.list_element(names, 1).cast(pa.int64()).to_numpy()[None, :]
        first = ranges["row"].to_numpy()[None, :]
        last = first + ranges["count"].to_numpy()[None, :] - 1
        low, high = self.parts["low"].to_numpy()[:, None], self.parts["high"].to_numpy()[:, None]
        lowest = pc.fill_null(self.parts["min_put_seq"], -1).to_numpy()[:, None]
        highest = pc.fill_null(self.parts["max_put_seq"], -1).to_numpy()[:, None]
        precise = _flags(pc.is_valid(self.parts["version"]))[:, None] & (lowest >= 0) & (lowest >> 32 == highest >> 32)
        inside = (task == lowest >> 32) & (first <= (highest & _ROWS)) & (last >= (lowest & _ROWS))
        hit = (low <= version) & (version <= high) & (~precise | inside)
        return np.flatnonzero(hit.any(axis=1))

    def expired(self, now: datetime) -> int:
        """How many messages of the unread parts have expired at ``now`` (only ``expiry`` is read, of
        the parts with an expiry)."""
        moment = pa.scalar(now, TIMESTAMP)
        total = 0
        for row in self.parts.filter(self.parts["expiring"]).to_pylist():
            expiry = store.read_data_rows(self.location, row["path"], row["start"], row["stop"], ["expiry"])["expiry"]
            total += int(pc.sum(pc.less_equal(expiry, moment)).as_py() or 0)
        return total

    def holding_groups(self, group_ids: pa.Array) -> np.ndarray:
        """The parts that hold an item of one of these groups (their ``group_id`` read once each)."""
        if not len(self) or not len(group_ids):
            return np.zeros(0, dtype=np.int64)
        self._split(np.flatnonzero(self.parts["grouped"].to_numpy(zero_copy_only=False)))
        found = []
        for number in np.flatnonzero(self.parts["grouped"].to_numpy(zero_copy_only=False)):
            row = self.parts.slice(int(number), 1).to_pylist()[0]
            key = (row["path"], row["start"])
            if key not in self._groups:
                column = store.read_data_rows(self.location, row["path"], row["start"], row["stop"], ["group_id"])
                self._groups[key] = pc.unique(column["group_id"].drop_null())
            if pc.any(pc.is_in(self._groups[key], value_set=group_ids)).as_py():
                found.append(number)
        return np.array(found, dtype=np.int64)


def _flags(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=bool)


def _whole_file(file: dict, lanes: str) -> dict:
    """The catalogue row of one live file (see :func:`mqspark.store.live_files`), as one part."""
    # A put's file carries no commit_version: its rows came from the commit that added it.
    written = file["version"] is not None
    low = file["version"] if written else file["min_commit_version"]
    return {
        "path": file["path"],
        "size": file["size"],
        "version": file["version"],
        "rows": file["rows"],
        "start": 0,
        "stop": file["rows"],
        "grouped": not file["never_grouped"],
        "expiring": not file["never_expire"],
        "lane": -file["max_priority"] if lanes == "priority" else 0,
        "first_version": low,
        # A file maintenance wrote may start anywhere in its first commit version.
        "first_put_seq": file["min_put_seq"] if written else 0,
        "min_put_seq": file["min_put_seq"],
        "max_put_seq": file["max_put_seq"],
        "low": low,
        "high": file["version"] if written else file["max_commit_version"],
        "unsplit": file["rows"] > SPLIT_ROWS,
    }


def _row_group_parts(location: str, whole: dict, lanes: str | None) -> list[dict]:
    """The catalogue rows of the row groups of the file whose whole part is ``whole``, from its
    footer; ``whole`` itself (no longer unsplit) when the footer lacks a statistic."""
    written = whole["version"] is not None
    groups = store.row_group_statistics(
        location, whole["path"], ["priority", "put_seq", "commit_version", "group_id", "expiry"]
    )
    parts = []
    for index, (start, stop) in enumerate(zip(groups["start"].tolist(), groups["stop"].tolist(), strict=True)):
        rows = stop - start
        priority = groups["max.priority"][index]
        put_seq = groups["min.put_seq"][index]
        version = whole["low"] if written else groups["min.commit_version"][index]
        if priority is None or put_seq is None or version is None:
            return [{**whole, "unsplit": False}]
        parts.append(
            {
                **whole,
                "start": start,
                "stop": stop,
                "grouped": groups["null_count.group_id"][index] != rows,
                "expiring": groups["null_count.expiry"][index] != rows,
                "lane": -priority if lanes == "priority" else 0,
                "first_version": version,
                "first_put_seq": put_seq if written else 0,
                "min_put_seq": put_seq,
                "max_put_seq": groups["max.put_seq"][index],
                "unsplit": False,
            }
        )
    return parts
