"""Competing Python gets: several processes getting from one consumer group at once, as several
MQGET applications serving one queue do. Every message is delivered once, none counts a failure,
and each message group is delivered in logical order across the getters."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest

from mqspark import MQError, QueueManager
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.pending import PendingMessages
from mqspark.qmgr import engine

MESSAGES = 100
GROUPS = 5
GROUP_SIZE = 4
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
            for payload, seq in zip(got["payload"].to_pylist(), got["delivery_seq"].to_pylist(), strict=True):
                lines.write(f"got {payload.decode()} {seq}\n")
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
    for group in range(GROUPS):
        items = [
            {"payload": f"g{group}-{i}", "group_id": f"G{group}", "msg_seq_number": i + 1} for i in range(GROUP_SIZE)
        ]
        items[-1]["last_in_group"] = True
        qm.put("Q", items)
    grouped = [f"g{group}-{item}" for group in range(GROUPS) for item in range(GROUP_SIZE)]

    lines = _run(tmp_path / "qm", tmp_path)

    assert [line for line in lines if line.startswith("refused ")] == []
    delivered = [line.split()[1:] for line in lines if line.startswith("got ")]
    assert sorted(payload for payload, _ in delivered) == sorted([f"m{n}" for n in range(MESSAGES)] + grouped)
    # A group goes to one get at a time: its items' delivery numbers follow the group's order.
    for group in range(GROUPS):
        items = sorted((int(seq), payload) for payload, seq in delivered if payload.startswith(f"g{group}-"))
        assert [payload for _, payload in items] == [f"g{group}-{item}" for item in range(GROUP_SIZE)]
    assert qm.depth("Q", "workers") == 0
    assert qm.depth(engine(qm).dead_letter_queue) == 0
    # A race between healthy getters is not a failed delivery: nothing backed out or rolled back.
    state = ConsumerState(qm.root, "Q", engine(qm).storage_options)
    assert state.events("workers", ("backout", "rollback"), ["event", "origin", "row"]).to_pylist() == []


def test_a_first_get_that_found_no_state_table_does_not_deliver_what_another_get_took_meanwhile(qm, monkeypatch):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "m0"}, {"payload": "m1"}])
    other = QueueManager.open(qm.root)
    taken = []
    real_load = PendingMessages.load

    def load_then_another_get(self, consumed, up_to=None, lanes=None):
        real_load(self, consumed, up_to, lanes)
        if not taken:  # right after this get's first look: another get takes m0
            taken.append(None)
            worker = threading.Thread(target=lambda: taken.append(other.get("Q", "workers")))
            worker.start()
            worker.join()

    monkeypatch.setattr(PendingMessages, "load", load_then_another_get)
    got = qm.get("Q", "workers")
    assert [p.decode() for p in taken[1]["payload"].to_pylist()] == ["m0"]
    assert [p.decode() for p in got["payload"].to_pylist()] == ["m1"]
