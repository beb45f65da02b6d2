"""Queue managers on an object store: Azure Blob Storage, as the Azurite emulator serves it.

Every table and file is on the emulator: the catalog, the message tables, the state tables, a
put's data files and the maintenance lease. Credentials come from storage options here; the Spark
tests (`test_object_store_spark.py`) reach the same store through the environment variables.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

import mqspark
from mqspark import MQError, MQValidationError, QueueManager, Reason, store
from mqspark.qmgr import engine
from mqspark.services.instances import Instance, switchover
from mqspark.services.monitor import Monitor
from mqspark.store.filesystems import filesystem_of

from .support.samples import spec_example

OUTAGE = 4.0
LOGICAL_ORDER = ["A", "Y1", "Y2", "Y3-1:", "Y3-2", "Z1", "Z2", "B"]


def without_environment(monkeypatch, prefix: str) -> None:
    """Remove the environment variables that start with ``prefix`` for the test."""
    for name in list(os.environ):
        if name.startswith(prefix):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _options_only(monkeypatch):
    """These tests give credentials as storage options only: the session's AZURE_* variables go."""
    without_environment(monkeypatch, "AZURE")


def _payloads(table: pa.Table) -> list[str]:
    return [payload.decode() for payload in table["payload"].to_pylist()]


@pytest.mark.slow  # needs the emulator's process
def test_a_queue_manager_on_the_object_store_puts_browses_gets_and_maintains(azurite, az_root):
    qm = QueueManager.create(az_root, "QM1", storage_options=azurite.storage_options)
    spec_example(qm)
    assert _payloads(qm.browse("Q")) == LOGICAL_ORDER
    assert qm.depth("Q") == 8
    assert _payloads(qm.get("Q", consumer="c", max_messages=3)) == ["A", "Y1", "Y2"]
    # The same queue manager opened again, as az://container/path (a new process would do the
    # same), goes on where the group is.
    container = az_root.removeprefix("abfs://").split("@")[0]
    again = QueueManager.open(f"az://{container}/qm", storage_options=azurite.storage_options)
    assert _payloads(again.get("Q", consumer="c", max_messages=10)) == LOGICAL_ORDER[3:]
    assert again.depth("Q", consumer="c") == 0
    summary = again.maintain("Q", retention=timedelta(0))
    assert (summary.removed_consumed, summary.files_after) == (8, 0)
    assert again.depth("Q") == 0
    for root in (az_root, again.root):
        filesystem, path = filesystem_of(store.queue_location(root, "Q"))
        assert isinstance(filesystem, type(azurite.filesystem()))
        assert path == f"{container}/qm/queues/Q"


