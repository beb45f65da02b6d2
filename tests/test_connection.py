"""Client reconnection of the Python API against real outages: the queue manager root is moved away
(its path then holds a file, as when a mount is gone) and put back once the connection's clock has
moved a few seconds, or at the end of the test's block. That clock is a ManualClock, which the
connection's own backoff moves, so no test waits in real time."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import mqspark
from mqspark import MQError, MQValidationError, QueueManager, Reason, store
from mqspark.qmgr import engine
from mqspark.reconnect import Connection

from .support.outages import break_root_on, clocked_outage, outage

OUTAGE = 1.5


def payloads(qm: QueueManager, queue: str = "Q") -> list[bytes]:
    return qm.browse(queue)["payload"].to_pylist()


@pytest.fixture
def q(qm) -> QueueManager:
    qm.define_queue("Q")
    return qm


def test_mode_no_fails_at_once_with_connection_broken_and_writes_nothing(q, clock):
    connection = mqspark.connect(q.root, reconnect="no", clock=clock)
    connection.put("Q", [{"payload": b"before"}])
    started = clock.monotonic()
    with clocked_outage(clock, q.root, OUTAGE):
        with pytest.raises(MQError) as caught:
            connection.put("Q", [{"payload": b"lost"}])
        assert clock.monotonic() - started < OUTAGE
    assert caught.value.reason is Reason.MQRC_CONNECTION_BROKEN
    assert str(caught.value).startswith(
        f"MQRC_CONNECTION_BROKEN (2009): put to queue Q: queue manager QM1 at {q.root} cannot be reached ("
    )
    assert str(caught.value).endswith("; reconnect is no")
    assert payloads(q) == [b"before"]


def test_default_mode_is_the_queue_managers_default_reconnect(q):
    assert Connection(q.root).effective_mode == "no"
    q.alter_qmgr(default_reconnect="yes")
    assert Connection(q.root).effective_mode == "yes"
    assert Connection(q.root, reconnect="qmgr").effective_mode == "qmgr"


def test_mode_yes_retries_through_the_outage(q, clock):
    connection = mqspark.connect(q.root, reconnect="yes", reconnect_timeout=30, clock=clock)
    started = clock.monotonic()
    with clocked_outage(clock, q.root, OUTAGE):
        ids = connection.put("Q", [{"payload": b"a"}, {"payload": b"b"}])
        assert clock.monotonic() - started >= OUTAGE
        assert connection.depth("Q") == 2
    assert q.browse("Q")["msg_id"].to_pylist() == ids
    assert payloads(q) == [b"a", b"b"]
    assert connection.get("Q", max_messages=2)["payload"].to_pylist() == [b"a", b"b"]


def test_mode_yes_moves_along_the_connection_list_to_a_queue_manager_hosting_the_queue(q, tmp_path, clock):
    without = QueueManager.create(tmp_path / "qm2", "QM2")
    other = QueueManager.create(tmp_path / "qm3", "QM3")
    other.define_queue("Q")
    connection = mqspark.connect([q.root, without.root, other.root], reconnect="yes", reconnect_timeout=30, clock=clock)
    assert connection.qm.name == "QM1"
    with outage(q.root, None):
        connection.put("Q", [{"payload": b"moved"}])
        assert connection.qm.name == "QM3"
    assert payloads(other) == [b"moved"]
    assert payloads(q) == []


def test_mode_qmgr_comes_back_only_to_the_same_queue_manager(q, tmp_path, clock):
    other = QueueManager.create(tmp_path / "qm2", "QM2")
    other.define_queue("Q")
    connection = mqspark.connect([q.root, other.root], reconnect="qmgr", reconnect_timeout=30, clock=clock)
    started = clock.monotonic()
    with clocked_outage(clock, q.root, OUTAGE):
        connection.put("Q", [{"payload": b"back home"}])
        assert clock.monotonic() - started >= OUTAGE
    assert connection.qm.qmid == q.qmid
    assert payloads(q) == [b"back home"]
    assert payloads(other) == []


def test_mode_qmgr_refuses_a_new_queue_manager_created_at_the_same_root_with_qmid_mismatch(q, clock):
    connection = mqspark.connect(q.root, reconnect="qmgr", reconnect_timeout=2, clock=clock)
    created: list[QueueManager] = []

    def create_again() -> None:
        os.remove(q.root)
        created.append(QueueManager.create(q.root, "QM1"))
        created[0].define_queue("Q")

    with outage(q.root, None):
        # While the client waits, another queue manager of the same name appears at the root.
        clock.after(0.3, create_again)
        with pytest.raises(MQError) as caught:
            connection.put("Q", [{"payload": b"x"}])
        store.remove_tree(q.root)
        open(q.root, "w").close()
    assert created[0].qmid != q.qmid
    assert caught.value.reason is Reason.MQRC_RECONNECT_QMID_MISMATCH
    assert str(caught.value) == (
        f"MQRC_RECONNECT_QMID_MISMATCH (2545): put to queue Q: queue manager {q.qmid} did not come back within "
        f"the reconnect timeout of 2 s; only other queue managers answered ({created[0].qmid} at {q.root})"
    )
    assert payloads(q) == []


def test_disabled_on_the_queue_manager_overrides_the_clients_mode(q, clock):
    q.alter_qmgr(default_reconnect="disabled")
    connection = mqspark.connect(q.root, reconnect="yes", clock=clock)
    assert connection.effective_mode == "disabled"
    with clocked_outage(clock, q.root, OUTAGE):
        with pytest.raises(MQError) as caught:
            connection.depth("Q")
    assert caught.value.reason is Reason.MQRC_CONNECTION_BROKEN
    assert str(caught.value).endswith("; reconnection is disabled on the queue manager")


def test_reconnect_timeout_ends_with_reconnect_failed(q, clock):
    connection = mqspark.connect(q.root, reconnect="yes", reconnect_timeout=0.5, clock=clock)
    with outage(q.root, None):
        with pytest.raises(MQError) as caught:
            connection.put("Q", [{"payload": b"x"}])
    assert caught.value.reason is Reason.MQRC_RECONNECT_FAILED
    assert str(caught.value).startswith(
        "MQRC_RECONNECT_FAILED (2548): put to queue Q: no queue manager of the connection list answered within "
        f"the reconnect timeout of 0.5 s (lost QM1 at {q.root}: "
    )
    assert payloads(q) == []


def _break_at_commit(
    monkeypatch, clock, root: str, table: str, landed: bool, wanted=lambda table, files: True
) -> list[str]:
    """The root goes away at the first commit to a ``table`` (``queues`` or ``state``) table that
    ``wanted`` picks, for OUTAGE seconds of ``clock``: just before it (so it does not land), or just
    after it (it landed, but the client's next read fails). Commits through delta-rs and through
    mqspark's own appender (a put to a local queue) alike."""
    broke: list[str] = []

    def breaking(real, location_of, files_of):
        def commit(*args, **kwargs):
            location, files = location_of(*args), files_of(*args)
            if broke or f"/{table}/" not in location or not wanted(location, files):
                return real(*args, **kwargs)
            broke.append(location)
            if not landed:
                break_root_on(clock, root, OUTAGE)
                return real(*args, **kwargs)
            real(*args, **kwargs)
            break_root_on(clock, root, OUTAGE)
            # What the client does next after a commit fails: the answer never reaches it.
            return DeltaTable(location).version()

        return commit

    def first(target, *_):
        return target

    def second(_, files, *__):
        return files

    def third(_, __, files, *___):
        return files

    monkeypatch.setattr(store, "commit_files", breaking(store.commit_files, lambda table, *_: table.table_uri, second))
    monkeypatch.setattr(store.Appender, "append", breaking(store.Appender.append, lambda a, *_: a.location, second))
    monkeypatch.setattr(store, "append_files", breaking(store.append_files, first, third))
    return broke


@pytest.mark.parametrize("landed", [True, False], ids=["commit-landed", "commit-lost"])
def test_a_put_in_doubt_is_resolved_exactly_on_reconnect(q, monkeypatch, clock, landed):
    connection = mqspark.connect(q.root, reconnect="yes", reconnect_timeout=30, clock=clock)
    broke = _break_at_commit(monkeypatch, clock, q.root, "queues", landed)
    ids = connection.put("Q", [{"payload": b"once"}, {"payload": b"only once"}])
    assert broke
    assert clock.monotonic() >= OUTAGE
    assert q.browse("Q")["msg_id"].to_pylist() == ids
    assert payloads(q) == [b"once", b"only once"]
    assert engine(q).puts.committed_transaction("Q", connection.producer) == 1


def _consumption(location, files) -> bool:
    rows = pq.read_table(f"{location}/{files[0].path}", columns=["event"])
    return "consumed" in rows["event"].to_pylist()


@pytest.mark.parametrize("landed", [True, False], ids=["commit-landed", "commit-lost"])
def test_a_get_in_doubt_is_resolved_exactly_on_reconnect(q, monkeypatch, clock, landed):
    q.put("Q", [{"payload": b"1"}, {"payload": b"2"}, {"payload": b"3"}])
    connection = mqspark.connect(q.root, reconnect="yes", reconnect_timeout=30, clock=clock)
    broke = _break_at_commit(monkeypatch, clock, q.root, "state", landed, _consumption)
    first = connection.get("Q", max_messages=2)
    assert broke
    assert clock.monotonic() >= OUTAGE
    assert first["payload"].to_pylist() == [b"1", b"2"]
    assert connection.get("Q", max_messages=5)["payload"].to_pylist() == [b"3"]
    assert first["backout_count"].to_pylist() == [0, 0]


def test_bad_reconnect_options_name_the_option_and_value(q):
    with pytest.raises(MQValidationError) as caught:
        mqspark.connect(q.root, reconnect="maybe")
    assert str(caught.value) == "reconnect must be one of no, yes, qmgr; got 'maybe'"
    with pytest.raises(MQValidationError) as caught:
        mqspark.connect(q.root, reconnect="disabled")
    assert str(caught.value) == "reconnect must be one of no, yes, qmgr; got 'disabled'"
    with pytest.raises(MQValidationError) as caught:
        mqspark.connect(q.root, reconnect_timeout=-1)
    assert str(caught.value) == "reconnect_timeout must be a number of seconds >= 0, got -1"
    with pytest.raises(MQValidationError) as caught:
        mqspark.connect([])
    assert str(caught.value) == "connection list is empty: give at least one queue manager root"
    with pytest.raises(MQValidationError) as caught:
        q.alter_qmgr(default_reconnect="sometimes")
    assert str(caught.value) == (
        "queue manager QM1: attribute default_reconnect must be one of no, yes, qmgr, disabled; got 'sometimes'"
    )
    with pytest.raises(MQValidationError) as caught:
        q.alter_qmgr(name="QM9")
    assert str(caught.value) == (
        "queue manager QM1: attribute 'name' cannot be altered; alterable attributes are description, default_reconnect"
    )


def test_no_queue_manager_of_the_list_answers_at_connect(tmp_path):
    with pytest.raises(MQError) as caught:
        mqspark.connect([str(tmp_path / "none1"), str(tmp_path / "none2")], reconnect="yes")
    assert caught.value.reason is Reason.MQRC_Q_MGR_NOT_AVAILABLE
    assert str(caught.value) == (
        "MQRC_Q_MGR_NOT_AVAILABLE (2059): no queue manager of the connection list answered ("
        f"{tmp_path}/none1: MQError: MQRC_UNKNOWN_OBJECT_NAME (2085): no queue manager at {tmp_path}/none1; "
        f"{tmp_path}/none2: MQError: MQRC_UNKNOWN_OBJECT_NAME (2085): no queue manager at {tmp_path}/none2)"
    )


def test_qmid_and_default_reconnect_survive_reopening(q):
    q.alter_qmgr(default_reconnect="qmgr")
    again = QueueManager.open(q.root)
    assert again.qmid == q.qmid
    assert again.qmid.startswith("QM1_")
    assert engine(again).definition.default_reconnect == "qmgr"
