"""Duplicate detection: a queue's ``duplicate_window`` (SQS FIFO's deduplication, Service Bus's
duplicate detection).

A producer that cannot know whether its put landed (it was killed, or it timed out) puts again with
the same ``msg_id``. On a queue whose ``duplicate_window`` is more than 0 seconds, a producer's put
(``qm.put``, the Spark sink, and the puts a staged-puts holder commits for other processes) is
checked at its commit, against exactly the version the commit follows. A message is dropped when a
message of the queue put within the window has its ``msg_id`` and ``offset`` (a segment's place),
or when an earlier message of the same commit has them. The put still returns its msg_ids: the
message is acknowledged, and stored once. Moves (backout, redrive) keep their msg_ids and are not
checked.

The landed ids are read from the queue's data files (``msg_id``, ``offset``, ``put_time``).
Maintenance keeps a consumed message while its put lies within the window, so the live files hold
every message put within it. A purge empties the queue, and what it removed no longer counts.

Each process keeps one :class:`LandedIds` per queue. It reads each live file once, the first time it
sees it: the ``put_time`` column first, then ``msg_id`` and ``offset`` only where a row lies within
the window. The files a commit of the process adds are recorded when it lands, without a read, and a
file no longer live is forgotten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.model.groups import group_items
from mqspark.model.messages import QUEUE_TABLE_SCHEMA

KEY_COLUMNS = ["msg_id", "offset"]
# How often the ids that left the window are let go (seconds of put time).
_PRUNE_EVERY = 10.0


@dataclass
class PendingPut:
    """The written, not yet committed data files of one put and its group items (as
    :func:`~mqspark.model.groups.group_items` gives them), as duplicate detection leaves them."""

    files: list[store.DataFile]
    groups: pa.Table

    @property
    def rows(self) -> int:
        return sum(file.rows for file in self.files)


class LandedIds:
    """The ``(msg_id, offset)`` of the messages of one queue's live files put within its window, and
    when: a file that is no longer live (a purge, a deleted queue) no longer counts."""

    def __init__(self, location: str) -> None:
        self.location = location
        # Each live file read: the keys of its rows within the window when it was read.
        self._keys: dict[str, list[tuple[str, int]]] = {}
        # (msg_id, offset) -> (put_time in microseconds since the epoch, the file that holds it).
        self._landed: dict[tuple[str, int], tuple[int, str]] = {}
        self._pruned = 0

    def drop_duplicates(
        self, put: PendingPut, live_paths: Iterable[str], now: datetime, window: float
    ) -> Callable[[], None]:
        """Drop from ``put`` (rewriting its files, and deleting those it replaced) the messages that
        are duplicates at the version whose live files are ``live_paths``; return what records the
        put's messages once its commit landed."""
        cutoff = _micros(now - timedelta(seconds=window))
        self._advance(live_paths, cutoff)
        pieces = [store.read_data_file(self.location, f.path, [*KEY_COLUMNS, "put_time"]) for f in put.files]
        keys = pa.concat_tables(pieces)
        duplicate = np.zeros(keys.num_rows, dtype=bool)
        first: set[tuple[str, int]] = set()
        for row, key in enumerate(_keys_of(keys)):
            duplicate[row] = key in first or self._landed.get(key, (cutoff - 1, ""))[0] >= cutoff
            first.add(key)
        if duplicate.any():
            self._rewrite(put, pa.array(~duplicate))
            pieces = [keys.filter(pa.array(~duplicate))] if put.files else []

        def record() -> None:
            for file, piece in zip(put.files, pieces, strict=True):
                self._add(file.path, _keys_of(piece), _micros_of(piece["put_time"]))

        return record

    def _advance(self, live_paths: Iterable[str], cutoff: int) -> None:
        """Read the live files not read before, forget those no longer live, and let go of the ids
        that left the window."""
        live = set(live_paths)
        for path in live.difference(self._keys):
            times = _micros_of(store.read_data_file(self.location, path, ["put_time"])["put_time"])
            within = times >= cutoff
            if within.any():
                keys = store.read_data_file(self.location, path, KEY_COLUMNS).filter(pa.array(within))
                self._add(path, _keys_of(keys), times[within])
            else:
                self._keys[path] = []
        for path in set(self._keys).difference(live):
            for key in self._keys.pop(path):
                if self._landed.get(key, (0, ""))[1] == path:
                    del self._landed[key]
        if cutoff - self._pruned >= _PRUNE_EVERY * 1e6:
            self._landed = {key: landed for key, landed in self._landed.items() if landed[0] >= cutoff}
            self._pruned = cutoff

    def _add(self, path: str, keys: list[tuple[str, int]], times: np.ndarray) -> None:
        self._keys[path] = keys
        for key, at in zip(keys, times.tolist(), strict=True):
            self._landed[key] = (at, path)

    def _rewrite(self, put: PendingPut, kept: pa.Array) -> None:
        """Replace ``put``'s files by one holding the rows ``kept`` marks, in the same order."""
        rows = pa.concat_tables([store.read_data_file(self.location, f.path) for f in put.files]).filter(kept)
        old = put.files
        file = store.write_data_file(self.location, rows.to_batches(), QUEUE_TABLE_SCHEMA)
        put.files = [file] if file is not None else []
        put.groups = group_items(rows) if put.groups.num_rows else put.groups
        store.remove_data_files(self.location, old)


def _keys_of(keys: pa.Table) -> list[tuple[str, int]]:
    return list(zip(keys["msg_id"].to_pylist(), keys["offset"].to_pylist(), strict=True))


def _micros(moment: datetime) -> int:
    return int(moment.timestamp() * 1e6)


def _micros_of(column: pa.ChunkedArray) -> np.ndarray:
    """A ``put_time`` column as microseconds since the epoch (none is null: every put stamps one)."""
    return pc.cast(column, pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
