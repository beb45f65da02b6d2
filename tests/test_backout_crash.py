"""A move to the backout queue survives SIGKILL between its put and its consumption record.

Each step of the streaming get's planner runs in a process of its own, as Spark's planner process
does; the test kills it with SIGKILL the moment the backout queue's put has landed, before the
move is recorded as consumed, and lets the next planner run finish the move.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import mqspark
from mqspark import store
from mqspark.engine.consumer_groups import ConsumerState

pytestmark = pytest.mark.slow

PLANNER = """
import json, os, sys
from pyspark.sql.streaming.datasource import ReadMaxRows
from mqspark.spark.datasource import _get_options
from mqspark.spark.stream import QueueStreamReader

reader = QueueStreamReader(_get_options({"path": sys.argv[1], "queue": "Q", "maintenanceinterval": "0"}))
start = json.loads(sys.argv[2]) or reader.initialOffset()
print(json.dumps(reader.latestOffset(start, ReadMaxRows(1))), flush=True)
os._exit(0)
"""


def _planner(root: str, start: dict | None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PLANNER, root, json.dumps(start)], stdout=subprocess.PIPE, text=True)


def _plan(root: str, start: dict | None) -> dict:
    process = _planner(root, start)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    return json.loads(out)


def _log_versions(location: str) -> int:
    return len([name for name in os.listdir(os.path.join(location, "_delta_log")) if name.endswith(".json")])


def test_sigkill_between_the_backout_put_and_its_consumption_moves_each_message_once(qm):
    qm.define_queue("BOQ")
    qm.define_queue("Q", backout_threshold=1, backout_queue="BOQ")
    state = ConsumerState(qm.root, "Q")
    boq = store.queue_location(qm.root, "BOQ")
    offset = _plan(qm.root, None)
    in_window, attempts = 0, 0
    while in_window < 5 and attempts < 40:
        qm.put("Q", [{"payload": f"m{attempts}"}])
        # The planner plans the message; the batch backs it out.
        offset = _plan(qm.root, offset)
        assert offset["plan"]
        assert mqspark.backout([{"queue": "Q", "delivery_seq": offset["delivered"] - 1}], "bad", root=qm.root) == 1
        # The next planner moves it; it is killed as soon as the copy is on the backout queue.
        before = _log_versions(boq)
        process = _planner(qm.root, offset)
        deadline = time.monotonic() + 120
        while _log_versions(boq) == before and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        process.send_signal(signal.SIGKILL)
        process.wait()
        in_window += state.pending_moves("default").num_rows > 0
        attempts += 1
    # A planner run after the last kill finishes what is left.
    _plan(qm.root, offset)
    assert in_window >= 5, f"only {in_window} of {attempts} kills fell between the put and its record"
    moved = sorted(row["payload"].decode() for row in qm.browse("BOQ").to_pylist())
    assert moved == sorted(f"m{n}" for n in range(attempts))
    assert state.pending_moves("default").num_rows == 0
    assert qm.depth("Q", consumer="default") == 0


def test_a_poison_message_ends_on_the_backout_queue_within_bounded_restarts(spark, qm, tmp_path):
    """A plain foreachBatch consumer that raises whenever its batch holds the bad message, restarted
    after each failure as a job supervisor would."""
    from pyspark.errors import StreamingQueryException

    qm.define_queue("BOQ")
    qm.define_queue("Q", backout_threshold=3, backout_queue="BOQ")
    payloads = [f"m{i:04d}" for i in range(1000)]
    qm.put("Q", [{"payload": p} for p in payloads])
    processed: list[str] = []

    def process(df, batch_id: int) -> None:
        rows = [r.payload.decode() for r in df.orderBy("delivery_seq").select("payload").collect()]
        if "m0500" in rows:
            raise ValueError("cannot process m0500")
        processed.extend(rows)

    restarts = 0
    while True:
        query = (
            spark.readStream.format("mq")
            .option("queue", "Q")
            .load(qm.root)
            .writeStream.foreachBatch(process)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination()
        except StreamingQueryException:
            restarts += 1
            assert restarts <= 12, f"still failing after {restarts} restarts; processed {len(processed)}"
            continue
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(30_000)
        if qm.depth("Q", consumer="default") == 0:
            break
    assert processed == [p for p in payloads if p != "m0500"]
    moved = qm.browse("BOQ").to_pylist()
    assert [(m["payload"], m["dlq_reason"]) for m in moved] == [(b"m0500", 2362)]
    assert moved[0]["backout_count"] >= 3
    assert restarts <= 12
