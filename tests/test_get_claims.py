"""Claims of competing Python gets: a get holds its messages for the queue's ``lock_duration``; it
renews, releases or finishes them; once the lock passed another get takes them back, counted as a
rolled-back delivery, and the late get's consumption is refused. Real Delta tables; a real process
paused with SIGSTOP past its lock."""

from __future__ import annotations

import signal
import textwrap
import time

import pytest

from mqspark import MQError, QueueManager, Reason
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.qmgr import engine

from .support.processes import python_child
from .support.stream_batches import collecting_query


def _payloads(table) -> list[str]:
    return [p.decode() for p in table["payload"].to_pylist()]


def _grouped(group: str, count: int) -> list[dict]:
    items = [{"payload": f"{group}{i}", "group_id": group, "msg_seq_number": i + 1} for i in range(count)]
    items[-1]["last_in_group"] = True
    return items


def test_a_claimed_message_and_the_rest_of_its_group_wait_while_other_messages_go_to_another_get(qm):
    qm.define_queue("Q")
    qm.put("Q", [*_grouped("G", 3), {"payload": "u1"}, {"payload": "u2"}])
    first = qm.claim("Q", "workers")
    assert _payloads(first.messages) == ["G0"]
    # G0 is held: G1 and G2 wait behind it; u1 and u2 go to whoever asks.
    assert _payloads(qm.get("Q", "workers", max_messages=10)) == ["u1", "u2"]
    assert _payloads(qm.get("Q", "workers", max_messages=10)) == []
    first.commit()
    assert _payloads(qm.get("Q", "workers", max_messages=10)) == ["G1", "G2"]
    assert qm.depth("Q", "workers") == 0


def test_a_released_claim_gives_its_messages_back_at_once_without_a_failure(qm):
    qm.define_queue("Q", backout_threshold=1)
    qm.put("Q", [{"payload": "m1"}, {"payload": "m2"}])
    claim = qm.claim("Q", max_messages=2)
    claim.release()
    got = qm.get("Q", max_messages=2)
    assert _payloads(got) == ["m1", "m2"]
    assert got["backout_count"].to_pylist() == [0, 0]
    assert qm.depth(engine(qm).dead_letter_queue) == 0


def test_a_claim_committed_is_consumed_and_one_backed_out_comes_back_counting_a_failure(qm):
    qm.define_queue("Q", retry_count=2)
    qm.put("Q", [{"payload": "m1"}, {"payload": "m2"}])
    assert qm.claim("Q", group_id="none", wait=0) is None
    kept = qm.claim("Q")
    assert _payloads(kept.messages) == ["m1"]
    failed = qm.claim("Q")
    assert _payloads(failed.messages) == ["m2"]
    kept.commit()
    failed.backout("no stock for item 7")
    again = qm.get("Q", max_messages=5)
    assert _payloads(again) == ["m2"]
    assert again["backout_count"].to_pylist() == [1]
    assert qm.depth("Q") == 0


def test_a_backout_error_that_is_not_text_is_refused_naming_the_queue_and_value(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "m1"}])
    claim = qm.claim("Q")
    for bad in (7, ""):
        with pytest.raises(MQError, match=rf"^get from queue Q: backout error must be a non-empty text, got {bad!r}$"):
            claim.backout(bad)
    claim.release()
    assert _payloads(qm.get("Q")) == ["m1"]


