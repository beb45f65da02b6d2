"""Group commit: concurrent puts of one process to one queue share Delta commits. Each call returns
once its messages are committed, or raises with none of them committed. Real Delta tables, real
threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from deltalake import DeltaTable

from mqspark import MQError, QueueManager, Reason, store


def _put_from_threads(qm: QueueManager, count: int) -> list[list[str] | MQError]:
    barrier = threading.Barrier(count)
    results: list[list[str] | MQError] = [[] for _ in range(count)]

    def put(number: int) -> None:
        barrier.wait()
        try:
            results[number] = qm.put("Q", [{"payload": f"t{number}"}])
        except MQError as error:
            results[number] = error

    threads = [threading.Thread(target=put, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_concurrent_puts_of_one_process_all_land_each_once(qm):
    qm.define_queue("Q")
    results = _put_from_threads(qm, 16)
    assert all(isinstance(result, list) and len(result) == 1 for result in results)
    browsed = qm.browse("Q")
    assert sorted(browsed["payload"].to_pylist()) == sorted(f"t{n}".encode() for n in range(16))
    ids = dict(zip(browsed["payload"].to_pylist(), browsed["msg_id"].to_pylist(), strict=True))
    assert [ids[f"t{n}".encode()] for n in range(16)] == [result[0] for result in results]
    history = DeltaTable(store.queue_location(qm.root, "Q")).history()
    puts = [entry for entry in history if entry.get("mqspark.operation") == "put"]
    assert sum(entry["mqspark.messages"] for entry in puts) == 16


def test_every_message_of_a_group_commit_is_got_once_by_its_own_identity(qm):
    """Puts committed together are told apart: getting one consumes only it, not the first message
    of each other put in its commit."""
    qm.define_queue("Q")
    results = _put_from_threads(qm, 16)
    history = DeltaTable(store.queue_location(qm.root, "Q")).history()
    assert any(entry.get("mqspark.messages", 0) > 1 for entry in history), "no commit held two puts"
    got = []
    while (batch := qm.get("Q", consumer="c", max_messages=1)).num_rows:
        got += batch["msg_id"].to_pylist()
    assert sorted(got) == sorted(result[0] for result in results)
    assert qm.depth("Q", consumer="c") == 0


def test_a_commit_that_fails_fails_every_put_in_it_and_commits_none_of_them(qm):
    qm.define_queue("Q", max_depth=3)
    results = _put_from_threads(qm, 8)
    landed = [result for result in results if isinstance(result, list)]
    refused = [result for result in results if isinstance(result, MQError)]
    assert len(landed) + len(refused) == 8
    assert refused and all(error.reason == Reason.MQRC_Q_FULL for error in refused)
    assert all("queue Q is full (max_depth 3" in str(error) for error in refused)
    # Exactly the calls that returned have their message on the queue.
    browsed = qm.browse("Q")
    assert sorted(browsed["msg_id"].to_pylist()) == sorted(result[0] for result in landed)
    assert len(landed) <= 3


@pytest.mark.slow
def test_a_producer_killed_mid_group_commit_leaves_each_returned_put_once_and_none_half_written(tmp_path):
    qm = QueueManager.create(tmp_path / "qm", "QM1")
    qm.define_queue("Q")
    script = textwrap.dedent(
        f"""
        import sys, threading
        from mqspark import QueueManager
        printing = threading.Lock()  # one whole line at a time

        def put(thread):
            qm = QueueManager.open({str(qm.root)!r})
            for n in range(10_000):
                qm.put("Q", [{{"payload": f"{{thread}}-{{n}}-a"}}, {{"payload": f"{{thread}}-{{n}}-b"}}])
                with printing:
                    sys.stdout.write(f"ok {{thread}}-{{n}}\\n")
                    sys.stdout.flush()

        for thread in range(8):
            threading.Thread(target=put, args=(thread,), daemon=True).start()
        threading.Event().wait()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
    returned = []
    try:
        # Kill it in the middle of its commits, once every thread's puts have been returning a while.
        while len(returned) < 120:
            line = child.stdout.readline()
            assert line, "the producer ended before it was killed"
            returned.append(line.split()[1])
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        child.kill()
        child.wait()
    payloads = [p.decode() for p in qm.browse("Q")["payload"].to_pylist()]
    assert len(payloads) == len(set(payloads))
    calls = {payload.rsplit("-", 1)[0] for payload in payloads}
    # Every put that returned is there; no put is there with one of its two messages only.
    assert set(returned) <= calls
    assert sorted(payloads) == sorted(f"{call}-{half}" for call in calls for half in "ab")
