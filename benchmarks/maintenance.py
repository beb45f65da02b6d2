"""Maintenance (``qm.maintain``): what it buys a queue with a long history, and how fast it removes.

Two queues get a history of single-message puts: ``history`` puts (the large queue) and
``small_history`` puts (the anchor), each put made through the put path itself
(``prepare_put`` + ``store.write_data_file`` + ``Puts.commit_put``, which is ``qm.put``
without re-reading the catalog every time). A put that leaves the table with
``mqspark.engine.puts.MAINTAIN_AT_FILES`` files runs maintenance itself (default retention, 1 hour), so the
large queue's build includes those runs (``large_build_put_triggered_maintenance_runs``);
``run(put_maintenance=False)`` switches them off for a queue that no maintenance ever touched. One
consumer group ``g`` consumes all but the last ``waiting`` messages of each queue (a planner-level
:class:`mqspark.spark.stream.QueueStreamReader`: one plan of the messages, recorded consumed by
``commit``). Then, in this order:

1. **Before qm.maintain** (``*_before_maintain``): ``put_samples`` single-message ``qm.put`` calls on
   each queue, alternating between them (``put_p50_ms``); the group then consumes all but the last
   ``waiting`` again. Then the start-up of a new planner of the group on each queue (``startup``):
   ``initialOffset()`` + the first ``latestOffset(start, default limit)`` + ``partitions(start,
   end)``, which is what Spark's planner does before the first micro-batch; ``readers`` fresh
   readers per queue, alternating, each stopped (its lease released) before the next; each must
   plan exactly the ``waiting`` messages.
2. ``qm.maintain(queue, retention=timedelta(0))`` on both queues, as a running consumer's planner
   would (with no retention, so the log is cleaned up and removed files vacuumed at once).
3. **After it**: the same start-up measurement, then the same put measurement.

Targets: ``startup.ratio`` and ``put_latency.ratio`` (large / small history, after maintenance) <= 1.5.
The ratios before are reported for comparison (delta-rs's own commit and table loading grow with
the number of live files and log entries).

**Throughput** (``maintenance_throughput``): a third queue gets ``bulk_messages`` messages of
``payload_bytes`` random bytes in ``bulk_puts`` puts, all consumed by one group; one ``qm.maintain``
run removes them. ``maintenance_messages_per_s`` is removed messages over the run's wall time.

The run fails instead of reporting when a planner plans other than the waiting messages, or a
group's depth or the queue's live messages are not what the steps leave. ``other_processes_cores``
and ``contention_*`` fields (see :class:`benchmarks.stream_get._Contention`) say how busy the machine
was with other work: wall times on a shared 2-core machine are only comparable when that is near 0.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from mqspark import QueueManager, store
from mqspark.engine import depth, puts
from mqspark.model.groups import group_items
from mqspark.model.messages import QUEUE_TABLE_SCHEMA
from mqspark.model.put import prepare_put, rows_to_table
from mqspark.qmgr import engine
from mqspark.spark.datasource import _get_options
from mqspark.spark.stream import QueueStreamReader

from .stream_get import _Contention, _p
from .stream_put import check_run

GROUP = "g"


def _reader(qm: QueueManager, queue: str) -> QueueStreamReader:
    """A planner of group ``g`` as Spark builds it (option keys lower-cased), without its own maintenance."""
    options = {"path": qm.root, "queue": queue, "consumer": GROUP, "maintenanceinterval": "0"}
    return QueueStreamReader(_get_options(options))


def _build(qm: QueueManager, queue: str, puts: int) -> dict:
    """``puts`` puts of one small message each, through the put path; returns build timings."""
    definition = engine(qm).resolve_for_put(queue)
    location = store.queue_location(qm.root, queue)
    times = []
    contention = _Contention()
    began = time.perf_counter()
    for index in range(puts):
        start = time.perf_counter()
        messages = prepare_put(definition, rows_to_table(queue, [{"payload": f"m{index}".encode()}])).messages
        file = store.write_data_file(location, messages.to_batches(), QUEUE_TABLE_SCHEMA)
        engine(qm).puts.commit_put(queue, [file], group_items(messages), definition=definition)
        times.append(time.perf_counter() - start)
    total = time.perf_counter() - began
    busy = contention.fields()
    check_run("maintenance", {f"queue {queue}: depth after building": (qm.depth(queue), puts)})
    history = store.open_table(location, engine(qm).storage_options).history()
    operations = [entry.get("mqspark.operation") for entry in history]
    return {
        "build_s": round(total, 1),
        "build_puts_per_s": round(puts / total),
        "build_put_ms_first100_median": _ms(statistics.median(times[:100])),
        "build_put_ms_last100_median": _ms(statistics.median(times[-100:])),
        "build_put_ms_p99": _ms(_p(times, 0.99)),
        "build_put_ms_max": _ms(max(times)),
        # Runs the put path started itself (a put that leaves MAINTAIN_AT_FILES files or more).
        "build_put_triggered_maintenance_runs": operations.count("maintain"),
        "build_other_processes_cores": busy["other_processes_cores"],
    }


def _consume_all_but(qm: QueueManager, queue: str, keep: int) -> None:
    """Group ``g`` consumes every waiting message but the last ``keep``, in one recorded batch."""
    waiting = qm.depth(queue, consumer=GROUP)
    if waiting > keep:
        reader = _reader(qm, queue)
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, ReadMaxRows(waiting - keep))
            planned = end["delivered"] - start["delivered"]
            if planned != waiting - keep:
                raise RuntimeError(f"queue {queue}: planned {planned} messages to consume, not {waiting - keep}")
            reader.commit(end)
        finally:
            reader.stop()
    check_run("maintenance", {f"queue {queue}: group {GROUP} depth": (qm.depth(queue, consumer=GROUP), keep)})


def _startup_once(qm: QueueManager, queue: str, waiting: int) -> dict:
    """One new planner's start-up: initialOffset + first latestOffset + partitions, in seconds."""
    reader = _reader(qm, queue)
    try:
        began = time.perf_counter()
        start = reader.initialOffset()
        initial = time.perf_counter()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        latest = time.perf_counter()
        parts = reader.partitions(start, end)
        done = time.perf_counter()
    finally:
        reader.stop()
    # A partition holds ranges of rows: ``count`` messages from ``row`` on.
    planned = sum(int(part.count.sum()) for part in parts)
    if planned != waiting or end["delivered"] - start["delivered"] != waiting:
        raise RuntimeError(f"queue {queue}: a new planner planned {planned} messages, not the {waiting} waiting")
    return {
        "startup_s": done - began,
        "initial_offset_s": initial - began,
        "latest_offset_s": latest - initial,
        "partitions_s": done - latest,
    }


