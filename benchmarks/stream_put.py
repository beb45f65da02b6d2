"""Streaming put: ``writeStream.format("mq")`` against ``writeStream.format("delta")`` on the same input.

The input is Parquet files of ``payload`` (binary, random bytes, so compression cannot make it cheap),
``file_rows`` rows each, written once before anything is timed. Each sink reads them with
``maxFilesPerTrigger`` files per micro-batch and ``trigger(availableNow=True)`` in the same
SparkSession (Delta's snapshotPartitions set to the core count, see :func:`run`), after a small
warm-up stream through both sinks. Wall time is start() to
awaitTermination(). Per micro-batch times come from each query's ``recentProgress``; commit times
come from the Delta logs of the two tables (see :func:`_commits`), because neither sink records how
long its commit took. The run fails instead of reporting when either table does not hold exactly
the input rows, one commit per micro-batch.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import mqspark
from mqspark import QueueManager, store

INPUT_SCHEMA = "payload binary"


def random_payloads(generator: np.random.Generator, rows: int, payload_bytes: int) -> pa.Array:
    """``rows`` random binary payloads of ``payload_bytes`` each, built on one buffer."""
    offsets = pa.py_buffer(np.arange(rows + 1, dtype=np.int32) * payload_bytes)
    data = pa.py_buffer(generator.bytes(rows * payload_bytes))
    return pa.Array.from_buffers(pa.binary(), rows, [None, offsets, data])


def _write_input(folder: Path, files: int, file_rows: int, payload_bytes: int, seed: int) -> None:
    """``files`` Parquet files of ``file_rows`` distinct random payloads each."""
    folder.mkdir(parents=True)
    generator = np.random.default_rng(seed)
    for index in range(files):
        payload = random_payloads(generator, file_rows, payload_bytes)
        pq.write_table(pa.table({"payload": payload}), folder / f"part-{index:05d}.parquet")


def check_run(benchmark: str, checks: dict[str, tuple]) -> None:
    """Fail instead of reporting when any (got, expected) pair differs."""
    wrong = {name: values for name, values in checks.items() if values[0] != values[1]}
    if wrong:
        raise RuntimeError(f"{benchmark} run is broken (got, expected): {wrong}")


def _run_stream(spark, source: Path, files_per_trigger: int, sink: str, target: str, checkpoint: Path, **options):
    """Run one availableNow stream to its end; returns (seconds from start() to awaitTermination(), progress)."""
    reader = spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", files_per_trigger)
    writer = (
        reader.parquet(str(source))
        .writeStream.format(sink)
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    start = time.perf_counter()
    query = writer.start(target)
    query.awaitTermination()
    elapsed = time.perf_counter() - start
    if query.exception() is not None:
        raise RuntimeError(f"{sink} stream failed: {query.exception()}")
    return elapsed, [p for p in query.recentProgress if p.numInputRows > 0]


def _commits(location: str) -> list[dict]:
    """Every commit of the Delta table at ``location`` that added files, in version order.

    For each: its commitInfo, the latest ``modificationTime`` of the files it added (when the last of
    the batch's data files was closed) and the modification time of its log file (when the commit
    was written), in milliseconds.
    """
    log = Path(location) / "_delta_log"
    commits = []
    for path in sorted(log.glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        adds = [action["add"] for action in actions if "add" in action]
        if not adds:
            continue
        info = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
        commits.append(
            {
                "version": int(path.stem),
                "info": info,
                "rows": sum(json.loads(add["stats"])["numRecords"] for add in adds),
                "bytes": sum(add["size"] for add in adds),
                "last_file_ms": max(add["modificationTime"] for add in adds),
                "log_written_ms": path.stat().st_mtime_ns / 1e6,
            }
        )
    return commits


def _p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _summary(prefix: str, values: list[float]) -> dict:
    if not values:
        return {f"{prefix}_median": None, f"{prefix}_p95": None}
    return {f"{prefix}_median": round(statistics.median(values), 1), f"{prefix}_p95": round(_p95(values), 1)}


def _progress_fields(prefix: str, progress: list) -> dict:
    return {
        **_summary(f"{prefix}_add_batch_ms", [p.durationMs.get("addBatch", 0) for p in progress]),
        **_summary(f"{prefix}_trigger_ms", [p.durationMs.get("triggerExecution", 0) for p in progress]),
    }


def _commit_fields(prefix: str, commits: list[dict]) -> dict:
    timestamps = [commit["info"]["timestamp"] for commit in commits]
    started = [c["info"]["mqspark.commit_started_ms"] for c in commits if "mqspark.commit_started_ms" in c["info"]]
    measured = {}
    if started:
        # mqspark records when its driver-side commit began; commitInfo.timestamp is when it committed.
        measured = _summary(f"{prefix}_commit_ms", [t - s for t, s in zip(timestamps, started, strict=True)])
    return {
        **measured,
        **_summary(f"{prefix}_commit_interval_ms", [b - a for a, b in zip(timestamps, timestamps[1:], strict=False)]),
        **_summary(f"{prefix}_file_to_commit_ms", [c["log_written_ms"] - c["last_file_ms"] for c in commits]),
    }


def run(
    batch_rows: int,
    messages: int = 1_000_000,
    file_rows: int = 10_000,
    payload_bytes: int = 1024,
    delta_snapshot_partitions: int | None = 2,
    keep: bool = False,
) -> dict:
    """Put ``messages`` through both sinks in micro-batches of ``batch_rows`` rows.

    ``delta_snapshot_partitions`` sets ``spark.databricks.delta.snapshotPartitions`` while the
    benchmark runs (None keeps the session's). Delta's default of 50 makes its sink reconstruct the
    table state with 50-task jobs in every micro-batch, about 2 s per batch on 2 cores, which would
    make the baseline a measure of that setting rather than of writing Delta. ``keep`` leaves the
    temporary folder in place for inspection.
    """
    if batch_rows % file_rows or messages % batch_rows:
        raise ValueError(f"batch_rows {batch_rows} must be a multiple of {file_rows} and divide {messages}")
    files_per_trigger = batch_rows // file_rows
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-stream-"))
    spark = None
    previous: dict[str, str | None] = {}
    try:
        _write_input(root / "input", messages // file_rows, file_rows, payload_bytes, seed=1)
        _write_input(root / "warmup-input", 4, 2_500, payload_bytes, seed=2)
        load_at_start = os.getloadavg()[0]

        # Console progress bars would only clutter stderr; a session that already exists keeps its settings.
        spark = mqspark.session(
            app_name="mqspark-bench", master="local[2]", **{"spark.ui.showConsoleProgress": "false"}
        )
        # Keep every micro-batch's progress (Spark keeps 100 by default).
        settings = {"spark.sql.streaming.numRecentProgressUpdates": "10000"}
        if delta_snapshot_partitions is not None:
            settings["spark.databricks.delta.snapshotPartitions"] = str(delta_snapshot_partitions)
        previous = {key: spark.conf.get(key, None) for key in settings}
        for key, value in settings.items():
            spark.conf.set(key, value)
        qm = QueueManager.create(root / "qm", "BENCH")
        qm.define_queue("WARMUP")
        qm.define_queue("Q")

        # Warm-up: JVM code paths, Python workers and the commit path of both sinks, on a few small batches.
        _run_stream(spark, root / "warmup-input", 2, "mq", qm.root, root / "ckpt-warmup-mq", queue="WARMUP")
        _run_stream(spark, root / "warmup-input", 2, "delta", str(root / "warmup-delta"), root / "ckpt-warmup-delta")

        mq_seconds, mq_progress = _run_stream(
            spark, root / "input", files_per_trigger, "mq", qm.root, root / "ckpt-mq", queue="Q"
        )
        delta_location = str(root / "delta")
        delta_seconds, delta_progress = _run_stream(
            spark, root / "input", files_per_trigger, "delta", delta_location, root / "ckpt-delta"
        )

        # A broken run must not report a number.
        depth = qm.depth("Q")
        delta_count = spark.read.format("delta").load(delta_location).count()
        mq_commits = _commits(store.queue_location(qm.root, "Q"))
        delta_commits = _commits(delta_location)
        batches = messages // batch_rows
        checks = {
            "queue depth": (depth, messages),
            "delta table count": (delta_count, messages),
            "mq commits": (len(mq_commits), batches),
            "mq put commits": (sum(c["info"].get("mqspark.operation") == "put" for c in mq_commits), batches),
            "delta commits": (len(delta_commits), batches),
            "mq progress batches": (len(mq_progress), batches),
            "delta progress batches": (len(delta_progress), batches),
        }
        check_run("stream_put", checks)

        mq_rate = messages / mq_seconds
        delta_rate = messages / delta_seconds
        return {
            "benchmark": "stream_put",
            "messages": messages,
            "batch_rows": batch_rows,
            "payload_bytes": payload_bytes,
            "delta_snapshot_partitions": delta_snapshot_partitions,
            "mq_seconds": round(mq_seconds, 2),
            "delta_seconds": round(delta_seconds, 2),
            "mq_messages_per_s": round(mq_rate),
            "delta_messages_per_s": round(delta_rate),
            "ratio_to_delta": round(mq_rate / delta_rate, 3),
            **_progress_fields("mq", mq_progress),
            **_progress_fields("delta", delta_progress),
            # Neither sink records its commit duration. From the Delta logs instead:
            # file_to_commit = commit log file written - last data file of the batch closed (an upper
            # bound of the driver-side commit: it also holds task completion and, for mq, the start
            # of the Python commit process); commit_interval = gap between consecutive commit
            # timestamps (the micro-batch cycle, not the commit).
            **_commit_fields("mq", mq_commits),
            **_commit_fields("delta", delta_commits),
            "mq_table_bytes": sum(c["bytes"] for c in mq_commits),
            "delta_table_bytes": sum(c["bytes"] for c in delta_commits),
            "load_avg_1m_at_start": round(load_at_start, 2),
        }
    finally:
        if spark is not None:
            for key, value in previous.items():
                if value is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, value)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
