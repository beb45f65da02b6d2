"""Group commit across processes (mqspark.engine.staged_puts): puts of several processes to one local
queue in one commit, in arrival order, with every rule of the issue: max_depth checked at the commit,
a put that returned is in a landed commit, a put that raised left nothing, and a holder killed
mid-commit neither loses nor doubles a put.

The putters are real processes (``spawn``: deltalake panics in forked children). The test itself
holds the queue's commit lock where a case needs putters to stage: a holder that is slow, paused or
never lets go."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from mqspark import MQError, QueueManager, Reason, store
from mqspark.engine import staged_puts
from mqspark.engine.maintenance import maintain
from mqspark.model.groups import group_items
from mqspark.model.messages import QUEUE_TABLE_SCHEMA
from mqspark.model.put import prepare_put, rows_to_table
from mqspark.store.log import commit_info

CONTEXT = multiprocessing.get_context("spawn")
PATIENCE = 120


def _put_one(root: str, payload: str, result: str) -> None:
    """Put one message; write its msg_id, or the reason code that refused it, to ``result``."""
    qm = QueueManager.open(root)
    try:
        outcome = {"msg_id": qm.put("Q", [{"payload": payload}])[0]}
    except MQError as error:
        outcome = {"reason": int(error.reason or 0), "text": str(error)}
    Path(result).write_text(json.dumps(outcome))


def _wait_for(condition, what: str, timeout: float = PATIENCE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.01)


def _putters(root: str, tmp_path: Path, count: int) -> list[tuple[multiprocessing.Process, Path]]:
    runs = []
    for number in range(count):
        result = tmp_path / f"put-{number}.json"
        process = CONTEXT.Process(target=_put_one, args=(root, f"p{number}", str(result)))
        process.start()
        runs.append((process, result))
    return runs


def _results(runs: list[tuple[multiprocessing.Process, Path]]) -> list[dict]:
    for process, _ in runs:
        process.join(PATIENCE)
        assert process.exitcode == 0
    return [json.loads(result.read_text()) for _, result in runs]


def _put_commits(location: str) -> list[dict]:
    """The commitInfo of each put commit of the queue table, oldest first."""
    infos = [commit_info(location, version) for version in range(store.newest_version(location) + 1)]
    return [info for info in infos if info.get("mqspark.operation") == "put"]


@pytest.fixture
def queue(qm) -> tuple[QueueManager, str, store.Staging]:
    qm.define_queue("Q")
    location = store.queue_location(qm.root, "Q")
    return qm, location, store.Staging(location)


def _stage_in_threads(qm, staging: store.Staging, payloads: list[str], monkeypatch) -> list:
    """Put each payload through the staged commit from a thread of its own, one after another while
    the test holds the lock (each thread's lock is its own, as another process's would be), then
    let go; what each put raised, None for those that landed."""
    monkeypatch.setattr(staged_puts, "HOLDER_PATIENCE", PATIENCE)
    queues, location = qm._queues, store.queue_location(qm.root, "Q")
    definition = queues.resolve_for_put("Q")
    empty = _no_groups()
    errors: list = [None] * len(payloads)

    def put(number: int) -> None:
        try:
            staged_puts.commit(
                location,
                _prepared(qm, payloads[number]),
                lambda rows, metadata: queues.puts.commit_rows("Q", empty, definition, rows, metadata),
            )
        except MQError as error:
            errors[number] = error

    assert staging.lock.try_lock()
    threads = []
    try:
        for number in range(len(payloads)):
            threads.append(threading.Thread(target=put, args=(number,)))
            threads[-1].start()
            _wait_for(lambda n=number: len(staging.staged()) == n + 1, f"put {number} staged")
    finally:
        staging.lock.unlock()
    for thread in threads:
        thread.join(PATIENCE)
    return errors


def test_puts_staged_while_the_lock_is_held_land_in_one_commit_in_arrival_order(queue, monkeypatch):
    qm, location, staging = queue
    assert _stage_in_threads(qm, staging, ["p0", "p1", "p2"], monkeypatch) == [None, None, None]
    commits = _put_commits(location)
    assert [len(info[store.STAGED_KEY]) for info in commits] == [3]
    assert [bytes(p).decode() for p in qm.browse("Q")["payload"].to_pylist()] == ["p0", "p1", "p2"]
    assert sorted(os.listdir(staging.folder)) == [".lock", ".round"]


def test_when_the_staged_puts_together_do_not_fit_they_go_one_by_one_and_the_rest_are_refused(queue, monkeypatch):
    qm, location, staging = queue
    qm.alter_queue("Q", max_depth=2)
    errors = _stage_in_threads(qm, staging, ["p0", "p1", "p2"], monkeypatch)
    assert [error.reason if error else None for error in errors] == [None, None, Reason.MQRC_Q_FULL]
    assert "queue Q is full (max_depth 2, depth 2, put of 1)" in str(errors[2])
    assert [bytes(p).decode() for p in qm.browse("Q")["payload"].to_pylist()] == ["p0", "p1"]
    assert sorted(os.listdir(staging.folder)) == [".lock", ".round"]


def test_a_put_returns_when_its_round_ends_while_the_holder_keeps_the_lock(queue, monkeypatch):
    """A holder goes on holding the lock after the round that landed a staged put (it drains more
    rounds): the putter learns of its landing from the round's end, without taking the lock."""
    qm, location, staging = queue
    monkeypatch.setattr(staged_puts, "HOLDER_PATIENCE", PATIENCE)
    queues = qm._queues
    definition, empty = queues.resolve_for_put("Q"), _no_groups()

    def commit_rows(rows, metadata) -> None:
        queues.puts.commit_rows("Q", empty, definition, rows, metadata)

    assert staging.lock.try_lock()
    try:
        putting = threading.Thread(target=staged_puts.commit, args=(location, _prepared(qm, "p0"), commit_rows))
        putting.start()
        _wait_for(lambda: len(staging.staged()) == 1, "the put staged")
        assert staged_puts._hold(staging, commit_rows, None) == (1, None)
        putting.join(PATIENCE)
        assert not putting.is_alive()
        assert [bytes(p).decode() for p in qm.browse("Q")["payload"].to_pylist()] == ["p0"]
    finally:
        staging.lock.unlock()


