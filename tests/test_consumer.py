"""The block consumer (``qm.consumer``): blocks claimed in one commit, handed out one at a time,
acknowledged per block; a clean stop, a failure inside the block, bad input, and a real process
killed with SIGKILL while it holds a block. Real Delta tables."""

from __future__ import annotations

import signal
import textwrap

import pytest
from deltalake import DeltaTable

from mqspark import MQValidationError, QueueManager, store

from .support.processes import python_child


def _payloads(messages) -> list[str]:
    return [m["payload"].decode() for m in messages]


def test_a_consumer_hands_out_every_message_once_in_logical_order_a_block_at_a_time(qm):
    qm.define_queue("Q")
    items = [{"payload": f"g{i}", "group_id": "G", "msg_seq_number": i + 1} for i in range(3)]
    items[-1]["last_in_group"] = True
    qm.put("Q", [{"payload": "a", "priority": 9}, *items, {"payload": "b"}])
    with qm.consumer("Q", "workers", prefetch=2) as consumer:
        seen = list(consumer)
    assert _payloads(seen) == ["a", "g0", "g1", "g2", "b"]
    assert [m["delivery_seq"] for m in seen] == [0, 1, 2, 3, 4]
    assert qm.depth("Q", "workers") == 0


def test_leaving_early_consumes_what_was_handed_out_and_gives_the_rest_back_without_a_failure(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"m{i}"} for i in range(5)])
    with qm.consumer("Q", prefetch=5) as consumer:
        for message in consumer:
            if message["payload"] == b"m1":
                break
    got = qm.get("Q", max_messages=10)
    assert [p.decode() for p in got["payload"].to_pylist()] == ["m2", "m3", "m4"]
    assert got["backout_count"].to_pylist() == [0, 0, 0]


def test_a_failure_inside_the_block_backs_out_the_message_being_processed_only(qm):
    qm.define_queue("Q", retry_count=5)
    qm.put("Q", [{"payload": f"m{i}"} for i in range(4)])
    handled = []
    with pytest.raises(RuntimeError, match="cannot handle m1"), qm.consumer("Q", prefetch=4) as consumer:
        for message in consumer:
            if message["payload"] == b"m1":
                raise RuntimeError("cannot handle m1")
            handled.append(message["payload"].decode())
    assert handled == ["m0"]
    got = qm.get("Q", max_messages=10)
    assert [p.decode() for p in got["payload"].to_pylist()] == ["m1", "m2", "m3"]
    assert got["backout_count"].to_pylist() == [1, 0, 0]


@pytest.mark.parametrize(
    ("prefetch", "text"),
    [
        (0, "consumer of queue Q: prefetch must be an integer from 1 to 100000, got 0"),
        ("5", "consumer of queue Q: prefetch must be an integer from 1 to 100000, got '5'"),
    ],
)
def test_a_bad_prefetch_is_refused_naming_the_queue_and_value(qm, prefetch, text):
    qm.define_queue("Q")
    with pytest.raises(MQValidationError) as refused:
        qm.consumer("Q", prefetch=prefetch)
    assert str(refused.value) == text


@pytest.mark.slow
def test_a_consumer_killed_holding_a_block_gives_it_back_after_the_lock_each_message_once_in_the_end(tmp_path):
    qm = QueueManager.create(tmp_path / "qm", "QM1")
    # Long enough that the free messages are taken before it passes, even on a loaded machine.
    qm.define_queue("Q", lock_duration=20)
    items = [{"payload": f"g{i}", "group_id": "G", "msg_seq_number": i + 1} for i in range(4)]
    items[-1]["last_in_group"] = True
    qm.put("Q", [*items, *({"payload": f"m{i}"} for i in range(4))])
    script = textwrap.dedent(
        f"""
        import time
        from mqspark import QueueManager
        qm = QueueManager.open({str(qm.root)!r})
        with qm.consumer("Q", "workers", prefetch=5) as consumer:
            for message in consumer:
                print("got", message["payload"].decode(), flush=True)
                time.sleep(600)
        """
    )
    child = python_child(script)
    try:
        assert child.stdout.readline() == "got g0\n"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    # The killed consumer's block (g0-g3 and m0) is held until its lock passes; m1-m3 are free now.
    with qm.consumer("Q", "workers", prefetch=5) as consumer:
        free = _payloads(consumer)
    assert free == ["m1", "m2", "m3"]
    with qm.consumer("Q", "workers", prefetch=5, wait=60) as consumer:
        back = []
        for message in consumer:
            back.append(message)
            if len(back) == 5:
                break
    assert _payloads(back) == ["g0", "g1", "g2", "g3", "m0"]
    assert [m["backout_count"] for m in back] == [1] * 5
    assert qm.depth("Q", "workers") == 0


@pytest.mark.slow
def test_a_consumer_paused_past_its_lock_is_refused_when_it_acknowledges_and_claims_nothing_more(tmp_path):
    qm = QueueManager.create(tmp_path / "qm", "QM1")
    qm.define_queue("Q", lock_duration=2)
    qm.put("Q", [{"payload": "m0"}, {"payload": "m1"}])
    script = textwrap.dedent(
        f"""
        import sys
        from mqspark import MQError, QueueManager
        qm = QueueManager.open({str(qm.root)!r})
        with qm.consumer("Q", "workers", prefetch=2) as consumer:
            messages = iter(consumer)
            print("got", next(messages)["payload"].decode(), next(messages)["payload"].decode(), flush=True)
            sys.stdin.readline()
            try:
                next(messages)
            except MQError as error:
                print("refused", int(error.reason), flush=True)
        """
    )
    child = python_child(script)
    try:
        assert child.stdout.readline() == "got m0 m1\n"
        child.send_signal(signal.SIGSTOP)
        # Its renewals stop with it: once the lock passed, this get takes the block back.
        back = qm.get("Q", "workers", max_messages=2, wait=60)
        assert _payloads(back.to_pylist()) == ["m0", "m1"]
        assert back["backout_count"].to_pylist() == [1, 1]
        qm.put("Q", [{"payload": "m2"}])
        child.send_signal(signal.SIGCONT)
        child.stdin.write("go on\n")
        child.stdin.flush()
        # Its acknowledgement, which would have claimed m2 in the same commit, is refused whole.
        assert child.stdout.readline() == "refused 2003\n"
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
        child.wait()
    assert _payloads(qm.get("Q", "workers").to_pylist()) == ["m2"]
    assert qm.depth("Q", "workers") == 0


def test_a_block_is_acknowledged_in_the_commit_that_claims_the_next(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"m{i}"} for i in range(6)])
    qm.declare_consumer("Q", "workers")
    state = DeltaTable(store.state_location(qm.root, "Q"))
    before = state.version()
    with qm.consumer("Q", "workers", prefetch=2) as consumer:
        assert _payloads(consumer) == [f"m{i}" for i in range(6)]
    state.update_incremental()
    # Three claims, the last two with their block's acknowledgement, then the last block's alone.
    assert state.version() - before == 4
    assert qm.depth("Q", "workers") == 0
