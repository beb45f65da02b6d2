"""Shared gets (mqspark.engine.shared_gets): plain gets of several processes from one consumer group
served by one holder in one state commit, each its share in logical order, requests in arrival
order; a holder killed mid-round loses and doubles nothing, and a request whose getter is gone is
dropped before it is planned.

Waiting getters are threads of the test where a case needs them to ask while the lock is held (each
thread's lock is its own, as another process's would be); holders killed mid-round are real
processes (``spawn``: deltalake panics in forked children)."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from mqspark import MQError, QueueManager, Reason, store
from mqspark.engine import get as engine_get
from mqspark.engine import shared_gets
from mqspark.engine.maintenance import maintain
from mqspark.engine.state_table import CONSUMED_KEY
from mqspark.store.log import commit_info

CONTEXT = multiprocessing.get_context("spawn")
PATIENCE = 120


def _wait_for(condition, what: str, timeout: float = PATIENCE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.01)


def _folder(root: str, consumer: str = "c") -> str:
    return os.path.join(store.state_location(root, "Q"), store.GETS_FOLDER, consumer)


def _payloads(table: pa.Table) -> list[str]:
    return [bytes(p).decode() for p in table["payload"].to_pylist()]


def _consumed_commits(root: str) -> list[list[str]]:
    """The plans each commit of the queue's state table names consumed, oldest first."""
    location = store.state_location(root, "Q")
    infos = [commit_info(location, version) for version in range(store.newest_version(location) + 1)]
    return [info[CONSUMED_KEY] for info in infos if CONSUMED_KEY in info]


@pytest.fixture
def queue(qm) -> tuple[QueueManager, store.GetRequests]:
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"m{number}"} for number in range(6)])
    assert _payloads(qm.get("Q", consumer="c")) == ["m0"]  # the group and its state table
    return qm, store.GetRequests(_folder(qm.root))


def _ask_in_threads(qm, requests: store.GetRequests, wants: list[int], monkeypatch) -> tuple[list, list]:
    """Get ``wants[i]`` messages from a thread of its own each, asked one after another while the
    test holds the lock, then let go; what each got, and what each raised."""
    monkeypatch.setattr(shared_gets, "HOLDER_PATIENCE", PATIENCE)
    got: list = [None] * len(wants)
    errors: list = [None] * len(wants)

    def get(number: int) -> None:
        try:
            got[number] = _payloads(qm.get("Q", consumer="c", max_messages=wants[number]))
        except MQError as error:
            errors[number] = error

    assert requests.lock.try_lock()
    threads = []
    try:
        for number in range(len(wants)):
            threads.append(threading.Thread(target=get, args=(number,)))
            threads[-1].start()
            _wait_for(lambda n=number: len(requests.wanted()) == n + 1, f"get {number} asked")
    finally:
        requests.lock.unlock()
    for thread in threads:
        thread.join(PATIENCE)
    return got, errors


def test_gets_asked_while_the_lock_is_held_are_served_in_one_commit_in_arrival_order(queue, monkeypatch):
    qm, requests = queue
    before = len(_consumed_commits(qm.root))
    got, errors = _ask_in_threads(qm, requests, [1, 2, 1], monkeypatch)
    assert (got, errors) == ([["m1"], ["m2", "m3"], ["m4"]], [None, None, None])
    # One plan of the three gets' four messages, in one commit.
    assert [len(plans) for plans in _consumed_commits(qm.root)[before:]] == [1]
    assert _payloads(qm.get("Q", consumer="c", max_messages=5)) == ["m5"]
    assert sorted(os.listdir(requests.folder)) == [".lock", ".round"]


def test_a_get_alone_takes_the_lock_and_leaves_no_request(queue):
    qm, requests = queue
    assert _payloads(qm.get("Q", consumer="c", max_messages=2)) == ["m1", "m2"]
    assert sorted(os.listdir(requests.folder)) == [".lock", ".round"]


def test_a_request_whose_getter_is_gone_is_dropped_and_its_messages_stay(queue):
    qm, requests = queue
    name, descriptor = requests.request(2)
    os.close(descriptor)  # its getter died after asking
    assert _payloads(qm.get("Q", consumer="c")) == ["m1"]
    assert qm.depth("Q", consumer="c") == 4
    assert sorted(os.listdir(requests.folder)) == [".lock", ".round"]


