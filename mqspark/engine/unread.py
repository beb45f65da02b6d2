"""The live files a pending index has not read yet, and the bound their statistics put on their messages.

A reader with a limit needs only the first messages of the delivery order. The pending index
(:mod:`mqspark.engine.pending`) catalogues here the live files whose Delta statistics say enough of
their messages: the best position any of them can take (its lane, from the file's highest
``priority``, then the first commit version and ``put_seq``), no ``top_of_queue`` and no
``before_msg_id`` (those move a message ahead of its own position). It reads them, best first, only
while its messages that sort before every unread one are fewer than the reader needs.

A file is also read when something names one of its messages (a plan, a failure, a claim), or when
it may hold items of a group that begins among the messages read: a group is delivered whole, in
logical order.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.model.messages import TIMESTAMP, origin_versions

# A position: (lane, commit version, put_seq), compared as a tuple; the lane is -priority under
# ``priority`` delivery, else 0.
Position = tuple[int, int, int]


class UnreadFiles:
    """The catalogue: one row per unread file (``path``, ``size``, ``version``, ``rows``, the first
    position ``lane``/``first_version``/``first_put_seq``, and the commit versions ``low``/``high``
    its messages came from), best first position first."""

    def __init__(self, location: str, files: pa.Table | None = None, lanes: str | None = None) -> None:
        self.location = location
        self.lanes = lanes
        self.files = files if files is not None else _catalogue(pa.table({}), np.zeros(0, dtype=np.int64))
        # group_id values of unread files, read when first needed.
        self._groups: dict[str, pa.Array] = {}

    @staticmethod
    def split(location: str, live: pa.Table, lanes: str) -> tuple[UnreadFiles, np.ndarray]:
        """Catalogue the ``live`` files (see :func:`mqspark.store.live_files`) whose statistics bound
        their messages' positions under delivery sequence ``lanes``; returns the catalogue and which
        files it left out (to read now)."""
        if live.num_rows == 0:
            return UnreadFiles(location, None, lanes), np.zeros(0, dtype=bool)
        deferrable = (
            _flags(pc.is_valid(live["max_priority"]))
            & _flags(pc.equal(pc.fill_null(live["any_top"], True), False))
            & _flags(pc.fill_null(live["never_before"], False))
            & (
                _flags(pc.and_(pc.is_valid(live["version"]), pc.is_valid(live["min_put_seq"])))
                | _flags(pc.is_valid(live["min_commit_version"]))
            )
        )
        if not pc.all(pc.fill_null(live["never_before"], False)).as_py():
            # A message put before another takes that one's place, wherever it lies: read every file.
            deferrable[:] = False
        chosen = np.flatnonzero(deferrable)
        lane = -live["max_priority"].to_numpy(zero_copy_only=False)[chosen] if lanes == "priority" else None
        return UnreadFiles(location, _catalogue(live.take(pa.array(chosen)), lane), lanes), ~deferrable

    def __len__(self) -> int:
        return self.files.num_rows

    def bound(self) -> Position:
        """The best position a message of an unread file can take."""
        first = self.files.slice(0, 1).to_pylist()[0]
        return first["lane"], first["first_version"], first["first_put_seq"]

    def take(self, chosen: np.ndarray) -> list[tuple[str, int, int | None]]:
        """Remove the files ``chosen`` (row numbers) from the catalogue: their path, size and version."""
        taken = self.files.take(pa.array(chosen, pa.int64()))
        keep = np.ones(len(self), dtype=bool)
        keep[chosen] = False
        self.files = self.files.filter(pa.array(keep))
        for path in taken["path"].to_pylist():
            self._groups.pop(path, None)
        return list(
            zip(taken["path"].to_pylist(), taken["size"].to_pylist(), taken["version"].to_pylist(), strict=True)
        )

    def touched(self, paths: list[str]) -> bool:
        """Whether any of ``paths`` is an unread file."""
        return len(self) > 0 and bool(
            pc.any(pc.is_in(self.files["path"], value_set=pa.array(paths, pa.string()))).as_py()
        )

    def first(self, rows: int) -> np.ndarray:
        """The first files (at least one) that hold ``rows`` messages between them."""
        held = np.cumsum(self.files["rows"].to_numpy())
        return np.arange(min(int(np.searchsorted(held, rows)) + 1, len(self)))

    def holding(self, origin_names: list[str]) -> np.ndarray:
        """The files that may hold messages of these origins (by the commit version they name)."""
        if not len(self) or not origin_names:
            return np.zeros(0, dtype=np.int64)
        versions = np.unique(origin_versions(pa.array(origin_names, pa.string())).to_numpy())
        low, high = self.files["low"].to_numpy(), self.files["high"].to_numpy()
        at = np.searchsorted(versions, low)
        return np.flatnonzero((at < len(versions)) & (versions[np.minimum(at, len(versions) - 1)] <= high))

    def expired(self, now: datetime) -> int:
        """How many messages of the unread files have expired at ``now`` (only ``expiry`` is read, of
        the files with an expiry)."""
        paths = self.files["path"].filter(self.files["expiring"]).to_pylist()
        moment = pa.scalar(now, TIMESTAMP)
        return sum(
            int(
                pc.sum(pc.less_equal(store.read_data_file(self.location, path, ["expiry"])["expiry"], moment)).as_py()
                or 0
            )
            for path in paths
        )

    def holding_groups(self, group_ids: pa.Array) -> np.ndarray:
        """The files that hold an item of one of these groups (their ``group_id`` read once each)."""
        if not len(self) or not len(group_ids):
            return np.zeros(0, dtype=np.int64)
        found = []
        paths = self.files["path"].to_pylist()
        grouped = self.files["grouped"].to_numpy(zero_copy_only=False)
        for number in np.flatnonzero(grouped):
            path = paths[number]
            if path not in self._groups:
                column = store.read_data_file(self.location, path, ["group_id"])["group_id"]
                self._groups[path] = pc.unique(column.drop_null())
            if pc.any(pc.is_in(self._groups[path], value_set=group_ids)).as_py():
                found.append(number)
        return np.array(found, dtype=np.int64)


def _flags(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=bool)


def _catalogue(files: pa.Table, lane: np.ndarray | None) -> pa.Table:
    if files.num_rows == 0:
        return pa.table(
            {
                name: pa.array([], kind)
                for name, kind in [
                    ("path", pa.string()),
                    ("size", pa.int64()),
                    ("version", pa.int64()),
                    ("rows", pa.int64()),
                    ("grouped", pa.bool_()),
                    ("expiring", pa.bool_()),
                    ("lane", pa.int64()),
                    ("first_version", pa.int64()),
                    ("first_put_seq", pa.int64()),
                    ("low", pa.int64()),
                    ("high", pa.int64()),
                ]
            }
        )
    # A put's file carries no commit_version: its rows came from the commit that added it.
    written = pc.is_valid(files["version"])
    low = pc.if_else(written, files["version"], files["min_commit_version"])
    high = pc.if_else(written, files["version"], files["max_commit_version"])
    # A file maintenance wrote may start anywhere in its first commit version.
    first_put_seq = pc.if_else(written, files["min_put_seq"], 0)
    catalogue = pa.table(
        {
            "path": files["path"],
            "size": files["size"],
            "version": files["version"],
            "rows": files["rows"],
            "grouped": pc.invert(pc.fill_null(files["never_grouped"], False)),
            "expiring": pc.invert(pc.fill_null(files["never_expire"], False)),
            "lane": pa.array(lane if lane is not None else np.zeros(files.num_rows, dtype=np.int64), pa.int64()),
            "first_version": low.cast(pa.int64()),
            "first_put_seq": first_put_seq.cast(pa.int64()),
            "low": low.cast(pa.int64()),
            "high": high.cast(pa.int64()),
        }
    )
    return catalogue.sort_by([("lane", "ascending"), ("first_version", "ascending"), ("first_put_seq", "ascending")])
