"""Active and standby instances of a streaming get under real faults: the active instance's whole
process tree SIGKILLed again and again with groups in flight, and paused with SIGSTOP past its lease.

Each instance is its own Spark application (a driver process, its JVM and Python workers) sharing
the queue manager root and one checkpoint. Each writes what it gets to one Delta table with
idempotent writes (``txnAppId``/``txnVersion`` = the micro-batch id, as the checkpoint is shared)
and logs every micro-batch it delivered, so the test knows which instance delivered what, and when.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable

from mqspark import store
from mqspark.model.messages import MESSAGE_SCHEMA
from mqspark.services.instances import Instance

from .support import reference_model
from .support.cli import mqspark_process
from .support.processes import (
    PATIENCE,
    first_printed,
    kill_marked,
    kill_run,
    log_tail,
    log_version,
    marked_processes,
    start_driver,
    wait_printed,
)
from .test_get_failures import OUTPUT, _fill

# Every test runs instances that are Spark drivers of their own (mqspark.session()).
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("drivers-b")]

LEASE_S = 5
BATCH = 5

# One instance of the streaming get of group "ha": stands by until active, then delivers.
INSTANCE_SCRIPT = f"""
import os
import sys
import time
from datetime import timedelta

import mqspark
from mqspark import QueueManager
from mqspark.services.instances import Instance

root, output, checkpoint, deliveries = sys.argv[1:5]
spark = mqspark.session(
    app_name="mqspark-instance",
    master="local[2]",
    **{{
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
    }},
)
import logging
logging.basicConfig(level=logging.WARNING)
# A warm standby: the JVM has written a Delta table once, so the first batch after a takeover is quick.
spark.range(1).write.format("delta").mode("overwrite").save(output + "-warm-up-" + str(os.getpid()))
instance = Instance(QueueManager.open(root), "Q", "ha", lease_timeout=timedelta(seconds={LEASE_S}), spark=spark)
# Whole lines, in one write each: the JVM's log lines share the output.
sys.stdout.write(f"standby {{instance.id}}\\n")
sys.stdout.flush()


def deliver(batch, batch_id):
    batch.write.format("delta").mode("append").option("txnAppId", "ha").option("txnVersion", batch_id).save(output)
    with open(deliveries, "a") as log:
        log.write(f"{{instance.id}} {{batch_id}} {{time.time()}}\\n")


def start(instance_id):
    return (
        spark.readStream.format("mq")
        .option("queue", "Q")
        .option("consumer", "ha")
        .option("maxMessagesPerTrigger", {BATCH})
        .option("leaseTimeout", {LEASE_S})
        .option("instance", instance_id)
        .load(root)
        .select({", ".join(repr(name) for name in OUTPUT)})
        .writeStream.foreachBatch(instance.fence(deliver))
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="500 milliseconds")
        .start()
    )


