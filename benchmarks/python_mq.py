"""The Python put and get one message at a time, as applications outside Spark use them, against the
storage's own limit: a one-row ``write_deltalake`` append from the same number of processes; and the
block consumer draining a backlog, against the single get of the same run. Each also reports the CPU
time a call used and how many cores its processes kept busy: a call that keeps one core busy cannot
run faster in 4 processes than the machine has cores."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from mqspark import MQError, QueueManager
from mqspark.model.messages import MESSAGE_SCHEMA
from mqspark.model.put import prepare_put

# The block consumer's prefetch: Kafka's default max.poll.records.
CONSUMER_PREFETCH = 500
# The threads of one process putting at once.
THREADS = 8
# The most producer processes putting at once (issue targets: 8 producers against one process's append).
MANY_PRODUCERS = 8
# The latency run: one message every 1/LATENCY_RATE s, taken by a get that waits.
LATENCY_RATE = 10
LATENCY_MESSAGES = 100


def run(messages: int = 300, processes: int = 4, consumed: int = 100_000, put_messages: int = 1200) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-"))
    try:
        return _measure(root, messages, processes, consumed, put_messages)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(root: Path, messages: int, processes: int, consumed: int, put_messages: int) -> dict:
    """The appends and gets take ``messages`` each; the puts ``put_messages``, to queue P, so that a
    run of 8 processes is not mostly their first puts."""
    qm = QueueManager.create(root / "qm", "BENCH")
    qm.define_queue("Q")
    qm.define_queue("P")
    qm.define_queue("D", duplicate_window=300)
    rows = prepare_put(qm.inquire_queue("Q"), pa.table({"payload": [b"x" * 100]})).messages
    DeltaTable.create(str(root / "native"), schema=MESSAGE_SCHEMA)
    location = str(root / "qm")

    append_one = _in_processes(_append, str(root / "native"), messages, 1, rows)
    append_many = _in_processes(_append, str(root / "native"), messages, processes, rows)
    put_one = _in_processes(_put, location, put_messages, 1, "P")
    _in_processes(_put, location, messages, 1, "Q")  # what the single getter takes
    get_one = _in_processes(_get, location, messages, 1)
    put_many = _in_processes(_put, location, put_messages, processes, "P")
    _in_processes(_put, location, messages, processes, "Q")
    get_many = _in_processes(_get, location, messages, processes)
    delivered = sorted(get_many["delivered"])
    consumer = _in_processes(_consume, location, consumed, 1)
    put_threads = _in_processes(_put_threads, location, put_messages, 1, THREADS)
    # Duplicate detection's cost: the same puts to a queue with a window, each with its own msg_id.
    dedup_one = _in_processes(_put_with_ids, location, put_messages, 1, "D")
    dedup_many = _in_processes(_put_with_ids, location, put_messages, processes, "D")
    append_most = _in_processes(_append, str(root / "native"), messages, MANY_PRODUCERS, rows)
    put_most = _in_processes(_put, location, put_messages, MANY_PRODUCERS, "P")
    latency = {
        **_latency(str(root / "qm"), "L", _take, "latency_get"),
        **_latency(str(root / "qm"), "LC", _consume_waiting, "latency_consumer"),
    }
    return {
        "benchmark": "python_mq",
        "messages": messages,
        "put_messages": put_messages,
        "processes": processes,
        "anchor_append_per_s": append_one["rate"],
        "anchor_append_p50_ms": append_one["p50_ms"],
        "anchor_append_cores_busy": append_one["cores_busy"],
        f"anchor_append_{processes}_processes_cores_busy": append_many["cores_busy"],
        f"anchor_append_{processes}_processes_per_s": append_many["rate"],
        "put_per_s": put_one["rate"],
        "put_p50_ms": put_one["p50_ms"],
        "put_cpu_ms_per_call": put_one["cpu_ms"],
        "put_ratio_to_append": round(put_one["rate"] / append_one["rate"], 3),
        f"put_{processes}_processes_per_s": put_many["rate"],
        f"put_{processes}_processes_ratio_to_append": round(put_many["rate"] / append_many["rate"], 3),
        f"put_{processes}_processes_ratio_to_one": round(put_many["rate"] / put_one["rate"], 3),
        f"put_{processes}_processes_cpu_ms_per_call": put_many["cpu_ms"],
        f"put_{processes}_processes_cores_busy": put_many["cores_busy"],
        f"anchor_append_{MANY_PRODUCERS}_processes_per_s": append_most["rate"],
        f"put_{MANY_PRODUCERS}_processes_per_s": put_most["rate"],
        f"put_{MANY_PRODUCERS}_processes_ratio_to_append": round(put_most["rate"] / append_most["rate"], 3),
        # The anchor for 8 producers: one process's append.
        f"put_{MANY_PRODUCERS}_processes_ratio_to_one_append": round(put_most["rate"] / append_one["rate"], 3),
        f"put_{MANY_PRODUCERS}_processes_ratio_to_one": round(put_most["rate"] / put_one["rate"], 3),
        f"put_{MANY_PRODUCERS}_processes_cpu_ms_per_call": put_most["cpu_ms"],
        f"put_{MANY_PRODUCERS}_processes_cores_busy": put_most["cores_busy"],
        "get_per_s": get_one["rate"],
        "get_p50_ms": get_one["p50_ms"],
        "get_cpu_ms_per_call": get_one["cpu_ms"],
        "get_cores_busy": get_one["cores_busy"],
        f"get_{processes}_processes_cores_busy": get_many["cores_busy"],
        "cores": os.cpu_count(),
        "get_ratio_to_append": round(get_one["rate"] / append_one["rate"], 3),
        f"get_{processes}_processes_per_s": get_many["rate"],
        f"get_{processes}_processes_ratio_to_one": round(get_many["rate"] / get_one["rate"], 3),
        f"get_{processes}_processes_refused": len(get_many["refused"]),
        "refusals": sorted(set(get_one["refused"] + get_many["refused"]))[:3],
        f"get_{processes}_processes_duplicates": len(delivered) - len(set(delivered)),
        f"get_{processes}_processes_missing": messages - len(set(delivered)),
        f"put_{THREADS}_threads_per_s": put_threads["rate"],
        f"put_{THREADS}_threads_ratio_to_one": round(put_threads["rate"] / put_one["rate"], 2),
        "put_duplicate_window_per_s": dedup_one["rate"],
        "put_duplicate_window_ratio_to_put": round(dedup_one["rate"] / put_one["rate"], 3),
        f"put_duplicate_window_{processes}_processes_per_s": dedup_many["rate"],
        f"put_duplicate_window_{processes}_processes_ratio_to_put": round(dedup_many["rate"] / put_many["rate"], 3),
        "consumer_messages": consumed,
        "consumer_prefetch": CONSUMER_PREFETCH,
        "consumer_per_s": consumer["rate"],
        "consumer_ratio_to_get": round(consumer["rate"] / get_one["rate"], 1),
        **latency,
    }


def _in_processes(work, root: str, messages: int, processes: int, *args) -> dict:
    """Run ``work(root, count, *args)`` in ``processes`` spawned processes sharing ``messages``, and
    merge what they return: the rate in all, the median latency, the refusals and deliveries. The
    processes are started, imported and have opened the queue manager before the clock, then are
    released together (:func:`_released`)."""
    context = multiprocessing.get_context("spawn")  # deltalake in a forked child panics
    counts = [messages // processes + (n < messages % processes) for n in range(processes)]
    with context.Manager() as manager:
        start_line = manager.Barrier(processes)
        with context.Pool(processes, initializer=_at_start_line, initargs=(start_line,)) as pool:
            results = pool.starmap(work, [(root, count, *args) for count in counts])
    # From the first call's start to the last call's end, leaving out the processes' start.
    elapsed = max(result["end"] for result in results) - min(result["start"] for result in results)
    latencies = [latency for result in results for latency in result["latencies"]]
    cpu = sum(result.get("cpu", 0.0) for result in results)
    return {
        "rate": round(len(latencies) / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        # CPU time of the processes (their native threads too) per call, and the cores it kept busy.
        "cpu_ms": round(cpu / len(latencies) * 1000, 1),
        "cores_busy": round(cpu / elapsed, 2),
        "refused": [reason for result in results for reason in result["refused"]],
        "delivered": [payload for result in results for payload in result["delivered"]],
    }


_start_line = None


def _at_start_line(start_line) -> None:
    """The pool's initializer: the barrier the processes of one run wait at before their clock starts."""
    global _start_line
    _start_line = start_line


