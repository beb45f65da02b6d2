"""The clock tests move by hand: it moves only when told, and a sleep elsewhere waits for it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from mqspark.clock import SYSTEM_CLOCK, ManualClock

START = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def test_it_moves_only_when_advanced():
    clock = ManualClock(START)
    assert (clock.now(), clock.monotonic()) == (START, 0.0)
    clock.advance(timedelta(seconds=1.5))
    clock.advance(2)
    assert (clock.now(), clock.monotonic()) == (START + timedelta(seconds=3.5), 3.5)


def test_a_sleep_in_its_own_thread_moves_it():
    clock = ManualClock(START)
    clock.sleep(0.25)
    assert clock.now() == START + timedelta(seconds=0.25)


def test_a_sleep_in_another_thread_waits_until_it_is_moved_past_its_end():
    clock = ManualClock(START)
    woke = threading.Event()
    sleeper = threading.Thread(target=lambda: (clock.sleep(10), woke.set()))
    sleeper.start()
    clock.advance(9.999)
    # The sleeper is still asleep: it wakes only once the clock passed its end.
    assert not woke.wait(0.2)
    clock.advance(0.001)
    assert woke.wait(10)
    sleeper.join()
    assert clock.monotonic() == pytest.approx(10.0)


def test_wait_returns_at_once_on_a_set_event_and_else_after_the_clock_moved():
    clock = ManualClock(START)
    event = threading.Event()
    assert clock.wait(event, 5) is False
    assert clock.monotonic() == 5
    event.set()
    assert clock.wait(event, 5) is True
    assert clock.monotonic() == 5


def test_it_refuses_to_go_back_or_a_naive_start():
    with pytest.raises(ValueError, match="a clock moves forward only; got -1.0 s"):
        ManualClock(START).advance(-1)
    with pytest.raises(ValueError, match="start must be timezone-aware"):
        ManualClock(datetime(2026, 1, 1))


def test_the_system_clock_reads_utc():
    assert SYSTEM_CLOCK.now().tzinfo is UTC