def one_writer_wins_each_version(location: str, options: dict[str, str], rounds: int = 10) -> None:
    """What every mqspark commit relies on: of two writers that read the same version and commit the
    next one at the same moment without retrying, exactly one wins and the other gets delta-rs's
    CommitFailedError, ``rounds`` times. A store that overwrote log entries would let both win."""
    write_deltalake(location, pa.table({"n": [0]}), storage_options=options)

    def commit(table: DeltaTable, name: str, together: threading.Barrier, outcomes: list[str]) -> None:
        together.wait()
        try:
            table.create_write_transaction(
                [],
                mode="append",
                schema=table.schema(),
                commit_properties=CommitProperties(max_commit_retries=0, custom_metadata={"writer": name}),
            )
            outcomes.append("won")
        except CommitFailedError:
            outcomes.append("refused")

    for number in range(rounds):
        together, outcomes = threading.Barrier(2), []
        threads = [
            threading.Thread(
                target=commit, args=(DeltaTable(location, storage_options=options), f"{number}-{n}", together, outcomes)
            )
            for n in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == ["refused", "won"], f"round {number}: {outcomes}"
    assert DeltaTable(location, storage_options=options).version() == rounds


def producers_and_a_repeated_transaction_put_exactly_once(qm: QueueManager) -> None:
    """Three producers put three transactions each at once, then each repeats its transaction 1."""
    qm.define_queue("Q")
    errors: list[BaseException] = []

    def producer(name: str) -> None:
        try:
            for batch in range(3):
                rows = [{"payload": f"{name}-{batch}-{n}"} for n in range(2)]
                qm.put("Q", rows, producer=name, batch_id=batch)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=producer, args=(name,)) for name in ("P0", "P1", "P2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    # Each producer's transaction 1 again: already committed, so nothing is put.
    for name in ("P0", "P1", "P2"):
        qm.put("Q", [{"payload": f"{name}-again"}], producer=name, batch_id=1)
        assert engine(qm).puts.committed_transaction("Q", name) == 2
    payloads = _payloads(qm.browse("Q"))
    assert sorted(payloads) == sorted(f"{p}-{b}-{n}" for p in ("P0", "P1", "P2") for b in range(3) for n in range(2))
    for name in ("P0", "P1", "P2"):
        mine = [payload for payload in payloads if payload.startswith(name)]
        assert mine == [f"{name}-{b}-{n}" for b in range(3) for n in range(2)]


@pytest.mark.slow  # needs the emulator's process
def test_duplicate_detection_on_the_object_store_stores_a_msg_id_once_across_queue_managers(azurite, az_root):
    qm = QueueManager.create(az_root, "QM1", storage_options=azurite.storage_options)
    qm.define_queue("Q", duplicate_window=60)
    assert qm.put("Q", [{"msg_id": "A", "payload": "first"}, {"msg_id": "A", "payload": "twice"}]) == ["A", "A"]
    again = QueueManager.open(az_root, storage_options=azurite.storage_options)
    assert again.put("Q", [{"msg_id": "A", "payload": "again"}, {"msg_id": "B", "payload": "new"}]) == ["A", "B"]
    assert qm.put("Q", [{"msg_id": "B", "payload": "b again"}]) == ["B"]
    assert _payloads(qm.browse("Q")) == ["first", "new"]


def test_commits_on_the_object_store_are_put_if_absent_so_one_writer_of_a_version_wins(azurite, az_root):
    one_writer_wins_each_version(f"{az_root}/plain", azurite.storage_options)


@pytest.mark.slow
def test_concurrent_puts_and_a_repeated_transaction_on_the_object_store_are_exactly_once(azurite, az_root):
    producers_and_a_repeated_transaction_put_exactly_once(
        QueueManager.create(az_root, "QM1", storage_options=azurite.storage_options)
    )


def test_an_azure_root_without_an_account_is_refused_with_the_setting_to_give():
    with pytest.raises(MQValidationError) as raised:
        filesystem_of("az://nowhere/qm/queues/Q")
    assert str(raised.value) == (
        "an Azure location needs an account: storage option account_name, AZURE_STORAGE_ACCOUNT_NAME, "
        "or abfss://container@account.dfs.core.windows.net/path"
    )


@pytest.mark.slow  # needs the emulator's process
def test_a_store_that_refuses_the_key_or_does_not_answer_fails_opening_with_the_root(azurite, az_root):
    QueueManager.create(az_root, "QM1", storage_options=azurite.storage_options)
    wrong = {**azurite.storage_options, "account_key": base64.b64encode(bytes(64)).decode()}
    with pytest.raises(MQError) as refused:
        QueueManager.open(az_root, storage_options=wrong)
    assert refused.value.reason == Reason.MQRC_NOT_AUTHORIZED
    assert str(refused.value).startswith(f"MQRC_NOT_AUTHORIZED (2035): queue manager root {az_root}: the store refused")
    assert str(refused.value).endswith("403 Forbidden (AuthorizationFailure)")
    closed = {**azurite.storage_options, "endpoint": "http://127.0.0.1:1/devstoreaccount1"}
    with pytest.raises(MQError) as unanswered:
        QueueManager.open(az_root, storage_options=closed)
    assert unanswered.value.reason == Reason.MQRC_Q_MGR_NOT_AVAILABLE
    assert str(unanswered.value).startswith(
        f"MQRC_Q_MGR_NOT_AVAILABLE (2059): queue manager root {az_root}: the store did not answer: "
    )


@pytest.mark.slow  # stops and starts the emulator's process
def test_every_call_on_a_store_that_stopped_answering_fails_with_2009_naming_the_root(azurite, az_root):
    """An MQ application gets 2009 from any call on a broken connection (2059 when connecting):
    the facade's calls, a claim and a syncpoint get taken before the store stopped, the block
    consumer, a service instance, a switchover, a monitor's point and a request. delta-rs gives up
    on a store that does not answer after its own retries; by the time mqspark looks, the store may
    answer again: the failure is still a broken connection."""
    options = azurite.storage_options
    qm = QueueManager.create(az_root, "QM1", storage_options=options)
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"m1"}, {"payload": b"m2"}])
    claim = qm.claim("Q", "G")
    assert claim is not None
    held = qm.syncpoint_get("Q", "H")
    held.__enter__()
    qm.define_queue("REPLIES")
    monitor = Monitor(qm, "Q", "G", watch_interval=1, watch_count=10, expected_count=1)
    calls = {
        "open": lambda: QueueManager.open(az_root, storage_options=options),
        "put": lambda: qm.put("Q", [{"payload": b"m3"}]),
        "get": lambda: qm.get("Q", "G2"),
        "syncpoint_get": lambda: qm.syncpoint_get("Q", "G3").__enter__(),
        "claim": lambda: qm.claim("Q", "G4"),
        "claim.commit": claim.commit,
        "syncpoint_get's commit": lambda: held.__exit__(None, None, None),
        "consumer": lambda: next(iter(qm.consumer("Q", "G5"))),
        "browse": lambda: qm.browse("Q"),
        "depth": lambda: qm.depth("Q"),
        "define_queue": lambda: qm.define_queue("R"),
        "queues": qm.queues,
        "instance": lambda: Instance(qm, "Q", "G6").wait_until_active(timeout=5),
        "switchover": lambda: switchover(qm, "Q", "G6"),
        "monitor": monitor.point,
        "request": lambda: mqspark.request(qm, "Q", "r1", reply_to="REPLIES", timeout=5),
    }
    azurite.stop()
    try:
        # Each call gives up after the store clients' retries (about 6 s each here): at once, not in turn.
        with ThreadPoolExecutor(len(calls)) as pool:
            outcomes = dict(zip(calls, pool.map(_failure, calls.values()), strict=True))
    finally:
        azurite.start()
    failures = {name: error for name, error in outcomes.items() if isinstance(error, MQError)}
    assert failures.keys() == calls.keys(), outcomes
    reasons = {name: error.reason for name, error in failures.items()}
    assert reasons == {
        name: Reason.MQRC_Q_MGR_NOT_AVAILABLE if name == "open" else Reason.MQRC_CONNECTION_BROKEN for name in calls
    }
    for name, error in failures.items():
        assert "\n" not in str(error), name
        assert str(error).startswith(
            f"{error.reason.name} ({error.reason.value}): queue manager root {qm.root}: the store did not answer: "
        ), name
        assert store.unanswered(error)
    assert store.reachable(qm.root, options)
    assert store.broken(failures["browse"], qm.root, options)
    assert not store.broken(FileNotFoundError(2, "No such file or directory", "x"), qm.root, options)
    assert not store.broken(MQValidationError("bad"), qm.root, options)
    assert qm.browse("Q")["payload"].to_pylist() == [b"m1", b"m2"]


