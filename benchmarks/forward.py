"""The forwarding service: throughput against a plain get-to-put pipeline, and request/reply latency.

**Throughput.** Two queues get the same ``messages`` requests of ``payload_bytes`` bytes (reply queue
set) in ``puts`` puts. The anchor drains one with ``readStream.format("mq")`` into
``writeStream.format("mq")`` (a queue OUT), under ``trigger(availableNow=True)``; ``mqspark.forward``
drains the other with a trivial vectorised service (each reply is its request's payload), with
``exit_when_empty``. Both read ``batch`` messages per micro-batch. Wall time is start() to the end
of the query. The run fails unless each put every message once (OUT and REPLIES hold ``messages``
messages, both groups' depth is 0).

**Latency.** With a forwarder running at ``idle_interval=0`` (trigger processingTime 0) and an
upper-casing service, ``requests`` sequential :func:`mqspark.request` calls (put, then a Python get
by correl_id) are timed one by one; p50 and p99 of their round trips are reported. The first
``warmup`` round trips are left out.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

import mqspark
from mqspark import QueueManager

from .stream_put import check_run


def echo_all(requests: pa.Table) -> pa.ChunkedArray:
    return requests["payload"]


def upper(request: dict) -> bytes:
    return request["payload"].upper()


def _fill(qm: QueueManager, queue: str, messages: int, puts: int, payload_bytes: int) -> None:
    per_put = messages // puts
    payload = b"x" * payload_bytes
    for put in range(puts):
        rows = pa.table(
            {
                "payload": pa.array([payload] * per_put, pa.binary()),
                "correl_id": pa.array([f"c{put}-{i}" for i in range(per_put)]),
                "reply_to_queue": pa.array(["REPLIES"] * per_put),
            }
        )
        qm.put(queue, rows)


def run(
    spark,
    messages: int = 100_000,
    puts: int = 10,
    payload_bytes: int = 256,
    batch: int = 20_000,
    requests: int = 60,
    warmup: int = 10,
) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-forward-"))
    try:
        qm = QueueManager.create(root / "qm", "BENCH")
        for name in ("ANCHOR", "REQUESTS", "OUT", "REPLIES", "LIVE", "LIVE.REPLIES"):
            qm.define_queue(name, max_depth=10 * messages)
        _fill(qm, "ANCHOR", messages, puts, payload_bytes)
        _fill(qm, "REQUESTS", messages, puts, payload_bytes)

        # Warm-up: JVM code paths and Python workers of both pipelines, on a small queue.
        qm.define_queue("WARM")
        _fill(qm, "WARM", 1_000, 1, payload_bytes)
        _anchor(spark, qm, "WARM", batch, root / "ckpt-warm-anchor")
        mqspark.forward(
            spark,
            qm.root,
            "WARM",
            echo_all,
            vectorized=True,
            exit_when_empty=True,
            checkpoint_location=str(root / "ckpt-warm-forward"),
        ).awaitTermination()

        anchor_s = _anchor(spark, qm, "ANCHOR", batch, root / "ckpt-anchor")
        began = time.perf_counter()
        query = mqspark.forward(
            spark,
            qm.root,
            "REQUESTS",
            echo_all,
            vectorized=True,
            exit_when_empty=True,
            maxMessagesPerTrigger=batch,
            checkpoint_location=str(root / "ckpt-forward"),
        )
        query.awaitTermination()
        forward_s = time.perf_counter() - began
        if query.exception() is not None:
            raise RuntimeError(f"forward failed: {query.exception()}")

        live = mqspark.forward(
            spark, qm.root, "LIVE", upper, idle_interval=0, checkpoint_location=str(root / "ckpt-live")
        )
        round_trips = []
        try:
            for number in range(requests):
                began = time.perf_counter()
                reply = mqspark.request(qm, "LIVE", f"ping {number}", reply_to="LIVE.REPLIES", timeout=120)
                round_trips.append(time.perf_counter() - began)
                if reply["payload"][0].as_py() != f"PING {number}".encode():
                    raise RuntimeError(f"wrong reply {reply['payload'][0].as_py()!r} to request {number}")
        finally:
            live.stop()
        check_run(
            "forward",
            {
                "anchor messages put": (qm.depth("OUT"), messages + 1_000),
                "replies put": (qm.depth("REPLIES"), messages + 1_000),
                "anchor depth afterwards": (qm.depth("ANCHOR", consumer="anchor"), 0),
                "forward depth afterwards": (qm.depth("REQUESTS", consumer="forward"), 0),
            },
        )
        timed = sorted(round_trips[warmup:])
        return {
            "benchmark": "forward",
            "messages": messages,
            "payload_bytes": payload_bytes,
            "batch": batch,
            "anchor_seconds": round(anchor_s, 2),
            "forward_seconds": round(forward_s, 2),
            "anchor_messages_per_s": round(messages / anchor_s),
            "forward_messages_per_s": round(messages / forward_s),
            "ratio_to_get_put_pipeline": round(anchor_s / forward_s, 3),
            "round_trips": len(timed),
            "round_trip_p50_s": round(statistics.median(timed), 3),
            "round_trip_p99_s": round(timed[min(len(timed) - 1, int(len(timed) * 0.99))], 3),
            "round_trip_max_s": round(timed[-1], 3),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _anchor(spark, qm: QueueManager, queue: str, batch: int, checkpoint: Path) -> float:
    began = time.perf_counter()
    query = (
        spark.readStream.format("mq")
        .option("queue", queue)
        .option("consumer", "anchor")
        .option("maxMessagesPerTrigger", str(batch))
        .load(qm.root)
        .select("payload", "correl_id")
        .writeStream.format("mq")
        .option("queue", "OUT")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(qm.root)
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"anchor failed: {query.exception()}")
    return time.perf_counter() - began
