"""The Python get (MQGET): logical order, consumer groups, match, wait, syncpoint, sharing a group with
a streaming query, and bad input. Real Delta tables; real streaming queries where a query is involved."""

from __future__ import annotations

import signal
import textwrap

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from mqspark import MQError, MQValidationError, Reason, store
from mqspark.engine.backout import Transfer, failures
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.state_commit import Stale
from mqspark.engine.state_rows import event_rows
from mqspark.engine.waiting import waiting_messages
from mqspark.model.messages import BROWSE_SCHEMA
from mqspark.qmgr import engine

from .support.processes import python_child
from .support.samples import spec_example
from .support.stream_batches import collecting_query, wait_for_finished_batches


def _payloads(table) -> list[str]:
    return [p.decode() for p in table["payload"].to_pylist()]


def test_get_returns_messages_in_logical_order_and_consumes_them_for_its_group_only(qm):
    spec_example(qm)
    first = qm.get("Q", max_messages=3)
    assert first.schema == BROWSE_SCHEMA
    assert _payloads(first) == ["A", "Y1", "Y2"]
    assert first["delivery_seq"].to_pylist() == [0, 1, 2]
    rest = qm.get("Q", max_messages=100)
    assert _payloads(rest) == ["Y3-1:", "Y3-2", "Z1", "Z2", "B"]
    assert rest["delivery_seq"].to_pylist() == [3, 4, 5, 6, 7]
    assert qm.get("Q").num_rows == 0
    assert qm.depth("Q", consumer="default") == 0
    # Another group gets every message again.
    assert _payloads(qm.get("Q", consumer="audit", max_messages=2)) == ["A", "Y1"]
    assert qm.depth("Q", consumer="audit") == 6


def test_get_matches_correl_id_msg_id_and_group_id(qm):
    qm.define_queue("Q")
    ids = qm.put(
        "Q",
        [
            {"payload": "a", "correl_id": "c1"},
            {"payload": "b", "correl_id": "c2"},
            {"payload": "c", "correl_id": "c1"},
            {"payload": "g1", "group_id": "G", "msg_seq_number": 1, "correl_id": "c3"},
            {"payload": "g2", "group_id": "G", "msg_seq_number": 2, "last_in_group": True, "correl_id": "c3"},
        ],
    )
    assert _payloads(qm.get("Q", correl_id="c1", max_messages=5)) == ["a", "c"]
    assert _payloads(qm.get("Q", msg_id=ids[1])) == ["b"]
    # A match never takes a group's later item before its next one.
    assert _payloads(qm.get("Q", msg_id=ids[4])) == []
    assert _payloads(qm.get("Q", group_id="G", max_messages=5)) == ["g1", "g2"]
    assert qm.get("Q", correl_id="c1").num_rows == 0


def test_get_waits_for_a_message_put_meanwhile_and_returns_empty_when_none_comes(clocked_qm, clock):
    qm = clocked_qm
    qm.define_queue("Q")
    # The get waits on its queue manager's clock, which its sleeps move in this thread.
    began = clock.monotonic()
    assert qm.get("Q", wait=0.5).num_rows == 0
    assert clock.monotonic() - began == pytest.approx(0.5)

    began = clock.monotonic()
    clock.after(0.5, lambda: qm.put("Q", [{"payload": "late", "correl_id": "r1"}]))
    got = qm.get("Q", wait=20, correl_id="r1")
    assert _payloads(got) == ["late"]
    # Taken at the first look after the put: at most one poll (0.05 s) later.
    assert 0.5 <= clock.monotonic() - began <= 0.55 + 1e-9


def test_syncpoint_get_consumes_on_success_and_backs_out_when_the_block_raises(qm):
    qm.define_queue("Q", retry_count=1, retry_delay=0)
    qm.put("Q", [{"payload": "one"}, {"payload": "two"}])
    with qm.syncpoint_get("Q") as messages:
        assert _payloads(messages) == ["one"]
    assert qm.depth("Q") == 1
    with pytest.raises(RuntimeError, match="service down"):
        with qm.syncpoint_get("Q") as messages:
            assert _payloads(messages) == ["two"]
            raise RuntimeError("service down")
    again = qm.get("Q")
    assert _payloads(again) == ["two"]
    assert again["backout_count"].to_pylist() == [1]