def test_a_refusal_of_the_holders_get_refuses_each_request_with_its_reason(queue, monkeypatch):
    qm, requests = queue
    monkeypatch.setattr(shared_gets, "HOLDER_PATIENCE", PATIENCE)
    errors: list = []

    def get() -> None:
        try:
            qm.get("Q", consumer="c")
        except MQError as error:
            errors.append(error)

    def refuse(max_messages: int, share) -> pa.Table:
        raise MQError("get: queue Q: consumer group 'c' is already being read", Reason.MQRC_OBJECT_IN_USE)

    assert requests.lock.try_lock()
    try:
        asking = [threading.Thread(target=get) for _ in range(2)]
        for thread in asking:
            thread.start()
        _wait_for(lambda: len(requests.wanted()) == 2, "two gets asked")
        with pytest.raises(MQError) as refused:
            shared_gets._hold(requests, store.state_location(qm.root, "Q"), refuse, own=1)
    finally:
        requests.lock.unlock()
    for thread in asking:
        thread.join(PATIENCE)
    assert refused.value.reason == Reason.MQRC_OBJECT_IN_USE
    assert [(error.reason, error.detail) for error in errors] == [(refused.value.reason, refused.value.detail)] * 2
    assert qm.depth("Q", consumer="c") == 5


def test_a_get_through_an_alias_gets_alone(queue, monkeypatch):
    qm, requests = queue
    qm.define_queue("A", type="alias", target_queue="Q")
    monkeypatch.setattr(shared_gets, "HOLDER_PATIENCE", PATIENCE)
    assert requests.lock.try_lock()
    try:
        assert _payloads(qm.get("A", consumer="c")) == ["m1"]
        assert requests.wanted() == []
    finally:
        requests.lock.unlock()


def _holder_stopped_at(root: str, point: str, signals: str) -> None:
    """Take the group's lock, wait for a get to be asked, and serve it in a round, stopping for good
    at ``point``: "share" (its share written, the plan not committed) or "commit" (committed, the
    share not yet given). Writes ``signals``/locked and ``signals``/stopped as it gets there."""
    qm = QueueManager.open(root)
    requests = store.GetRequests(_folder(root))
    assert requests.lock.try_lock()
    Path(signals, "locked").touch()
    _wait_for(lambda: requests.wanted(), "a get asked")

    def stop() -> None:
        Path(signals, "stopped").touch()
        time.sleep(PATIENCE * 10)

    def serve(max_messages: int, share) -> pa.Table:
        def stop_after_share(plan_id: str, messages: pa.Table) -> None:
            share(plan_id, messages)
            if point == "share":
                stop()

        request = engine_get.GetRequest("Q", "c", max_messages)
        engine_get.plan_get(qm._queues, request, consume=True, share=stop_after_share)
        stop()
        raise AssertionError("not reached")

    shared_gets._hold(requests, store.state_location(root, "Q"), serve)


@pytest.mark.parametrize("point", ["share", "commit"])
def test_a_get_served_by_a_holder_killed_mid_round_gets_its_message_once(queue, tmp_path, monkeypatch, point):
    """The holder is SIGKILLed after writing the get's share, before its commit (the plan did not
    land: the get is asked again) or after it (the next holder gives the share by the log): the get
    returns the first message either way, and the next get the second."""
    qm, requests = queue
    monkeypatch.setattr(shared_gets, "HOLDER_PATIENCE", PATIENCE)
    got: list = []
    holder = CONTEXT.Process(target=_holder_stopped_at, args=(qm.root, point, str(tmp_path)))
    holder.start()
    try:
        _wait_for(lambda: (tmp_path / "locked").exists(), "the holder took the lock")
        getting = threading.Thread(target=lambda: got.append(_payloads(qm.get("Q", consumer="c"))))
        getting.start()
        _wait_for(lambda: (tmp_path / "stopped").exists(), f"the holder stopped at its {point}")
        os.kill(holder.pid, signal.SIGKILL)
        getting.join(PATIENCE)
        assert (getting.is_alive(), got) == (False, [["m1"]])
    finally:
        holder.kill()
        holder.join(PATIENCE)
    assert _payloads(qm.get("Q", consumer="c")) == ["m2"]
    assert qm.depth("Q", consumer="c") == 3
    assert sorted(os.listdir(requests.folder)) == [".lock", ".round"]


