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

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.engine.put_checks import before_targets
from mqspark.model.groups import group_items
from mqspark.model.messages import QUEUE_TABLE_SCHEMA

KEY_COLUMNS_AND_TIME = ["msg_id", "offset", "put_time"]
# How often the ids that left the window are let go (seconds of put time).
_PRUNE_EVERY = 10.0
# The written files' keys kept for their commits (a process's puts to a queue commit one at a time).
_WRITTEN_KEPT = 16


@dataclass
class PendingPut:
    """The written, not yet committed data files of one put, its group items (as
    :func:`~mqspark.model.groups.group_items` gives them) and its ``before_msg_id`` targets, as
    duplicate detection leaves them. ``files`` is changed in place: the commit's retries and
    clean-up see what is left."""

    files: list[store.DataFile]
    groups: pa.Table
    targets: Sequence[str] = ()

    @property
    def rows(self) -> int:
        return sum(file.rows for file in self.files)


class LandedIds:
    """The ``(msg_id, offset)`` of the messages of one queue's live files put within its window, and
    when: a key counts while a live file holds it, so a file that is no longer live (a purge, a
    deleted queue) no longer counts."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._lock = threading.Lock()
        # Each live file read or recorded: the keys of its rows within the window then.
        self._keys: dict[str, list[tuple[str, int]]] = {}
        # (msg_id, offset) -> (its latest put_time in microseconds since the epoch, the live file
        # holding it); and the keys more than one live file holds (a redriven copy has the msg_id of
        # a message still in another file; maintenance's file holds a put's rows beside it for a while).
        self._landed: dict[tuple[str, int], tuple[int, str]] = {}
        self._shared: dict[tuple[str, int], set[str]] = {}
        # The keys of files this process wrote for a put, until that put's commit is prepared.
        self._written: dict[str, pa.Table] = {}
        self._pruned = 0

    def written(self, path: str, messages: pa.Table) -> None:
        """The rows of data file ``path``, just written for a put: not read back at its commit. Only
        the last few are kept: a put that failed before its commit was prepared leaves its own."""
        with self._lock:
            self._written[path] = messages.select(KEY_COLUMNS_AND_TIME)
            while len(self._written) > _WRITTEN_KEPT:
                del self._written[next(iter(self._written))]

    def drop_duplicates(
        self, put: PendingPut, live: Mapping[str, int], now: datetime, window: float
    ) -> Callable[[], None]:
        """Drop from ``put`` the messages that are duplicates at the version whose live files hold
        ``live`` rows by path (a file holding one is written again without it, and the one it
        replaces deleted); return what records the put's messages once its commit landed."""
        cutoff = _micros(now - timedelta(seconds=window))
        with self._lock:
            self._advance(live, cutoff)
            pieces = [self._put_keys(f.path) for f in put.files]
            first: set[tuple[str, int]] = set()
            duplicates = []
            for piece in pieces:
                duplicate = np.zeros(piece.num_rows, dtype=bool)
                for row, key in enumerate(_keys_of(piece)):
                    duplicate[row] = key in first or self._landed.get(key, (cutoff - 1,))[0] >= cutoff
                    first.add(key)
                duplicates.append(duplicate)
        if any(d.any() for d in duplicates):
            pieces = self._rewrite(put, pieces, duplicates)

        def record() -> None:
            with self._lock:
                for file, piece in zip(put.files, pieces, strict=True):
                    self._add(file.path, _keys_of(piece), _micros_of(piece["put_time"]))

        return record

    def _put_keys(self, path: str) -> pa.Table:
        """The keys and put times of the rows of the put's data file ``path``."""
        written = self._written.pop(path, None)
        return written if written is not None else store.read_data_file(self.location, path, KEY_COLUMNS_AND_TIME)

    def _advance(self, live: Mapping[str, int], cutoff: int) -> None:
        """Read the live files not read before, forget those no longer live, and let go of the ids
        that left the window."""
        for path in live.keys() - self._keys.keys():
            keys = self._recent_keys(path, live[path], cutoff)
            self._add(path, _keys_of(keys), _micros_of(keys["put_time"]))
        for path in self._keys.keys() - live.keys():
            for key in self._keys.pop(path):
                self._remove(key, path)
        if cutoff - self._pruned >= _PRUNE_EVERY * 1e6:
            self._landed = {key: landed for key, landed in self._landed.items() if landed[0] >= cutoff}
            self._shared = {key: paths for key, paths in self._shared.items() if key in self._landed}
            self._pruned = cutoff

    def _recent_keys(self, path: str, rows: int, cutoff: int) -> pa.Table:
        """The keys and put times of data file ``path`` (of ``rows`` rows) put at ``cutoff`` or later.
        A large file (maintenance's) is read only when its footer says some of its rows may be."""
        if rows > store.ROW_GROUP_ROWS:
            newest = store.row_group_statistics(self.location, path, ["put_time"])["max.put_time"]
            if all(at is not None and _micros(_utc(at)) < cutoff for at in newest):
                return QUEUE_TABLE_SCHEMA.empty_table().select(KEY_COLUMNS_AND_TIME)
        keys = store.read_data_file(self.location, path, KEY_COLUMNS_AND_TIME)
        return keys.filter(pa.array(_micros_of(keys["put_time"]) >= cutoff))

    def _add(self, path: str, keys: list[tuple[str, int]], times: np.ndarray) -> None:
        """The keys of live file ``path``, once (a commit's own file may have been read meanwhile)."""
        if path in self._keys:
            return
        self._keys[path] = keys
        for key, at in zip(keys, times.tolist(), strict=True):
            landed = self._landed.get(key)
            if landed is None:
                self._landed[key] = (at, path)
            else:
                if landed[1] != path:
                    self._shared.setdefault(key, {landed[1]}).add(path)
                self._landed[key] = (max(landed[0], at), path)

    def _remove(self, key: tuple[str, int], path: str) -> None:
        """Live file ``path`` no longer holds ``key``: it counts while another one does."""
        shared = self._shared.get(key)
        if shared is not None:
            shared.discard(path)
            if len(shared) > 1:
                return
            del self._shared[key]
            if shared:
                at = self._landed[key][0]
                self._landed[key] = (at, next(iter(shared)))
                return
        if self._landed.get(key, (0, ""))[1] == path:
            del self._landed[key]

    def _rewrite(self, put: PendingPut, pieces: list[pa.Table], duplicates: list[np.ndarray]) -> list[pa.Table]:
        """Write each of ``put``'s files that holds a duplicate again without them (or drop it), in
        place in ``put.files``, and take its group items and targets again from what is left; the
        keys of the files left."""
        files, kept_pieces, rows = [], [], []
        # The group items and targets are taken again from every row left: only then is each file read.
        every = bool(put.groups.num_rows or put.targets)
        for file, piece, duplicate in zip(put.files, pieces, duplicates, strict=True):
            if not (every or duplicate.any()):
                files.append(file)
                kept_pieces.append(piece)
                continue
            data = store.read_data_file(self.location, file.path)
            if duplicate.any():
                data = data.filter(pa.array(~duplicate))
                written = store.write_data_file(self.location, data.to_batches(), QUEUE_TABLE_SCHEMA)
                store.remove_data_files(self.location, [file])
                if written is None:
                    continue
                file, piece = written, piece.filter(pa.array(~duplicate))
            files.append(file)
            kept_pieces.append(piece)
            rows.append(data)
        put.files[:] = files
        if every:
            kept = pa.concat_tables(rows) if rows else QUEUE_TABLE_SCHEMA.empty_table()
            put.groups = group_items(kept) if put.groups.num_rows else put.groups
            put.targets = before_targets(kept) if put.targets else put.targets
        return kept_pieces


def _keys_of(keys: pa.Table) -> list[tuple[str, int]]:
    return list(zip(keys["msg_id"].to_pylist(), keys["offset"].to_pylist(), strict=True))


def _micros(moment: datetime) -> int:
    return int(moment.timestamp() * 1e6)


def _utc(moment: datetime) -> datetime:
    """A footer's timestamp statistic, which pyarrow gives without its time zone (UTC)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _micros_of(column: pa.ChunkedArray) -> np.ndarray:
    """A ``put_time`` column as microseconds since the epoch (none is null: every put stamps one)."""
    return pc.cast(column, pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
