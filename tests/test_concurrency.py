"""Two processes putting to one queue at once lose nothing and double nothing."""

from __future__ import annotations

import multiprocessing
from collections import Counter

import pytest

from mqspark import QueueManager

PUTS_PER_PROCESS = 15
MESSAGES_PER_PUT = 4


def _producer(root: str, name: str) -> None:
    qm = QueueManager.open(root)
    for put in range(PUTS_PER_PROCESS):
        qm.put("SHARED", [{"payload": f"{name}-{put}-{n}", "correl_id": name} for n in range(MESSAGES_PER_PUT)])


@pytest.mark.slow
def test_two_processes_putting_at_once_lose_nothing(qm):
    qm.define_queue("SHARED")
    # spawn, not fork: a forked child using deltalake after its parent did panics.
    context = multiprocessing.get_context("spawn")
    producers = [context.Process(target=_producer, args=(qm.root, name)) for name in ("P1", "P2")]
    for process in producers:
        process.start()
    for process in producers:
        process.join(timeout=120)
    assert [process.exitcode for process in producers] == [0, 0]

    messages = qm.browse("SHARED")
    payloads = [payload.decode() for payload in messages["payload"].to_pylist()]
    expected = {
        f"{name}-{put}-{n}" for name in ("P1", "P2") for put in range(PUTS_PER_PROCESS) for n in range(MESSAGES_PER_PUT)
    }
    assert Counter(payloads) == Counter(expected)
    assert qm.depth("SHARED") == len(expected)
    # Each producer's own messages stay in the order it put them.
    for name in ("P1", "P2"):
        own = [p for p in payloads if p.startswith(name)]
        assert own == [f"{name}-{put}-{n}" for put in range(PUTS_PER_PROCESS) for n in range(MESSAGES_PER_PUT)]


def _filler(root: str, name: str) -> None:
    qm = QueueManager.open(root)
    try:
        while True:
            qm.put("SMALL", [{"payload": name}])
    except Exception as error:  # noqa: BLE001 - the parent checks the reason
        assert "MQRC_Q_FULL (2053)" in str(error), error


@pytest.mark.slow
def test_concurrent_puts_never_exceed_max_depth(qm):
    qm.define_queue("SMALL", max_depth=20)
    context = multiprocessing.get_context("spawn")
    fillers = [context.Process(target=_filler, args=(qm.root, name)) for name in ("F1", "F2")]
    for process in fillers:
        process.start()
    for process in fillers:
        process.join(timeout=120)
    assert [process.exitcode for process in fillers] == [0, 0]
    assert qm.depth("SMALL") == 20
    assert qm.browse("SMALL").num_rows == 20
