"""Browse in logical order over 1M messages, against a plain Delta scan of the same queue table.

Three queue shapes: all ungrouped; 10k open groups (items spread over every put, no last message);
segmented messages. Each reports the engine alone, ``qm.browse``, ``spark.read.format("mq")`` and
``spark.read.format("delta")`` (both drained into Spark's ``noop`` sink) and the ratio of the two.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa

from mqspark import QueueManager, store
from mqspark.engine.ordering import DeliveryOptions, deliver
from mqspark.model.messages import MESSAGE_SCHEMA

PUTS = 10


def _payloads(count: int, size: int, seed: int) -> pa.Array:
    data = np.random.default_rng(seed).integers(0, 256, count * size, dtype=np.uint8).tobytes()
    offsets = pa.array(np.arange(0, count * size + 1, size, dtype=np.int32))
    return pa.BinaryArray.from_buffers(pa.binary(), count, [None, offsets.buffers()[1], pa.py_buffer(data)])


def _fill(qm: QueueManager, shape: str, messages: int, payload_bytes: int) -> None:
    rng = np.random.default_rng(7)
    per_put = messages // PUTS
    for put in range(PUTS):
        columns = {
            "payload": _payloads(per_put, payload_bytes, put),
            "priority": pa.array(rng.integers(0, 10, per_put), pa.int32()),
        }
        if shape == "open_groups":
            # 10k groups of 10 items: item `put + 1` of every group goes into put `put`.
            grouped = 10_000
            group_ids = [f"G{g}" for g in range(grouped)] + [None] * (per_put - grouped)
            columns["group_id"] = pa.array(group_ids, pa.string())
            columns["msg_seq_number"] = pa.array([put + 1] * grouped + [None] * (per_put - grouped), pa.int32())
            columns["priority"] = pa.array([5] * grouped + list(rng.integers(0, 10, per_put - grouped)), pa.int32())
        if shape == "segments":
            # Half the rows are segments: logical messages of 5 segments each, all in this put.
            segmented = per_put // 2
            message = np.arange(segmented) // 5
            columns["group_id"] = pa.array([f"S{put}-{m}" for m in message] + [None] * (per_put - segmented))
            columns["msg_seq_number"] = pa.array([1] * segmented + [None] * (per_put - segmented), pa.int32())
            columns["segmented"] = pa.array([True] * segmented + [False] * (per_put - segmented))
            columns["offset"] = pa.array(list((np.arange(segmented) % 5) * payload_bytes) + [0] * (per_put - segmented))
            last = np.arange(segmented) % 5 == 4
            columns["last_segment"] = pa.array(list(last) + [False] * (per_put - segmented))
            columns["last_in_group"] = pa.array([True] * segmented + [False] * (per_put - segmented))
            columns["priority"] = pa.array([5] * per_put, pa.int32())
        qm.put("Q", pa.table(columns))


def _drain(spark, reader) -> float:
    start = time.perf_counter()
    reader.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def run(spark, shape: str, messages: int = 1_000_000, payload_bytes: int = 1024) -> dict:
    root = tempfile.mkdtemp(prefix="mqspark-bench-")
    try:
        qm = QueueManager.create(f"{root}/qm", "BENCH")
        qm.define_queue("Q")
        _fill(qm, shape, messages, payload_bytes)
        location = store.queue_location(qm.root, "Q")
        table = store.open_table(location, None)

        start = time.perf_counter()
        committed = store.read_committed(table, MESSAGE_SCHEMA.names, MESSAGE_SCHEMA)
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        engine = deliver(committed, "priority", DeliveryOptions(), datetime.now(UTC)).messages
        engine_s = time.perf_counter() - start

        start = time.perf_counter()
        browsed = qm.browse("Q")
        browse_s = time.perf_counter() - start
        assert browsed.num_rows == engine.num_rows

        complete_s = None
        if shape == "segments":
            start = time.perf_counter()
            whole = qm.browse("Q", complete_message=True)
            complete_s = time.perf_counter() - start
            assert whole.num_rows == messages // 2 + messages // 2 // 5

        mq_s = _drain(spark, spark.read.format("mq").option("queue", "Q").load(qm.root))
        delta_s = _drain(spark, spark.read.format("delta").load(location))
        return {
            "benchmark": f"browse_{shape}",
            "messages": messages,
            "payload_bytes": payload_bytes,
            "delivered": browsed.num_rows,
            "read_committed_s": round(read_s, 3),
            "engine_logical_order_s": round(engine_s, 3),
            "qm_browse_s": round(browse_s, 3),
            "qm_browse_complete_message_s": None if complete_s is None else round(complete_s, 3),
            "qm_browse_rows_per_s": round(browsed.num_rows / browse_s),
            "spark_mq_s": round(mq_s, 3),
            "spark_delta_s": round(delta_s, 3),
            "spark_mq_rows_per_s": round(browsed.num_rows / mq_s),
            "spark_delta_rows_per_s": round(messages / delta_s),
            "ratio_to_delta": round((browsed.num_rows / mq_s) / (messages / delta_s), 3),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