query = instance.run(start)
sys.stdout.write(f"active {{instance.id}}\\n")
sys.stdout.flush()
query.awaitTermination()
"""


class Instances:
    """The instance processes of one test: start, find the active one, kill or pause it."""

    def __init__(self, tmp_path: Path, root: str) -> None:
        self.tmp_path, self.root = tmp_path, root
        self.script = tmp_path / "instance.py"
        self.script.write_text(INSTANCE_SCRIPT)
        self.output, self.checkpoint = tmp_path / "output", tmp_path / "checkpoint"
        self.deliveries = tmp_path / "deliveries.log"
        self.deliveries.touch()
        self.running: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.started = 0
        self.output_version, self.rows = -1, 0

    def start(self) -> str:
        token = uuid.uuid4().hex
        log = self.tmp_path / f"instance-{self.started}.log"
        self.started += 1
        args = [str(self.script), self.root, str(self.output), str(self.checkpoint), str(self.deliveries)]
        self.running[token] = (start_driver(args, log, token), log)
        return token

    def start_active_and_standby(self) -> tuple[str, str, str, str]:
        """Start two instances at once and wait until one of them is active: the active one's token
        and id, then the standby's. Started one after the other, a test waited for two driver starts."""
        tokens = [self.start(), self.start()]
        ids = [self.instance_id(token) for token in tokens]
        runs = [self.running[token] for token in tokens]
        number = first_printed(runs, [f"active {instance}" for instance in ids], PATIENCE)
        return tokens[number], ids[number], tokens[1 - number], ids[1 - number]

    def instance_id(self, token: str, role: str = "standby", timeout: float = PATIENCE) -> str:
        """The instance id the process printed on reaching ``role``."""
        return wait_printed(*self.running[token], role, timeout)

    def log_of(self, instance: str) -> str:
        """The log of the process that ran ``instance``."""
        for log in sorted(self.tmp_path.glob("instance-*.log")):
            text = log.read_text()
            if f"standby {instance}\n" in text:
                return text
        raise AssertionError(f"no log of instance {instance}")

    def delivered(self) -> list[tuple[str, int, float]]:
        """(instance, micro-batch id, time) of every micro-batch delivered, in order."""
        lines = self.deliveries.read_text().splitlines()
        return [(i, int(b), float(t)) for i, b, t in (line.split() for line in lines if line.strip())]

    def wait_for_deliveries(self, instance: str, count: int, timeout: float = PATIENCE) -> float:
        """Wait until ``instance`` delivered ``count`` micro-batches in all; the time of the last."""
        deadline = time.monotonic() + timeout
        while True:
            mine = [d for d in self.delivered() if d[0] == instance]
            if len(mine) >= count:
                return mine[count - 1][2]
            assert time.monotonic() < deadline, f"{instance} delivered {len(mine)} of {count} batches in {timeout} s"
            time.sleep(0.05)

    def signal(self, token: str, number: int) -> None:
        process, _ = self.running[token]
        os.killpg(process.pid, number)
        for pid in marked_processes(token):
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass

    def kill(self, token: str) -> None:
        process, _ = self.running.pop(token)
        kill_run(process, token)

    def stop_all(self) -> None:
        for token, (process, _) in list(self.running.items()):
            if process.poll() is None:
                self.signal(token, signal.SIGCONT)
                kill_run(process, token)
            kill_marked(token)
        self.running.clear()

    def output_rows(self) -> int:
        """The rows in the output table, read again only when its log has moved on."""
        version = log_version(self.output, self.output_version)
        if version != self.output_version:
            self.output_version = version
            self.rows = DeltaTable(str(self.output)).to_pyarrow_table(columns=["msg_id"]).num_rows
        return self.rows


def _filled(qm, seed: int, groups: int, plain: int) -> list[dict]:
    """Define and fill queue Q (groups in flight across puts); the messages in their logical order."""
    qm.define_queue("Q", delivery_sequence="priority")
    _fill(qm, random.Random(seed), groups=groups, plain=plain)
    location = store.queue_location(qm.root, "Q")
    rows = store.read_committed(DeltaTable(location), MESSAGE_SCHEMA.names, MESSAGE_SCHEMA).to_pylist()
    expected = reference_model.delivered(rows, "priority", datetime.now(UTC))
    assert len(expected) == len(rows)
    return expected


def _check_output(spark, output: Path, expected: list[dict]) -> None:
    """Every message exactly once, delivery_seq 0..n-1, in the reference model's logical order."""
    got = spark.read.format("delta").load(str(output)).select(*OUTPUT)
    wanted = spark.createDataFrame(
        [
            (row["msg_id"], row["group_id"], row["msg_seq_number"], row["offset"], row["priority"], row["payload"], seq)
            for seq, row in enumerate(expected)
        ],
        got.schema,
    )
    assert_df_equality(got.orderBy("delivery_seq"), wanted.orderBy("delivery_seq"), ignore_nullable=True)


