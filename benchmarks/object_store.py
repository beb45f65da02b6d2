"""Put commit latency on the object store (Azure Blob Storage, as the Azurite emulator serves it on
127.0.0.1) against a local folder, in the same run: the same small puts, one commit each, p50
and p99. The native anchor is delta-rs's own ``write_deltalake`` append of the same rows to a
plain Delta table on the emulator."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from mqspark import QueueManager
from mqspark.model.messages import MESSAGE_SCHEMA
from mqspark.model.put import prepare_put
from tests.support.azurite import ACCOUNT, Azurite

from .stream_get import _p


def _latencies(qm: QueueManager, data: pa.Table, puts: int) -> list[float]:
    times = []
    for _ in range(puts):
        start = time.perf_counter()
        qm.put("Q", data)
        times.append(time.perf_counter() - start)
    return times


def run(puts: int = 200, put_size: int = 10, payload_bytes: int = 1024) -> dict:
    work = Path(tempfile.mkdtemp(prefix="mqspark-bench-object-store-"))
    emulator = Azurite(work / "azurite")
    try:
        emulator.start()
        emulator.filesystem().create_dir("bench")
        options = emulator.storage_options
        data = pa.table({"payload": pa.array([b"x" * payload_bytes] * put_size, pa.binary())})
        remote = QueueManager.create(
            f"abfs://bench@{ACCOUNT}.dfs.core.windows.net/qm", "BENCH", storage_options=options
        )
        local = QueueManager.create(work / "qm", "BENCH")
        for qm in (remote, local):
            qm.define_queue("Q")
        remote_times = _latencies(remote, data, puts)
        local_times = _latencies(local, data, puts)
        rows = prepare_put(remote.inquire_queue("Q"), data).messages
        native = DeltaTable.create(
            f"abfs://bench@{ACCOUNT}.dfs.core.windows.net/native", schema=MESSAGE_SCHEMA, storage_options=options
        )
        native_times = []
        for _ in range(puts):
            start = time.perf_counter()
            write_deltalake(native, rows, mode="append")
            native_times.append(time.perf_counter() - start)
        assert remote.depth("Q") == local.depth("Q") == puts * put_size
        p50, p99 = _p(remote_times, 0.5), _p(remote_times, 0.99)
        return {
            "benchmark": "object_store_put",
            "puts": puts,
            "put_size": put_size,
            "payload_bytes": payload_bytes,
            "azurite_put_ms_p50": round(p50 * 1000, 1),
            "azurite_put_ms_p99": round(p99 * 1000, 1),
            "local_put_ms_p50": round(_p(local_times, 0.5) * 1000, 1),
            "local_put_ms_p99": round(_p(local_times, 0.99) * 1000, 1),
            "native_azurite_append_ms_p50": round(_p(native_times, 0.5) * 1000, 1),
            "ratio_p50_to_local": round(p50 / _p(local_times, 0.5), 2),
            "ratio_p50_to_native_azurite": round(p50 / _p(native_times, 0.5), 2),
        }
    finally:
        emulator.stop()
        shutil.rmtree(work, ignore_errors=True)
