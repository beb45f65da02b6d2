"""Backlog (issue 27): what planning costs, and the memory it holds, as the waiting backlog grows.

For each size (waiting messages), one queue is built once, through the put path (``qm.put`` of
Arrow tables of ``PUT_ROWS`` messages, one data file and one commit each): 16-byte random payloads,
a tenth of the messages in complete groups of 10 (in every 100 messages put, the first 10 are one
group, items 1-10, the 10th last in group), default priority. Then each case runs in a fresh
process (so its peak RSS is its own), one at a time:

- ``python``: without Spark, on group ``c``: ``qm.depth(queue)`` (checked to be the size), the first
  and the second ``qm.get`` of one message, ``qm.browse(limit=10)``, one point of a new
  :class:`mqspark.services.monitor.Monitor` of group ``c``, and the process's peak RSS
  (``VmHWM``).
- ``mq``: ``readStream.format("mq")`` of group ``stream`` with ``maxMessagesPerTrigger`` 10000 into
  the ``noop`` sink (default trigger), after a warm-up stream on a small queue of the same shape in
  the same session. Seconds from ``start()`` to the first batch done (its progress's trigger start
  plus ``triggerExecution``), Spark's durations of that batch (``latestOffset`` holds ``initialOffset`` and
  the first ``latestOffset``), the second batch's ``latestOffset``, and the peak RSS (``VmHWM``) of
  the query's planner process (``python_streaming_source_runner``, which the JVM starts for each
  query) and of the driver's JVM.
- ``delta``: the anchor, ``readStream.format("delta")`` of the same table with ``maxFilesPerTrigger``
  1 into ``noop``, after its own warm-up: seconds to the first batch done, the driver JVM's peak RSS
  and its heap in use after a GC. One file is one put, so its first batch is the whole queue below
  ``PUT_ROWS`` messages and ``PUT_ROWS`` messages from there up.

Every value is also given as its ratio to the same value at the smallest size of the run (the
issue's "ratio to 100k"), with the issue's target and whether it is met (``TARGETS``; the issue
sets them for 20M and 100M, and a ratio of at most 2 for each). Each case reports how busy the
machine was with other work (``other_processes_cores``, see :class:`benchmarks.stream_get._Contention`):
times on a shared machine compare only when that is near 0.

Run: ``./dev.sh bench backlog`` (100k and 1M, a few minutes), or with sizes:
``./dev.sh bench backlog 100k 1M 20M`` and, separately, ``./dev.sh bench backlog 100k 100M``
(the smallest size given is the ratios' base). The big cases need disk (about 60 B per message
in the queue table). Readers with a limit read the queue's index lazily, so their memory follows
the head they need; the Python case still runs under an address-space limit
(``PYTHON_MEMORY_FRACTION`` of the machine's memory) and reports ``failed`` instead of taking the
machine down. A case that fails is reported, not raised.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from mqspark import QueueManager, store

from .stream_put import check_run, random_payloads

DEFAULT_SIZES = (100_000, 1_000_000)
QUEUE = "Q"
WARMUP_QUEUE = "WARMUP"
WARMUP_MESSAGES = 1_000
PAYLOAD_BYTES = 16
# In every BLOCK messages put, the first GROUP_SIZE are one complete group: a tenth in groups of 10.
BLOCK = 100
GROUP_SIZE = 10
PUT_ROWS = 1_000_000
MAX_MESSAGES_PER_TRIGGER = 10_000
DELTA_MAX_FILES_PER_TRIGGER = 1
PYTHON_GROUP = "c"
# The process the JVM starts for a Python streaming source's planner methods.
PLANNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
STREAM_GROUP = "stream"
# The Python case may use this share of the machine's memory before an allocation fails.
PYTHON_MEMORY_FRACTION = 0.75
# The targets (upper bounds); None: reported, no target. Every value but the Delta
# anchor's should also stay within RATIO_TARGET of the smallest size's.
TARGETS: dict[str, float | None] = {
    "mq_first_batch_s": None,
    "mq_first_planning_s": 2.0,
    "mq_second_latest_offset_s": 0.2,
    "mq_planner_peak_rss_mb": 1536.0,
    "depth_s": 0.5,
    "first_get_s": None,
    "second_get_s": 0.1,
    "browse_10_s": 1.0,
    "monitor_point_s": 0.5,
    "python_peak_rss_mb": None,
}
ANCHOR = ("delta_first_batch_s", "delta_driver_peak_rss_mb", "delta_driver_heap_used_mb")
RATIO_TARGET = 2.0


def parse_size(text: str) -> int:
    """``100k``, ``1M``, ``20M`` or a plain number of messages (a multiple of 100)."""
    factor = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    size = int(float(text[:-1] if factor > 1 else text) * factor)
    if size < BLOCK or size % BLOCK:
        raise argparse.ArgumentTypeError(f"size {text} must be a positive multiple of {BLOCK} messages")
    return size


def size_label(size: int) -> str:
    """``size`` as the issue writes it: 100k, 1M."""
    for factor, suffix in ((1_000_000, "M"), (1_000, "k")):
        if size % factor == 0:
            return f"{size // factor}{suffix}"
    return str(size)


def _messages(generator: np.random.Generator, first: int, rows: int) -> pa.Table:
    """Messages ``first`` .. ``first + rows - 1`` of a queue (``first`` and ``rows`` multiples of BLOCK)."""
    index = np.arange(first, first + rows)
    position = index % BLOCK
    grouped = position < GROUP_SIZE
    names = pa.array([f"g{block}" for block in range(first // BLOCK, (first + rows) // BLOCK)])
    group_id = pc.if_else(pa.array(grouped), names.take(pa.array(index // BLOCK - first // BLOCK)), None)
    return pa.table(
        {
            "payload": random_payloads(generator, rows, PAYLOAD_BYTES),
            "group_id": group_id,
            "msg_seq_number": pa.array((position + 1).astype(np.int32), mask=~grouped),
            "last_in_group": pa.array(position == GROUP_SIZE - 1),
        }
    )


def build(qm: QueueManager, queue: str, messages: int, seed: int = 1) -> dict:
    """Put ``messages`` messages on ``queue`` (see the module docstring); returns how long it took."""
    generator = np.random.default_rng(seed)
    began = time.perf_counter()
    for first in range(0, messages, PUT_ROWS):
        qm.put(queue, _messages(generator, first, min(PUT_ROWS, messages - first)))
    seconds = time.perf_counter() - began
    table = DeltaTable(store.queue_location(qm.root, queue))
    files, rows = store.live_counts(table)
    check_run("backlog", {f"queue {queue}: messages built": (rows, messages)})
    sizes = pa.table(table.get_add_actions()).column("size_bytes")
    return {"build_s": round(seconds, 1), "table_files": files, "table_mb": round(pc.sum(sizes).as_py() / 2**20, 1)}


def _mb(kilobytes: float) -> float:
    return round(kilobytes / 1024, 1)


def _peak_rss_mb(pid: int) -> float:
    """The peak resident set (VmHWM) of a live process."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return _mb(int(line.split()[1]))
    raise RuntimeError(f"process {pid} has no VmHWM")


