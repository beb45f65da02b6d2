"""The console under load: 50 clients each polling the overview and a queue page every second, at
100 queues, while a producer puts, gets and maintains (the queues aged first, by one round of its
maintenance, unless ``aged`` is false) and a streaming get drains a backlog. Reports
the pages' p50 and p99, the streaming get's throughput against the same drain with the console and
its pollers stopped (the anchor: drains in pairs at the same moments of the run, the median of
``PAIRS`` each), the CPU (in cores) of the console, of the pollers and of the producer, which share
the machine with the get, and the memory of the console (its reader process too) over the run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import pyarrow as pa

import mqspark
from mqspark import MQError, QueueManager, Reason
from mqspark.console.app import KEEP_ALIVE_SECONDS, SERVING_NICE
from mqspark.console.machine import BUSY_SHARE, MachineLoad

# Runs ``clients`` pollers for ``seconds``: each asks for the overview and then one queue's page,
# once a second; writes each page kind's answers (seconds into the run, latency in ms), and the
# failures, as JSON to a file (a pipe, read only once the pollers end, would fill up and block them).
# The pollers stand in for browsers on other machines but share this one with the get, so they use
# aiohttp's client: 0.066 cores where httpx's took 0.19 for the same pages.
CLIENTS = """
import asyncio, json, sys, time
import aiohttp
base, seconds, clients, queues, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
latencies = {"overview": [], "queue": []}
failures = []
begun = time.perf_counter()
async def poll(session, number):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        for kind, url in (("overview", "/"), ("queue", f"/qmgr/BENCH/queue/Q{number % queues:03d}")):
            at, t = time.time(), time.perf_counter()
            try:
                async with session.get(base + url) as answer:
                    await answer.read()
                    if answer.status != 200:
                        failures.append(f"{url}: {answer.status}")
            except Exception as error:
                failures.append(f"{url}: {error!r}")
            latencies[kind].append((at, (time.perf_counter() - t) * 1000))
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
async def main():
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        await asyncio.gather(*(poll(session, n) for n in range(clients)))
asyncio.run(main())
summary = {"failures": failures[:20], "failed": len(failures), "cpu_s": time.process_time()}
summary["seconds"] = time.perf_counter() - begun
with open(out, "w") as written:
    json.dump({"latencies": latencies, **summary}, written)
"""
# Pairs of drains of the streaming get, spread over the run: one with the console and its pollers
# stopped (SIGSTOP), one with them running, in turn first; the medians are compared. Drains of the
# same condition spread by 0.4 s (2.3-2.7 s, 30-minute runs), so that three pairs could not tell 5%.
PAIRS = 8
# The run's p99, and the console's highest memory, are also given for each of this many equal parts
# of it (by default): a slow start, or a trend.
WINDOWS = 6
# Until killed, in rounds 100 ms apart: puts 10 messages to a queue and gets 10 of that queue's
# (group app); every 60th round maintains a queue, round the queues, so that they stay the same size
# as a queue manager's in service do (a round took 56 ms on new queues, so each queue is maintained
# about every 15 minutes). Its first ``ahead`` rounds run at once, unpaced, and then it prints
# "aged": with ``ahead`` = 60 x queues, every queue has been maintained once before the console
# starts, and the queues are as the producer keeps them from then on.
PRODUCER = """
import sys, time
from mqspark import QueueManager
qm = QueueManager.open(sys.argv[1])
queues, ahead = int(sys.argv[2]), int(sys.argv[3])
number = 0
while True:
    if number == ahead:
        print("aged", flush=True)
    queue = f"Q{number % queues:03d}"
    qm.put(queue, [{"payload": b"x" * 100}] * 10)
    qm.get(queue, "app", max_messages=10)
    if number % 60 == 0:
        qm.maintain(f"Q{number // 60 % queues:03d}")
    number += 1
    if number > ahead:
        time.sleep(0.1)
