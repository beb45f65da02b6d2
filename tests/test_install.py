"""A copy of mqspark installed from its wheel, away from the source tree, has what the source tree
gives: the shipped Spark defaults and logging."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Builds a wheel and starts a Spark driver of its own.
pytestmark = [pytest.mark.slow, pytest.mark.spark]

PROJECT = Path(__file__).resolve().parents[1]
SESSION = """
import mqspark
spark = mqspark.session(master="local[1]")
print(mqspark.__file__)
for key in ("spark.sql.session.timeZone", "spark.databricks.delta.snapshotPartitions", "spark.driver.extraJavaOptions"):
    print(spark.conf.get(key))
spark.stop()
"""


def _install(tmp_path: Path) -> Path:
    """Build the project's wheel from a copy of its package files and install it into a folder."""
    source = tmp_path / "source"
    shutil.copytree(PROJECT / "mqspark", source / "mqspark", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(PROJECT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(tmp_path / "wheel"), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "wheel").glob("mqspark-*.whl")
    target = tmp_path / "site-packages"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, capture_output=True)
    return target


def test_a_session_of_an_installed_copy_starts_with_the_shipped_defaults_and_logging(tmp_path):
    target = _install(tmp_path)
    environment = {key: value for key, value in os.environ.items() if key != "MQSPARK_CONF_DIR"}
    environment["PYTHONPATH"] = str(target)
    run = subprocess.run(
        [sys.executable, "-c", SESSION], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    module, time_zone, partitions, java_options = run.stdout.splitlines()[-4:]
    conf = target / "mqspark" / "spark" / "conf"
    assert Path(module).is_relative_to(target)
    assert (time_zone, partitions) == ("UTC", "2")
    assert java_options == f"-Dlog4j.configurationFile=file:{conf / 'log4j2.properties'}"
