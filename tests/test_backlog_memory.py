"""A backlog of millions plans within a memory limit (issue 27): on a queue of 5M waiting messages, the
streaming get's planner and a Python get each run in a fresh process whose peak resident set must
stay under 512 MB (the issue asks for 1.5 GB; both take about 250 MB since the index is read
lazily), and deliver the queue's first messages in order.

The limit is on the peak resident set (``VmHWM``), not ``RLIMIT_AS``: a process that has only
imported mqspark already reserves about 1.7 GB of address space (thread stacks and allocator arenas
of pyarrow and delta-rs), so an address-space limit would measure those reservations, not planning.
Not ``ru_maxrss`` either: Linux keeps it across ``execve``, so a child counts the resident set of
the test process it was forked from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from mqspark import QueueManager

pytestmark = pytest.mark.slow

MESSAGES = 5_000_000
PUT_ROWS = 1_000_000
LIMIT_MB = 512

# Runs in the child: plan as the streaming get does (two micro-batches of 10,000, each consumed), or get one
# message twice as a Python get; prints what it delivered and its peak resident set.
_CHILD = """
import json, sys
from datetime import UTC, datetime, timedelta
from mqspark import QueueManager
from mqspark.engine.ordering import DeliveryOptions
from mqspark.engine.planner import Planner
from mqspark.qmgr import engine

root, case = sys.argv[1], sys.argv[2]
qm = QueueManager.open(root)
if case == "stream":
    planner = Planner(engine(qm), "Q", "stream", "query-1", DeliveryOptions(), timedelta(minutes=5))
    planner.load()
    delivered = []
    for first in (0, 10_000):
        plan = planner.plan(first, datetime.now(UTC), 10_000, None)
        plan_id = plan.schema.metadata[b"plan_id"].decode()
        planner.record(plan_id, first, plan)
        # The batch ran: as the query's commit does, its messages are consumed.
        planner.consume(plan_id, first)
        delivered.append(plan.select(["origin", "row", "count", "delivery_seq"]).to_pylist())
    planner.close()
else:
    delivered = [qm.get("Q", "python", max_messages=1)["payload"].to_pylist()[0].hex() for _ in range(2)]
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) // 1024
print(json.dumps({"delivered": delivered, "peak_mb": peak}))
"""


def _messages(rng: np.random.Generator, first: int, rows: int) -> pa.Table:
    """16-byte payloads; in each block of 100 messages the first 10 are one group."""
    index = np.arange(first, first + rows)
    grouped = index % 100 < 10
    payload = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), rows, [None, pa.py_buffer(rng.bytes(16 * rows))])
    names = pc.binary_join_element_wise("g", pa.array(index // 100).cast(pa.string()), "")
    return pa.table(
        {
            "payload": payload.cast(pa.binary()),
            "group_id": pc.if_else(pa.array(grouped), names, None),
            "msg_seq_number": pa.array((index % 100 + 1).astype(np.int32), mask=~grouped),
            "last_in_group": pa.array(index % 100 == 9),
        }
    )


@pytest.fixture(scope="module")
def backlog(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    root = tmp_path_factory.mktemp("backlog") / "qm"
    qm = QueueManager.create(root, "QM1")
    qm.define_queue("Q")
    rng = np.random.default_rng(27)
    first_payloads = b""
    for first in range(0, MESSAGES, PUT_ROWS):
        rows = _messages(rng, first, PUT_ROWS)
        if first == 0:
            first_payloads = b"".join(rows["payload"].slice(0, 2).to_pylist())
        qm.put("Q", rows)
    assert qm.depth("Q") == MESSAGES
    return root, first_payloads


def _run(root: Path, case: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), case], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_streaming_planner_plans_a_5m_backlog_within_the_memory_limit(backlog):
    root, _ = backlog
    result = _run(root, "stream")
    # Two batches: the first 20,000 rows of the first put's origin, in order.
    delivered = [
        (plan_range["origin"], plan_range["row"] + n, plan_range["delivery_seq"] + n)
        for batch in result["delivered"]
        for plan_range in batch
        for n in range(plan_range["count"])
    ]
    origin = delivered[0][0]
    assert sorted(delivered, key=lambda item: item[2]) == [(origin, n, n) for n in range(20_000)]
    assert result["peak_mb"] <= LIMIT_MB, result["peak_mb"]


def test_a_python_get_on_a_5m_backlog_stays_within_the_memory_limit(backlog):
    root, first_payloads = backlog
    result = _run(root, "python")
    assert bytes.fromhex("".join(result["delivered"])) == first_payloads
    assert result["peak_mb"] <= LIMIT_MB, result["peak_mb"]