def _wait_until_drained(qm, instances: Instances, total: int) -> None:
    """Until every message reached the output and the active instance recorded the last micro-batch
    consumed (at its next trigger). Fails when no message reached the output for PATIENCE s: under
    CI's load a micro-batch of 5 took up to 43 s."""
    seen, deadline = -1, 0.0
    while (rows := instances.output_rows()) < total or qm.depth("Q", consumer="ha"):
        if rows != seen:
            seen, deadline = rows, time.monotonic() + PATIENCE
        assert time.monotonic() < deadline, f"{rows} of {total} messages delivered, none for {PATIENCE} s"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_standby_takes_over_each_time_the_active_instance_is_killed(spark, qm, tmp_path, record_property):
    # Two kills: the first hands over to the standby started with the first instance, the second to
    # the replacement started after the first kill. A third would repeat the second's case.
    kills = 2
    rng = random.Random(20261125)
    expected = _filled(qm, 20261125, groups=8, plain=25)
    instances = Instances(tmp_path, qm.root)
    takeovers = []
    try:
        # One active instance and one standby; after each kill a new instance starts, and one of the
        # two live ones takes over.
        first, active, second, standby = instances.start_active_and_standby()
        tokens = {active: first, standby: second}
        for number in range(kills):
            done = len([d for d in instances.delivered() if d[0] == active])
            instances.wait_for_deliveries(active, done + rng.randint(1, 3))
            time.sleep(rng.uniform(0.0, 0.6))
            killed_at = time.time()
            instances.kill(tokens.pop(active))
            replacement = instances.start()
            deadline = time.monotonic() + LEASE_S + PATIENCE
            while not (after := [d for d in instances.delivered() if d[2] > killed_at and d[0] != active]):
                assert time.monotonic() < deadline, (
                    f"no standby took over within {LEASE_S + PATIENCE} s of kill {number}"
                )
                time.sleep(0.05)
            successor, batch, first_delivery = after[0]
            takeovers.append(
                {
                    "kill": number,
                    "from": active,
                    "to": successor,
                    "batch": batch,
                    "s": round(first_delivery - killed_at, 2),
                }
            )
            tokens[instances.instance_id(replacement)] = replacement
            assert successor in tokens, f"{successor} is not one of the live instances"
            active = successor
        _wait_until_drained(qm, instances, len(expected))
    finally:
        instances.stop_all()
        record_property("takeovers", json.dumps(takeovers))
        print("\ntakeovers:\n" + "\n".join(json.dumps(t) for t in takeovers))

    # Each takeover came (the wait above gives up after LEASE_S + PATIENCE). How fast is the
    # benchmark's question (instances_takeover): under CI's load one took 96 s.
    assert len(takeovers) == kills
    # Only the active instance delivered: deliveries change hands at each kill, and never back. An
    # active instance starved past its lease under load loses the group to a standby, by design (a
    # CI run saw one): a hand-over between kills is allowed when the one that lost the group says so.
    order = [d[0] for d in instances.delivered()]
    hands = [order[0], *(b for a, b in zip(order, order[1:], strict=False) if a != b)]
    assert len(hands) == len(set(hands)) and hands[0] == takeovers[0]["from"], hands
    killed = {(t["from"], t["to"]) for t in takeovers}
    changes = set(zip(hands, hands[1:], strict=False))
    assert killed <= changes, hands
    for lost, taker in changes - killed:
        assert f"was taken over by {taker}" in instances.log_of(lost), hands
    _check_output(spark, instances.output, expected)
    assert qm.depth("Q", consumer="ha") == 0


