"""Shared fixtures: one SparkSession for the whole run, a fresh queue manager per test."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from mqspark import QueueManager
from mqspark.clock import ManualClock
from mqspark.console.app import build_app
from mqspark.spark.datasource import _get_options
from mqspark.spark.stream import QueueStreamReader

from .support.azurite import ACCOUNT, Azurite
from .support.processes import SHORT_LIVED_JVM
from .support.s3 import MotoS3

# What the run's processes put in temporary folders goes under one folder per test process, removed
# when the run ends (pytest_unconfigure): a Spark driver the tests kill cannot remove its own (each
# holds a ~90 MB copy of Delta's jars), and leaving them filled the disk.
SCRATCH = Path(tempfile.mkdtemp(prefix="mqspark-tests-"))
os.environ["SPARK_LOCAL_DIRS"] = str(SCRATCH)
# An xdist worker inherits the controller's folder in the environment: this process's replaces it.
# Every driver JVM of the run (this process's session, notebooks, scripts, servers) is short-lived.
_submit_options = [
    o
    for o in os.environ.get("SPARK_SUBMIT_OPTS", "").split()
    if not o.startswith("-Djava.io.tmpdir=") and o not in SHORT_LIVED_JVM.split()
]
os.environ["SPARK_SUBMIT_OPTS"] = " ".join([*_submit_options, SHORT_LIVED_JVM, f"-Djava.io.tmpdir={SCRATCH}"])

# The emulators' ports are chosen before Spark starts, so Spark's JVM and Python workers inherit the
# AZURE_* and AWS_* variables that reach them: Spark jobs take object-store credentials from the
# environment.
AZURITE = Azurite(SCRATCH / "azurite")
os.environ.update(AZURITE.environment)
S3 = MotoS3(SCRATCH / "s3")
os.environ.update(S3.environment)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker more than the cores this process may run on: the tests wait on processes, files
    and timers as much as they compute. On 2 cores, two workers kept 1.74 of them busy; three took
    the whole run from 1,672 s to 1,386 s, and the tier without Spark from 92 s to 80 s."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(SCRATCH, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Mark ``spark`` every test that uses the session fixture ``spark``, directly or through other
    fixtures, before ``-m`` selects. Tests that start Spark some other way (spark-submit, a Spark
    Connect server, a standalone cluster, driver scripts, notebooks, the demo) carry the mark in their
    modules."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
    # The tests that start their own Spark drivers form two chains of about 15 minutes each under CI's
    # load (xdist_groups drivers-a and drivers-b, split by module). A chain runs on one worker, one test
    # after another, so at most two such tests compete for the 2 cores. xdist's loadgroup hands out the
    # groups with the most tests first, so two workers start on a chain each and the rest fill in.


@pytest.fixture
def console_client() -> Iterator[Callable[..., TestClient]]:
    """Makes clients of consoles (``console_client(roots, base_url=..., **build_app options)``), each
    app started and, at the test's end, stopped with its reader process."""
    with ExitStack() as started:

        def client(roots: list[str], base_url: str = "http://localhost", **options) -> TestClient:
            return started.enter_context(TestClient(build_app(roots, **options), base_url=base_url))

        yield client


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


@pytest.fixture
def clock() -> ManualClock:
    """A clock the test moves by hand (see mqspark.clock)."""
    return ManualClock()


@pytest.fixture
def clocked_qm(tmp_path, clock) -> QueueManager:
    """A queue manager whose leases, locks, instances, monitors, depth and expiry read ``clock``."""
    return QueueManager.create(tmp_path / "qm", "QM1", clock=clock)


@pytest.fixture
def readers():
    """Every planner a test made, stopped at its end (their lease threads would run on)."""
    made: list[QueueStreamReader] = []
    yield made
    for reader in made:
        reader.stop()


@pytest.fixture
def new_reader(qm, readers):
    """Makes streaming-get planners of queue Q (of ``root``, default the ``qm`` fixture's), called
    directly as Spark would: ``new_reader(maxMessagesPerTrigger="3")``."""

    def make(root: str | None = None, **options) -> QueueStreamReader:
        given = {"path": root or qm.root, "queue": "Q", **{key.lower(): value for key, value in options.items()}}
        reader = QueueStreamReader(_get_options(given))
        readers.append(reader)
        return reader

    return make


def _store_name(request) -> str:
    """A container or bucket name of the test's own: lower-case letters and digits, unique."""
    return re.sub(r"[^a-z0-9]", "", request.node.name.lower())[:40] + uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def azurite():
    """The Azure Storage emulator, started at the first test that needs it (see ``tests/support/azurite.py``)."""
    if AZURITE.process is None:
        AZURITE.start()
    yield AZURITE
    AZURITE.stop()
    shutil.rmtree(AZURITE.folder, ignore_errors=True)


@pytest.fixture
def az_root(azurite, request) -> str:
    """A fresh queue manager root on the emulator, a container of its own per test, in the form that
    delta-rs, mqspark and Spark's ABFS driver all read."""
    name = _store_name(request)
    azurite.filesystem().create_dir(name)
    return f"abfs://{name}@{ACCOUNT}.dfs.core.windows.net/qm"


@pytest.fixture(scope="session")
def s3():
    """moto's S3 server, started at the first test that needs it (see ``tests/support/s3.py``)."""
    if S3.process is None:
        S3.start()
    yield S3
    S3.stop()
    shutil.rmtree(S3.folder, ignore_errors=True)


@pytest.fixture
def s3_root(s3, request) -> str:
    """A fresh queue manager root on the S3 server, a bucket of its own per test."""
    name = _store_name(request)
    s3.filesystem().create_dir(name)
    return f"s3://{name}/qm"