def test_a_lapsed_claim_is_taken_back_counted_once_and_its_late_consumption_is_refused(clocked_qm, clock):
    qm = clocked_qm
    qm.define_queue("Q", lock_duration=1)
    qm.put("Q", [{"payload": "m1"}])
    late = qm.claim("Q")
    renewed = qm.claim("Q", "other")
    clock.advance(0.6)
    renewed.renew()
    began = clock.monotonic()
    # The get waits (moving the clock) until the lock of the claim of "default" passed, 1 s after it.
    got = qm.get("Q", wait=30)
    assert 0.4 <= clock.monotonic() - began <= 0.45 + 1e-9
    # The claim of group "other", renewed, still holds; the lapsed one of "default" was taken back.
    assert _payloads(got) == ["m1"]
    assert got["backout_count"].to_pylist() == [1]
    with pytest.raises(MQError, match="get from queue Q: consumer group 'default': the lock of its 1 messages passed"):
        late.commit()
    renewed.commit()
    assert qm.depth("Q", "default") == 0 and qm.depth("Q", "other") == 0
    state = ConsumerState(qm.root, "Q")
    rolled_back = state.events("default", ("rollback",), ["plan_id"])["plan_id"].to_pylist()
    assert rolled_back == [late.plan_id]
    assert state.events("other", ("rollback",), ["plan_id"]).num_rows == 0


def test_a_renewal_after_the_claim_was_taken_back_is_refused(clocked_qm, clock):
    qm = clocked_qm
    qm.define_queue("Q", lock_duration=1)
    qm.put("Q", [{"payload": "m1"}])
    late = qm.claim("Q")
    began = clock.monotonic()
    assert _payloads(qm.get("Q", wait=30)) == ["m1"]
    # Taken back at the first look once the lock passed.
    assert 1.0 <= clock.monotonic() - began <= 1.05 + 1e-9
    with pytest.raises(MQError) as refused:
        late.renew()
    assert refused.value.reason == Reason.MQRC_BACKED_OUT
    assert "the lock of its 1 messages passed (lock_duration 1 s)" in str(refused.value)


@pytest.mark.slow
def test_a_get_paused_past_its_lock_is_refused_when_it_goes_on_and_the_message_is_delivered_once(tmp_path):
    qm = QueueManager.create(tmp_path / "qm", "QM1")
    qm.define_queue("Q", lock_duration=2)
    qm.put("Q", [{"payload": "m1"}])
    script = textwrap.dedent(
        f"""
        import sys
        from mqspark import MQError, QueueManager
        qm = QueueManager.open({str(qm.root)!r})
        try:
            with qm.syncpoint_get("Q") as messages:
                print("got", messages["payload"][0].as_py().decode(), flush=True)
                sys.stdin.readline()
            print("consumed", flush=True)
        except MQError as error:
            print("refused", int(error.reason), flush=True)
        """
    )
    child = python_child(script)
    try:
        assert child.stdout.readline() == "got m1\n"
        child.send_signal(signal.SIGSTOP)
        # Its claim's renewals stop with it: once the lock passed, this get takes the message back.
        got = qm.get("Q", wait=60)
        assert _payloads(got) == ["m1"]
        assert got["backout_count"].to_pylist() == [1]
        child.send_signal(signal.SIGCONT)
        child.stdin.write("go on\n")
        child.stdin.flush()
        assert child.stdout.readline() == "refused 2003\n"
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
        child.wait()
    assert qm.depth("Q") == 0
    assert qm.get("Q").num_rows == 0


def test_a_bad_lock_duration_is_refused_naming_the_queue_and_value(qm):
    with pytest.raises(MQError, match="queue Q: attribute lock_duration must be a number of seconds > 0, got -1"):
        qm.define_queue("Q", lock_duration=-1)
    assert "Q" not in qm.queues()


def test_a_streaming_query_starting_waits_for_the_gets_claims_then_delivers_the_rest(spark, qm, tmp_path):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"m{i}"} for i in range(4)])
    claim = qm.claim("Q", max_messages=2)
    seen: list[tuple[int, str]] = []
    query = collecting_query(spark, qm.root, tmp_path / "ckpt", seen)
    try:
        deadline = time.monotonic() + 60
        while not query.status["message"].startswith("Getting offsets") and time.monotonic() < deadline:
            time.sleep(0.05)
        # The query's planner waits for the claim; the claimed messages are consumed, never delivered.
        claim.commit()
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        query.stop()
    assert [payload for _, payload in seen] == ["m2", "m3"]
