"""A Spark Connect server for the tests, started as the guides start one: pyspark's spark-submit with
Delta's jars and settings, on a free local port."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mqspark.spark.session import DELTA_CONF, delta_jars

from .processes import PATIENCE, free_port, kill_run, log_tail, start_process
from .standalone import SPARK_SUBMIT


@contextmanager
def connect_server(
    folder: Path, conf: dict[str, str] | None = None, python_path: tuple[Path, ...] = ()
) -> Iterator[str]:
    """A running server (its log in ``folder``, ``conf`` on top of the defaults, ``python_path`` on its
    Python's path) for the block's length; its ``sc://`` URL."""
    port = free_port()
    settings = {
        **DELTA_CONF,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        **(conf or {}),
    }
    command = [
        SPARK_SUBMIT,
        *("--class", "org.apache.spark.sql.connect.service.SparkConnectServer"),
        *("--master", "local[2]", "--jars", ",".join(delta_jars())),
        *(argument for key, value in settings.items() for argument in ("--conf", f"{key}={value}")),
        "spark-internal",
    ]
    token = uuid.uuid4().hex
    log = folder / "server.log"
    server = start_process(command, log, token, python_path=python_path)
    deadline = time.monotonic() + PATIENCE
    while "Spark Connect server started" not in log.read_text():
        assert server.poll() is None, f"Connect server ended: {log_tail(log)}"
        assert time.monotonic() < deadline, f"Connect server did not start: {log_tail(log)}"
        time.sleep(0.2)
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        kill_run(server, token)