def _startups(qm: QueueManager, queues: list[str], readers: int, waiting: int) -> dict[str, dict]:
    """Median start-up of ``readers`` new planners per queue, the queues taken in turn (alternating
    which goes first) so that drift and contention hit both alike."""
    measured: dict[str, list[dict]] = {queue: [] for queue in queues}
    for round_ in range(readers):
        for queue in queues if round_ % 2 == 0 else queues[::-1]:
            measured[queue].append(_startup_once(qm, queue, waiting))
    return {
        queue: {key: statistics.median(run[key] for run in runs) for key in runs[0]} for queue, runs in measured.items()
    }


def _put_latency(qm: QueueManager, queues: list[str], samples: int) -> dict[str, float]:
    """Median seconds of one ``qm.put`` of one message per queue, the queues taken in turn."""
    times: dict[str, list[float]] = {queue: [] for queue in queues}
    for index in range(samples):
        for queue in queues if index % 2 == 0 else queues[::-1]:
            began = time.perf_counter()
            qm.put(queue, [{"payload": f"p{index}".encode()}])
            times[queue].append(time.perf_counter() - began)
    return {queue: statistics.median(values) for queue, values in times.items()}


def _live(qm: QueueManager, queue: str) -> tuple[int, int, int]:
    """Live files, live messages and log entries of ``queue``'s table."""
    location = store.queue_location(qm.root, queue)
    files, messages = depth.live_messages(store.open_table(location, engine(qm).storage_options))
    return files.num_rows, messages.num_rows, store.log_entry_count(location)


def _throughput(qm: QueueManager, messages: int, puts: int, payload_bytes: int) -> dict:
    if messages % puts:
        raise ValueError(f"bulk_messages {messages} must be a multiple of bulk_puts {puts}")
    queue = "BULK"
    qm.define_queue(queue)
    generator = np.random.default_rng(1)
    per_put = messages // puts
    began = time.perf_counter()
    for _ in range(puts):
        blob = generator.bytes(per_put * payload_bytes)
        payloads = [blob[i * payload_bytes : (i + 1) * payload_bytes] for i in range(per_put)]
        qm.put(queue, pa.table({"payload": pa.array(payloads, pa.binary())}))
    fill_s = time.perf_counter() - began

    reader = _reader(qm, queue)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        reader.commit(end)
    finally:
        reader.stop()
    check_run("maintenance", {"bulk: group depth after consuming": (qm.depth(queue, consumer=GROUP), 0)})

    contention = _Contention()
    began = time.perf_counter()
    summary = qm.maintain(queue, retention=timedelta(0))
    wall = time.perf_counter() - began
    busy = contention.fields()
    files, live, _ = _live(qm, queue)
    check_run(
        "maintenance",
        {
            "bulk: removed consumed": (summary.removed_consumed, messages),
            "bulk: live messages after": (live, 0),
            "bulk: live files after": (files, 0),
        },
    )
    return {
        "bulk_messages": messages,
        "bulk_puts": puts,
        "payload_bytes": payload_bytes,
        "bulk_fill_s": round(fill_s, 1),
        "maintenance_s": round(wall, 2),
        "maintenance_messages_per_s": round(summary.removed_consumed / wall),
        "summary": summary.as_dict(),
        **{f"contention_{key}": value for key, value in busy.items()},
    }


