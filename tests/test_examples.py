"""The examples run as they are documented, with ``mqspark submit`` (pyspark's own spark-submit)."""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

import pytest

from mqspark import QueueManager

from .support.processes import finish_driver, start_process

# Each example runs under spark-submit.
pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.xdist_group("drivers-a")]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _submit(tmp_path: Path, name: str, job_args: list[str]) -> str:
    """Run ``mqspark submit examples/<name> JOB_ARGS`` as docs/request-reply.md gives it, as from a virtualenv
    that is not activated (no PYSPARK_PYTHON; ``python3`` on PATH need not have pyspark); its output."""
    log = tmp_path / f"{name}.log"
    token = uuid.uuid4().hex
    command = [
        sys.executable,
        "-m",
        "mqspark.cli",
        "submit",
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
    ]
    process = start_process([*command, str(EXAMPLES / name), *job_args], log, token, pyspark_python=False)
    assert finish_driver(process, token) == 0, log.read_text()[-3000:]
    # The shipped logging is in force: Spark's INFO lines (its default) would fill the output.
    assert [line for line in log.read_text().splitlines() if re.search(r" INFO (?!mqspark\.)", line)] == []
    return log.read_text()


def test_put_file_then_drain_to_delta(qm, tmp_path, spark):
    qm.define_queue("ORDERS")
    lines = tmp_path / "orders.txt"
    lines.write_text("order 1\norder 2\norder 3\n")
    put = ["--root", qm.root, "--queue", "ORDERS", "--file", str(lines), "--priority", "6"]
    out = _submit(tmp_path, "put_file.py", put)
    assert "put 3 messages on ORDERS" in out.splitlines()
    browsed = qm.browse("ORDERS")
    assert (browsed["payload"].to_pylist(), browsed["priority"].to_pylist()) == (
        [b"order 1", b"order 2", b"order 3"],
        [6] * 3,
    )

    output = tmp_path / "archive"
    args = ["--root", qm.root, "--queue", "ORDERS", "--consumer", "archive", "--output", str(output)]
    out = _submit(tmp_path, "drain_to_delta.py", [*args, "--checkpoint", str(tmp_path / "ckpt")])
    assert f"drained ORDERS for archive into {output}" in out.splitlines()
    drained = spark.read.format("delta").load(str(output)).orderBy("delivery_seq")
    assert [(r.delivery_seq, bytes(r.payload)) for r in drained.collect()] == [
        (0, b"order 1"),
        (1, b"order 2"),
        (2, b"order 3"),
    ]
    assert qm.depth("ORDERS", consumer="archive") == 0


def test_forwarder_example_answers_and_fails_requests(qm: QueueManager, tmp_path):
    qm.define_queue("QUOTES")
    qm.define_queue("ANSWERS")
    qm.define_queue("NO.PRICE")
    qm.put(
        "QUOTES",
        [
            {"payload": "apple", "correl_id": "q1", "reply_to_queue": "ANSWERS"},
            {"payload": "plum", "correl_id": "q2", "reply_to_queue": "ANSWERS", "failure_queue": "NO.PRICE"},
        ],
    )
    _submit(tmp_path, "forwarder.py", ["--root", qm.root, "--queue", "QUOTES"])
    answers = qm.browse("ANSWERS")
    assert (answers["correl_id"].to_pylist(), answers["payload"].to_pylist()) == (["q1"], [b"apple 0.40"])
    failed = qm.browse("NO.PRICE")
    assert failed["payload"].to_pylist() == [b"plum"]
    assert (
        failed["dlq_reason_text"][0].as_py().endswith("last error: ServiceError: no price for 'plum' (return code 404)")
    )