def _python_case(root: str, size: int) -> dict:
    """Depth, two single gets, a browse of 10 and a monitor point of group ``c``, in this process."""
    from mqspark.services.monitor import Monitor

    from .monitor import _points
    from .stream_get import _Contention

    limit = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * PYTHON_MEMORY_FRACTION)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    qm = QueueManager.open(root)
    contention = _Contention()
    values, got = {}, {}

    def timed(name: str, call: Callable[[], Any]) -> Any:
        began = time.perf_counter()
        result = call()
        values[name] = time.perf_counter() - began
        return result

    depth = timed("depth_s", lambda: qm.depth(QUEUE))
    for name in ("first_get_s", "second_get_s"):
        got[name] = timed(name, lambda: qm.get(QUEUE, PYTHON_GROUP, max_messages=1)).num_rows
    browsed = timed("browse_10_s", lambda: qm.browse(QUEUE, limit=10)).num_rows
    # As the monitor benchmark: a warm-up point, then the measured one.
    monitor = Monitor(qm, QUEUE, PYTHON_GROUP, watch_interval=1.0, watch_count=size + 1, expected_count=1)
    (values["monitor_point_s"],) = _points(monitor, 1)
    check_run(
        "backlog python",
        {
            "depth": (depth, size),
            "first get": (got["first_get_s"], 1),
            "second get": (got["second_get_s"], 1),
            "browsed": (browsed, 10),
            "monitor backlog": (monitor.window[-1].backlog, size - 2),
        },
    )
    return {
        **{name: round(seconds, 3) for name, seconds in values.items()},
        # VmHWM, not ru_maxrss: Linux keeps that across execve, so it would count the parent's
        # resident set (the builder of the queue) at the fork that spawned this process.
        "python_peak_rss_mb": _peak_rss_mb(os.getpid()),
        **{f"python_{key}": value for key, value in contention.fields().items()},
    }