"""
# The pollers' pages served by the least a server can do: a bare Starlette app on uvicorn at the
# console's nice value and keep-alive, answering with fixed bytes of the sizes of the console's
# pages at 100 queues (the overview 20,630 B, a queue's page 3,187 B), computing nothing. Run in
# place of the console (``server="bare"``), it tells what serving 50 clients on this machine costs
# the get whatever the console does.
BARE = """
import os, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
port, nice, keep_alive = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
os.nice(nice)
def page(size):
    body = b"x" * size
    async def answer(request):
        return Response(body, media_type="text/html")
    return answer
routes = [Route("/", page(20_630)), Route("/qmgr/{qmgr}/queue/{queue}", page(3_187)), Route("/api/v1/qmgr", page(2))]
uvicorn.run(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=keep_alive)
"""


def run(
    minutes: float = 30.0,
    clients: int = 50,
    queues: int = 100,
    messages: int = 200_000,
    pairs: int = PAIRS,
    windows: int = WINDOWS,
    server: str = "console",
    aged: bool = True,
    reader_stopped: bool = False,
    per_trigger: int | None = None,
) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-"))
    try:
        return _measure(
            root, minutes, clients, queues, messages, pairs, windows, server, aged, reader_stopped, per_trigger
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(
    root: Path,
    minutes: float,
    clients: int,
    queues: int,
    messages: int,
    pairs: int,
    windows: int,
    server: str,
    aged: bool,
    reader_stopped: bool,
    per_trigger: int | None,
) -> dict:
    qm = QueueManager.create(root / "qm", "BENCH")
    for number in range(queues):
        qm.define_queue(f"Q{number:03d}")
        qm.declare_consumer(f"Q{number:03d}", "app")
    qm.define_queue("GET")
    aging = time.monotonic()
    ahead = 60 * queues if aged else 0
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, qm.root, str(queues), str(ahead)], stdout=subprocess.PIPE
    )
    console = spark = None
    try:
        batch = pa.table({"payload": [b"m" * 1000] * (messages // 20)})
        for _ in range(20):
            qm.put("GET", batch)
        spark = mqspark.session(
            app_name="mqspark-bench", master="local[2]", **{"spark.ui.showConsoleProgress": "false"}
        )
        aged_line = producer.stdout.readline()
        if aged_line != b"aged\n":
            raise RuntimeError(f"the producer ended (exit code {producer.wait()}) before it aged the queues")
        aged_s = time.monotonic() - aging
        _drain(spark, qm.root, root / "warm", "warm", max(1000, messages // 200))  # 200 micro-batches
        port = _free_port()
        console = subprocess.Popen(_server_command(server, qm.root, port), stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        _wait_answering(base)
        seconds = minutes * 60
        polls = root / "polls.json"
        started, cpu_at_start, producer_cpu_at_start = time.monotonic(), _cpu_s(console.pid), _cpu_s(producer.pid)
        begun = time.time()
        load = subprocess.Popen(
            [sys.executable, "-c", CLIENTS, base, str(seconds), str(clients), str(queues), str(polls)]
        )
        memory: list[float] = []
        readers: set[int] = set()
        shares: list[float] = []
        sampling = threading.Thread(target=_sample_rss, args=(console.pid, load, memory, readers, shares), daemon=True)
        sampling.start()
        paused: list[list[float]] = []  # the console's pauses: their start and end, epoch seconds
        conditions = ("stopped", "reader_stopped", "running") if reader_stopped else ("stopped", "running")
        drains: dict[str, list[float]] = {condition: [] for condition in conditions}
        in_drains: list[list[float]] = []  # the serving and the reader processes' cores in each running drain
        # Spread over the run, past its start, where the console computes every page once.
        for n in range(pairs):
            time.sleep(max(0.0, started + seconds * (n + 1) / (pairs + 1) - time.monotonic()))
            # The first drain after minutes without one took 2-3 s longer, the console stopped or
            # not (a 30-minute run): one drain first, not counted, so that the pair compares alike.
            _drain(spark, qm.root, root / f"warm{n}", f"warm{n}", per_trigger or messages)
            for condition in conditions[n % len(conditions) :] + conditions[: n % len(conditions)]:
                with _paused(condition, console.pid, load.pid, paused):
                    before = _cpu_by_part(console.pid)
                    drain = root / f"drain{n}-{condition}"
                    drained = _drain(spark, qm.root, drain, f"{condition}{n}", per_trigger or messages)
                    after = _cpu_by_part(console.pid)
                drains[condition].append(drained)
                if condition == "running":
                    in_drains.append([(used - start) / drained for start, used in zip(before, after, strict=True)])
        load.wait()
        elapsed = time.monotonic() - started
        console_cores = (_cpu_s(console.pid) - cpu_at_start) / elapsed
        producer_cores = (_cpu_s(producer.pid) - producer_cpu_at_start) / elapsed
        sampling.join()
        if load.returncode != 0:
            raise RuntimeError(f"the pollers failed with exit code {load.returncode}")
        polled = json.loads(polls.read_text())
    finally:
        producer.kill()
        if console is not None:
            console.kill()
        if spark is not None:
            spark.stop()
    # A page asked while the console was stopped waited for the pause, not for the console.
    answered = {
        kind: [(at - begun, ms) for at, ms in polled["latencies"][kind] if not _overlaps(at, ms, paused)]
        for kind in ("overview", "queue")
    }
    overview, queue = (sorted(ms for _, ms in answered[kind]) for kind in ("overview", "queue"))
    p99_by_window = _windows(answered["overview"] + answered["queue"], seconds, windows)
    asked = sum(len(polled["latencies"][kind]) for kind in ("overview", "queue"))
    anchors, loads = drains["stopped"], drains["running"]
    anchor, loaded = statistics.median(anchors), statistics.median(loads)
    pair_ratios = [stopped / running for stopped, running in zip(anchors, loads, strict=True)]
    return {
        "benchmark": "console",
        "server": server,
        "minutes": minutes,
        "clients": clients,
        "queues": queues,
        "messages": messages,
        # Seconds until the producer had aged the queues (0 rounds ahead when not ``aged``).
        "queues_aged_s": round(aged_s, 1),
        "anchor_get_per_s": round(messages / anchor, 1),
        "get_per_s_under_load": round(messages / loaded, 1),
        "get_ratio_to_anchor": round(anchor / loaded, 3),
        # Each pair's own ratio: the drains of one condition spread by more than 1 s over a run, and
        # a pair's two drains ran next to each other, so the pairs tell the console from the drift.
        "pair_ratios": [round(ratio, 3) for ratio in pair_ratios],
        "pair_ratio_median": round(statistics.median(pair_ratios), 3),
        "anchor_drains_s": [round(drain, 2) for drain in anchors],
        "loaded_drains_s": [round(drain, 2) for drain in loads],
        **(_reader_stopped(drains["reader_stopped"], loads) if reader_stopped else {}),
        "overview_p50_ms": _p(overview, 0.5),
        "overview_p99_ms": _p(overview, 0.99),
        "queue_p50_ms": _p(queue, 0.5),
        "queue_p99_ms": _p(queue, 0.99),
        "pages_p99_ms_by_window": p99_by_window,
        "pages": len(overview) + len(queue),
        "pages_left_out_paused": asked - len(overview) - len(queue),
        "failed": polled["failed"],
        "failures": polled["failures"],
        "console_cpu_cores": round(console_cores, 2),
        # What the console used during the drains it ran beside (the run's average hides its bursts).
        "serving_cores_in_drains": [round(serving, 2) for serving, _ in in_drains],
        "reader_cores_in_drains": [round(reader, 2) for _, reader in in_drains],
        "clients_cpu_cores": round(polled["cpu_s"] / polled["seconds"], 2),
        "producer_cpu_cores": round(producer_cores, 2),
        "console_rss_mb_first": memory[0] if memory else None,
        "console_rss_mb_last": memory[-1] if memory else None,
        "console_rss_mb_max": max(memory) if memory else None,
        "console_rss_mb_max_by_window": [max(part, default=None) for part in _parts(memory, windows)],
        "reader_processes": len(readers),
        **_busy(shares[1:]),
    }


def _server_command(server: str, root: str, port: int) -> list[str]:
    """The command serving the pollers' pages: the console of ``root``, or (``bare``) :data:`BARE`."""
    if server == "console":
        return [sys.executable, "-m", "mqspark.cli", "console", "--root", root, "--port", str(port)]
    if server == "bare":
        return [sys.executable, "-c", BARE, str(port), str(SERVING_NICE), str(KEEP_ALIVE_SECONDS)]
    raise ValueError(f"option server must be console or bare, got {server!r}")