def test_a_put_no_holder_claims_commits_alone_after_the_holder_patience(queue, tmp_path):
    """The lock's holder never lets go (a paused holder): the put takes its file back and commits alone."""
    qm, location, staging = queue
    assert staging.lock.try_lock()
    try:
        started = time.monotonic()
        results = _results(_putters(qm.root, tmp_path, 1))
        assert time.monotonic() - started >= staged_puts.HOLDER_PATIENCE
    finally:
        staging.lock.unlock()
    assert qm.browse("Q")["msg_id"].to_pylist() == [results[0]["msg_id"]]
    assert _put_commits(location)[0].get(store.STAGED_KEY) is None
    assert staging.staged() == []


def test_a_put_staged_by_a_process_that_died_is_committed_by_the_next_put_first(queue):
    qm, location, staging = queue
    staging.stage(_prepared(qm, "orphan"))
    qm.put("Q", [{"payload": "next"}])
    assert [bytes(p).decode() for p in qm.browse("Q")["payload"].to_pylist()] == ["orphan", "next"]
    assert staging.staged() == []


def test_a_put_staged_by_a_process_that_died_is_committed_by_a_get_once_it_waited_the_patience(queue):
    qm, location, staging = queue
    name = staging.stage(_prepared(qm, "orphan"))
    assert qm.get("Q", consumer="c").num_rows == 0
    assert staging.staged() == [name]
    aged = time.time() - staged_puts.HOLDER_PATIENCE - 1
    os.utime(os.path.join(staging.folder, f"{name}.arrow"), (aged, aged))
    got = qm.get("Q", consumer="c")
    assert [bytes(p).decode() for p in got["payload"].to_pylist()] == ["orphan"]


def test_maintenance_commits_what_a_dead_process_staged(queue):
    qm, location, staging = queue
    staging.stage(_prepared(qm, "orphan"))
    qm.maintain("Q")
    assert [bytes(p).decode() for p in qm.browse("Q")["payload"].to_pylist()] == ["orphan"]


def test_claims_of_a_holder_that_died_are_settled_by_the_log(queue):
    """A holder died after claiming two puts: one landed in its commit, the other did not. The next
    holder marks the first landed without committing it again, and commits the second."""
    qm, location, staging = queue
    landed, lost = staging.stage(_prepared(qm, "landed")), staging.stage(_prepared(qm, "lost"))
    assert staging.claim(landed) and staging.claim(lost)
    rows = staging.rows(landed)
    qm._queues.puts.commit_rows("Q", _no_groups(), qm._queues.resolve("Q"), rows, {store.STAGED_KEY: [landed]})
    qm.put("Q", [{"payload": "next"}])
    assert [bytes(p).decode() for p in qm.browse("Q")["payload"].to_pylist()] == ["landed", "lost", "next"]
    # Each once: the landed one was marked, the lost one committed with the next put.
    assert [info.get(store.STAGED_KEY) for info in _put_commits(location)] == [[landed], [lost]]
    assert staging.outcome(landed) == staging.outcome(lost) == store.staging.Outcome(landed=True)