def test_a_message_that_fails_beyond_the_retry_count_goes_to_the_error_queue_with_the_error(qm):
    qm.define_queue("Q.ERR")
    qm.define_queue("Q", retry_count=1, retry_delay=0, error_queue="Q.ERR")
    qm.put("Q", [{"payload": "poison"}])
    for _ in range(2):
        with pytest.raises(ValueError):
            with qm.syncpoint_get("Q"):
                raise ValueError("cannot parse")
    assert qm.get("Q").num_rows == 0
    moved = qm.get("Q.ERR")
    assert _payloads(moved) == ["poison"]
    assert moved["backout_count"].to_pylist() == [2]
    assert moved["dlq_original_queue"].to_pylist() == ["Q"]
    assert "ValueError: cannot parse" in moved["dlq_reason_text"][0].as_py()


def test_a_grouped_message_failed_by_two_consumer_groups_moves_to_the_backout_queue_once_for_each(qm):
    # Each group moves its own copy: the backout queue holds the group's item twice, which a
    # producer could never put, and the second copy must not be refused for it.
    qm.define_queue("Q.BACKOUT")
    qm.define_queue("Q", backout_threshold=1, backout_queue="Q.BACKOUT")
    qm.put(
        "Q", [{"payload": f"m{i}", "group_id": "G", "msg_seq_number": i, "last_in_group": i == 3} for i in (1, 2, 3)]
    )
    for group in ("A", "B"):
        qm.declare_consumer("Q", group)
    for group in ("A", "B"):
        assert _payloads(qm.get("Q", consumer=group)) == ["m1"]
        with pytest.raises(ValueError):
            with qm.syncpoint_get("Q", group):
                raise ValueError("cannot parse")
        assert _payloads(qm.get("Q", consumer=group, max_messages=5)) == ["m3"]
    moved = qm.browse("Q.BACKOUT", order="physical")
    assert _payloads(moved) == ["m2", "m2"]
    assert moved["dlq_reason"].to_pylist() == [Reason.MQRC_BACKOUT_THRESHOLD_REACHED] * 2
    assert moved["msg_seq_number"].to_pylist() == [2, 2]
    assert qm.browse("SYSTEM.DEAD.LETTER.QUEUE").num_rows == 0


def test_a_compaction_between_a_moves_look_and_its_record_does_not_make_the_move_stale(qm):
    # A streaming planner's move found Stale fails its query; compaction, which any committer runs
    # every few versions, folds finished moves away, so it must not count as another move.
    qm.define_queue("Q.BACKOUT")
    qm.define_queue("Q", backout_threshold=1, backout_queue="Q.BACKOUT")
    qm.put("Q", [{"payload": "one"}, {"payload": "two"}, {"payload": "three"}])
    with pytest.raises(ValueError):
        with qm.syncpoint_get("Q"):
            raise ValueError("cannot parse")
    assert _payloads(qm.get("Q")) == ["two"]  # "one" moved first: a finished move
    state = ConsumerState(qm.root, "Q", engine(qm).storage_options)
    transfer = Transfer(
        engine(qm), "Q", state, "default", "test", "mqspark.backout/QM1/Q/default", None, group_rules=False
    )
    table = store.open_table(store.queue_location(qm.root, "Q.BACKOUT"), engine(qm).storage_options)
    committed = table.transaction_version("mqspark.backout/QM1/Q/default")
    waiting = failures(state, "default").slice(0, 0)  # the move's messages: none consumed
    check = transfer._alone("Q.BACKOUT", committed, waiting)

    assert ConsumerState(qm.root, "Q", engine(qm).storage_options).compact()  # another process compacts
    check()  # not stale: no move was recorded since the look

    other = ConsumerState(qm.root, "Q", engine(qm).storage_options)
    other.append(event_rows("default", "another", "move", plan_id="m2"))
    with pytest.raises(Stale, match="consumer group 'default' moved messages since"):
        check()


