"""QueueManager.put against delta-rs's own write_deltalake append of the same rows."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from mqspark import QueueManager
from mqspark.model.messages import MESSAGE_SCHEMA
from mqspark.model.put import prepare_put


def run(messages: int = 200_000, put_size: int = 10_000, payload_bytes: int = 1024) -> dict:
    root = tempfile.mkdtemp(prefix="mqspark-bench-")
    try:
        return _measure(root, messages, put_size, payload_bytes)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(root: str, messages: int, put_size: int, payload_bytes: int) -> dict:
    qm = QueueManager.create(f"{root}/qm", "BENCH")
    qm.define_queue("Q")
    data = pa.table({"payload": pa.array([b"x" * payload_bytes] * put_size, pa.binary())})
    puts = messages // put_size

    mq_times = []
    for _ in range(puts):
        start = time.perf_counter()
        qm.put("Q", data)
        mq_times.append(time.perf_counter() - start)

    rows = prepare_put(qm.inquire_queue("Q"), data).messages
    native = DeltaTable.create(f"{root}/native", schema=MESSAGE_SCHEMA)
    native_times = []
    for _ in range(puts):
        start = time.perf_counter()
        write_deltalake(native, rows, mode="append")
        native_times.append(time.perf_counter() - start)

    assert qm.depth("Q") == puts * put_size
    mq_rate = puts * put_size / sum(mq_times)
    native_rate = puts * put_size / sum(native_times)
    return {
        "benchmark": "python_put",
        "messages": puts * put_size,
        "put_size": put_size,
        "payload_bytes": payload_bytes,
        "mq_messages_per_s": round(mq_rate),
        "native_messages_per_s": round(native_rate),
        "ratio_to_native": round(mq_rate / native_rate, 3),
        "mq_put_median_ms": round(statistics.median(mq_times) * 1000, 1),
        "native_append_median_ms": round(statistics.median(native_times) * 1000, 1),
    }