def _released() -> float:
    """Wait until every process of the run is ready, then start the clock: the time now."""
    if _start_line is not None:
        _start_line.wait()
    return time.time()


def _timed_calls(count: int, call: Callable[[int], object]) -> dict:
    """Call ``call(n)`` for n in 0 .. count-1, timing each call, with the process's CPU time: what
    :func:`_in_processes` merges."""
    begun = _released()
    latencies, cpu = [], time.process_time()
    for n in range(count):
        start = time.perf_counter()
        call(n)
        latencies.append(time.perf_counter() - start)
    return {
        "latencies": latencies,
        "refused": [],
        "delivered": [],
        "start": begun,
        "end": time.time(),
        "cpu": time.process_time() - cpu,
    }


def _append(root: str, count: int, rows: pa.Table) -> dict:
    table = DeltaTable(root)

    def append(_: int) -> None:
        # delta-rs retries a conflicting append a few times and then gives up: an application retries.
        while True:
            try:
                write_deltalake(table, rows, mode="append")
                return
            except CommitFailedError:
                continue

    return _timed_calls(count, append)


def _put(root: str, count: int, queue: str = "Q") -> dict:
    qm = QueueManager.open(root)
    return _timed_calls(count, lambda n: qm.put(queue, [{"payload": f"{os.getpid()}-{n}".encode()}]))


def _put_with_ids(root: str, count: int, queue: str) -> dict:
    """Single puts each with a msg_id of its own, as a producer using duplicate detection puts."""
    qm = QueueManager.open(root)
    return _timed_calls(count, lambda n: qm.put(queue, [{"msg_id": f"{os.getpid()}-{n}", "payload": b"x" * 100}]))


