"""A quiet, readable first run: jar resolution prints one line (Ivy's output goes to a log file that
an error names), and the demo shows mqspark's lines and its results, with Spark's own output in a log."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mqspark.spark.session import _resolve


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


@pytest.mark.slow
@pytest.mark.spark
def test_the_demo_shows_mqspark_lines_and_results_and_logs_the_rest(tmp_path):
    root = tmp_path / "mq-data"
    run = subprocess.run(
        [sys.executable, "-m", "mqspark.demo", "--root", str(root)], capture_output=True, text=True, timeout=600
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