def _one_failed(qm) -> ConsumerState:
    """Q with backout threshold 1 holding "one", failed once (due to move), and "two"."""
    qm.define_queue("Q.BACKOUT")
    qm.define_queue("Q", backout_threshold=1, backout_queue="Q.BACKOUT")
    qm.put("Q", [{"payload": "one"}, {"payload": "two"}])
    with pytest.raises(ValueError):
        with qm.syncpoint_get("Q"):
            raise ValueError("cannot parse")
    return ConsumerState(qm.root, "Q", engine(qm).storage_options)


def _late_move_check(qm, state: ConsumerState, looked):
    """The check of a move of ``looked`` by a get that reads the backout queue's version now."""
    transfer = Transfer(
        engine(qm), "Q", state, "default", "late", "mqspark.backout/QM1/Q/default", None, group_rules=False
    )
    table = store.open_table(store.queue_location(qm.root, "Q.BACKOUT"), engine(qm).storage_options)
    return transfer._alone("Q.BACKOUT", table.transaction_version("mqspark.backout/QM1/Q/default"), looked)


def test_a_move_another_get_finished_and_compaction_folded_meanwhile_makes_a_move_of_the_same_message_stale(qm):
    # Found by a chaos run: two competing getters moved the same message to the backout queue, half a
    # second apart, once the first one's move had been folded into the group's checkpoint.
    state = _one_failed(qm)
    looked = failures(state, "default")  # what the second get saw: "one" failed, due to move
    assert _payloads(qm.get("Q")) == ["two"]  # the first get moved "one", and took "two"
    assert ConsumerState(qm.root, "Q", engine(qm).storage_options).compact()
    check = _late_move_check(qm, state, looked)
    with pytest.raises(Stale, match="consumer group 'default' moved messages since"):
        check()
    assert _payloads(qm.browse("Q.BACKOUT")) == ["one"]


def test_a_move_another_get_has_under_way_makes_a_move_of_the_same_message_stale(qm, monkeypatch):
    # Found by a 60-minute chaos run: two competing getters moved a message 0.9 s apart. The second
    # planned before the first recorded its move, and read the move ids and the backout queue's
    # version after the first had put its copy but before it recorded the move consumed.
    state = _one_failed(qm)
    looked = failures(state, "default")  # what the second get planned on: "one" failed, due to move
    real_append = ConsumerState.append

    def stopped_after_the_put(self, rows, check=None):
        if rows["event"].to_pylist() == ["consumed"] and self.queue == "Q":
            raise RuntimeError("stopped before the move was recorded consumed")
        return real_append(self, rows, check)

    monkeypatch.setattr(ConsumerState, "append", stopped_after_the_put)
    with pytest.raises(RuntimeError, match="stopped before the move"):
        qm.get("Q")  # the first get: its move recorded, its copy put
    monkeypatch.setattr(ConsumerState, "append", real_append)
    assert _payloads(qm.browse("Q.BACKOUT")) == ["one"]

    check = _late_move_check(qm, state, looked)
    with pytest.raises(Stale, match="consumer group 'default' moved messages since"):
        check()
    # The next get finishes the first one's move, and moves nothing again.
    assert _payloads(qm.get("Q")) == ["two"]
    assert _payloads(qm.browse("Q.BACKOUT")) == ["one"]


def test_a_move_of_other_messages_waits_while_another_move_of_the_group_is_under_way(qm, monkeypatch):
    # Two moves under way at once would carry the same txn version of the backout queue: the second
    # put to land would be taken for a repeat and skipped, and its messages lost for the group.
    state = _one_failed(qm)
    real_put = Transfer._put

    def stopped_before_the_put(self, move, pending):
        raise RuntimeError("stopped before the put")

    monkeypatch.setattr(Transfer, "_put", stopped_before_the_put)
    with pytest.raises(RuntimeError, match="stopped before the put"):
        qm.get("Q")  # the first get: its move of "one" recorded, its copy not put yet
    monkeypatch.setattr(Transfer, "_put", real_put)

    two = waiting_messages(engine(qm), "Q", "default", ["payload"])
    two = two.filter(pa.array([p == b"two" for p in two["payload"].to_pylist()]))
    check = _late_move_check(qm, state, two)  # another get moves "two" meanwhile
    with pytest.raises(Stale, match="consumer group 'default' moved messages since"):
        check()
    # The next get finishes the first one's move; "one" is on the backout queue, "two" delivered.
    assert _payloads(qm.get("Q")) == ["two"]
    assert _payloads(qm.browse("Q.BACKOUT")) == ["one"]