def _put_threads(root: str, count: int, threads: int) -> dict:
    """Single puts from ``threads`` threads of this process, each with its own queue manager."""
    results: list[dict] = []

    def work(share: int) -> None:
        results.append(_put(root, share, "P"))

    workers = [threading.Thread(target=work, args=(count // threads + (n < count % threads),)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {
        "latencies": [latency for result in results for latency in result["latencies"]],
        "refused": [],
        "delivered": [],
        "start": min(result["start"] for result in results),
        "end": max(result["end"] for result in results),
    }


def _consume(root: str, count: int) -> dict:
    """Put ``count`` messages of 100 B in one commit, then take them with the block consumer; the
    rate counts the consumer only."""
    qm = QueueManager.open(root)
    qm.define_queue("C")
    qm.put("C", pa.table({"payload": [b"x" * 100] * count}))
    begun = _released()
    with qm.consumer("C", "bench", prefetch=CONSUMER_PREFETCH) as consumer:
        taken = sum(1 for _ in consumer)
    end = time.time()
    # One "latency" per message: the rate is messages over the consumer's time.
    return {"latencies": [(end - begun) / taken] * taken, "refused": [], "delivered": [], "start": begun, "end": end}


def _get(root: str, count: int) -> dict:
    """Single gets until this process has had ``count`` messages or the group has none left."""
    qm = QueueManager.open(root)
    latencies, delivered, refused = [], [], []
    begun = _released()
    cpu = time.process_time()
    while len(delivered) < count:
        start = time.perf_counter()
        try:
            got = qm.get("Q", consumer="bench", max_messages=1)
        except MQError as error:
            refused.append(str(error))
            continue
        if got.num_rows == 0:
            if qm.depth("Q", "bench") == 0:
                break
            continue
        latencies.append(time.perf_counter() - start)
        delivered.extend(got["payload"].to_pylist())
    return {
        "latencies": latencies,
        "refused": refused,
        "delivered": delivered,
        "start": begun,
        "end": time.time(),
        "cpu": time.process_time() - cpu,
    }


def _latency(root: str, queue: str, taker, name: str) -> dict:
    """Put one message every 1/LATENCY_RATE s on ``queue`` in one process while ``taker`` waits for
    them in another: the time from the put's call, and from its return, to the moment the taker had
    the message (one clock: one machine)."""
    context = multiprocessing.get_context("spawn")
    QueueManager.open(root).define_queue(queue)
    with context.Manager() as manager, context.Pool(2) as pool:
        ready = manager.Event()
        taken = pool.apply_async(taker, (root, queue, LATENCY_MESSAGES, ready))
        put = pool.apply_async(_put_paced, (root, queue, LATENCY_MESSAGES, ready))
        sent, received = put.get(), taken.get()
    from_call = [received[n] - sent[n][0] for n in sent]
    from_return = [received[n] - sent[n][1] for n in sent]
    return {
        f"{name}_messages": len(received),
        f"{name}_from_put_call_p50_ms": _percentile_ms(from_call, 50),
        f"{name}_from_put_call_p99_ms": _percentile_ms(from_call, 99),
        f"{name}_from_put_return_p50_ms": _percentile_ms(from_return, 50),
        f"{name}_from_put_return_p99_ms": _percentile_ms(from_return, 99),
    }


def _percentile_ms(values: list[float], percent: int) -> float:
    return round(statistics.quantiles(values, n=100, method="inclusive")[percent - 1] * 1000, 1)


def _put_paced(root: str, queue: str, count: int, ready) -> dict[int, tuple[float, float]]:
    """Put ``count`` messages, one every 1/LATENCY_RATE s, once the taker is ``ready``; each one's
    call and return times."""
    qm = QueueManager.open(root)
    ready.wait()
    times, start = {}, time.monotonic()
    for n in range(count):
        time.sleep(max(0.0, start + n / LATENCY_RATE - time.monotonic()))
        called = time.time()
        qm.put(queue, [{"payload": str(n).encode()}])
        times[n] = (called, time.time())
    return times


def _take(root: str, queue: str, count: int, ready) -> dict[int, float]:
    """Get ``count`` messages one at a time, each get waiting up to 30 s; each one's time of return."""
    qm = QueueManager.open(root)
    qm.get(queue, consumer="latency", max_messages=1)  # the first get's set-up is not a message's wait
    ready.set()
    received = {}
    while len(received) < count:
        got = qm.get(queue, consumer="latency", max_messages=1, wait=30)
        received[int(got["payload"][0].as_py())] = time.time()
    return received


def _consume_waiting(root: str, queue: str, count: int, ready) -> dict[int, float]:
    """Take ``count`` messages with a block consumer waiting up to 30 s for each block; each one's
    time of hand-out."""
    qm = QueueManager.open(root)
    qm.get(queue, consumer="latency", max_messages=1)
    ready.set()
    received = {}
    with qm.consumer(queue, "latency", prefetch=CONSUMER_PREFETCH, wait=30) as consumer:
        for message in consumer:
            received[int(message["payload"])] = time.time()
            if len(received) == count:
                break
    return received
