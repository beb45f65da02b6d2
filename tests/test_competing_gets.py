"""Competing Python gets: several processes getting from one consumer group at once, as several
MQGET applications serving one queue do. Every message is delivered once, none counts a failure."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from mqspark import MQError, QueueManager
from mqspark.engine.consumer_groups import ConsumerState

MESSAGES = 100
GETTERS = 4
RUNS = 2


def _getter(root: str, number: int, out: str) -> None:
    """Get with ``max_messages`` 1, 2 or 3 until the group has nothing left, writing each delivered
    payload, and each refused get, as a line of ``out``."""
    qm = QueueManager.open(root)
    with open(out, "w") as lines:
        while True:
            try:
                got = qm.get("Q", consumer="workers", max_messages=1 + number % 3)
            except MQError as error:
                lines.write(f"refused {error}\n")
                lines.flush()
                continue
            for payload in got["payload"].to_pylist():
                lines.write(f"got {payload.decode()}\n")
            lines.flush()
            if got.num_rows == 0 and qm.depth("Q", "workers") == 0:
                return


def _run(root: Path, out: Path) -> list[str]:
    context = multiprocessing.get_context("spawn")  # a forked child using deltalake after its parent panics
    files = [out / f"getter-{number}.txt" for number in range(GETTERS)]
    getters = [context.Process(target=_getter, args=(str(root), n, str(f))) for n, f in enumerate(files)]
    for process in getters:
        process.start()
    for process in getters:
        process.join(timeout=300)
    assert [process.exitcode for process in getters] == [0] * GETTERS
    return [line for file in files for line in file.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("run", range(RUNS))
def test_competing_gets_deliver_every_message_once_and_fail_none(tmp_path, run):
    qm = QueueManager.create(tmp_path / "qm", "QM1")
    qm.define_queue("Q", backout_threshold=1)
    qm.put("Q", [{"payload": f"m{n}"} for n in range(MESSAGES)])

    lines = _run(tmp_path / "qm", tmp_path)

    delivered = sorted(line.split()[1] for line in lines if line.startswith("got "))
    assert delivered == sorted(f"m{n}" for n in range(MESSAGES))
    # Gets of one group take turns on its lease; one that waited longer than its patience for its
    # turn is refused (documented). Nothing else may refuse: "taken over" was two gets holding at once.
    refused = [line for line in lines if line.startswith("refused ")]
    assert [line for line in refused if "is being read by a Python get" not in line] == []
    assert qm.depth("Q", "workers") == 0
    assert qm.depth(qm.dead_letter_queue) == 0
    # A race between healthy getters is not a failed delivery: nothing backed out or rolled back.
    state = ConsumerState(qm.root, "Q", qm.storage_options)
    assert state.events("workers", ("backout", "rollback"), ["event", "origin", "row"]).to_pylist() == []