def test_get_refuses_while_a_streaming_query_reads_the_group_and_a_query_continues_after_gets(spark, qm, tmp_path):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"m{i}"} for i in range(6)])
    assert _payloads(qm.get("Q", max_messages=2)) == ["m0", "m1"]
    seen: list[tuple[int, str]] = []
    query = collecting_query(spark, qm.root, tmp_path / "ckpt", seen, maxMessagesPerTrigger="2")
    try:
        wait_for_finished_batches(query, 2)  # m2 and m3, then m4 and m5
        with pytest.raises(MQError) as refused:
            qm.get("Q")
        assert refused.value.reason == Reason.MQRC_OBJECT_IN_USE
        assert "consumer group 'default' is already being read by a running query" in str(refused.value)
    finally:
        query.stop()
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(30_000)
    assert seen == [(2, "m2"), (3, "m3"), (4, "m4"), (5, "m5")]
    qm.put("Q", [{"payload": "m6"}])
    got = qm.get("Q")
    assert _payloads(got) == ["m6"]
    assert got["delivery_seq"].to_pylist() == [6]


def test_bad_get_arguments_are_refused_naming_the_argument_and_value(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "kept"}])
    cases = [
        (dict(max_messages=0), "get: queue Q: max_messages must be an integer >= 1, got 0"),
        (dict(wait=-1), "get: queue Q: wait must be a number of seconds >= 0, got -1"),
        (dict(correl_id=""), "get: queue Q: correl_id must be a non-empty text, got ''"),
    ]
    for arguments, text in cases:
        with pytest.raises(MQValidationError) as error:
            qm.get("Q", **arguments)
        assert str(error.value) == text
    with pytest.raises(MQError) as unknown:
        qm.get("NOPE")
    assert unknown.value.reason == Reason.MQRC_UNKNOWN_OBJECT_NAME
    assert qm.depth("Q") == 1


@pytest.mark.slow
def test_a_get_killed_inside_its_syncpoint_gives_its_message_back_once_its_lock_passed(qm, tmp_path):
    qm.define_queue("Q", retry_count=3, retry_delay=0, lock_duration=20)
    qm.put("Q", [{"payload": "first"}, {"payload": "second"}])
    script = textwrap.dedent(
        f"""
        import time
        from mqspark import QueueManager
        qm = QueueManager.open({str(qm.root)!r})
        with qm.syncpoint_get("Q") as messages:
            print(messages["payload"][0].as_py().decode(), flush=True)
            time.sleep(600)
        """
    )
    child = python_child(script)
    try:
        assert child.stdout.readline().strip() == "first"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    # The dead get's claim holds "first" until its lock passes; another get takes what is free.
    assert _payloads(qm.get("Q")) == ["second"]
    assert _payloads(qm.get("Q")) == []
    got = qm.get("Q", wait=60)
    assert _payloads(got) == ["first"]
    assert got["backout_count"].to_pylist() == [1]
    assert qm.depth("Q", "default") == 0


def test_a_get_after_its_group_was_deleted_or_its_queue_made_again_sees_them_afresh(qm):
    # Gets of a process keep the group's pending index between calls; it must not outlive the group.
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"m1"}, {"payload": b"m2"}])
    assert qm.get("Q", "G")["payload"].to_pylist() == [b"m1"]
    qm.delete_consumer("Q", "G")
    assert qm.get("Q", "G", max_messages=5)["payload"].to_pylist() == [b"m1", b"m2"]
    qm.delete_queue("Q", purge=True)
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"n1"}])
    assert qm.get("Q", "G", max_messages=5)["payload"].to_pylist() == [b"n1"]
    assert qm.get("Q", "G")["payload"].to_pylist() == []


def test_a_get_reads_its_messages_then_claims_them_consumed_in_one_commit(qm):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"m{i}"} for i in range(3)])
    qm.declare_consumer("Q", "default")
    state = DeltaTable(store.state_location(qm.root, "Q"))
    before = state.version()
    assert [_payloads(qm.get("Q")) for _ in range(3)] == [["m0"], ["m1"], ["m2"]]
    state.update_incremental()
    assert state.version() - before == 3
    assert qm.depth("Q") == 0