def run(
    *,
    history: int = 10_000,
    small_history: int = 100,
    waiting: int = 10,
    readers: int = 5,
    put_samples: int = 50,
    bulk_messages: int = 200_000,
    bulk_puts: int = 200,
    payload_bytes: int = 1024,
    put_maintenance: bool = True,
) -> dict:
    """The whole benchmark (see the module docstring). ``put_maintenance=False`` switches off the
    maintenance the put path starts itself (``mqspark.engine.puts.MAINTAIN_AT_FILES``) for the run, so that
    the "before" figures are those of a queue that maintenance never touched (its build is much
    slower: every put's commit reads all the live files)."""
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-maint-"))
    threshold = puts.MAINTAIN_AT_FILES
    if not put_maintenance:
        puts.MAINTAIN_AT_FILES = sys.maxsize
    try:
        result = _measure(root, history, small_history, waiting, readers, put_samples)
        result["put_triggered_maintenance_at_files"] = puts.MAINTAIN_AT_FILES if put_maintenance else None
        result["maintenance_throughput"] = _throughput(
            QueueManager.open(root / "qm"), bulk_messages, bulk_puts, payload_bytes
        )
        return result
    finally:
        puts.MAINTAIN_AT_FILES = threshold
        shutil.rmtree(root, ignore_errors=True)


def _ratio(values: dict[str, float], large: str, small: str) -> float:
    return round(values[large] / values[small], 2)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _measure(root: Path, history: int, small_history: int, waiting: int, readers: int, put_samples: int) -> dict:
    whole = _Contention()
    qm = QueueManager.create(root / "qm", "BENCH")
    small, large = "SMALL", "LARGE"
    queues = [small, large]
    sizes = {small: small_history, large: history}
    result: dict = {"benchmark": "maintenance", "history": history, "small_history": small_history, "waiting": waiting}

    for queue in queues:
        qm.define_queue(queue)
        built = _build(qm, queue, sizes[queue])
        result.update({f"{queue.lower()}_{key}": value for key, value in built.items()})
        _consume_all_but(qm, queue, waiting)

    # Before any qm.maintain (the put path may have started its own runs while building).
    contention = _Contention()
    put_before = _put_latency(qm, queues, put_samples)
    put_before_busy = contention.fields()
    for queue in queues:
        _consume_all_but(qm, queue, waiting)
    before = {queue: _live(qm, queue) for queue in queues}
    contention = _Contention()
    startup_before = _startups(qm, queues, readers, waiting)
    startup_before_busy = contention.fields()

    # Maintenance, as a running consumer's planner would run it.
    summaries = {queue: qm.maintain(queue, retention=timedelta(0)) for queue in queues}
    after = {queue: _live(qm, queue) for queue in queues}
    check_run(
        "maintenance",
        {
            **{f"queue {queue}: group depth after maintain": (qm.depth(queue, GROUP), waiting) for queue in queues},
            **{f"queue {queue}: live messages after maintain": (after[queue][1], waiting) for queue in queues},
        },
    )

    # After it.
    contention = _Contention()
    startup = _startups(qm, queues, readers, waiting)
    startup_busy = contention.fields()
    contention = _Contention()
    put = _put_latency(qm, queues, put_samples)
    put_busy = contention.fields()

    startup_s = {queue: values["startup_s"] for queue, values in startup.items()}
    startup_before_s = {queue: values["startup_s"] for queue, values in startup_before.items()}
    result["startup"] = {
        "readers_per_queue": readers,
        "ratio": _ratio(startup_s, large, small),
        "target_ratio": 1.5,
        "ratio_before_maintain": _ratio(startup_before_s, large, small),
        **{
            f"{queue.lower()}_{key.removesuffix('_s')}_ms_median": _ms(value)
            for queue, values in startup.items()
            for key, value in values.items()
        },
        **{
            f"{queue.lower()}_{key.removesuffix('_s')}_ms_median_before_maintain": _ms(value)
            for queue, values in startup_before.items()
            for key, value in values.items()
        },
        "other_processes_cores": startup_busy["other_processes_cores"],
        "other_processes_cores_before_maintain": startup_before_busy["other_processes_cores"],
    }
    result["put_latency"] = {
        "puts_per_queue": put_samples,
        "ratio": _ratio(put, large, small),
        "target_ratio": 1.5,
        "ratio_before_maintain": _ratio(put_before, large, small),
        **{f"{queue.lower()}_put_p50_ms": _ms(value) for queue, value in put.items()},
        **{f"{queue.lower()}_put_p50_ms_before_maintain": _ms(value) for queue, value in put_before.items()},
        "other_processes_cores": put_busy["other_processes_cores"],
        "other_processes_cores_before_maintain": put_before_busy["other_processes_cores"],
    }
    result["queues"] = {
        queue.lower(): {
            "live_files_before_maintain": before[queue][0],
            "live_messages_before_maintain": before[queue][1],
            "log_entries_before_maintain": before[queue][2],
            "live_files_after_maintain": after[queue][0],
            "live_messages_after_maintain": after[queue][1],
            "log_entries_after_maintain": after[queue][2],
            "maintain": summaries[queue].as_dict(),
        }
        for queue in queues
    }
    result.update({f"contention_{key}": value for key, value in whole.fields().items()})
    return result
