"""Shared gets: the files through which plain gets of several processes share one state commit.

A get that finds another process getting from the same consumer group of a queue writes a request
to the group's folder under the queue's state table (``_mqspark_gets/<group>``; Delta readers skip
folders starting with ``_``) and waits; the process holding the folder's
:class:`~mqspark.store.round_lock.RoundLock` takes every request, gets the messages of all of them
in one plan and one commit, and hands each request its share. A request ``N`` is two files:

- the request, ``N.want`` (how many messages it wants; ``N`` starts with the arrival time, so names
  sort in arrival order), renamed ``N.taken`` when a holder takes it. Its getter holds an
  exclusive ``flock`` on it until it has its answer: a holder that can take that lock knows the
  getter is gone, and drops the request;
- the answer, written by the holder: ``N.tentative`` (the share, with the plan's id, written before
  the commit and final once the plan is consumed in the state table), renamed ``N.got`` once the
  commit landed; ``N.again`` (the plan held no message for it: ask again); ``N.refused`` (the reason
  code and message its getter raises).

A holder finding ``.taken`` requests without a final answer knows their holder died, and settles
them by the state table: a tentative share whose plan was consumed is the getter's, anything else
is asked again. Local folders only: an object store has no such lock, and its gets plan alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc as ipc

from mqspark.store.round_lock import RoundLock, move, named

GETS_FOLDER = "_mqspark_gets"
_PLAN_KEY = b"mqspark.plan_id"
# The answers a holder gives; a request with none of them is in flight.
_FINAL = ("got", "again", "refused")
# A request's name: its arrival time in 20 digits, a dash and 32 hex digits.
_NAME_LENGTH = 53


@dataclass(frozen=True)
class Answer:
    """What a holder answered a request: its ``messages`` (None: ask again), or a refusal with a
    reason code (0: bad input) and message."""

    messages: pa.Table | None = None
    reason: int | None = None
    message: str = ""


class GetRequests:
    """The requests and the locks of one consumer group's shared gets, in ``folder``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.lock = RoundLock(folder)

    def _path(self, name: str, state: str) -> str:
        return os.path.join(self.folder, f"{name}.{state}")

    def request(self, max_messages: int) -> tuple[str, int]:
        """Write a request for up to ``max_messages`` messages; its name, and the descriptor holding
        its lock (closed by :meth:`forget`)."""
        os.makedirs(self.folder, exist_ok=True)
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex}"
        temporary = self._path(name, "tmp")
        descriptor = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        os.write(descriptor, str(max_messages).encode())
        os.rename(temporary, self._path(name, "want"))
        return name, descriptor

    def forget(self, name: str, descriptor: int) -> None:
        """Remove a request and its answer, as its getter, and let go of its lock."""
        for state in ("want", "taken", "withdrawn", "tentative", *_FINAL):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(name, state))
        os.close(descriptor)

    def wanted(self) -> list[str]:
        """The requests no holder took yet, in arrival order."""
        return self._named("want")

    def taken(self) -> list[str]:
        """The requests taken by a holder and not answered, in arrival order."""
        return [name for name in self._named("taken") if not any(self._exists(name, s) for s in _FINAL)]

    def _named(self, state: str) -> list[str]:
        return named(self.folder, state)

    def _exists(self, name: str, state: str) -> bool:
        return os.path.exists(self._path(name, state))

    def take(self, name: str) -> int | None:
        """Take a request for the holder's round; how many messages it wants. None when its getter
        withdrew it, or is gone (the request is dropped)."""
        if not self._move(name, "want", "taken"):
            return None
        wanted = self.alive(name)
        if wanted is None:
            self._drop(name)
        return wanted

    def alive(self, name: str, state: str = "taken") -> int | None:
        """How many messages a request (``want`` or ``taken``) wants; None when its getter is gone."""
        try:
            descriptor = os.open(self._path(name, state), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return int(os.pread(descriptor, 32, 0))
            return None
        finally:
            os.close(descriptor)

    def _drop(self, name: str) -> None:
        for state in ("taken", "tentative"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(name, state))

    def withdraw(self, name: str) -> bool:
        """Take back a request no holder took, for its getter to get alone; False when one took it."""
        return self._move(name, "want", "withdrawn")

    def ask_again(self, name: str) -> None:
        """Put a taken request back for the next round (its answer dropped)."""
        for state in ("tentative", "again"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(name, state))
        self._move(name, "taken", "want")

    def drop_tentative(self, name: str) -> None:
        """Remove a request's tentative share (a later plan has none for it)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(name, "tentative"))

    def tentative(self, name: str, messages: pa.Table, plan_id: str) -> None:
        """Write a request's share of the plan ``plan_id``, before the plan's commit."""
        schema = messages.schema.with_metadata({**(messages.schema.metadata or {}), _PLAN_KEY: plan_id.encode()})
        self._write(name, "tentative", messages.replace_schema_metadata(schema.metadata))

    def tentative_plan(self, name: str) -> str | None:
        """The plan of a request's tentative share; None when it has none."""
        try:
            with ipc.open_file(self._path(name, "tentative")) as reader:
                return reader.schema.metadata[_PLAN_KEY].decode()
        except FileNotFoundError:
            return None

    def tentative_time(self, name: str) -> float:
        """When a request's tentative share was written (a POSIX time)."""
        return os.stat(self._path(name, "tentative")).st_mtime

    def grant(self, name: str) -> None:
        """Make a request's tentative share its answer: its plan was consumed."""
        self._move(name, "tentative", "got")

    def nothing(self, name: str, schema: pa.Schema) -> None:
        """Answer a request with no message: nothing matched."""
        self._write(name, "got", schema.empty_table())

    def again(self, name: str) -> None:
        """Answer a request to ask again: the plan was short of messages for it."""
        self._write_text(name, "again", "")

    def refuse(self, name: str, reason: int, message: str) -> None:
        """Answer a request with the reason code and message its getter raises."""
        self._write_text(name, "refused", json.dumps({"reason": reason, "message": message}))

    def answer(self, name: str) -> Answer | None:
        """A request's answer; None while it has none."""
        try:
            with ipc.open_file(self._path(name, "got")) as reader:
                return Answer(messages=reader.read_all().replace_schema_metadata(None))
        except FileNotFoundError:
            pass
        if self._exists(name, "again"):
            return Answer()
        try:
            with open(self._path(name, "refused")) as refused:
                given = json.load(refused)
        except FileNotFoundError:
            return None
        return Answer(reason=int(given["reason"]), message=str(given["message"]))

    def gone(self, name: str) -> bool:
        """Whether a request is in no state at all (the queue's state folder was deleted)."""
        return not any(self._exists(name, state) for state in ("want", "taken", *_FINAL))

    def _write(self, name: str, state: str, table: pa.Table) -> None:
        temporary = self._path(f"{name}-{uuid.uuid4().hex}", "tmp")
        with open(temporary, "wb") as out, ipc.new_file(out, table.schema) as writer:
            writer.write_table(table)
        os.rename(temporary, self._path(name, state))

    def _write_text(self, name: str, state: str, text: str) -> None:
        temporary = self._path(f"{name}-{uuid.uuid4().hex}", "tmp")
        with open(temporary, "w") as out:
            out.write(text)
        os.rename(temporary, self._path(name, state))

    def _move(self, name: str, source: str, target: str) -> bool:
        return move(self.folder, name, source, target)


def oldest_tentative(location: str) -> float | None:
    """When the oldest tentative share in the shared-gets folders of the local state table at
    ``location`` was written (a POSIX time); None when there is none."""
    oldest = None
    for folder, _, files in os.walk(os.path.join(location, GETS_FOLDER)):
        for file in files:
            if file.endswith(".tentative"):
                with contextlib.suppress(FileNotFoundError):
                    written = os.stat(os.path.join(folder, file)).st_mtime
                    oldest = written if oldest is None else min(oldest, written)
    return oldest


def remove_get_leftovers(location: str, older_than: float) -> int:
    """Delete what getters killed while they asked left in the shared-gets folders of the local
    state table at ``location``, last changed before ``older_than`` (a POSIX time); how many files
    went. The files of a request whose getter still holds its lock stay."""
    removed = 0
    for folder, _, files in os.walk(os.path.join(location, GETS_FOLDER)):
        requests = GetRequests(folder)
        for file in files:
            name, _, state = file.rpartition(".")
            if not name or state in ("lock", "round"):
                continue
            name = name[:_NAME_LENGTH]  # a temporary answer's name goes on after its request's
            if any(requests.alive(name, request) is not None for request in ("want", "taken")):
                continue
            with contextlib.suppress(FileNotFoundError):
                path = os.path.join(folder, file)
                if os.stat(path).st_mtime < older_than:
                    os.unlink(path)
                    removed += 1
    return removed
