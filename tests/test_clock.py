"""The clock tests move by hand: it moves only when told, a sleep elsewhere waits for it, and what
is scheduled on it runs when it gets there."""

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


def test_a_wait_in_another_thread_ends_when_its_event_is_set_without_the_clock_moving():
    clock = ManualClock(START)
    event, waited = threading.Event(), []
    waiter = threading.Thread(target=lambda: waited.append(clock.wait(event, 10)))
    waiter.start()
    # Asleep on the clock (its end not reached), until the event is set.
    waiter.join(0.2)
    assert waiter.is_alive()
    event.set()
    waiter.join(10)
    assert (waiter.is_alive(), waited, clock.monotonic()) == (False, [True], 0.0)


def test_it_refuses_to_go_back_or_a_naive_start():
    with pytest.raises(ValueError, match="a clock moves forward only; got -1.0 s"):
        ManualClock(START).advance(-1)
    with pytest.raises(ValueError, match="start must be timezone-aware"):
        ManualClock(datetime(2026, 1, 1))


def test_the_system_clock_reads_utc():
    assert SYSTEM_CLOCK.now().tzinfo is UTC


def test_after_runs_each_action_once_at_its_moment_in_the_order_of_the_moments():
    clock = ManualClock(START)
    ran: list[tuple[str, float]] = []

    def action(name: str):
        return lambda: ran.append((name, clock.monotonic()))

    clock.after(3, action("third"))
    clock.after(1, action("first"))
    clock.after(2, action("second"))
    clock.after(5, action("later"))
    clock.advance(4)
    assert ran == [("first", 1.0), ("second", 2.0), ("third", 3.0)]
    assert clock.monotonic() == 4
    clock.advance(0.5)
    assert ran[3:] == []
    # A sleep in the clock's own thread moves it, and so runs what falls due.
    clock.sleep(0.5)
    assert ran[3:] == [("later", 5.0)]
    clock.advance(10)
    assert len(ran) == 4


def test_after_runs_actions_of_the_same_moment_in_the_order_they_were_scheduled():
    clock = ManualClock(START)
    ran: list[str] = []
    for name in ("a", "b", "c"):
        clock.after(1.5, lambda name=name: ran.append(name))
    clock.after(0, lambda: ran.append("now"))
    clock.advance(0)
    assert ran == ["now"]
    clock.advance(timedelta(seconds=1.5))
    assert ran == ["now", "a", "b", "c"]


def test_an_action_may_schedule_another_which_runs_in_the_same_advance_if_it_falls_within_it():
    clock = ManualClock(START)
    ran: list[tuple[str, float]] = []

    def first() -> None:
        ran.append(("first", clock.monotonic()))
        clock.after(0.5, lambda: ran.append(("within", clock.monotonic())))
        clock.after(2, lambda: ran.append(("beyond", clock.monotonic())))

    clock.after(1, first)
    clock.after(1.75, lambda: ran.append(("between", clock.monotonic())))
    clock.advance(2)
    assert ran == [("first", 1.0), ("within", 1.5), ("between", 1.75)]
    assert clock.monotonic() == 2
    clock.advance(1)
    assert ran[3:] == [("beyond", 3.0)]


def test_after_refuses_a_moment_in_the_past():
    with pytest.raises(ValueError, match="a clock moves forward only; got -1 s"):
        ManualClock(START).after(-1, lambda: None)


def test_an_actions_error_ends_the_advance_at_its_moment_and_reaches_the_caller():
    clock = ManualClock(START)
    ran: list[float] = []

    def fail() -> None:
        raise RuntimeError("outage did not end")

    clock.after(1, fail)
    clock.after(2, lambda: ran.append(clock.monotonic()))
    with pytest.raises(RuntimeError, match="outage did not end"):
        clock.advance(3)
    assert (clock.monotonic(), ran) == (1.0, [])
    clock.advance(2)
    assert (clock.monotonic(), ran) == (3.0, [2.0])
