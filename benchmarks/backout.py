"""Backout: the drain throughput of a streaming get whose consumer backs out 1% of the messages,
against the same drain with none backed out, in the same SparkSession and run.

Two queues get the same ``messages`` messages of ``payload_bytes`` bytes, in ``puts`` puts. Each is
drained by ``spark.readStream.format("mq")`` with ``maxMessagesPerTrigger`` = ``batch`` into
``foreachBatch``, under ``trigger(availableNow=True)``. The consumer collects each batch's
``delivery_seq`` and ``backout_count`` as Arrow. On the backout queue it gives back, with
``mqspark.backout``, every message whose ``delivery_seq`` is a multiple of 100 on its first
delivery (1%); the queue's ``retry_count`` of 3 and ``retry_delay`` of 0 bring each back at once, and
the next delivery is processed. The anchor queue backs out nothing. Wall time is start() to
awaitTermination(). The run fails unless both drains processed every message (the anchor exactly
once, the backout drain once plus once per backed-out message) and both groups' depth is 0.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa

import mqspark
from mqspark import QueueManager

from .stream_put import check_run


def _drain(spark, qm: QueueManager, queue: str, batch: int, checkpoint: Path, back_out: bool) -> tuple[float, dict]:
    seen = {"rows": 0, "backed_out": 0, "batches": 0}

    def process(df, batch_id: int) -> None:
        rows = df.select("queue", "delivery_seq", "backout_count").toArrow()
        seen["rows"] += rows.num_rows
        seen["batches"] += 1
        if back_out and rows.num_rows:
            seq = rows["delivery_seq"].to_numpy()
            first = rows["backout_count"].to_numpy() == 0
            chosen = rows.filter(pa.array(first & (seq % 100 == 0)))
            if chosen.num_rows:
                seen["backed_out"] += mqspark.backout(chosen, "benchmark", root=qm.root, consumer="bench")

    query = (
        spark.readStream.format("mq")
        .option("queue", queue)
        .option("consumer", "bench")
        .option("maxMessagesPerTrigger", str(batch))
        .load(qm.root)
        .writeStream.foreachBatch(process)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    start = time.perf_counter()
    running = query.start()
    running.awaitTermination()
    seconds = time.perf_counter() - start
    if running.exception() is not None:
        raise RuntimeError(f"stream failed: {running.exception()}")
    return seconds, seen


def run(spark, messages: int = 100_000, puts: int = 10, batch: int = 10_000, payload_bytes: int = 100) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-backout-"))
    try:
        qm = QueueManager.create(root / "qm", "BENCH")
        payload = b"x" * payload_bytes
        for queue in ("WARMUP", "ANCHOR", "BACKOUT"):
            qm.define_queue(queue, retry_count=3)
        qm.put("WARMUP", [{"payload": payload}] * 1_000)
        for queue in ("ANCHOR", "BACKOUT"):
            for _ in range(puts):
                qm.put(queue, pa.table({"payload": pa.array([payload] * (messages // puts), pa.binary())}))
        _drain(spark, qm, "WARMUP", batch, root / "ck-warmup", back_out=True)
        anchor_s, anchor = _drain(spark, qm, "ANCHOR", batch, root / "ck-anchor", back_out=False)
        backout_s, backed = _drain(spark, qm, "BACKOUT", batch, root / "ck-backout", back_out=True)
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(60_000)
        check_run(
            "backout",
            {
                "anchor rows delivered": (anchor["rows"], messages),
                "backout rows delivered": (backed["rows"], messages + backed["backed_out"]),
                "messages backed out": (backed["backed_out"], messages // 100),
                "anchor depth afterwards": (qm.depth("ANCHOR", consumer="bench"), 0),
                "backout depth afterwards": (qm.depth("BACKOUT", consumer="bench"), 0),
            },
        )
        anchor_rate = messages / anchor_s
        backout_rate = messages / backout_s
        return {
            "benchmark": "backout",
            "messages": messages,
            "batch": batch,
            "payload_bytes": payload_bytes,
            "backed_out": backed["backed_out"],
            "anchor_seconds": round(anchor_s, 2),
            "backout_seconds": round(backout_s, 2),
            "anchor_batches": anchor["batches"],
            "backout_batches": backed["batches"],
            "anchor_messages_per_s": round(anchor_rate),
            "backout_messages_per_s": round(backout_rate),
            "ratio_to_anchor": round(backout_rate / anchor_rate, 3),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
