"""Shared fixtures: one SparkSession for the whole run, a fresh queue manager per test."""

from __future__ import annotations

import pytest

from mqspark import QueueManager


@pytest.fixture(scope="session")
def spark():
    import mqspark

    session = mqspark.session(
        app_name="mqspark-tests",
        master="local[2]",
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        },
    )
    yield session
    session.stop()


@pytest.fixture
def qm(tmp_path) -> QueueManager:
    return QueueManager.create(tmp_path / "qm", "QM1")
