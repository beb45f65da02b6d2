"""A move to the backout queue survives SIGKILL between its put and its consumption record.

Each step of the streaming get's planner runs in a process of its own, as Spark's planner process
does; the test kills it with SIGKILL the moment the backout queue's put has landed, before the
move is recorded as consumed, and lets the next planner run finish the move.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

import mqspark
from mqspark import store
from mqspark.engine.backout import plan_messages
from mqspark.engine.consumer_groups import ConsumerState

from .support.processes import log_version

pytestmark = pytest.mark.slow

PLANNER = """
import json, os, sys
from pyspark.sql.streaming.datasource import ReadMaxRows
from mqspark.spark.datasource import _get_options
from mqspark.spark.stream import QueueStreamReader

if len(sys.argv) > 4:
    # A crash the moment a move is recorded, before its put: the process ends with status 3.
    from mqspark.engine import backout
    backout.Transfer._put = lambda *args: os._exit(3)
reader = QueueStreamReader(_get_options({"path": sys.argv[1], "queue": "Q", "maintenanceinterval": "0"}))
start = json.loads(sys.argv[2]) or reader.initialOffset()
print(json.dumps(reader.latestOffset(start, ReadMaxRows(int(sys.argv[3])))), flush=True)
os._exit(0)
"""


def _planner(root: str, start: dict | None, rows: int = 1, *crash: str) -> subprocess.Popen:
    command = [sys.executable, "-c", PLANNER, root, json.dumps(start), str(rows), *crash]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def _plan(root: str, start: dict | None, rows: int = 1) -> dict:
    process = _planner(root, start, rows)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    return json.loads(out)


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
        before = log_version(boq)
        process = _planner(qm.root, offset)
        deadline = time.monotonic() + 120
        while log_version(boq) == before and process.poll() is None and time.monotonic() < deadline:
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


@pytest.mark.parametrize("batch", [1, 2], ids=["alone", "with-the-next-item"])
def test_a_crash_right_after_a_grouped_message_s_move_is_recorded_delivers_the_group_s_next_item(qm, batch):
    """Item 4 of a group of 5 fails once (the threshold) in a batch of ``batch`` items; the planner
    that moves it ends the moment the move is recorded. The next planner finishes the move, and item
    5 is delivered next, once."""
    qm.define_queue("BOQ")
    qm.define_queue("Q", backout_threshold=1, backout_queue="BOQ")
    items = [{"payload": f"g{n}", "group_id": "G", "msg_seq_number": n, "last_in_group": n == 5} for n in range(1, 6)]
    qm.put("Q", items)
    offset = _plan(qm.root, None, 3)  # g1-g3
    offset = _plan(qm.root, offset, batch)  # g4 (and g5)
    assert mqspark.backout([{"queue": "Q", "delivery_seq": 3}], "bad", root=qm.root) == 1
    crashed = _planner(qm.root, offset, 3, "crash")
    crashed.communicate(timeout=120)
    assert crashed.returncode == 3
    state = ConsumerState(qm.root, "Q")
    assert state.pending_moves("default")["row"].to_pylist() == [3]
    assert qm.depth("BOQ") == 0
    offset = _plan(qm.root, offset, 3)
    delivered = plan_messages(state.plan("default", offset["plan"]))
    assert delivered["row"].to_pylist() == [4]
    assert [row["payload"] for row in qm.browse("BOQ", "physical").to_pylist()] == [b"g4"]
    _plan(qm.root, offset, 3)
    assert qm.depth("Q", consumer="default") == 0
    assert state.pending_moves("default").num_rows == 0


def test_a_backout_names_the_batch_being_processed_not_a_plan_spark_never_started(qm):
    """A planner records a plan and ends before Spark logs its offsets (a driver killed between the
    two); the next planner plans the same messages again. A backout in that batch holds the message
    and its group's next item back when the batch is consumed."""
    qm.define_queue("Q", backout_threshold=5)
    items = [{"payload": f"g{n}", "group_id": "G", "msg_seq_number": n, "last_in_group": n == 3} for n in (1, 2, 3)]
    qm.put("Q", items)
    offset = _plan(qm.root, None, 1)  # g1
    never_started = _plan(qm.root, offset, 2)  # g2, g3: Spark never logs this offset
    started = _plan(qm.root, offset, 2)  # g2, g3 again, in the batch Spark runs
    assert (never_started["delivered"], started["delivered"]) == (3, 3)
    assert started["seq"] > never_started["seq"]
    state = ConsumerState(qm.root, "Q")
    assert state.current_plan("default")[0] == started["plan"]
    assert mqspark.backout([{"queue": "Q", "delivery_seq": 1}], "bad", root=qm.root) == 1
    offset = _plan(qm.root, started, 2)
    assert qm.depth("Q", consumer="default") == 2
    assert plan_messages(state.plan("default", offset["plan"]))["row"].to_pylist() == [1, 2]


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