def _failure(call: Callable[[], object]) -> BaseException | object:
    """What ``call`` raised, or what it returned."""
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - the test compares it
        return error


@pytest.mark.slow  # stops the emulator's process for OUTAGE seconds
def test_the_object_store_stopped_and_restarted_under_connections(azurite, az_root):
    """Azurite stopped and started again on the same port with the same data: a connection in mode
    ``no`` fails with 2009, one in mode ``yes`` waits and puts once the store answers again."""
    options = azurite.storage_options
    QueueManager.create(az_root, "QM1", storage_options=options).define_queue("Q")
    broken = mqspark.connect(az_root, reconnect="no", storage_options=options)
    riding = mqspark.connect(az_root, reconnect="yes", reconnect_timeout=120, storage_options=options)
    azurite.stop()
    restart = threading.Timer(OUTAGE, azurite.start)
    try:
        with pytest.raises(MQError) as raised:
            broken.put("Q", [{"payload": b"lost"}])
        assert raised.value.reason == Reason.MQRC_CONNECTION_BROKEN
        started = time.monotonic()
        restart.start()
        ids = riding.put("Q", [{"payload": b"a"}, {"payload": b"b"}])
        assert time.monotonic() - started >= OUTAGE
    finally:
        restart.join()
        if azurite.process is None:
            azurite.start()
    qm = QueueManager.open(az_root, storage_options=options)
    assert qm.browse("Q")["msg_id"].to_pylist() == ids
    assert _payloads(qm.browse("Q")) == ["a", "b"]
    assert _payloads(riding.get("Q", max_messages=2)) == ["a", "b"]