def _holder_killed_after(root: str, point: str, signals: str) -> None:
    """Take the queue's commit lock, wait for a put to be staged, and commit it in a round, stopping
    for good after ``point``: "commit" (its claim not yet marked) or "mark" (marked landed, the
    round not ended). Writes ``signals``/locked and ``signals``/stopped as it gets there."""
    qm = QueueManager.open(root)
    staging = store.Staging(store.queue_location(root, "Q"))
    assert staging.lock.try_lock()
    Path(signals, "locked").touch()
    _wait_for(lambda: staging.staged(), "a put staged")
    staging.lock.start_round()
    names = [name for name in staging.staged() if staging.claim(name)]
    rows = staging.rows(names[0])
    qm._queues.puts.commit_rows("Q", _no_groups(), qm._queues.resolve("Q"), rows, {store.STAGED_KEY: names})
    if point == "mark":
        staging.land(names[0])
    Path(signals, "stopped").touch()
    time.sleep(PATIENCE * 10)


@pytest.mark.parametrize("point", ["commit", "mark"])
def test_a_put_staged_with_a_holder_killed_mid_round_returns_and_lands_once(queue, tmp_path, monkeypatch, point):
    """The holder is SIGKILLed with the put it claimed committed, before marking it (the next
    holder settles it by the log) or after (between the landed commit and the putter's return):
    the put returns, and its message is on the queue once."""
    qm, location, staging = queue
    monkeypatch.setattr(staged_puts, "HOLDER_PATIENCE", PATIENCE)
    queues = qm._queues
    definition, empty = queues.resolve_for_put("Q"), _no_groups()
    errors: list[BaseException] = []

    def put() -> None:
        try:
            staged_puts.commit(
                location,
                _prepared(qm, "p0"),
                lambda rows, info: queues.puts.commit_rows("Q", empty, definition, rows, info),
            )
        except BaseException as error:  # noqa: BLE001 - the test asserts there was none
            errors.append(error)

    holder = CONTEXT.Process(target=_holder_killed_after, args=(qm.root, point, str(tmp_path)))
    holder.start()
    try:
        _wait_for(lambda: (tmp_path / "locked").exists(), "the holder took the lock")
        putting = threading.Thread(target=put)
        putting.start()
        _wait_for(lambda: (tmp_path / "stopped").exists(), "the holder committed the put")
        # A putter that looked between its pauses may have seen the mark already: it returned then.
        os.kill(holder.pid, signal.SIGKILL)
        putting.join(PATIENCE)
        assert (putting.is_alive(), errors) == (False, [])
    finally:
        holder.kill()
        holder.join(PATIENCE)
    assert [bytes(p).decode() for p in qm.browse("Q")["payload"].to_pylist()] == ["p0"]
    assert [len(info[store.STAGED_KEY]) for info in _put_commits(location)] == [1]
    assert staging.staged() == staging.claimed() == []


def _producer(root: str, name: str, log: str) -> None:
    """Put messages named ``name-i`` one at a time, logging each whose put returned."""
    qm = QueueManager.open(root)
    with open(log, "a") as out:
        for number in range(10_000):
            qm.put("Q", [{"payload": f"{name}-{number}"}])
            out.write(f"{name}-{number}\n")
            out.flush()


