"""The reader process: where the console computes the answers its clients poll
(:mod:`mqspark.console.answers`), apart from the process that serves them.

- It runs at the lowest CPU priority, so that on a busy machine the queue managers' own work (a
  streaming get, a put) comes first: the console's answers get older instead.
- The process that serves the pages holds no Delta table, and its threads do not wait for the GIL
  while depths are counted.
- A reader process that dies (killed, out of memory) is replaced, and the read asked of it again
  once; one asked nothing for ``IDLE_SECONDS`` ends."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.console.answers import ANSWERS
from mqspark.console.managers import Managers
from mqspark.errors import MQError

# A reader process nobody asked anything for this long ends (an idle console holds no reader).
IDLE_SECONDS = 60.0
# The nice value of the reader process (the lowest priority there is).
NICE = 19

_managers: Managers | None = None  # the queue managers a reader process reads, opened at its start


def renice(value: int) -> None:
    """Give every thread of this process the nice value ``value``. Linux keeps a nice value per
    thread: every thread started so far is set, and those started later inherit it from the thread
    that starts them."""
    for thread in _threads():
        os.setpriority(os.PRIO_PROCESS, thread, value)


def idle_policy() -> None:
    """Put every thread of this process under Linux's ``SCHED_IDLE`` policy: on a busy CPU it gets
    the smallest share (weight 3, nice 19's is 15), and a thread of another policy that wakes takes
    the CPU from it at once, where at nice 19 it may first run out its slice. Threads started later
    inherit it."""
    for thread in _threads():
        os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))


def _threads() -> list[int]:
    """The ids of this process's threads so far (0, this thread, where /proc does not list them)."""
    return [int(thread) for thread in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]


def _start(roots: list[str]) -> None:
    global _managers
    threading.Thread(target=_end_with_parent, name="console-reader-parent", daemon=True).start()
    renice(NICE)
    if hasattr(os, "SCHED_IDLE"):
        idle_policy()
    _managers = Managers(roots)


def _end_with_parent() -> None:
    """Ends the reader process once the console's process ended (when it was killed, nothing else
    would end it: the pool's pipes stay open in the reader itself)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(0)


def _read(answer: str, args: tuple) -> Any:
    if _managers is None:
        raise RuntimeError("the reader process was not started with its queue managers")
    return ANSWERS[answer](_managers, *args)


class Reader:
    """Computes answers for the queue managers at ``roots`` in a reader process, started at the first
    read and ended once no read was asked of it for ``idle`` seconds of ``clock``."""

    def __init__(self, roots: Sequence[str], idle: float = IDLE_SECONDS, clock: Clock = SYSTEM_CLOCK) -> None:
        self.roots, self.idle, self.clock = list(roots), idle, clock
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._retired = threading.Event()  # set once the current pool is asked no more
        self._last_read = 0.0
        self._closed = False

    def read(self, answer: str, *args: Any) -> Any:
        """The answer named ``answer`` (see ``ANSWERS``) for ``args``; its errors are raised here."""
        try:
            return self._answer(answer, args)
        except BrokenProcessPool:
            pass  # asked once more, of a new reader process
        try:
            return self._answer(answer, args)
        except BrokenProcessPool as error:
            raise MQError(f"console: the reader process ended while reading {answer}: {error}") from None

    def close(self) -> None:
        """Stop the reader process, once what it was asked is answered."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            self._retired.set()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _answer(self, answer: str, args: tuple) -> Any:
        pool, future = self._submit(answer, args)
        try:
            return future.result()
        except BrokenProcessPool:
            with self._lock:
                self._retire(pool)
            raise

    def _submit(self, answer: str, args: tuple) -> tuple[ProcessPoolExecutor, Future]:
        with self._lock:
            if self._closed:
                raise MQError("console: the reader is closed")
            if self._pool is None:
                context = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(1, context, initializer=_start, initargs=(self.roots,))
                self._retired = threading.Event()
                threading.Thread(
                    target=self._end_when_idle, args=(self._pool, self._retired), name="console-reader", daemon=True
                ).start()
            pool = self._pool
            self._last_read = self.clock.monotonic()
            try:
                return pool, pool.submit(_read, answer, args)
            except BrokenProcessPool:
                self._retire(pool)
                raise

    def _retire(self, pool: ProcessPoolExecutor | None) -> None:
        """Ask no more of ``pool`` when it is the current one (its process answers what it was asked,
        then ends); the caller holds ``_lock``."""
        if pool is not None and self._pool is pool:
            self._pool = None
            pool.shutdown(wait=False)
            self._retired.set()

    def _end_when_idle(self, pool: ProcessPoolExecutor, retired: threading.Event) -> None:
        while True:
            with self._lock:
                if self._pool is not pool:
                    return
                idle = self.clock.monotonic() - self._last_read
                if idle >= self.idle:
                    self._retire(pool)
                    return
            if self.clock.wait(retired, self.idle - idle):
                return