@pytest.mark.slow
def test_a_paused_active_instance_delivers_nothing_after_the_standby_took_over(spark, qm, tmp_path):
    expected = _filled(qm, 7, groups=5, plain=20)
    instances = Instances(tmp_path, qm.root)
    try:
        paused_token, paused, _, standby = instances.start_active_and_standby()
        # Paused just after a delivery, between micro-batches: a pause inside the foreachBatch function
        # itself resumes that function, which nothing outside it can stop (see mqspark.services.instances).
        # It may have delivered several batches by now: wait for its next one.
        seen = sum(1 for d in instances.delivered() if d[0] == paused)
        instances.wait_for_deliveries(paused, max(2, seen + 1))
        instances.signal(paused_token, signal.SIGSTOP)
        stopped_at = time.time()
        took_over = instances.wait_for_deliveries(standby, 1, timeout=LEASE_S + PATIENCE)
        time.sleep(2)
        instances.signal(paused_token, signal.SIGCONT)
        process, log = instances.running[paused_token]
        # The resumed instance's query ends instead of delivering: its lease is gone (the instance stops
        # its query, or the planner fails it), or Spark's checkpoint already holds the batch it was on
        # (Spark's own fence on a shared checkpoint).
        process.wait(timeout=120)
        fences = ("MQRC_OBJECT_IN_USE (2042)", "Multiple streaming queries are concurrently using")
        assert any(fence in log.read_text() for fence in fences), log_tail(log)
        _wait_until_drained(qm, instances, len(expected))
    finally:
        instances.stop_all()

    late = [d for d in instances.delivered() if d[0] == paused and d[2] >= stopped_at]
    assert late == [], f"the paused instance delivered after its pause: {late}"
    assert took_over - stopped_at >= LEASE_S - 1
    assert {d[0] for d in instances.delivered() if d[2] >= took_over} == {standby}
    _check_output(spark, instances.output, expected)
    assert Counter(d[0] for d in instances.delivered())[paused] >= 2


@pytest.mark.slow
def test_switchover_hands_over_at_a_batch_boundary_with_nothing_redelivered(spark, qm, tmp_path):
    expected = _filled(qm, 11, groups=8, plain=30)
    instances = Instances(tmp_path, qm.root)
    try:
        active_token, active, _, standby = instances.start_active_and_standby()
        instances.wait_for_deliveries(active, 2)
        requested = mqspark_process(qm.root, "--json", "instance", "switchover", "Q", "--consumer", "ha")
        assert (requested.returncode, json.loads(requested.stdout)) == (
            0,
            {"queue": "Q", "consumer": "ha", "switchover": "requested"},
        )
        asked_at = time.time()
        taken_over = instances.wait_for_deliveries(standby, 1)
        process, log = instances.running[active_token]
        # The old active instance stopped its query cleanly.
        assert process.wait(timeout=60) == 0, log_tail(log)
        _wait_until_drained(qm, instances, len(expected))
    finally:
        instances.stop_all()

    batches = [d[1] for d in instances.delivered()]
    assert batches == list(range(len(batches))), "a micro-batch was delivered twice, or one was skipped"
    assert {d[0] for d in instances.delivered() if d[2] >= taken_over} == {standby}
    assert {d[0] for d in instances.delivered() if d[2] < asked_at} == {active}
    _check_output(spark, instances.output, expected)


def test_a_query_stopped_inside_a_fenced_batch_s_spark_write_stops_cleanly(spark, qm, tmp_path):
    # Spark tells a stop from a failure by matching the foreachBatch's Python error with a regex
    # that overflowed the stream thread's stack on the whole Java stack trace of an interrupted write.
    from pyspark.sql import functions as F

    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"one"}])
    instance = Instance(qm, "Q", "G")
    writing = threading.Event()

    def slow(payload):  # no type hints: pyspark would read them as a pandas UDF's
        time.sleep(PATIENCE)
        return payload

    def deliver(batch, batch_id: int) -> None:
        writing.set()
        slowly = batch.select(F.udf(slow, "binary")("payload").alias("payload"))
        slowly.write.format("delta").mode("append").save(str(tmp_path / "out"))

    query = instance.run(
        lambda instance_id: (
            spark.readStream.format("mq")
            .option("queue", "Q")
            .option("consumer", "G")
            .option("instance", instance_id)
            .load(qm.root)
            .writeStream.foreachBatch(instance.fence(deliver))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .start()
        )
    )
    try:
        assert writing.wait(PATIENCE)
        deadline = time.monotonic() + PATIENCE
        while not spark.sparkContext.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        query.stop()
        instance.stop()
    assert (query.status["message"], query.exception()) == ("Stopped", None)