@pytest.mark.slow
def test_producers_killed_with_sigkill_lose_and_double_no_put_that_returned(queue, tmp_path):
    """Four producers put one message at a time; one at a time is SIGKILLed at whatever moment its
    put is in (staging, holding claims, committing, marking) and started again under a new name."""
    qm, location, staging = queue
    rng = random.Random(20261203)
    log = tmp_path / "returned.log"
    running: dict[int, multiprocessing.Process] = {}
    names = iter(f"P{number}" for number in range(100))

    def start(slot: int) -> None:
        running[slot] = CONTEXT.Process(target=_producer, args=(qm.root, next(names), str(log)))
        running[slot].start()

    for slot in range(4):
        start(slot)
    try:
        for _ in range(9):
            # Killed after a few more commits, at whatever moment its put is in.
            target = store.newest_version(location) + rng.randint(2, 8)
            _wait_for(lambda target=target: store.newest_version(location) >= target, "puts going on")
            slot = rng.randrange(4)
            os.kill(running[slot].pid, signal.SIGKILL)
            running[slot].join(30)
            start(slot)
    finally:
        for process in running.values():
            process.kill()
            process.join(30)
    qm.maintain("Q")  # commits what the killed ones staged, or settles their claims
    payloads = [bytes(p).decode() for p in qm.browse("Q")["payload"].to_pylist()]
    assert [p for p, n in Counter(payloads).items() if n > 1] == []
    assert set(log.read_text().splitlines()) - set(payloads) == set()
    # Nothing undecided (a killed putter may leave its outcome's mark, which maintenance removes later).
    assert staging.staged() == staging.claimed() == []
    by_producer: dict[str, list[int]] = {}
    for payload in payloads:
        name, number = payload.rsplit("-", 1)
        by_producer.setdefault(name, []).append(int(number))
    # Each producer's puts in its order.
    assert all(numbers == sorted(numbers) for numbers in by_producer.values()), by_producer


def _prepared(qm: QueueManager, payload: str):
    """The rows a put of one message stages, as a putter that died left them."""
    definition = qm._queues.resolve_for_put("Q")
    messages, _ = prepare_put(definition, rows_to_table("Q", [{"payload": payload}]), now=qm._queues.clock.now())
    return messages


def _no_groups():
    return group_items(QUEUE_TABLE_SCHEMA.empty_table())


def _claimed_by_a_dead_holder(qm: QueueManager, staging: store.Staging) -> tuple[str, str]:
    """A consumed message (for maintenance to remove), then two puts a holder claimed before it died
    with one of them landed in its commit; their names."""
    qm.put("Q", [{"payload": "first"}])
    assert qm.get("Q", consumer="c").num_rows == 1
    landed, lost = staging.stage(_prepared(qm, "landed")), staging.stage(_prepared(qm, "lost"))
    assert staging.claim(landed) and staging.claim(lost)
    rows = staging.rows(landed)
    qm._queues.puts.commit_rows("Q", _no_groups(), qm._queues.resolve("Q"), rows, {store.STAGED_KEY: [landed]})
    return landed, lost


def test_maintenance_settles_a_dead_holders_claims_before_it_cleans_up_the_log(queue):
    """With no retention, maintenance may clean up the very log entry that says a claimed put landed:
    it settles the claims first (the streaming get's background maintenance as much as ``maintain``)."""
    qm, location, staging = queue
    landed, lost = _claimed_by_a_dead_holder(qm, staging)
    summary = maintain(qm._queues, qm._queues.resolve("Q"), timedelta(0))
    assert (summary.removed_consumed, summary.log_entries_removed > 0) == (1, True)
    assert (staging.claimed(), staging.staged()) == ([], [lost])
    assert staging.outcome(landed) == store.staging.Outcome(landed=True)
    qm.put("Q", [{"payload": "next"}])
    assert [bytes(p).decode() for p in qm.browse("Q")["payload"].to_pylist()] == ["landed", "lost", "next"]


def test_maintenance_keeps_the_log_while_a_live_holders_claims_are_out(queue):
    qm, location, staging = queue
    landed, lost = _claimed_by_a_dead_holder(qm, staging)
    assert staging.lock.try_lock()  # the holder is alive: its claims are its own
    try:
        summary = maintain(qm._queues, qm._queues.resolve("Q"), timedelta(0))
    finally:
        staging.lock.unlock()
    assert (summary.removed_consumed, summary.log_entries_removed) == (1, 0)
    assert staging.claimed() == [landed, lost]


def test_a_put_through_an_alias_commits_alone(queue, monkeypatch):
    """An alias retargeted during a put backs out that put only, so puts through an alias are not
    staged with other processes' puts."""
    qm, location, staging = queue
    qm.define_queue("A", type="alias", target_queue="Q")
    monkeypatch.setattr(staged_puts, "HOLDER_PATIENCE", PATIENCE)
    assert staging.lock.try_lock()
    try:
        putting = threading.Thread(target=qm.put, args=("A", [{"payload": "through the alias"}]))
        putting.start()
        _wait_for(lambda: not putting.is_alive() or staging.staged(), "the put returned or staged")
        assert staging.staged() == []
    finally:
        staging.lock.unlock()
    putting.join(PATIENCE)
    assert [bytes(p).decode() for p in qm.browse("Q")["payload"].to_pylist()] == ["through the alias"]
    assert _put_commits(location)[-1].get(store.STAGED_KEY) is None