def _drain(spark, root: str, checkpoint: Path, consumer: str, per_trigger: int) -> float:
    """Seconds a streaming get of group ``consumer`` takes to drain queue GET into ``noop``,
    ``per_trigger`` messages a micro-batch at most. The group
    is deleted afterwards: with every drain's group kept, the drains of a 30-minute run of eight
    pairs slowed from 2.8-3.3 s to 4.3-5.6 s, and the pages' p99 doubled."""
    started = time.perf_counter()
    query = (
        spark.readStream.format("mq")
        .option("queue", "GET")
        .option("consumer", consumer)
        .option("maxMessagesPerTrigger", per_trigger)
        .load(root)
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    drained = time.perf_counter() - started
    _delete_group(QueueManager.open(root), consumer)
    return drained


def _delete_group(qm: QueueManager, consumer: str, timeout: float = 30.0) -> None:
    """Delete group ``consumer`` of queue GET once its ended query gave up its lease, which comes a
    fraction of a second after ``awaitTermination`` returns (0.33 s once)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            qm.delete_consumer("GET", consumer)
            return
        except MQError as error:
            if error.reason != Reason.MQRC_OBJECT_IN_USE or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_answering(base: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/v1/qmgr", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _sample_rss(pid: int, load: subprocess.Popen, memory: list[float], readers: set[int], shares: list[float]) -> None:
    """The console's RSS (MB) every 10 s into ``memory``, its reader processes seen into
    ``readers``, and the share of the CPUs the other processes used in those 10 s (as the console
    measures it) into ``shares``, while the pollers run."""
    console: list[int] = []  # the console's processes, as this sample found them
    others = MachineLoad(own=lambda: console)
    while load.poll() is None:
        processes = _processes(pid)
        console[:] = processes
        memory.append(_rss_mb(processes))
        readers.update(number for number in processes if _is_reader(number))
        shares.append(others.others_share())
        time.sleep(10)


def _is_reader(pid: int) -> bool:
    """Whether process ``pid`` is a reader process (a pool's worker, not multiprocessing's tracker)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"spawn_main" in command and b"resource_tracker" not in command


def _cpu_s(pid: int) -> float:
    """The CPU time (user and system, seconds) process ``pid`` and its processes (the console's
    reader process) have used, ended ones included."""
    used = 0.0
    for number, fields in _processes(pid).items():
        used += _ticks(fields)
        if number == pid:
            used += int(fields[13]) + int(fields[14])  # its ended children's, once waited for
    return used / os.sysconf("SC_CLK_TCK")


def _busy(shares: list[float]) -> dict:
    """How busy the other processes kept the machine, by 10 s (the first sample measures nothing):
    the median share of the CPUs they used, and the part of the run the console counted as busy
    (refreshing its answers less often)."""
    if not shares:
        return {}
    return {
        "others_cpu_share_median": round(statistics.median(shares), 2),
        "machine_busy_part": round(sum(share >= BUSY_SHARE for share in shares) / len(shares), 3),
    }


def _cpu_by_part(pid: int) -> tuple[float, float]:
    """The CPU time (user and system, seconds) used so far by the console's serving process ``pid``
    and by its reader processes (those alive: a reader that ended takes its time with it)."""
    processes = _processes(pid)
    readers = sum(_ticks(fields) for number, fields in processes.items() if _is_reader(number))
    return _ticks(processes[pid]) / os.sysconf("SC_CLK_TCK"), readers / os.sysconf("SC_CLK_TCK")


def _ticks(fields: list[str]) -> int:
    """The ticks a process spent on a CPU (user and system), from its /proc stat fields."""
    return int(fields[11]) + int(fields[12])


def _rss_mb(processes: dict[int, list[str]]) -> float:
    """The resident memory (MB) of ``processes`` (see :func:`_processes`)."""
    pages = sum(int(fields[21]) for fields in processes.values())
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def _processes(pid: int) -> dict[int, list[str]]:
    """The fields of /proc/N/stat after the command, of process ``pid`` and its descendants, by N."""
    every: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                every[int(entry.name)] = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue  # ended meanwhile
    tree, added = {pid}, True
    while added:
        children = {number for number, fields in every.items() if int(fields[1]) in tree} - tree
        tree |= children
        added = bool(children)
    return {number: every[number] for number in tree if number in every}


def _paused(condition: str, console: int, load: int, paused: list[list[float]]) -> AbstractContextManager:
    """What a drain of ``condition`` runs beside: the console, its reader process and the pollers
    stopped (their pauses appended to ``paused``); the reader process alone stopped, the console
    serving its pages from the answers it has; or everything running."""
    if condition == "stopped":
        return _stopped([*_processes(console), load], paused)
    if condition == "reader_stopped":
        return _stopped([number for number in _processes(console) if _is_reader(number)], [])
    return nullcontext()


def _reader_stopped(drains: list[float], loads: list[float]) -> dict:
    """The drains with the reader process alone stopped, and each against the running drain of its
    round: what the reader's work costs the get, apart from serving the pages."""
    ratios = [stopped / running for stopped, running in zip(drains, loads, strict=True)]
    return {
        "reader_stopped_drains_s": [round(drain, 2) for drain in drains],
        "reader_stopped_ratios": [round(ratio, 3) for ratio in ratios],
        "reader_stopped_ratio_median": round(statistics.median(ratios), 3),
    }


@contextmanager
def _stopped(processes: list[int], paused: list[list[float]]) -> Iterator[None]:
    """``processes`` stopped (SIGSTOP) for the block and continued after it, even when it fails;
    the pause's start and end appended to ``paused``."""
    paused.append([time.time()])
    for process in processes:
        os.kill(process, signal.SIGSTOP)
    try:
        yield
    finally:
        for process in processes:
            os.kill(process, signal.SIGCONT)
        paused[-1].append(time.time())


def _overlaps(at: float, ms: float, paused: list[list[float]]) -> bool:
    """Whether a page asked at ``at`` (epoch seconds) and answered ``ms`` later overlaps a pause."""
    return any(at < end and at + ms / 1000 > start for start, end in paused)


def _parts(values: list[float], count: int) -> list[list[float]]:
    """``values`` in ``count`` consecutive parts of (nearly) equal length."""
    size = len(values) / count
    return [values[round(n * size) : round((n + 1) * size)] for n in range(count)]


def _windows(answers: list[tuple[float, float]], seconds: float, count: int) -> list[float | None]:
    """The p99 of the answers' latencies in each of ``count`` equal windows of a run of ``seconds``."""
    by_window: list[list[float]] = [[] for _ in range(count)]
    for at, ms in answers:
        by_window[min(count - 1, int(at // (seconds / count)))].append(ms)
    return [_p(sorted(window), 0.99) for window in by_window]


def _p(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(fraction * len(values)))], 1)
