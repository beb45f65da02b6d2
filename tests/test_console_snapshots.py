"""The console's polled answers: computed once for many clients, refreshed in the background while
asked for, errors never kept, and dropped when what they show changed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from mqspark.console.snapshots import NotReady, Snapshots, ready_only


def _wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.01)


@pytest.fixture
def snapshots():
    kept = Snapshots(refresh=0.2, idle=60.0)
    yield kept
    kept.close()


def test_an_answer_is_refreshed_in_the_background_while_clients_are_served_the_last_one(snapshots) -> None:
    computed = []
    release = threading.Event()

    def compute() -> int:
        computed.append(threading.current_thread().name)
        if len(computed) > 1:
            release.wait(30)
        return len(computed)

    first = snapshots.get(("k",), compute)
    assert first.value == 1
    _wait_for(lambda: len(computed) == 2)
    # The refresher computes the second answer; clients are served the first meanwhile, at once.
    started = time.monotonic()
    assert [snapshots.get(("k",), compute).value for _ in range(5)] == [1] * 5
    assert time.monotonic() - started < 5
    release.set()
    _wait_for(lambda: snapshots.get(("k",), compute).value >= 2)
    # Each answer is dated by its computation.
    assert snapshots.get(("k",), compute).at > first.at
    assert computed[0] == threading.current_thread().name
    assert set(computed[1:]) == {"console-refresh"}


def test_a_failed_computation_is_not_kept(snapshots) -> None:
    answers = iter([ValueError("queue Q: unreadable"), 7])

    def compute() -> int:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with pytest.raises(ValueError, match="queue Q: unreadable"):
        snapshots.get(("k",), compute)
    assert snapshots.get(("k",), compute).value == 7


def test_a_failed_refresh_drops_the_answer_and_the_next_client_sees_the_error(snapshots) -> None:
    calls = []

    def compute() -> int:
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("queue Q was deleted")
        return 1

    assert snapshots.get(("k",), compute).value == 1
    _wait_for(lambda: len(calls) >= 2)
    # The refresher failed: the answer goes, and the client computes (and fails) itself.
    _wait_for(lambda: ("k",) not in snapshots._answers)
    with pytest.raises(ValueError, match="queue Q was deleted"):
        snapshots.get(("k",), compute)


def test_clients_asking_at_once_for_the_same_answer_compute_it_once(snapshots) -> None:
    computed = []
    start = threading.Barrier(20)

    def compute() -> list[int]:
        computed.append(1)
        time.sleep(0.3)
        return [len(computed)]

    def ask() -> list[int]:
        start.wait()
        return snapshots.get(("same",), compute).value

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: ask(), range(20)))
    assert (len(computed), answers) == (1, [[1]] * 20)


def test_a_forgotten_answer_is_computed_again_for_the_next_client() -> None:
    kept = Snapshots(refresh=3600.0, idle=3600.0)
    try:
        values = iter([1, 2])
        assert kept.get(("queue", "QM1", "Q"), lambda: next(values)).value == 1
        kept.forget(lambda key: key[1] == "QM2")
        assert kept.get(("queue", "QM1", "Q"), lambda: next(values)).value == 1
        kept.forget(lambda key: key[1] == "QM1")
        assert kept.get(("queue", "QM1", "Q"), lambda: next(values)).value == 2
    finally:
        kept.close()


def test_an_answer_nobody_asks_for_is_dropped() -> None:
    kept = Snapshots(refresh=0.05, idle=0.3)
    try:
        calls = []
        kept.get(("k",), lambda: calls.append(1))
        _wait_for(lambda: ("k",) not in kept._answers)
        assert len(calls) >= 2
        assert kept.get(("k",), lambda: "again").value == "again"
    finally:
        kept.close()


def test_inside_ready_only_an_answer_not_computed_yet_is_neither_computed_nor_waited_for() -> None:
    kept = Snapshots(refresh=3600.0, idle=3600.0)
    try:
        computing, release = threading.Event(), threading.Event()

        def slow() -> str:
            computing.set()
            release.wait(30)
            return "computed"

        with ready_only(), pytest.raises(NotReady):
            kept.get(("k",), lambda: pytest.fail("computed inside ready_only"))
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(kept.get, ("k",), slow)
            assert computing.wait(30)
            # Being computed by another client: not waited for.
            with ready_only(), pytest.raises(NotReady):
                kept.get(("k",), slow)
            release.set()
            assert first.result(30).value == "computed"
        with ready_only():
            assert kept.get(("k",), lambda: pytest.fail("computed again")).value == "computed"
        # Outside the block, an answer not computed yet is computed as before.
        assert kept.get(("other",), lambda: "new").value == "new"
    finally:
        kept.close()


def test_while_the_machine_is_busy_an_answer_is_refreshed_only_every_busy_refresh_seconds() -> None:
    busy = threading.Event()
    busy.set()
    kept = Snapshots(refresh=0.05, idle=60.0, busy=busy.is_set, busy_refresh=0.6)
    try:
        computed: list[float] = []

        def compute() -> int:
            computed.append(time.monotonic())
            return len(computed)

        kept.get(("k",), compute)
        _wait_for(lambda: len(computed) >= 3)
        busy.clear()
        counted = len(computed)
        _wait_for(lambda: len(computed) >= counted + 3)
        gaps = [later - earlier for earlier, later in zip(computed, computed[1:], strict=False)]
        # Busy: 0.6 s apart at least; then, as often as ``refresh`` says (well within 0.6 s).
        assert min(gaps[:2]) >= 0.6, gaps
        assert max(gaps[counted:]) < 0.6, gaps
    finally:
        kept.close()
