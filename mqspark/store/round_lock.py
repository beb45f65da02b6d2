"""The round lock: how processes that share one commit take turns, and how their waiters sleep.

Staged puts (:mod:`mqspark.store.staging`) and shared gets (:mod:`mqspark.store.get_requests`) work
alike: one process holds an exclusive ``flock`` on ``.lock`` in a folder and commits, in *rounds*,
for every process that left a request there. For each round it also holds an exclusive ``flock`` on
``.round``, and counts the rounds in that file: waiting processes ask for it shared, so the kernel
wakes them all when a round ends (or its holder dies), and the count tells them whether one did.
The kernel releases both locks when their holder dies. Local folders only: an object store has no
such lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator

# The file whose lock the holder keeps while it claims, commits and marks one round.
_ROUND = ".round"
# How long a waiter first waits before looking again when the holder has no round going (seconds).
BETWEEN_ROUNDS = 0.001
# How long a waiter whose request a paused holder took waits at a time, and the longest pause.
CLAIMED_POLL = 0.05


class RoundLock:
    """The commit lock and the round lock of the processes sharing commits through ``folder``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._lock: int | None = None
        self._round: int | None = None

    def try_lock(self) -> bool:
        """Take the commit lock if it is free; True when this process holds it now."""
        descriptor = self._open(".lock")
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return False
        self._lock = descriptor
        return True

    def _open(self, name: str) -> int:
        os.makedirs(self.folder, exist_ok=True)
        return os.open(os.path.join(self.folder, name), os.O_RDWR | os.O_CREAT, 0o644)

    def unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        if self._round is not None:
            os.close(self._round)
            self._round = None

    @contextlib.contextmanager
    def locked(self) -> Iterator[bool]:
        """The commit lock if it is free (yields True), released on leaving; yields False otherwise."""
        held = self.try_lock()
        try:
            yield held
        finally:
            if held:
                self.unlock()

    def start_round(self) -> None:
        """As the lock's holder, before claiming: waiters sleep until :meth:`end_round`."""
        if self._round is None:
            self._round = self._open(_ROUND)
        fcntl.flock(self._round, fcntl.LOCK_EX)

    def end_round(self) -> None:
        """As the lock's holder, once its claims are settled: wake the processes waiting in
        :meth:`wait_round`, and tell them a round ended (its count in the file goes up)."""
        if self._round is None:
            return
        ended = int.from_bytes(os.pread(self._round, 8, 0).ljust(8, b"\0"), "little") + 1
        os.pwrite(self._round, ended.to_bytes(8, "little"), 0)
        fcntl.flock(self._round, fcntl.LOCK_UN)

    def wait_round(self, timeout: float) -> bool:
        """Sleep until the holder's round ends, or while none is going, at most ``timeout`` seconds;
        True when a round ended since the call. The kernel wakes the waiter: nothing is polled. A
        thread waits, since ``flock`` has no timeout; it closes its descriptor once woken."""
        descriptor = self._open(_ROUND)
        before = os.pread(descriptor, 8, 0)
        after: list[bytes] = []
        woken = threading.Event()

        def wait() -> None:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_SH)
                after.append(os.pread(descriptor, 8, 0))
            finally:
                os.close(descriptor)
                woken.set()

        threading.Thread(target=wait, name="mqspark-round", daemon=True).start()
        return woken.wait(timeout) and after != [before]

    def pause(self, remaining: float, pause: float) -> float:
        """As a waiter whose answer is not in: sleep until a round ends (at most ``remaining``
        seconds), or, when no round is going, for ``pause`` seconds; the pause to give the next
        call. Once ``remaining`` is spent, a holder that does not let go took the request: look now
        and then, starting no more threads."""
        if remaining <= 0:
            time.sleep(CLAIMED_POLL)
            return pause
        if self.wait_round(remaining):
            return BETWEEN_ROUNDS
        # The holder is between rounds, or paused in one: look again after a pause that grows.
        time.sleep(pause)
        return min(2 * pause, CLAIMED_POLL)


def named(folder: str, state: str) -> list[str]:
    """The names of the files in ``folder`` in ``state`` (their suffix), sorted: in arrival order."""
    try:
        entries = os.listdir(folder)
    except FileNotFoundError:
        return []
    suffix = f".{state}"
    return sorted(entry.removesuffix(suffix) for entry in entries if entry.endswith(suffix))


def move(folder: str, name: str, source: str, target: str) -> bool:
    """Rename file ``name`` in ``folder`` from state ``source`` to ``target``; False when it was
    not in ``source``."""
    try:
        os.rename(os.path.join(folder, f"{name}.{source}"), os.path.join(folder, f"{name}.{target}"))
    except FileNotFoundError:
        return False
    return True
