"""Spark Declarative Pipelines: the two pipelines of docs/pipelines.md, written out from the page's
blocks (spec and definition file, under the headings that name their files) and run as the page
runs them, with ``spark-pipelines --remote`` against a Spark Connect server started as the page
says (Delta's jars and settings, mqspark and ``STATIC_SOURCES`` on its Python path). One puts the
JSON lines of a folder to a queue through a sink of format ``mq``; the other gets the queue into a
Delta streaming table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable

from mqspark import QueueManager
from mqspark.spark.session import STATIC_SOURCES

from .support.connect import connect_server as connect_server_at
from .support.docs import PROJECT, code_blocks
from .support.processes import PATIENCE, kill_marked, log_tail
from .support.standalone import SPARK_SUBMIT

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DOCUMENT = "docs/pipelines.md"
SPARK_PIPELINES = str(Path(SPARK_SUBMIT).with_name("spark-pipelines"))


def _environment(token: str) -> dict[str, str]:
    """This interpreter for Spark's Python, the checkout and the static ``mq`` registration on its path."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PROJECT), str(STATIC_SOURCES)]),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "MQSPARK_TEST_RUN": token,
    }


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """The server's URL and its warehouse folder (where the pipelines' tables are)."""
    folder = tmp_path_factory.mktemp("pipelines-server")
    conf = {"spark.sql.warehouse.dir": str(folder / "warehouse"), "spark.databricks.delta.snapshotPartitions": "2"}
    with connect_server_at(folder, conf, python_path=(STATIC_SOURCES,)) as url:
        yield url, folder / "warehouse"


def _write_pipeline(name: str, folder: Path) -> Path:
    """Write pipeline ``name``'s files from the page, placeholder paths under ``folder``; its spec."""
    blocks = [block for block in code_blocks(DOCUMENT) if block.heading.startswith(f"{name}/")]
    assert [block.heading for block in blocks] == [f"{name}/spark-pipeline.yml", f"{name}/transformations/{name}.py"]
    for block in blocks:
        path = folder / block.heading
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.code.replace("/data/", f"{folder}/data/"))
    return folder / name / "spark-pipeline.yml"


def _run_pipeline(url: str, spec: Path) -> str:
    """``spark-pipelines --remote URL run --spec SPEC`` as the page runs it; its output, once it succeeded."""
    token = uuid.uuid4().hex
    log = spec.parent / "run.log"
    try:
        with log.open("w") as output:
            done = subprocess.run(
                [SPARK_PIPELINES, "--remote", url, "run", "--spec", str(spec)],
                cwd=spec.parent.parent,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=_environment(token),
                timeout=PATIENCE,
            )
    finally:
        kill_marked(token)
    assert done.returncode == 0, log_tail(log)
    return log.read_text()


def test_a_pipeline_puts_to_a_queue_and_another_gets_it_into_a_delta_table(connect_server, tmp_path):
    url, warehouse = connect_server
    qm = QueueManager.create(tmp_path / "data" / "qm1", "QM1")
    qm.define_queue("ORDERS", delivery_sequence="fifo")
    incoming = tmp_path / "data" / "incoming"
    incoming.mkdir()
    payloads = [f"order {n}" for n in range(1, 6)]
    (incoming / "orders-1.json").write_text("".join(json.dumps({"payload": payload}) + "\n" for payload in payloads))

    output = _run_pipeline(url, _write_pipeline("intake", tmp_path))
    assert "Flow intake has COMPLETED." in output and "Run is COMPLETED." in output
    put = qm.browse("ORDERS")
    assert put["payload"].to_pylist() == [payload.encode() for payload in payloads]
    assert qm.depth("ORDERS") == 5

    output = _run_pipeline(url, _write_pipeline("orders", tmp_path))
    assert "Flow spark_catalog.default.orders has COMPLETED." in output and "Run is COMPLETED." in output
    table = DeltaTable(str(warehouse / "orders")).to_pyarrow_table().sort_by("delivery_seq")
    assert table.column_names == ["delivery_seq", "msg_id", "payload"]
    assert table["payload"].to_pylist() == payloads
    assert table["msg_id"].to_pylist() == put["msg_id"].to_pylist()
    assert qm.depth("ORDERS", consumer="pipeline") == 0
    assert qm.depth("ORDERS") == 0
