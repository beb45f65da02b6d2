"""mqspark on a real Spark cluster: a standalone master and two one-core workers on 127.0.0.1, jobs
sent with spark-submit, queue managers and outputs on the object store (the Azurite emulator), so
executors reach nothing but the store and the driver's jars.

A worker is SIGKILLed mid-stream (its JVM, its executor and their Python workers): Spark runs the
lost tasks again on the other worker, and the output is still every message once, in logical order.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from chispa import assert_df_equality

from mqspark import QueueManager
from mqspark.cluster.repository import Cluster
from mqspark.spark.session import delta_jars

from .support.processes import finish_driver, kill_marked, kill_run
from .support.standalone import Standalone
from .test_forward_jobs import SERVICES, _job
from .test_stream_get import _expected_df, _reference

# Every test runs jobs on a Spark standalone cluster.
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("drivers-b")]

JOB = Path(__file__).parent / "support" / "standalone_job.py"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    cluster = Standalone(tmp_path_factory.mktemp("standalone"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _orders(folder: Path, files: int, per_file: int = 6) -> None:
    """``files`` JSON files, each ``per_file`` // 2 ungrouped messages then a group of the rest."""
    folder.mkdir(parents=True)
    half = per_file // 2
    for f in range(files):
        rows = [{"payload": f"u{f}-{n}"} for n in range(half)]
        rows += [
            {"payload": f"g{f}-{n}", "group_id": f"G{f}", "msg_seq_number": n, "last_in_group": n == per_file - half}
            for n in range(1, per_file - half + 1)
        ]
        (folder / f"part-{f:03d}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))


def _run(standalone: Standalone, tmp_path: Path, *args: str, timeout: float = 600) -> str:
    """spark-submit the job to the cluster and wait for it; its output on success."""
    token = uuid.uuid4().hex
    log = tmp_path / f"job-{args[0]}-{token[:6]}.log"
    process = standalone.submit(JOB, list(args), log, ",".join(delta_jars()), {"MQSPARK_TEST_RUN": token})
    code = finish_driver(process, token, timeout=timeout)
    assert code == 0, log.read_text()[-4000:]
    return log.read_text()


def _delivered(spark, location: str):
    return spark.read.format("delta").load(location).select("delivery_seq", "msg_id", "offset", "payload")


def test_a_streaming_put_and_get_on_the_cluster_deliver_every_message_once_in_logical_order(
    spark, standalone, azurite, az_root, tmp_path
):
    qm = QueueManager.create(az_root, "QM1")
    qm.define_queue("ORDERS", delivery_sequence="fifo")
    _orders(tmp_path / "input", 4)
    output = f"{az_root}-output"
    _run(standalone, tmp_path, "put-get", az_root, str(tmp_path / "input"), str(tmp_path / "checkpoints"), output)
    got = _delivered(spark, output).orderBy("delivery_seq")
    assert_df_equality(got, _expected_df(spark, _reference(qm, "ORDERS")), ignore_nullable=True)
    assert qm.depth("ORDERS", consumer="g") == 0


def test_a_routed_put_on_the_cluster_spreads_over_the_replicas(standalone, azurite, az_root, tmp_path):
    managers = {name: QueueManager.create(f"{az_root}/{name}", name) for name in ("QM1", "QM2", "QM3", "QM4")}
    repository = Cluster.create(f"{az_root}/cluster", "INVENTORY")
    for name, qm in managers.items():
        repository.join(qm)
        if name != "QM1":
            qm.define_queue("ORDERS")
            repository.advertise(qm, "ORDERS")
    source = tmp_path / "input"
    source.mkdir()
    for batch in range(3):
        rows = [{"payload": f"b{batch}-m{number}"} for number in range(6)]
        (source / f"part-{batch:03d}.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    _run(standalone, tmp_path, "put", managers["QM1"].root, str(source), str(tmp_path / "checkpoints"), "INVENTORY")
    placed = {
        name: [p.decode() for p in managers[name].browse("ORDERS")["payload"].to_pylist()]
        for name in ("QM2", "QM3", "QM4")
    }
    assert sorted(p for payloads in placed.values() for p in payloads) == sorted(
        f"b{batch}-m{number}" for batch in range(3) for number in range(6)
    )
    assert {name: len(payloads) for name, payloads in placed.items()} == {"QM2": 6, "QM3": 6, "QM4": 6}


def test_the_forwarder_on_the_cluster_replies_once_to_every_request(standalone, azurite, az_root, tmp_path):
    """The forwarding service's spark-submit job on the cluster, its checkpoint under the queue
    manager root on the object store: its tasks call the service on the executors."""
    qm = QueueManager.create(az_root, "QM1")
    qm.define_queue("REQUESTS")
    qm.define_queue("REPLIES")
    qm.put("REQUESTS", [{"payload": f"r{i}", "correl_id": f"c{i}", "reply_to_queue": "REPLIES"} for i in range(12)])
    token = uuid.uuid4().hex
    log = tmp_path / "forward.log"
    args = ["--root", az_root, "--queue", "REQUESTS", "--service", f"{SERVICES}:upper", "--exit-when-empty"]
    process = standalone.submit(Path(_job()), args, log, ",".join(delta_jars()), {"MQSPARK_TEST_RUN": token})
    assert finish_driver(process, token, timeout=600) == 0, log.read_text()[-4000:]
    replies = qm.browse("REPLIES")
    assert dict(zip(replies["correl_id"].to_pylist(), replies["payload"].to_pylist(), strict=True)) == {
        f"c{i}": f"R{i}".encode() for i in range(12)
    }
    assert qm.depth("REQUESTS", consumer="forward") == 0


@pytest.mark.slow
def test_a_worker_killed_mid_stream_loses_and_duplicates_nothing(spark, standalone, azurite, az_root, tmp_path):
    qm = QueueManager.create(az_root, "QM1")
    qm.define_queue("ORDERS", delivery_sequence="fifo")
    qm.declare_consumer("ORDERS", "g")  # its depth is asked before the job first reads
    for f in range(10):
        qm.put("ORDERS", [{"payload": f"u{f}-{n}"} for n in range(3)])
        qm.put(
            "ORDERS",
            [
                {"payload": f"g{f}-{n}", "group_id": f"G{f}", "msg_seq_number": n, "last_in_group": n == 3}
                for n in (1, 2, 3)
            ],
        )
    output = f"{az_root}-output"
    token = uuid.uuid4().hex
    log = tmp_path / "get.log"
    process = standalone.submit(
        JOB,
        ["forever", az_root, output, str(tmp_path / "checkpoints"), "6"],
        log,
        ",".join(delta_jars()),
        {"MQSPARK_TEST_RUN": token},
    )
    busy: list[int] = []
    try:
        # Kill the worker whose executor runs, once a few batches are out.
        deadline = time.monotonic() + 240
        while qm.depth("ORDERS", consumer="g") > 45:
            assert process.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, f"no progress: {log.read_text()[-4000:]}"
            time.sleep(0.2)
        busy = [
            number
            for number in range(len(standalone.workers))
            if standalone.workers[number].poll() is None and standalone.executors(number)
        ]
        assert busy, "no worker runs an executor"
        standalone.kill_worker(busy[0])
        deadline = time.monotonic() + 240
        while qm.depth("ORDERS", consumer="g"):
            assert process.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, f"the group was not drained: {log.read_text()[-4000:]}"
            time.sleep(0.2)
        time.sleep(2)
    finally:
        kill_run(process, token)
        kill_marked(token)
        standalone.start_worker(busy[0] if busy else 0)
    got = _delivered(spark, output)
    assert got.count() == got.select("msg_id").distinct().count() == 60
    assert_df_equality(got.orderBy("delivery_seq"), _expected_df(spark, _reference(qm, "ORDERS")), ignore_nullable=True)
