"""A quiet, readable first run: jar resolution prints one line (Ivy's output goes to a log file that
an error names), and the demo shows mqspark's lines and its results, with Spark's own output in a log."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from mqspark.spark.session import _resolve

PROJECT = Path(__file__).resolve().parents[1]


@pytest.mark.spark  # the resolution builds a SparkSession in a process of its own
def test_a_failed_jar_resolution_names_its_log_and_keeps_ivy_off_the_screen(tmp_path, capfd):
    folder = tmp_path / "jars"
    with pytest.raises(RuntimeError) as failed:
        _resolve("io.delta:no-such-artifact-of-mqspark_2.13:0.0.1", folder)
    log = folder / "resolve.log"
    assert str(failed.value) == (
        f"resolving io.delta:no-such-artifact-of-mqspark_2.13:0.0.1 failed (exit code 1); see {log}"
    )
    assert "UNRESOLVED DEPENDENCIES" in log.read_text()
    out, err = capfd.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"mqspark: resolving io.delta:no-such-artifact-of-mqspark_2.13:0.0.1 from Maven Central "
        f"(once; Ivy's output: {log})"
    ]


def _path_without(programs: set[str], farm: Path) -> str:
    """``$PATH`` with each folder that holds one of ``programs`` replaced by a folder of links to
    everything else in it."""
    folders = []
    for number, folder in enumerate(os.environ["PATH"].split(os.pathsep)):
        if not any((Path(folder) / name).exists() for name in programs):
            folders.append(folder)
            continue
        copy = farm / str(number)
        copy.mkdir(parents=True)
        for entry in os.scandir(folder):
            if entry.name not in programs:
                (copy / entry.name).symlink_to(entry.path)
        folders.append(str(copy))
    return os.pathsep.join(folders)


@pytest.mark.slow
@pytest.mark.spark  # the demo runs a Spark session in a process of its own
def test_the_demo_shows_mqspark_lines_and_results_and_logs_the_rest(tmp_path):
    """``./dev.sh demo`` as the README gives it, on a machine without npm (only the tests need it)."""
    root = tmp_path / "mq-data"
    environment = {
        **os.environ,
        "PATH": _path_without({"npm", "node"}, tmp_path / "bin"),
        "MQSPARK_VENV": str(Path(sys.executable).parents[1]),
    }
    run = subprocess.run(
        [str(PROJECT / "dev.sh"), "demo", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines(), "the producer's commits are shown"
    for line in run.stderr.splitlines():
        assert re.fullmatch(r"\d\d:\d\d:\d\d INFO mqspark\.spark\.sink: queue ORDERS: batch \d .*", line), line
    log = root / "demo" / "spark.log"
    assert run.stdout.splitlines()[-1] == f"Spark's own log of this run: {log.resolve()}"
    assert "WARN" in log.read_text()
    # Which orders the consumer got first depends on timing; each is in the table once.
    rows = [line.split("|") for line in run.stdout.splitlines() if re.match(r"\|\d", line)]
    assert [int(row[1]) for row in rows] == list(range(9))
    assert sorted(row[5].strip() for row in rows) == sorted(
        ["order 1", "order 2", "order 3", "order 4", "rush order", "bulk order"]
        + [f"basket item {n}" for n in (1, 2, 3)]
    )


REGISTER = """
from pyspark.sql import SparkSession
import mqspark
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
try:
    mqspark.register(spark)
except mqspark.MQError as error:
    print(error)
spark.stop()
"""


@pytest.mark.spark  # starts a plain Spark session in a process of its own
def test_register_refuses_a_session_whose_python_cannot_import_mqspark(tmp_path):
    """A plain session's Python processes run ``PYSPARK_PYTHON`` (else ``python3``): one without
    mqspark would fail the first read with ``No module named 'mqspark'``."""
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    python = bare / "bin" / "python"
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment["PYSPARK_PYTHON"] = str(python)
    run = subprocess.run(
        [sys.executable, "-c", REGISTER], env=environment, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[-1] == (
        f"Spark runs the mq data source with Python {str(python)!r} ({python}), which cannot import mqspark: "
        f"start the session with PYSPARK_PYTHON={sys.executable} in the environment, or use mqspark.session()"
    )


STREAM = """
import sys, mqspark
from mqspark import QueueManager
root = sys.argv[1]
qm = QueueManager.create(root, "QM1")
qm.define_queue("Q")
qm.put("Q", [{"payload": "one"}, {"payload": "two"}])
spark = mqspark.session(master="local[1]", **{"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})
query = (spark.readStream.format("mq").option("queue", "Q").load(root)
         .writeStream.format("noop").option("checkpointLocation", root + "-checkpoint").start())
query.processAllAvailable()
query.stop()
spark.stop()
print("done")
"""
# The JVM prints this itself when Spark adds the module; no logging setting reaches it.
INCUBATOR = "WARNING: Using incubator modules: jdk.incubator.vector"


@pytest.mark.spark  # a session and a streaming query in a process of their own
def test_a_streaming_query_started_and_stopped_prints_nothing_a_user_cannot_act_on(tmp_path):
    """Spark's warnings that every streaming query's start ("spark.sql.adaptive.enabled is not
    supported") and stop ("Failed to cancel job group") printed are filtered out by message."""
    run = subprocess.run(
        [sys.executable, "-c", STREAM, str(tmp_path / "qm")], capture_output=True, text=True, timeout=300
    )
    assert (run.returncode, run.stdout.splitlines()) == (0, ["done"]), run.stderr[-3000:]
    assert [line for line in run.stderr.splitlines() if line != INCUBATOR] == []
