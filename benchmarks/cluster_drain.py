"""Drain throughput on a Spark standalone cluster (a master and two one-core workers on 127.0.0.1,
from pyspark's ``spark-class``) against ``local[2]``, on the same queue in the same run: each
drains it for a consumer group of its own with a spark-submit job (``drain_job.py``,
availableNow into ``noop``). Times are the job's own, from ``start()`` to the end of the query, so
the JVM's start is left out. The queue manager root is a local folder every executor reaches."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path

import pyarrow as pa

from mqspark import QueueManager
from mqspark.spark.session import delta_jars
from tests.support.processes import finish_driver
from tests.support.standalone import Standalone

JOB = Path(__file__).with_name("drain_job.py")


def _drain(cluster: Standalone, master: str, root: str, group: str, work: Path, per_trigger: int) -> dict:
    token = uuid.uuid4().hex
    log = work / f"drain-{group}.log"
    process = cluster.submit(
        JOB,
        [root, group, str(work / f"checkpoint-{group}"), str(per_trigger)],
        log,
        ",".join(delta_jars()),
        {"MQSPARK_TEST_RUN": token},
        master=master,
    )
    if finish_driver(process, token, timeout=1800) != 0:
        raise RuntimeError(f"drain job failed: {log.read_text()[-3000:]}")
    line = next(line for line in log.read_text().splitlines() if line.startswith("drained "))
    return json.loads(line.removeprefix("drained "))


def run(messages: int = 400_000, puts: int = 20, payload_bytes: int = 256, per_trigger: int = 50_000) -> dict:
    work = Path(tempfile.mkdtemp(prefix="mqspark-bench-cluster-drain-"))
    cluster = Standalone(work / "cluster")
    try:
        qm = QueueManager.create(work / "qm", "BENCH")
        qm.define_queue("Q")
        for consumer in ("local", "cluster"):
            qm.declare_consumer("Q", consumer)
        size = messages // puts
        data = pa.table({"payload": pa.array([b"x" * payload_bytes] * size, pa.binary())})
        for _ in range(puts):
            qm.put("Q", data)
        cluster.start()
        on_cluster = _drain(cluster, cluster.url, qm.root, "cluster", work, per_trigger)
        local = _drain(cluster, "local[2]", qm.root, "local", work, per_trigger)
        for result in (on_cluster, local):
            if result["rows"] != size * puts:
                raise RuntimeError(f"drained {result['rows']} rows, not {size * puts}")
        if qm.depth("Q"):
            raise RuntimeError(f"depth {qm.depth('Q')} after both groups drained")
        cluster_rate, local_rate = size * puts / on_cluster["seconds"], size * puts / local["seconds"]
        return {
            "benchmark": "cluster_drain",
            "messages": size * puts,
            "payload_bytes": payload_bytes,
            "max_messages_per_trigger": per_trigger,
            "cluster_workers": 2,
            "cluster_messages_per_s": round(cluster_rate),
            "local2_messages_per_s": round(local_rate),
            "cluster_s": on_cluster["seconds"],
            "local2_s": local["seconds"],
            "ratio_cluster_to_local2": round(cluster_rate / local_rate, 3),
        }
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
