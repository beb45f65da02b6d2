"""The Spark sink under failures: a producer killed with SIGKILL and restarted, producers racing maintenance.

Real processes, real Spark and real Delta tables on disk. Each micro-batch reads one input file and
makes one Delta commit, so the queue's physical order is the input's file order.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import subprocess
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from mqspark import QueueManager, store
from mqspark.model.messages import MESSAGE_SCHEMA

from .support.processes import PATIENCE, finish_driver, kill_run, last_spark_commit, start_driver

# Every test runs producers that are Spark drivers of their own (mqspark.session()).
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("drivers-b")]

REPLAYED = "was committed before"

# A streaming producer in its own process: one file per micro-batch, until the input is drained.
PRODUCER_SCRIPT = """
import sys

import mqspark

root, source, checkpoint = sys.argv[1:4]
spark = mqspark.session(
    app_name="mqspark-killed-producer",
    master="local[2]",
    **{"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
)
query = (
    spark.readStream.schema("payload string")
    .option("maxFilesPerTrigger", 1)
    .json(source)
    .writeStream.format("mq")
    .option("queue", "Q")
    .option("checkpointLocation", checkpoint)
    .trigger(availableNow=True)
    .start(root)
)
query.awaitTermination()
spark.stop()
"""


def _write_input(folder: Path, template: str, files: int, rows: int) -> list[str]:
    """JSON-lines files named and timed in creation order, payloads ``template.format(f=file, r=row)``.

    Returns every payload in input order.
    """
    folder.mkdir(parents=True)
    # The file source orders files by modification time: give each file its own second.
    base = int(time.time()) - files - 60
    payloads = []
    for f in range(files):
        lines = [template.format(f=f, r=r) for r in range(rows)]
        path = folder / f"part-{f:04d}.json"
        path.write_text("".join(json.dumps({"payload": line}) + "\n" for line in lines))
        os.utime(path, (base + f, base + f))
        payloads += lines
    return payloads


def _payloads(table) -> list[str]:
    return [payload.decode() for payload in table["payload"].to_pylist()]


@pytest.mark.slow
def test_producer_killed_with_sigkill_commits_each_batch_once(qm, tmp_path, record_property):
    files, rows, kills = 16, 25, 4  # two at a commit, two between; the runs killed take up to ~12 files
    qm.define_queue("Q")
    location = store.queue_location(qm.root, "Q")
    expected = _write_input(tmp_path / "input", "f{f}-r{r}", files, rows)
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER_SCRIPT)
    checkpoint = tmp_path / "checkpoint"
    token = uuid.uuid4().hex
    rng = random.Random(20261121)
    started = time.monotonic()

    def run(number: int) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"run-{number}.log"
        return start_driver([str(script), qm.root, str(tmp_path / "input"), str(checkpoint)], log, token), log

    logs: list[Path] = []
    killed: list[dict] = []
    for number in range(kills):
        # When to kill: after the run's k-th new Delta commit (the JVM start takes 5-20 s on a loaded
        # machine, so a wall-clock moment would often fall before the stream runs), then either at
        # once, which lands between the Delta commit and Spark's commit log and forces a replay, or
        # after a random delay, which lands anywhere in a micro-batch. The first kill hits batch 0.
        at_commit = number % 2 == 0
        new_commits = 1 if at_commit else rng.randint(1, 3)
        delay = 0.0 if at_commit else rng.uniform(0.05, 0.8)
        target = DeltaTable(location).version() + new_commits
        process, log = run(number)
        logs.append(log)
        deadline = time.monotonic() + PATIENCE
        while not store.version_exists(location, target):
            assert process.poll() is None, f"run {number} ended (rc {process.returncode}) before its kill"
            assert time.monotonic() < deadline, (
                f"run {number} made no progress in {PATIENCE} s: {log.read_text()[-3000:]}"
            )
            time.sleep(0.002)
        time.sleep(delay)
        assert process.poll() is None, f"run {number} ended (rc {process.returncode}) before its kill"
        kill_run(process, token)
        query_id = json.loads((checkpoint / "metadata").read_text())["id"]
        committed_batch = DeltaTable(location).transaction_version(query_id)
        killed.append(
            {
                "run": number,
                "delay_s": round(delay, 3),
                "messages_committed": qm.depth("Q"),
                "last_delta_batch": committed_batch,
                "last_spark_batch": last_spark_commit(checkpoint),
            }
        )

    process, log = run(kills)
    logs.append(log)
    final_rc = finish_driver(process, token)
    elapsed = time.monotonic() - started

    replayed = sum(log.read_text().count(REPLAYED) for log in logs)
    # A kill after the Delta commit of batch N and before Spark's commit log recorded N must make the
    # next run replay N, and that replay must be recognised and skipped.
    pending = sum(kill["last_delta_batch"] > kill["last_spark_batch"] for kill in killed)
    record_property("replayed_batches", replayed)
    record_property("kills", json.dumps(killed))
    print(f"\nkills: {killed}\nreplayed batches: {replayed} (expected {pending}); {elapsed:.1f} s in all")

    assert final_rc == 0, logs[-1].read_text()[-3000:]
    assert killed[-1]["messages_committed"] < files * rows, "the stream had drained before the last kill"

    messages = qm.browse("Q")
    assert Counter(_payloads(messages)) == Counter(expected)
    assert qm.depth("Q") == len(expected)
    # A kill between Spark's file-source log and its offset log can make the restarted source fold
    # two input files into one micro-batch, whose tasks Spark orders (by file size). So: commits
    # follow the input files' order, and inside a commit each file's rows are together and in order.
    columns = pa.schema([MESSAGE_SCHEMA.field("payload"), MESSAGE_SCHEMA.field("put_seq")])
    committed = store.read_committed(DeltaTable(location), columns.names, columns)
    committed = committed.sort_by([("commit_version", "ascending"), ("put_seq", "ascending")])
    assert _payloads(committed) == _payloads(messages)
    files_in_order = []
    for version in sorted(set(committed["commit_version"].to_pylist())):
        payloads = _payloads(committed.filter(pc.equal(committed["commit_version"], version)))
        files_of_commit = list(dict.fromkeys(payload.split("-")[0] for payload in payloads))
        assert payloads == [f"{f}-r{r}" for f in files_of_commit for r in range(rows)]
        files_in_order += sorted(files_of_commit, key=lambda name: int(name[1:]))
    assert files_in_order == [f"f{f}" for f in range(files)]

    # One commit per micro-batch, all by the one producer the restarts kept: batches 0..n-1, once each.
    # n may be below the number of files (see above).
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    puts = [commit for commit in DeltaTable(location).history() if commit.get("mqspark.operation") == "put"]
    assert {commit["mqspark.producer"] for commit in puts} == {query_id}
    assert sorted(commit["mqspark.batch_id"] for commit in puts) == list(range(len(puts)))
    assert all(commit["mqspark.messages"] % rows == 0 for commit in puts)
    assert sum(commit["mqspark.messages"] for commit in puts) == files * rows
    assert replayed == pending


STREAMS = ("A", "B", "C")
STREAM_FILES, STREAM_ROWS = 8, 20
PUTS, PUT_SIZE = 30, 3


def _put_loop(root: str, go) -> None:
    """A plain Python producer: PUTS puts of PUT_SIZE messages while the streams run."""
    qm = QueueManager.open(root)
    assert go.wait(180), "the streams never started"
    for i in range(PUTS):
        qm.put("Q", [{"payload": f"P-{i}-{n}"} for n in range(PUT_SIZE)])
        time.sleep(0.15)


def _maintain(root: str, stop, result: str) -> None:
    """The one maintenance process: maintain the queue again and again until told to stop. The retention
    keeps the whole log, so the test can read every commit back."""
    compactions = attempts = 0
    qm = QueueManager.open(root)
    deadline = time.monotonic() + 240
    while not stop.is_set() and time.monotonic() < deadline:
        attempts += 1
        compactions += qm.maintain("Q", retention=timedelta(hours=1)).version is not None
        stop.wait(0.1)
    Path(result).write_text(json.dumps({"compactions": compactions, "attempts": attempts}))


@pytest.mark.slow
def test_four_producers_and_a_maintenance_commit_lose_nothing(spark, qm, tmp_path, record_property):
    qm.define_queue("Q")
    location = store.queue_location(qm.root, "Q")
    inputs = {name: _write_input(tmp_path / name, name + "-{f}-{r}", STREAM_FILES, STREAM_ROWS) for name in STREAMS}
    put_payloads = [f"P-{i}-{n}" for i in range(PUTS) for n in range(PUT_SIZE)]
    total = len(STREAMS) * STREAM_FILES * STREAM_ROWS + len(put_payloads)

    # spawn, not fork: a forked child using deltalake after its parent did panics.
    context = multiprocessing.get_context("spawn")
    go, stop = context.Event(), context.Event()
    result = tmp_path / "maintenance.json"
    maintenance = context.Process(target=_maintain, args=(qm.root, stop, str(result)))
    putter = context.Process(target=_put_loop, args=(qm.root, go))
    maintenance.start()
    putter.start()
    queries = []
    try:
        for name in STREAMS:
            queries.append(
                spark.readStream.schema("payload string")
                .option("maxFilesPerTrigger", 1)
                .json(str(tmp_path / name))
                .writeStream.format("mq")
                .option("queue", "Q")
                .option("checkpointLocation", str(tmp_path / f"checkpoint-{name}"))
                .trigger(availableNow=True)
                .start(qm.root)
            )
        # The Python puts start once the streams are committing, so that all four producers overlap.
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline and all(query.isActive and not query.lastProgress for query in queries):
            time.sleep(0.05)
        go.set()
        for query in queries:
            assert query.awaitTermination(240), f"query {query.name or query.id} did not finish"
            assert query.exception() is None
        putter.join(timeout=120)
        assert putter.exitcode == 0
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
        stop.set()
        maintenance.join(timeout=120)
        for process in (putter, maintenance):
            if process.is_alive():
                process.kill()
                process.join()
    assert maintenance.exitcode == 0
    report = json.loads(result.read_text())
    record_property("maintenance", json.dumps(report))
    print(f"\nmaintenance: {report}")

    history = sorted(DeltaTable(location).history(), key=lambda commit: commit["version"])
    maintained = [c for c in history if c.get("mqspark.operation") == "maintain"]
    puts = [c["version"] for c in history if c.get("mqspark.operation") == "put"]
    streamed = [c["version"] for c in history if c.get("mqspark.producer")]
    # The compactions really ran between the producers' commits, not before or after them all, and
    # the Python puts landed while the streams were committing.
    assert report["compactions"] >= 1
    assert len(maintained) == report["compactions"]
    assert any(streamed[0] < c["version"] < streamed[-1] for c in maintained)
    assert any(streamed[0] < version < streamed[-1] for version in sorted(set(puts) - set(streamed)))

    # Each micro-batch of each stream committed exactly once, and each Python put once.
    by_producer = Counter(
        commit.get("mqspark.producer") for commit in history if commit.get("mqspark.operation") == "put"
    )
    assert by_producer == Counter({**{str(query.id): STREAM_FILES for query in queries}, None: PUTS})
    for query in queries:
        batches = [c["mqspark.batch_id"] for c in history if c.get("mqspark.producer") == str(query.id)]
        assert sorted(batches) == list(range(STREAM_FILES))

    expected = [payload for name in STREAMS for payload in inputs[name]] + put_payloads
    messages = _payloads(qm.browse("Q"))
    assert Counter(messages) == Counter(expected)
    assert qm.depth("Q") == total
    # Each producer's messages keep its own order (file by file, row by row; put by put).
    for prefix, own in [*((f"{name}-", inputs[name]) for name in STREAMS), ("P-", put_payloads)]:
        assert [payload for payload in messages if payload.startswith(prefix)] == own

    table = spark.read.format("delta").load(location)
    assert table.count() == total
    assert Counter(row.payload.decode() for row in table.select("payload").collect()) == Counter(expected)
