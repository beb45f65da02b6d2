"""Streaming get: ``spark.readStream.format("mq")`` (destructive, one consumer group) in four cases.

``drain``: ``messages`` messages of ``payload_bytes`` random bytes, put in ``puts`` commits through the
mq batch sink (``spark.read.parquet(...).write.format("mq")``), are drained with
``trigger(availableNow=True)``, in the same SparkSession and run, after a warm-up of every source on
a small queue, by:

- ``ceiling``: a trivial Python streaming source (:mod:`benchmarks.arrow_source`) that reads the
  queue table's Parquet files with pyarrow and yields them as Arrow batches, into ``noop``: what
  any Python source pays (Spark's hand-off of Arrow batches to the JVM, and Parquet decoding);
- ``mq``: ``spark.readStream.format("mq")`` into ``noop`` (the source's cost alone);
- ``delta``: ``spark.readStream.format("delta")`` on the same queue table into ``noop``;
- ``mq_to_delta``, ``delta_to_delta`` and ``ceiling_to_delta``: the same three into a Delta table (mq
  under another consumer group);
- ``delta_batch_noop``: ``spark.read.format("delta")`` into ``noop``.

Wall time is start() to awaitTermination(); ``in_batch`` is the sum of the micro-batches' ``addBatch``
times from ``recentProgress``, and ``outside_triggers`` what the run spent outside any trigger
(start-up and shutdown). Ratios are throughput ratios (above 1: mq is faster). The run fails instead of
reporting when any stream did not read exactly ``messages`` rows, when a consumer group's depth is
not 0 afterwards (checked once the listener that records the last batch as consumed has seen the
query end), or when the Delta table mq drained into does not hold every message.

``latency``: a streaming get with ``trigger(processingTime="0 seconds")`` into ``foreachBatch`` runs
while the benchmark's main thread puts ``messages`` messages, one per ``qm.put``, every
``interval_s`` seconds (``foreachBatch`` runs on Py4J's callback thread of the same process). A
message's commit time is when its ``qm.put`` returned (correlated by the msg_id the put returns);
its latency is ``time.time()`` when its batch's rows are in the ``foreachBatch`` function's hands
(after ``collect()``) minus that. The time the function was called (before Spark ran the read) is
reported as a second figure. ``warmup`` messages go first and are not counted (the first batch with
rows starts the executors' Python workers: several seconds, reported as
``cold_first_message_latency_s``). The run fails unless every message arrived exactly once and
nothing else arrived, and the group's depth is 0 after stop().

``read_profile``: the executor's read alone, without Spark: a queue of ``messages`` messages put with
``qm.put`` in ``puts`` commits is planned in one batch, and ``QueueStreamReader.read`` of every
partition is profiled (cProfile) against the trivial source's read of the same files, each batch
written to an in-memory Arrow IPC stream as Spark's Python worker writes it to the JVM.

``planning``: the planner alone, without Spark. Two queues get ``small_versions`` and
``large_versions`` commits of one small message each (``qm.put``). For each, a
:class:`mqspark.spark.stream.QueueStreamReader` is built as Spark builds it (option keys lower-cased);
start-up is ``initialOffset()`` plus the first ``latestOffset()`` (which reads the table's history
and plans the whole backlog in one batch); the backlog is then drained, and ``rounds`` rounds of
one ``qm.put`` (not timed) then ``latestOffset(start, ReadMaxRows(10))`` + ``partitions(start, end)``
(timed) give the per-micro-batch planning time. Each round must plan exactly the message just put.
Planning time drifts up within a run, as the group's state table gains commits every batch
(``plan_ms_first10_median`` / ``plan_ms_last10_median``); both tables get the same number of rounds.

Every case also reports how busy the machine was with other work while it measured (see
:class:`_Contention`): ``own_cpu_s`` is the CPU time of this benchmark's processes (driver, JVM,
Python workers), ``other_processes_cores`` the average number of cores other processes used.
Wall times on a shared 2-core machine are only comparable when that is near 0.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import mqspark
from mqspark import QueueManager, store
from mqspark.model.messages import MESSAGE_SCHEMA
from mqspark.qmgr import engine

from .arrow_source import ArrowFilesSource
from .stream_put import _write_input, check_run, random_payloads


class _Contention:
    """CPU seconds the machine spent on processes outside this benchmark's process tree (other users
    of the machine) between construction and :meth:`fields`, from ``/proc``; Linux only.

    This process tree (the Python driver, its JVM, Spark's Python workers) is counted as the
    utime+stime+cutime+cstime of its live processes: children that ended are in their parent's
    cutime/cstime once reaped.
    """

    _TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self) -> None:
        self.load = os.getloadavg()[0]
        self.wall = time.perf_counter()
        self.machine, self.mine = self._machine(), self._tree()

    @staticmethod
    def _machine() -> float:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
        return (sum(fields[:8]) - fields[3] - fields[4]) / _Contention._TICK

    @staticmethod
    def _tree() -> float:
        parents, used = {}, {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            used[int(entry)] = sum(int(value) for value in fields[11:15]) / _Contention._TICK
        total, me = 0.0, os.getpid()
        for pid in used:
            ancestor = pid
            while ancestor not in (me, 0, 1) and ancestor in parents:
                ancestor = parents[ancestor]
            if ancestor == me:
                total += used[pid]
        return total

    def fields(self) -> dict:
        wall = time.perf_counter() - self.wall
        mine = self._tree() - self.mine
        others = max(0.0, self._machine() - self.machine - mine)
        return {
            "load_avg_1m_at_start": round(self.load, 2),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
            "own_cpu_s": round(mine, 1),
            "other_processes_cpu_s": round(others, 1),
            "other_processes_cores": round(others / wall, 2),
        }


def _p(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def _session(spark):
    if spark is None:
        spark = mqspark.session(
            app_name="mqspark-bench", master="local[2]", **{"spark.ui.showConsoleProgress": "false"}
        )
    return spark


@contextmanager
def _progress_kept(spark):
    """Keep every micro-batch's progress (Spark keeps 100 by default) while the block runs."""
    key = "spark.sql.streaming.numRecentProgressUpdates"
    previous = spark.conf.get(key, None)
    spark.conf.set(key, "10000")
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def _wait_for_listener(spark) -> None:
    """Let the mq listener see queries that just ended (it records their last batch as consumed)."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(60_000)


def _drain_stream(spark, reader, checkpoint: Path, target: Path | None = None):
    """Run one availableNow stream to its end, into ``noop`` or, with ``target``, a Delta table;
    returns (seconds start() to awaitTermination(), progress)."""
    writer = reader.writeStream.format("noop" if target is None else "delta")
    writer = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    start = time.perf_counter()
    query = writer.start() if target is None else writer.start(str(target))
    query.awaitTermination()
    elapsed = time.perf_counter() - start
    if query.exception() is not None:
        raise RuntimeError(f"stream failed: {query.exception()}")
    return elapsed, list(query.recentProgress)


def _in_batch_s(progress: list) -> float:
    """Seconds spent running micro-batches (``addBatch``: reading and writing the rows)."""
    return sum(p.durationMs.get("addBatch", 0) for p in progress) / 1000


def _durations(prefix: str, progress: list) -> dict:
    """Median per-batch duration (ms) of each phase Spark reports, over batches that read rows."""
    batches = [p for p in progress if p.numInputRows > 0]
    keys = sorted({key for p in batches for key in p.durationMs})
    return {f"{prefix}_{key}_ms_median": statistics.median(p.durationMs.get(key, 0) for p in batches) for key in keys}


def _outside_triggers(seconds: float, progress: list) -> float:
    """Wall time of a run not spent in any trigger: query start-up (for mq, the planner process and
    initialOffset) and shutdown."""
    return round(seconds - sum(p.durationMs.get("triggerExecution", 0) for p in progress) / 1000, 2)


def _mq(spark, root: str, queue: str, consumer: str, **options):
    return (
        spark.readStream.format("mq").option("queue", queue).option("consumer", consumer).options(**options).load(root)
    )


def _drain(spark, messages: int, puts: int, payload_bytes: int, keep: bool) -> dict:
    if messages % puts:
        raise ValueError(f"messages {messages} must be a multiple of puts {puts}")
    spark = _session(spark)
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-get-"))
    try:
        _write_input(root / "input", puts, messages // puts, payload_bytes, seed=1)
        _write_input(root / "warmup-input", 2, 5_000, payload_bytes, seed=2)
        qm = QueueManager.create(root / "qm", "BENCH")
        qm.define_queue("WARMUP")
        qm.define_queue("Q")

        fill_start = time.perf_counter()
        for path in sorted((root / "input").glob("*.parquet")):
            spark.read.parquet(str(path)).write.format("mq").option("queue", "Q").mode("append").save(qm.root)
        fill_s = time.perf_counter() - fill_start
        for path in sorted((root / "warmup-input").glob("*.parquet")):
            spark.read.parquet(str(path)).write.format("mq").option("queue", "WARMUP").mode("append").save(qm.root)
        location = store.queue_location(qm.root, "Q")
        table = store.open_table(location, None)
        files = len(table.file_uris())
        if qm.depth("Q") != messages or table.version() != puts:
            raise RuntimeError(f"fill is broken: depth {qm.depth('Q')}, table version {table.version()}")

        spark.dataSource.register(ArrowFilesSource)
        columns = json.dumps(MESSAGE_SCHEMA.names)

        def ceiling(location: str):
            files = json.dumps([f"{location}/{path}" for path in store.live_paths(store.open_table(location, None))])
            return spark.readStream.format("arrowfiles").option("files", files).option("columns", columns).load()

        # The fill leaves gigabytes to write back: flushed here, so no reader's run pays for it.
        os.sync()
        # Warm-up: JVM code paths, Python workers and the planners of every source, on a small queue.
        warmup = store.queue_location(qm.root, "WARMUP")
        _drain_stream(spark, _mq(spark, qm.root, "WARMUP", "warmup"), root / "ckpt-warmup-mq")
        _drain_stream(spark, spark.readStream.format("delta").load(warmup), root / "ckpt-warmup-delta")
        _drain_stream(spark, ceiling(warmup), root / "ckpt-warmup-ceiling")
        _drain_stream(spark, _mq(spark, qm.root, "WARMUP", "warmup2"), root / "ckpt-warmup-mq2", root / "warm-out")

        runs = {}
        with _progress_kept(spark):
            for name, reader, target in (
                ("ceiling", ceiling(location), None),
                ("mq", _mq(spark, qm.root, "Q", "drain"), None),
                ("delta", spark.readStream.format("delta").load(location), None),
                # mq last among the Delta writes: the first large one of a run pays the JVM's warm-up.
                ("delta_to_delta", spark.readStream.format("delta").load(location), root / "out-delta"),
                ("ceiling_to_delta", ceiling(location), root / "out-ceiling"),
                ("mq_to_delta", _mq(spark, qm.root, "Q", "drain_to_delta"), root / "out-mq"),
            ):
                contention = _Contention()
                seconds, progress = _drain_stream(spark, reader, root / f"ckpt-{name}", target)
                runs[name] = (seconds, progress, contention.fields())
            contention = _Contention()
            began = time.perf_counter()
            spark.read.format("delta").load(location).write.format("noop").mode("overwrite").save()
            delta_batch_s = time.perf_counter() - began
            delta_batch_contention = contention.fields()

        _wait_for_listener(spark)
        checks = {f"{name} rows read": (sum(p.numInputRows for p in runs[name][1]), messages) for name in runs}
        checks.update(
            {
                "mq consumer depth afterwards": (qm.depth("Q", consumer="drain"), 0),
                "mq to delta consumer depth afterwards": (qm.depth("Q", consumer="drain_to_delta"), 0),
                # Both groups consumed every message: none waits, and none was removed (no maintenance ran).
                "queue depth afterwards": (qm.depth("Q"), 0),
                "messages still in the queue table": (
                    store.live_counts(store.open_table(location, None))[1],
                    messages,
                ),
                "mq to delta rows written": (
                    store.live_counts(store.open_table(str(root / "out-mq"), None))[1],
                    messages,
                ),
            }
        )
        check_run("stream_get_drain", checks)

        rate = {name: messages / runs[name][0] for name in runs}
        in_batch = {name: _in_batch_s(runs[name][1]) for name in runs}
        result = {
            "benchmark": "stream_get_drain",
            "messages": messages,
            "payload_bytes": payload_bytes,
            "puts": puts,
            "table_files": files,
            "fill_s": round(fill_s, 2),
            "delta_batch_noop_seconds": round(delta_batch_s, 2),
            "ratio_to_delta": round(rate["mq"] / rate["delta"], 3),
            "ratio_to_delta_batch": round(delta_batch_s / runs["mq"][0], 3),
            "in_batch_ratio_to_ceiling": round(in_batch["ceiling"] / in_batch["mq"], 3),
            "in_batch_ratio_to_delta": round(in_batch["delta"] / in_batch["mq"], 3),
            "ceiling_in_batch_ratio_to_delta": round(in_batch["delta"] / in_batch["ceiling"], 3),
            "to_delta_ratio": round(rate["mq_to_delta"] / rate["delta_to_delta"], 3),
            "ceiling_to_delta_ratio": round(rate["ceiling_to_delta"] / rate["delta_to_delta"], 3),
            "to_delta_in_batch_ratio_to_ceiling": round(in_batch["ceiling_to_delta"] / in_batch["mq_to_delta"], 3),
            **{f"delta_batch_noop_{key}": value for key, value in delta_batch_contention.items()},
        }
        for name, (seconds, progress, contention) in runs.items():
            result.update(
                {
                    f"{name}_seconds": round(seconds, 2),
                    f"{name}_messages_per_s": round(rate[name]),
                    f"{name}_in_batch_s": round(in_batch[name], 2),
                    f"{name}_outside_triggers_s": _outside_triggers(seconds, progress),
                    f"{name}_batches": sum(p.numInputRows > 0 for p in progress),
                    **_durations(name, progress),
                    **{f"{name}_{key}": value for key, value in contention.items()},
                }
            )
        return result
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _latency(spark, messages: int, warmup: int, interval_s: float, payload_bytes: int, timeout_s: float) -> dict:
    spark = _session(spark)
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-get-"))
    query = None
    try:
        qm = QueueManager.create(root / "qm", "BENCH")
        qm.define_queue("Q")
        lock = threading.Lock()
        arrivals: dict[str, list[tuple[float, float, int]]] = {}  # msg_id: (foreachBatch called, rows in hand, batch)

        def on_batch(frame, batch_id: int) -> None:
            called = time.time()
            rows = frame.select("msg_id").collect()
            in_hand = time.time()
            with lock:
                for row in rows:
                    arrivals.setdefault(row.msg_id, []).append((called, in_hand, batch_id))

        with _progress_kept(spark):
            query = (
                _mq(spark, qm.root, "Q", "latency")
                .writeStream.foreachBatch(on_batch)
                .option("checkpointLocation", str(root / "ckpt"))
                .trigger(processingTime="0 seconds")
                .start()
            )
        # Let the query start its planner and go idle before the first put.
        deadline = time.time() + 120
        while not query.recentProgress and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(2)

        generator = np.random.default_rng(3)
        committed: dict[str, float] = {}
        put_s = []

        def produce(count: int) -> list[str]:
            """Put ``count`` messages one by one, ``interval_s`` apart; wait until all have arrived."""
            ids = []
            for _ in range(count):
                began = time.time()
                payload = generator.bytes(payload_bytes)
                (msg_id,) = qm.put("Q", [{"payload": payload, "properties": {"n": str(len(committed))}}])
                committed[msg_id] = time.time()
                put_s.append(committed[msg_id] - began)
                ids.append(msg_id)
                if query.exception() is not None:
                    raise RuntimeError(f"stream failed: {query.exception()}")
                time.sleep(max(0.0, interval_s - (time.time() - began)))
            deadline = time.time() + timeout_s
            while time.time() < deadline:
                with lock:
                    if all(msg_id in arrivals for msg_id in ids):
                        break
                if query.exception() is not None:
                    raise RuntimeError(f"stream failed: {query.exception()}")
                time.sleep(0.1)
            return ids

        # Warm-up, not counted: the first batch with rows starts the executors' Python workers.
        cold = produce(warmup)
        contention = _Contention()
        measured_ids = produce(messages)
        measured = contention.fields()
        # Stop only once the last batch is committed: a batch stopped between foreachBatch and its
        # commit is not finished for Spark, so its messages rightly stay on the queue for the group.
        last_batch = max(times[0][2] for times in arrivals.values())
        deadline = time.time() + timeout_s
        while time.time() < deadline and not any(p.batchId >= last_batch for p in query.recentProgress):
            time.sleep(0.1)
        query.stop()
        _wait_for_listener(spark)

        checks = {
            "messages delivered more than once": (sum(1 for times in arrivals.values() if len(times) > 1), 0),
            "messages never delivered": (len(set(committed) - set(arrivals)), 0),
            "unknown messages delivered": (len(set(arrivals) - set(committed)), 0),
            "consumer depth after stop": (qm.depth("Q", consumer="latency"), 0),
        }
        check_run("stream_get_latency", checks)

        measured_batches = {arrivals[msg_id][0][2] for msg_id in measured_ids}
        progress = [p for p in query.recentProgress if p.batchId in measured_batches]
        latency = [arrivals[msg_id][0][1] - committed[msg_id] for msg_id in measured_ids]
        called = [arrivals[msg_id][0][0] - committed[msg_id] for msg_id in measured_ids]
        first = measured_ids[0]
        return {
            "benchmark": "stream_get_latency",
            "messages": messages,
            "warmup_messages": warmup,
            "interval_s": interval_s,
            "payload_bytes": payload_bytes,
            "batches": len(measured_batches),
            "latency_p50_s": round(statistics.median(latency), 3),
            "latency_p99_s": round(_p(latency, 0.99), 3),
            "latency_max_s": round(max(latency), 3),
            "called_latency_p50_s": round(statistics.median(called), 3),
            "called_latency_p99_s": round(_p(called, 0.99), 3),
            "cold_first_message_latency_s": round(arrivals[cold[0]][0][1] - committed[cold[0]], 3) if cold else None,
            "first_measured_message_latency_s": round(arrivals[first][0][1] - committed[first], 3),
            "put_p50_s": round(statistics.median(put_s), 3),
            **_durations("batch", progress),
            **measured,
        }
    finally:
        if query is not None and query.isActive:
            query.stop()
        shutil.rmtree(root, ignore_errors=True)


def _fill_small(qm: QueueManager, queue: str, puts: int) -> float:
    start = time.perf_counter()
    for index in range(puts):
        qm.put(queue, [{"payload": f"m{index}".encode()}])
    return time.perf_counter() - start


def _plan_rounds(qm: QueueManager, queue: str, rounds: int, readers: list) -> dict:
    """Start-up and per-batch planning times of a fresh planner on ``queue`` (see the module docstring);
    the reader is added to ``readers`` (its lease heartbeat runs until stopped)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from mqspark.spark.datasource import _get_options
    from mqspark.spark.stream import QueueStreamReader

    options = {"path": qm.root, "queue": queue, "consumer": "bench", "maxmessagespertrigger": "10"}
    reader = QueueStreamReader(_get_options(options))
    readers.append(reader)
    backlog = qm.depth(queue)

    contention = _Contention()
    began = time.perf_counter()
    start = reader.initialOffset()
    initial_s = time.perf_counter() - began
    began = time.perf_counter()
    end = reader.latestOffset(start, ReadMaxRows(backlog + 1))
    first_s = time.perf_counter() - began
    drained = end["delivered"] - start["delivered"]
    while end != start:
        reader.partitions(start, end)
        start = end
        end = reader.latestOffset(start, ReadMaxRows(backlog + 1))
        drained += end["delivered"] - start["delivered"]
    if drained != backlog:
        raise RuntimeError(f"queue {queue}: the backlog drain planned {drained} messages, not {backlog}")

    latest_ms, partitions_ms, total_ms = [], [], []
    for index in range(rounds):
        qm.put(queue, [{"payload": f"r{index}".encode()}])
        began = time.perf_counter()
        end = reader.latestOffset(start, ReadMaxRows(10))
        middle = time.perf_counter()
        parts = reader.partitions(start, end)
        done = time.perf_counter()
        planned = sum(len(part.row) for part in parts)
        if end == start or end["delivered"] - start["delivered"] != 1 or planned != 1:
            raise RuntimeError(f"queue {queue}: round {index} planned {planned} messages, not the 1 just put")
        latest_ms.append((middle - began) * 1000)
        partitions_ms.append((done - middle) * 1000)
        total_ms.append((done - began) * 1000)
        start = end
    return {
        "startup_s": round(initial_s + first_s, 3),
        "initial_offset_s": round(initial_s, 3),
        "first_latest_offset_s": round(first_s, 3),
        "plan_ms_median": round(statistics.median(total_ms), 1),
        "plan_ms_p95": round(_p(total_ms, 0.95), 1),
        # The state table gains commits every round: does planning drift within one run?
        "plan_ms_first10_median": round(statistics.median(total_ms[:10]), 1),
        "plan_ms_last10_median": round(statistics.median(total_ms[-10:]), 1),
        "latest_offset_ms_median": round(statistics.median(latest_ms), 1),
        "partitions_ms_median": round(statistics.median(partitions_ms), 1),
        **contention.fields(),
    }


def _planning(small_versions: int, large_versions: int, rounds: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-get-"))
    readers = []
    try:
        qm = QueueManager.create(root / "qm", "BENCH")
        sizes = {"small": small_versions, "large": large_versions}
        fill = {}
        for name, puts in sizes.items():
            qm.define_queue(name.upper())
            fill[name] = _fill_small(qm, name.upper(), puts)
            version = engine(qm).queue_version(name.upper())
            if version != puts:
                raise RuntimeError(f"queue {name.upper()} has version {version}, not {puts}")
        result = {"benchmark": "stream_get_planning", "rounds": rounds}
        for name, puts in sizes.items():
            measured = _plan_rounds(qm, name.upper(), rounds, readers)
            result.update({f"v{puts}_{key}": value for key, value in measured.items()})
            result[f"v{puts}_fill_s"] = round(fill[name], 1)
        result["plan_ratio_large_to_small"] = round(
            result[f"v{large_versions}_plan_ms_median"] / result[f"v{small_versions}_plan_ms_median"], 3
        )
        result["startup_ratio_large_to_small"] = round(
            result[f"v{large_versions}_startup_s"] / result[f"v{small_versions}_startup_s"], 2
        )
        return result
    finally:
        # Stop the readers' lease heartbeats before their state tables are removed.
        heartbeats = [r._group.heartbeat for r in readers if r._group is not None]
        for heartbeat in heartbeats:
            heartbeat.lost = RuntimeError("benchmark finished")
        for heartbeat in heartbeats:
            heartbeat._thread.join(heartbeat.timeout.total_seconds() / 3 + 30)
        shutil.rmtree(root, ignore_errors=True)


def run(
    case: str,
    spark=None,
    *,
    messages: int | None = None,
    puts: int = 10,
    payload_bytes: int = 1024,
    interval_s: float = 0.15,
    warmup: int = 10,
    timeout_s: float = 60.0,
    small_versions: int = 100,
    large_versions: int = 10_000,
    rounds: int = 50,
    keep: bool = False,
) -> dict:
    """One case: ``drain`` (default 1M messages), ``latency`` (default 150 messages), ``planning`` or
    ``read_profile`` (default 1M messages).

    ``spark`` is the session for drain and latency (a local[2] mqspark session when None); ``keep``
    leaves the drain's temporary folder in place for inspection.
    """
    if case == "drain":
        return _drain(spark, messages or 1_000_000, puts, payload_bytes, keep)
    if case == "latency":
        return _latency(spark, messages or 150, warmup, interval_s, payload_bytes, timeout_s)
    if case == "planning":
        return _planning(small_versions, large_versions, rounds)
    if case == "read_profile":
        return _read_profile(messages or 1_000_000, puts, payload_bytes)
    raise ValueError(f"unknown case {case!r}: drain, latency, planning or read_profile")


def _profile_read(batches) -> tuple[float, dict, int, int]:
    """Profile handing every batch of ``batches`` (an iterable) over as Spark's Python worker does
    (to an Arrow IPC stream; here in memory): (seconds, the ten functions with the most own time
    and their seconds, batches, rows)."""
    import cProfile
    import pstats

    import pyarrow as pa

    profile = cProfile.Profile()
    count = rows = 0
    writer = None
    began = time.perf_counter()
    profile.enable()
    for batch in batches:
        if writer is None:
            writer = pa.ipc.new_stream(pa.BufferOutputStream(), batch.schema)
        writer.write_batch(batch)
        count += 1
        rows += batch.num_rows
    profile.disable()
    seconds = time.perf_counter() - began
    own = {
        f"{Path(file).name}:{function}" if file != "~" else function: entry[2]
        for (file, _, function), entry in pstats.Stats(profile).stats.items()
    }
    top = sorted(own.items(), key=lambda item: -item[1])[:10]
    return seconds, {name: round(value, 3) for name, value in top}, count, rows


def _read_profile(messages: int, puts: int, payload_bytes: int) -> dict:
    """The executor's read of a planned drain, without Spark, under cProfile: mq's
    ``QueueStreamReader.read`` of every partition of one plan, against the ceiling source's read of
    the same files (:func:`benchmarks.arrow_source.read_file`), each batch written to an Arrow IPC stream as the
    Python worker does. Each reports the ten functions with the most own time in cProfile."""
    import pyarrow as pa
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from mqspark.spark.datasource import _get_options
    from mqspark.spark.stream import QueueStreamReader

    from .arrow_source import read_file

    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-read-"))
    reader = None
    try:
        qm = QueueManager.create(root / "qm", "BENCH")
        qm.define_queue("Q")
        generator = np.random.default_rng(4)
        for _ in range(puts):
            qm.put("Q", pa.table({"payload": random_payloads(generator, messages // puts, payload_bytes)}))
        reader = QueueStreamReader(_get_options({"path": qm.root, "queue": "Q", "consumer": "profile"}))
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        parts = reader.partitions(start, end)

        def mq_batches():
            for part in parts:
                yield from reader.read(part)

        location = store.queue_location(qm.root, "Q")
        paths = [f"{location}/{path}" for path in store.live_paths(store.open_table(location, None))]

        def ceiling_batches():
            for path in paths:
                yield from read_file(path, MESSAGE_SCHEMA.names)

        # Warm-up of both (the first Parquet read of a process pays a one-time start).
        _profile_read(ceiling_batches())
        _profile_read(mq_batches())
        ceiling_s, ceiling_profile, ceiling_count, ceiling_rows = _profile_read(ceiling_batches())
        mq_s, mq_profile, mq_count, mq_rows = _profile_read(mq_batches())
        check_run("stream_get_read_profile", {"mq rows": (mq_rows, messages), "ceiling rows": (ceiling_rows, messages)})
        return {
            "benchmark": "stream_get_read_profile",
            "messages": messages,
            "payload_bytes": payload_bytes,
            "puts": puts,
            "mq_partitions": len(parts),
            "ceiling_partitions": len(paths),
            "mq_batches": mq_count,
            "ceiling_batches": ceiling_count,
            "mq_read_s": round(mq_s, 3),
            "ceiling_read_s": round(ceiling_s, 3),
            "read_ratio_to_ceiling": round(ceiling_s / mq_s, 3),
            "mq_profile_own_s": mq_profile,
            "ceiling_profile_own_s": ceiling_profile,
        }
    finally:
        if reader is not None:
            reader.stop()
        shutil.rmtree(root, ignore_errors=True)
