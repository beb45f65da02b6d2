"""Staged puts: the files through which puts of several processes share one Delta commit.

A put that finds another process committing to its queue writes its rows to a staged file in the
queue table's ``_mqspark_staged`` folder (Delta readers skip folders starting with ``_``) and
waits; the process holding the queue's commit lock claims every staged file, commits their rows
in one commit and marks each file with its outcome. A file moves through these names, each step
an atomic rename:

- ``N.arrow``: staged, waiting for a holder (``N`` starts with the arrival time, so names sort in
  arrival order);
- ``N.claimed``: taken by the lock's holder for its commit;
- ``N.done``: landed in a commit, whose ``commitInfo`` names it under :data:`STAGED_KEY`;
- ``N.refused`` (with ``N.why``: the reason code and message): not committed, and never will be;
- ``N.withdrawn``: taken back by its putter, which commits it alone.

The holder holds the folder's :class:`~mqspark.store.round_lock.RoundLock`: the kernel releases it
when its holder dies, so a holder finding ``.claimed`` files knows their holder is gone, and settles
them by the log: landed (``.done``) or staged again (``.arrow``). Local folders only: an object
store has no such lock, and its puts commit as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc as ipc

from mqspark.store.log import LogEntryGone, commit_info, log_stamp, newest_version
from mqspark.store.round_lock import RoundLock, move, named

STAGED_FOLDER = "_mqspark_staged"
# The commitInfo key naming the staged files a commit holds.
STAGED_KEY = "mqspark.staged"
# How far back from a claim a holder looks for the commit that may have landed it (seconds): a
# holder commits within moments of its claim, and log entries keep their write time.
_CLAIM_SLACK = 60.0


@dataclass(frozen=True)
class Outcome:
    """What became of a staged put: landed, or refused with a reason code and message."""

    landed: bool
    reason: int = 0
    message: str = ""


class Staging:
    """The staged files and the commit lock of one local queue table at ``location``."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.folder = os.path.join(location, STAGED_FOLDER)
        self.lock = RoundLock(self.folder)

    def _path(self, name: str, state: str) -> str:
        return os.path.join(self.folder, f"{name}.{state}")

    def stage(self, rows: pa.Table) -> str:
        """Write ``rows`` as a staged file; its name. Not synced to disk: a put returns only once a
        commit holds its rows in a data file of its own, so a staged file lost in a crash of the
        machine belongs to a put that never returned."""
        os.makedirs(self.folder, exist_ok=True)
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex}"
        temporary = self._path(name, "tmp")
        with open(temporary, "wb") as out, ipc.new_file(out, rows.schema) as writer:
            writer.write_table(rows)
        os.rename(temporary, self._path(name, "arrow"))
        return name

    def staged(self) -> list[str]:
        """The names of the files staged and not claimed, in arrival order."""
        return self._named("arrow")

    def claimed(self) -> list[str]:
        """The names of the files claimed and not settled, in arrival order."""
        return self._named("claimed")

    def _named(self, state: str) -> list[str]:
        return named(self.folder, state)

    def claim(self, name: str) -> bool:
        """Claim a staged file for the holder's commit; False when its putter withdrew it."""
        return self._move(name, "arrow", "claimed")

    def withdraw(self, name: str) -> bool:
        """Take a staged file back for its putter to commit alone; False when a holder claimed it."""
        if not self._move(name, "arrow", "withdrawn"):
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(name, "withdrawn"))
        return True

    def unclaim(self, name: str) -> None:
        """Stage a claimed file again (its commit did not land)."""
        self._move(name, "claimed", "arrow")

    def rows(self, name: str) -> pa.Table:
        """The rows of a claimed file."""
        with ipc.open_file(self._path(name, "claimed")) as reader:
            return reader.read_all()

    def land(self, name: str) -> None:
        """Mark a claimed file as landed."""
        self._move(name, "claimed", "done")

    def refuse(self, name: str, reason: int, message: str) -> None:
        """Mark a claimed file as refused, with the reason code and message its putter raises."""
        why = self._path(name, "why")
        with open(why, "w") as out:
            json.dump({"reason": reason, "message": message}, out)
        self._move(name, "claimed", "refused")

    def outcome(self, name: str) -> Outcome | None:
        """What became of the putter's staged file (and its marks removed), None while undecided."""
        if self._consume(name, "done"):
            return Outcome(landed=True)
        refused = self._path(name, "refused")
        if not os.path.exists(refused):
            return None
        with open(self._path(name, "why")) as why:
            given = json.load(why)
        for state in ("why", "refused"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(name, state))
        return Outcome(landed=False, reason=int(given["reason"]), message=str(given["message"]))

    def undecided(self, name: str) -> bool:
        """Whether the putter's file is staged or claimed: neither landed nor refused yet."""
        return any(os.path.exists(self._path(name, state)) for state in ("arrow", "claimed"))

    def age(self, name: str) -> float:
        """Seconds since a staged file was written (0 when it is no longer staged)."""
        try:
            return time.time() - os.stat(self._path(name, "arrow")).st_mtime
        except FileNotFoundError:
            return 0.0

    def gone(self, name: str) -> bool:
        """Whether the putter's file is in no state at all (its queue's folder was deleted)."""
        return not any(os.path.exists(self._path(name, s)) for s in ("arrow", "claimed", "done", "refused"))

    @staticmethod
    def arrival(name: str) -> int:
        """When the put of a staged file arrived (ns): its names sort in arrival order."""
        return int(name.split("-", 1)[0])

    def claim_time(self, name: str) -> float:
        """When a claimed file was claimed (its rename changed its status time)."""
        return os.stat(self._path(name, "claimed")).st_ctime

    def _consume(self, name: str, state: str) -> bool:
        try:
            os.unlink(self._path(name, state))
        except FileNotFoundError:
            return False
        return True

    def _move(self, name: str, source: str, target: str) -> bool:
        return move(self.folder, name, source, target)


def landed_names(location: str, since: float, key: str = STAGED_KEY) -> set[str]:
    """The names listed under ``key`` (by default, the staged files) in the ``commitInfo`` of the
    commits of the local table at ``location``, from its newest version back to the first whose log
    entry was written before ``since`` (a POSIX time)."""
    names: set[str] = set()
    version = newest_version(location)
    while version >= 0:
        written = log_stamp(location, version)
        try:
            info = commit_info(location, version)
        except LogEntryGone:
            break
        if written is None:
            break
        names.update(info.get(key) or ())
        if written / 1e9 < since - _CLAIM_SLACK:
            break
        version -= 1
    return names


def remove_staged_leftovers(location: str, older_than: float) -> int:
    """Delete the marks and partial files that putters killed after their outcome, or while staging,
    left in the staged folder of the local table at ``location``, last changed before ``older_than``
    (a POSIX time); how many went. Staged and claimed files stay: a holder commits or settles them."""
    folder = os.path.join(location, STAGED_FOLDER)
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return 0
    removed = 0
    for entry in entries:
        if entry.name.rsplit(".", 1)[-1] in ("done", "refused", "why", "tmp", "withdrawn"):
            with contextlib.suppress(FileNotFoundError):
                if entry.stat().st_mtime < older_than:
                    os.unlink(entry.path)
                    removed += 1
    return removed
