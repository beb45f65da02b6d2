"""The console's reader process: answers computed apart from the serving process, at the lowest CPU
priority, the process replaced when it dies, ended when idle or when the console is killed, and its
errors raised to the caller as they were."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqspark import MQError, QueueManager
from mqspark.clock import ManualClock
from mqspark.console.reader import NICE, Reader

from .support.processes import (
    free_port,
    marked_processes,
    nice_values,
    scheduling_policies,
    spawned_children,
    start_server,
    stop_server,
)

# Every test starts reader processes (a process pool's spawned workers).
pytestmark = pytest.mark.slow


@pytest.fixture
def reader(qm: QueueManager) -> Iterator[Reader]:
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"a"}, {"payload": b"b"}])
    kept = Reader([qm.root])
    yield kept
    kept.close()


def _readers() -> list[int]:
    """The reader processes this process started (the pool's spawned workers)."""
    return spawned_children(os.getpid())


def _wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.05)


def _depth(reader: Reader) -> int:
    return next(row["depth"] for row in reader.read("queues", "QM1") if row["name"] == "Q")


def test_answers_are_read_in_another_process_whose_every_thread_has_the_lowest_priority(reader: Reader) -> None:
    assert _depth(reader) == 2
    [pid] = _readers()
    assert pid != os.getpid()
    threads = list(Path(f"/proc/{pid}/task").iterdir())
    assert (len(threads) > 1, nice_values(pid), scheduling_policies(pid)) == (True, {NICE}, {os.SCHED_IDLE})
    assert os.getpriority(os.PRIO_PROCESS, 0) != NICE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE


def test_a_killed_reader_process_is_replaced_and_the_read_answered(qm: QueueManager, reader: Reader) -> None:
    assert _depth(reader) == 2
    [first] = _readers()
    os.kill(first, signal.SIGKILL)
    _wait_for(lambda: first not in _readers())
    qm.put("Q", [{"payload": b"c"}])
    assert _depth(reader) == 3
    assert first not in _readers()


def test_an_error_in_the_reader_process_is_raised_with_its_reason_and_text(reader: Reader) -> None:
    with pytest.raises(MQError) as raised:
        reader.read("queue", "QM1", "NOPE")
    assert (raised.value.reason, str(raised.value)) == (
        2085,
        "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1",
    )
    assert _depth(reader) == 2


def test_a_closed_reader_refuses_reads_and_leaves_no_process(reader: Reader) -> None:
    assert _depth(reader) == 2
    reader.close()
    assert _readers() == []
    with pytest.raises(MQError, match="^console: the reader is closed$"):
        reader.read("qmgrs")


def test_a_reader_process_asked_nothing_for_its_idle_time_ends_and_the_next_read_starts_one(qm: QueueManager) -> None:
    qm.define_queue("Q")
    clock = ManualClock()
    reader = Reader([qm.root], idle=60, clock=clock)
    try:
        assert _depth(reader) == 0
        [first] = _readers()
        clock.advance(59)
        assert _depth(reader) == 0  # a read starts the idle time again
        clock.advance(59)
        assert _depth(reader) == 0
        assert _readers() == [first]
        clock.advance(61)
        _wait_for(lambda: _readers() == [])
        qm.put("Q", [{"payload": b"a"}])
        assert _depth(reader) == 1
        assert _readers() not in ([], [first])
    finally:
        reader.close()


def test_the_reader_process_of_a_killed_console_ends(qm: QueueManager, tmp_path: Path, monkeypatch) -> None:
    qm.define_queue("Q")
    token = uuid.uuid4().hex
    monkeypatch.setenv("MQSPARK_TEST_RUN", token)
    port = free_port()
    command = [sys.executable, "-m", "mqspark.cli", "console", "--root", qm.root, "--port", str(port)]
    console = start_server(command, tmp_path / "console.log", port, "the console")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/qmgr/QM1/queue", timeout=30) as answer:
            assert answer.status == 200
        started = [pid for pid in marked_processes(token) if pid != console.pid]
        assert started != []
        os.kill(console.pid, signal.SIGKILL)
        console.wait(30)
        _wait_for(lambda: marked_processes(token) == [])
    finally:
        stop_server(console)
        subprocess.run(["pkill", "-KILL", "-s", str(console.pid)], check=False)
