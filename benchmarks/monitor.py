"""Backlog monitor: the cost of one monitor point, and how it grows with the queue's history.

A queue gets ``messages`` messages of 16 B in ``puts`` puts; group ``g`` consumes all but the last
``waiting`` (one planned batch, recorded consumed, as a streaming get does). Then:

1. ``points`` monitor points (:meth:`mqspark.services.monitor.Monitor.point`, history table on) after one
   warm-up point: ``point_ms_p50`` / ``point_ms_p99``. The anchor, in the same run, is the native
   Delta path's count of the queue's rows (``DeltaTable(...).to_pyarrow_dataset().count_rows()``,
   which reads file statistics only): ``ratio_point_to_native_count``.
2. ``history`` more commits, in pairs: a put of one message and a get of that message (by its
   ``msg_id``) by group ``g``, which commits to the state table too. The waiting messages stay the
   same ``waiting`` while the message and state tables' logs grow (and the message table gains a
   live file per put, consumed). The same points again: ``history_growth`` is the point's p50
   after over before. Nothing runs maintenance in between, so the log grows as it would between
   two maintenance runs: ``history`` stays below what makes a put start maintenance (a put that
   leaves ``MAINTAIN_AT_FILES`` live files), and the run checks that every file is still live.

Targets (issue): a point costs < 200 ms at 1M messages with 10k waiting, and grows with new data,
not with history (``history_growth`` near 1).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from mqspark import QueueManager, store
from mqspark.qmgr import engine
from mqspark.services.monitor import Monitor

from .maintenance import GROUP, _consume_all_but
from .stream_get import _Contention, _p
from .stream_put import check_run


def _points(monitor: Monitor, points: int) -> list[float]:
    monitor.point()
    times = []
    for _ in range(points):
        began = time.perf_counter()
        monitor.point()
        times.append(time.perf_counter() - began)
    return times


def _native_count(location: str, samples: int) -> tuple[list[float], int]:
    from deltalake import DeltaTable

    times, rows = [], 0
    for _ in range(samples):
        began = time.perf_counter()
        rows = DeltaTable(location).to_pyarrow_dataset().count_rows()
        times.append(time.perf_counter() - began)
    return times, rows


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def run(messages: int = 1_000_000, puts: int = 20, waiting: int = 10_000, points: int = 20, history: int = 200) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-monitor-"))
    try:
        qm = QueueManager.create(root / "qm", "QM1")
        qm.define_queue("Q")
        per_put = messages // puts
        payloads = pa.array([b"0123456789abcdef"] * per_put, pa.binary())
        for _ in range(puts):
            qm.put("Q", pa.table({"payload": payloads}))
        _consume_all_but(qm, "Q", waiting)
        contention = _Contention()
        # Watching only (watch_count above the backlog): the judgement itself costs nothing measurable.
        monitor = Monitor(qm, "Q", GROUP, watch_interval=1.0, watch_count=waiting + 1, expected_count=1)
        before = _points(monitor, points)
        native, rows = _native_count(store.queue_location(qm.root, "Q"), points)
        check_run("monitor", {"backlog": (monitor.window[-1].backlog, waiting), "rows": (rows, messages)})
        for _ in range(history):
            (msg_id,) = qm.put("Q", [{"payload": b"x"}])
            check_run("monitor", {"get": (qm.get("Q", GROUP, msg_id=msg_id).num_rows, 1)})
        after = _points(monitor, points)
        files, _ = engine(qm).live_messages("Q")
        check_run(
            "monitor",
            {
                "backlog after history": (monitor.window[-1].backlog, waiting),
                "live files": (files.num_rows, puts + history),
            },
        )
        p50_before, p50_after, native_p50 = _p(before, 0.5), _p(after, 0.5), _p(native, 0.5)
        return {
            "benchmark": "monitor",
            "messages": messages,
            "puts": puts,
            "waiting": waiting,
            "points": points,
            "point_ms_p50": _ms(p50_before),
            "point_ms_p99": _ms(_p(before, 0.99)),
            "native_count_ms_p50": _ms(native_p50),
            "ratio_point_to_native_count": round(p50_before / native_p50, 2),
            "history_commits": 2 * history,
            "point_ms_p50_after_history": _ms(p50_after),
            "point_ms_p99_after_history": _ms(_p(after, 0.99)),
            "history_growth": round(p50_after / p50_before, 3),
            **contention.fields(),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
