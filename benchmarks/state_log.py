"""A single get against the length of its queue's state log. Every look at a state table lists its
log; the getters of a busy queue commit several times a second, and a log kept an hour held 15,000
entries. The anchor is the same gets with that many entries kept, as an hour's retention kept them
(the trim is held off while they run); the other figure is after compaction trimmed the log to its
retention (:data:`mqspark.engine.state_table.STATE_RETENTION`)."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from mqspark import QueueManager, store
from mqspark.engine import state_compaction
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.state_rows import STATE_SCHEMA
from mqspark.engine.state_table import STATE_RETENTION


def run(entries: int = 15_000, gets: int = 200) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-"))
    try:
        return _measure(root / "qm", entries, gets)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(root: Path, entries: int, gets: int) -> dict:
    qm = QueueManager.create(root, "BENCH")
    qm.define_queue("Q")
    qm.put("Q", pa.table({"payload": [b"x" * 100] * (2 * gets + 1)}))
    qm.get("Q", consumer="bench", max_messages=1)
    state = ConsumerState(root, "Q")
    table = DeltaTable(state.location)
    started = time.perf_counter()
    for _ in range(entries):
        # A commit that changes no row: as long a log as that many state records make.
        store.commit_files(table, [], STATE_SCHEMA)
        table.update_incremental()
    made = time.perf_counter() - started
    trim_every = state_compaction.TRIM_EVERY
    state_compaction.TRIM_EVERY = 10**9  # as an hour's retention: no compaction in the run trims
    try:
        long_log = _gets(qm, gets)
    finally:
        state_compaction.TRIM_EVERY = trim_every
    log = Path(state.location) / "_delta_log"
    long_log_entries = sum(1 for _ in log.glob("*.json"))
    # The retention passing: the entries look as old as that to the clean-up.
    then = time.time() - STATE_RETENTION.total_seconds() - 60
    for path in log.iterdir():
        os.utime(path, (then, then))
    # The trim one compaction in ten makes (state_compaction.TRIM_EVERY), made now.
    trimmed_table = DeltaTable(state.location)
    store.trim_history(trimmed_table, trimmed_table.version(), int(STATE_RETENTION.total_seconds()))
    trimmed_entries = sum(1 for _ in log.glob("*.json"))
    trimmed = _gets(qm, gets)
    return {
        "benchmark": "state_log",
        "gets": gets,
        "seconds_to_make_the_log": round(made, 1),
        "anchor_log_entries": long_log_entries,
        "anchor_get_p50_ms": long_log["p50_ms"],
        "anchor_get_p99_ms": long_log["p99_ms"],
        "log_entries": trimmed_entries,
        "get_p50_ms": trimmed["p50_ms"],
        "get_p99_ms": trimmed["p99_ms"],
        "get_p50_ratio_to_anchor": round(trimmed["p50_ms"] / long_log["p50_ms"], 3),
    }


def _gets(qm: QueueManager, count: int) -> dict:
    """``count`` single gets of one message each, their latencies."""
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        got = qm.get("Q", consumer="bench", max_messages=1)
        latencies.append(time.perf_counter() - started)
        if got.num_rows != 1:
            raise RuntimeError(f"state_log: a get took {got.num_rows} messages, not 1")
    ordered = sorted(latencies)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 1),
    }
