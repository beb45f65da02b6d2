"""Time as the package reads it: the wall clock (UTC), a monotonic clock for deadlines, and sleep.

Everything that waits, leases, expires or delays takes a :class:`Clock`, :data:`SYSTEM_CLOCK` unless
given another. Tests give a :class:`ManualClock` and move it by hand instead of sleeping.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

# How often (s of real time) a ManualClock.wait in another thread looks at its event.
EVENT_LOOK = 0.01


class Clock(Protocol):
    """A source of time: ``now`` (timezone-aware UTC), ``monotonic`` seconds, and ``sleep``."""

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until ``event`` is set or ``seconds`` pass; whether it is set."""
        ...


class SystemClock:
    """The machine's clocks."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)


SYSTEM_CLOCK: Clock = SystemClock()


class ManualClock:
    """A clock that moves only when told: :meth:`advance` moves it, and a ``sleep`` is over once the
    clock has moved past its end. A ``sleep`` in the thread that made the clock moves the clock itself,
    so a loop there that sleeps runs at once; in any other thread (a lease renewer, say) it waits for
    the clock to be moved, unless ``autoadvance``. :meth:`after` makes something happen at a moment
    of the clock (an outage that ends, a queue manager that appears) without real waiting."""

    def __init__(self, start: datetime | None = None, *, autoadvance: bool = False) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError(f"start must be timezone-aware, got {start!r}")
        # From the real time by default, so that what it stamps reads sensibly beside the real clock.
        self._start = start or datetime.now(UTC)
        self._elapsed = 0.0
        self._autoadvance = autoadvance
        self._owner = threading.get_ident()
        self._moved = threading.Condition()
        # What after() scheduled: (moment, order scheduled, action), the next due first.
        self._due: list[tuple[float, int, Callable[[], object]]] = []
        self._order = itertools.count()
        # One advance at a time: advances in several threads add up even while an action runs.
        self._advancing = threading.RLock()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)

    def monotonic(self) -> float:
        return self._elapsed

    def advance(self, by: timedelta | float) -> None:
        """Move the clock forward by ``by`` (seconds, or a timedelta >= 0), running on the way the
        actions of :meth:`after` that fall due, each with the clock at its moment."""
        seconds = by.total_seconds() if isinstance(by, timedelta) else float(by)
        if seconds < 0:
            raise ValueError(f"a clock moves forward only; got {seconds} s")
        with self._advancing:
            end = self._elapsed + seconds
            while True:
                with self._moved:
                    if not self._due or self._due[0][0] > end:
                        # max: an action may have advanced the clock past this advance's end.
                        self._elapsed = max(self._elapsed, end)
                        self._moved.notify_all()
                        return
                    moment, _, action = heapq.heappop(self._due)
                    self._elapsed = max(self._elapsed, moment)
                    self._moved.notify_all()
                # Outside the lock: sleepers in other threads whose end has come wake meanwhile.
                action()

    def after(self, seconds: float, action: Callable[[], object]) -> None:
        """Run ``action()`` once, when the clock has moved ``seconds`` (>= 0) from now: inside the
        :meth:`advance` (or the :meth:`sleep` in the clock's own thread) that reaches that moment or
        passes it, in that thread, with the clock reading that moment. Actions run in the order of
        their moments, those of the same moment in the order they were scheduled; an action may
        schedule another, which runs in the same advance if its moment falls within it. An action
        due now runs at the next advance, even of 0 s. An action's error ends the advance there and
        reaches its caller. An action must not wait for another thread that advances the clock."""
        if seconds < 0:
            raise ValueError(f"a clock moves forward only; got {seconds} s")
        with self._moved:
            heapq.heappush(self._due, (self._elapsed + seconds, next(self._order), action))

    def sleep(self, seconds: float) -> None:
        if self._autoadvance or threading.get_ident() == self._owner:
            self.advance(max(0.0, seconds))
            # Lets other threads run, as a real sleep would.
            time.sleep(0)
            return
        end = self._elapsed + seconds
        with self._moved:
            self._moved.wait_for(lambda: self._elapsed >= end)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """As :meth:`sleep`, ending early when ``event`` is set, as the system clock's wait does; then
        whether ``event`` is set. Setting an event cannot wake a condition, so a sleeper in another
        thread looks at it every 10 ms of real time."""
        if event.is_set():
            return True
        if self._autoadvance or threading.get_ident() == self._owner:
            self.sleep(seconds)
            return event.is_set()
        end = self._elapsed + seconds
        with self._moved:
            while self._elapsed < end and not event.is_set():
                self._moved.wait(EVENT_LOOK)
        return event.is_set()