def _descendants(module: str) -> set[int]:
    """This process's descendants whose command line names ``module`` (Linux ``/proc``)."""
    parents, found = {}, set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if module.encode() in cmdline.read():
                    found.add(int(entry))
        except (OSError, IndexError):
            continue
    me = os.getpid()

    def descends(pid: int) -> bool:
        while pid not in (me, 0, 1) and pid in parents:
            pid = parents[pid]
        return pid == me

    return {pid for pid in found if descends(pid)}


def _finished_at(progress: Any) -> float:
    """When a micro-batch ended (epoch seconds): its trigger's start plus its duration."""
    started = datetime.strptime(progress.timestamp, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    return started + progress.durationMs["triggerExecution"] / 1000


def _first_batches(reader: Any, checkpoint: Path, batches: int, timeout_s: float) -> tuple[float, list, float]:
    """Run ``reader`` into ``noop`` until ``batches`` micro-batches with rows are done; returns the
    start time (epoch seconds), their progress, and the peak RSS of the query's planner process
    (its Python data source runner; 0 for a JVM source) taken before the query stops."""
    runners = _descendants(PLANNER_MODULE)
    started = time.time()
    query = reader.writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()
    try:
        while True:
            progress = [p for p in query.recentProgress if p.numInputRows > 0]
            if len(progress) >= batches:
                break
            if query.exception() is not None:
                raise RuntimeError(f"stream failed: {query.exception()}")
            if time.time() - started > timeout_s:
                raise RuntimeError(f"no {batches} batches within {timeout_s} s")
            time.sleep(0.05)
        planners = _descendants(PLANNER_MODULE) - runners
        planner_mb = max((_peak_rss_mb(pid) for pid in planners), default=0.0)
    finally:
        query.stop()
    return started, progress[:batches], planner_mb


def _readers(spark: Any, root: str, size: int, source: str) -> tuple[Any, Any, int, int]:
    """The warm-up and the measured stream of ``source`` (``mq`` or ``delta``), the micro-batches to
    measure and how many rows the first must read."""
    from .stream_get import _mq

    if source == "mq":
        options = {"maxMessagesPerTrigger": str(MAX_MESSAGES_PER_TRIGGER)}
        warmup = _mq(spark, root, WARMUP_QUEUE, "warmup", **options)
        measured = _mq(spark, root, QUEUE, STREAM_GROUP, **options)
        # A second batch (its latestOffset is the later planning) when the queue holds one.
        return warmup, measured, 2 if size >= 2 * MAX_MESSAGES_PER_TRIGGER else 1, min(size, MAX_MESSAGES_PER_TRIGGER)
    reader = spark.readStream.format("delta").option("maxFilesPerTrigger", DELTA_MAX_FILES_PER_TRIGGER)
    warmup, measured = (reader.load(store.queue_location(root, queue)) for queue in (WARMUP_QUEUE, QUEUE))
    return warmup, measured, 1, min(size, PUT_ROWS)


def _stream_case(work: str, size: int, source: str) -> dict:
    """The streaming get (``source`` ``mq``) or the Delta anchor (``delta``) in this process's own
    Spark session: a warm-up stream on the small queue, then the measured stream's first batches."""
    from .stream_get import _Contention, _drain_stream, _session, _wait_for_listener

    spark = _session(None)
    try:
        warmup, measured, batches, first_rows = _readers(spark, f"{work}/qm", size, source)
        _drain_stream(spark, warmup, Path(work) / f"ckpt-{source}-warmup")
        contention = _Contention()
        started, progress, planner_mb = _first_batches(measured, Path(work) / f"ckpt-{source}", batches, 1800.0)
        busy = contention.fields()
        _wait_for_listener(spark)
        check_run(f"backlog {source}", {"first batch rows": (progress[0].numInputRows, first_rows)})
        jvm = spark._jvm.java.lang
        driver_mb = _peak_rss_mb(jvm.ProcessHandle.current().pid())
        jvm.System.gc()
        heap_mb = _mb((jvm.Runtime.getRuntime().totalMemory() - jvm.Runtime.getRuntime().freeMemory()) / 1024)
    finally:
        spark.stop()
    first, first_s = progress[0].durationMs, _finished_at(progress[0]) - started
    result = {
        f"{source}_first_batch_s": round(first_s, 3),
        f"{source}_first_batch_rows": progress[0].numInputRows,
        # Before the first trigger: the query's start (for mq, its planner process's too).
        f"{source}_before_first_trigger_s": round(first_s - first["triggerExecution"] / 1000, 3),
        **{f"{source}_first_batch_{key}_s": round(ms / 1000, 3) for key, ms in sorted(first.items())},
        f"{source}_driver_peak_rss_mb": driver_mb,
        f"{source}_driver_heap_used_mb": heap_mb,
        **{f"{source}_{key}": value for key, value in busy.items()},
    }
    if source == "mq":
        # Spark's latestOffset of the first batch holds initialOffset and the first latestOffset;
        # partitions (in addBatch) reads the plan latestOffset recorded.
        result["mq_first_planning_s"] = round(first["latestOffset"] / 1000, 3)
        result["mq_planner_peak_rss_mb"] = planner_mb
        if len(progress) > 1:
            result["mq_second_latest_offset_s"] = round(progress[1].durationMs["latestOffset"] / 1000, 3)
    return result


def _in_fresh_process(case: Callable[..., dict], *args: Any) -> dict:
    """``case(*args)`` in a new process (spawned: deltalake in a forked child panics); a process
    that died or ran out of memory is reported as ``failed``."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(case, *args).result()
        except (BrokenProcessPool, MemoryError) as error:
            return {"failed": f"{type(error).__name__}: {error}"}


def _measure_size(size: int) -> dict:
    """Build the queues of one size, then run each case in its own process."""
    work = tempfile.mkdtemp(prefix="mqspark-bench-backlog-")
    try:
        qm = QueueManager.create(f"{work}/qm", "BENCH")
        for queue in (QUEUE, WARMUP_QUEUE):
            qm.define_queue(queue)
        built = build(qm, QUEUE, size)
        build(qm, WARMUP_QUEUE, WARMUP_MESSAGES, seed=2)
        measured: dict[str, Any] = {}
        failed = {}
        for name, case, args in (
            ("python", _python_case, (qm.root, size)),
            ("mq", _stream_case, (work, size, "mq")),
            ("delta", _stream_case, (work, size, "delta")),
        ):
            result = _in_fresh_process(case, *args)
            if "failed" in result:
                failed[name] = result["failed"]
            measured.update(result)
        return {"build": built, "failed": failed, "measured": measured}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _judged(value: float | None, base: float | None, target: float | None, anchor: bool) -> dict:
    """One value with its ratio to the smallest size's, its target and whether both are met."""
    ratio = round(value / base, 2) if value is not None and base else None
    return {
        "value": value,
        "ratio_to_smallest": ratio,
        "target": target,
        "pass": None if target is None or value is None else value <= target,
        "ratio_pass": None if anchor or ratio is None else ratio <= RATIO_TARGET,
    }


def report(sizes: list[int], measured: dict[int, dict]) -> dict:
    """The run's JSON: per size, every value judged against its target and the smallest size."""
    base = measured[min(sizes)]["measured"]
    results = {}
    for size in sizes:
        values = measured[size]["measured"]
        judged = {
            name: _judged(values.get(name), base.get(name), TARGETS.get(name), name in ANCHOR)
            for name in (*TARGETS, *ANCHOR)
        }
        missed = [name for name, entry in judged.items() if False in (entry["pass"], entry["ratio_pass"])]
        results[size_label(size)] = {
            "values": judged,
            "missed": missed,
            "failed": measured[size]["failed"],
            "build": measured[size]["build"],
            "details": {name: value for name, value in sorted(values.items()) if name not in judged},
        }
    return {
        "benchmark": "backlog",
        "sizes": [size_label(size) for size in sizes],
        "ratio_base": size_label(min(sizes)),
        "payload_bytes": PAYLOAD_BYTES,
        "grouped": f"{GROUP_SIZE} of every {BLOCK} messages, in one complete group",
        "put_rows": PUT_ROWS,
        "max_messages_per_trigger": MAX_MESSAGES_PER_TRIGGER,
        "delta_max_files_per_trigger": DELTA_MAX_FILES_PER_TRIGGER,
        "targets": {**{name: bound for name, bound in TARGETS.items() if bound is not None}, "ratio": RATIO_TARGET},
        "results": results,
    }


def run(sizes: list[int] | None = None) -> dict:
    """Measure every size in ``sizes`` (default 100k and 1M), smallest first, one case at a time."""
    sizes = sorted(set(sizes or DEFAULT_SIZES))
    return report(sizes, {size: _measure_size(size) for size in sizes})


def main(arguments: list[str]) -> dict:
    """``python -m benchmarks backlog [SIZE ...]``: sizes as 100k, 1M, 20M, 100M or a number."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks backlog", description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", type=parse_size, help="waiting messages (default: 100k 1M)")
    return run(parser.parse_args(arguments).sizes)