def test_maintenance_removes_what_getters_killed_while_asking_left(queue):
    qm, requests = queue
    gone, descriptor = requests.request(1)
    os.close(descriptor)
    alive, held = requests.request(1)
    old = time.time() - 3600
    for name in (gone, alive):
        os.utime(os.path.join(requests.folder, f"{name}.want"), (old, old))
    try:
        summary = maintain(qm._queues, qm._queues.resolve("Q"), timedelta(0))
        assert summary.leftovers_removed >= 1
        assert requests.wanted() == [alive]
    finally:
        requests.forget(alive, held)


def test_the_state_tables_history_stays_while_a_share_waits_to_be_settled(qm):
    """A holder died with a share written long ago and unsettled: the log entries that tell whether
    its plan landed stay through the state table's trims until it is settled."""
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"m{number}"} for number in range(500)])
    location = store.state_location(qm.root, "Q")
    log = Path(location, "_delta_log")
    requests = store.GetRequests(_folder(qm.root))

    def get_until(version: int) -> None:
        while store.newest_version(location) < version:
            assert qm.get("Q", consumer="c").num_rows == 1

    def age_the_log() -> None:
        old = time.time() - 3600
        for entry in log.glob("*.json"):
            os.utime(entry, (old, old))

    get_until(150)
    name, descriptor = requests.request(1)
    os.close(descriptor)
    assert requests.take(name) is None  # its getter is gone: dropped; a share is written as a holder would
    Path(requests.folder, f"{name}.tentative").write_bytes(b"")
    old = time.time() - 3600
    os.utime(Path(requests.folder, f"{name}.tentative"), (old, old))
    age_the_log()
    get_until(230)  # past a compaction that trims (one in ten, at versions 200-219)
    assert (log / f"{0:020d}.json").exists()
    os.unlink(Path(requests.folder, f"{name}.tentative"))
    age_the_log()
    get_until(430)
    assert not (log / f"{0:020d}.json").exists()


def _getter(root: str, name: str, log: str) -> None:
    """Get one message at a time, logging each get's message as it returns."""
    qm = QueueManager.open(root)
    with open(log, "a") as out:
        while True:
            for payload in _payloads(qm.get("Q", consumer="c")):
                out.write(f"{name} {payload}\n")
                out.flush()


@pytest.mark.slow
def test_getters_killed_with_sigkill_deliver_no_message_twice_and_lose_only_a_killed_gets(qm, tmp_path):
    """Four getters get one message at a time; one at a time is SIGKILLed at whatever moment its get
    is in (asking, holding others' requests, committing, answering) and started again under a new
    name. No message is delivered twice; a message is missing only where a getter was killed mid-get
    (at most one per kill); each getter's messages come in the queue's order."""
    qm.define_queue("Q")
    count, kills = 600, 8
    qm.put("Q", [{"payload": f"{number:04d}"} for number in range(count)])
    rng = random.Random(20261205)
    log = tmp_path / "got.log"
    log.touch()
    running: dict[int, multiprocessing.Process] = {}
    names = iter(f"G{number}" for number in range(100))

    def start(slot: int) -> None:
        running[slot] = CONTEXT.Process(target=_getter, args=(qm.root, next(names), str(log)))
        running[slot].start()

    def lines() -> list[str]:
        return [line for line in log.read_text().splitlines() if line.endswith(tuple("0123456789"))]

    for slot in range(4):
        start(slot)
    try:
        for _ in range(kills):
            target = len(lines()) + rng.randint(5, 30)
            _wait_for(lambda target=target: len(lines()) >= target, "gets going on")
            slot = rng.randrange(4)
            os.kill(running[slot].pid, signal.SIGKILL)
            running[slot].join(30)
            start(slot)
        _wait_for(lambda: qm.depth("Q", consumer="c") == 0, "the queue drained")
    finally:
        for process in running.values():
            process.kill()
            process.join(30)
    delivered = [line.split() for line in lines()]
    payloads = [payload for _, payload in delivered]
    print(f"\n{count - len(payloads)} messages lost with the gets of {kills} killed getters")
    assert [p for p, n in Counter(payloads).items() if n > 1] == []
    assert count - len(payloads) <= kills
    by_getter: dict[str, list[str]] = {}
    for getter, payload in delivered:
        by_getter.setdefault(getter, []).append(payload)
    assert all(got == sorted(got) for got in by_getter.values()), by_getter
