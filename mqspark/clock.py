"""Time as the package reads it: the wall clock (UTC), a monotonic clock for deadlines, and sleep.

Everything that waits, leases, expires or delays takes a :class:`Clock`, :data:`SYSTEM_CLOCK` unless
given another. Tests give a :class:`ManualClock` and move it by hand instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


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
    the clock to be moved, unless ``autoadvance``."""

    def __init__(self, start: datetime | None = None, *, autoadvance: bool = False) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError(f"start must be timezone-aware, got {start!r}")
        # From the real time by default, so that what it stamps reads sensibly beside the real clock.
        self._start = start or datetime.now(UTC)
        self._elapsed = 0.0
        self._autoadvance = autoadvance
        self._owner = threading.get_ident()
        self._moved = threading.Condition()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)

    def monotonic(self) -> float:
        return self._elapsed

    def advance(self, by: timedelta | float) -> None:
        """Move the clock forward by ``by`` (seconds, or a timedelta >= 0)."""
        seconds = by.total_seconds() if isinstance(by, timedelta) else float(by)
        if seconds < 0:
            raise ValueError(f"a clock moves forward only; got {seconds} s")
        with self._moved:
            self._elapsed += seconds
            self._moved.notify_all()

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
        """As :meth:`sleep`, and then whether ``event`` is set: it is looked at once the clock has
        moved past the end, or at once when it is already set."""
        if not event.is_set():
            self.sleep(seconds)
        return event.is_set()
