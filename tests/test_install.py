"""A copy of mqspark installed from its wheel, away from the source tree, has what the source tree
gives: the shipped Spark defaults and logging; and a pip install of the wheel into a fresh
virtualenv runs the tour of docs/install.md in a plain Spark session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from mqspark import QueueManager

from .support.docs import block_under

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


INSTALL_GUIDE = "docs/install.md"
TOUR = "The five-minute tour"
# What the tour prints: the messages it put, in the order the streaming get delivered them.
TOUR_PAYLOADS = ["rush", "order 1", "order 2"]
# Variables that would hand the tour the dev environment's Python, Spark or settings, and the object
# store emulators' credentials the test session exports; and a machine's PYTHONDONTWRITEBYTECODE,
# under which each of the tour's Python processes (driver, PySpark workers) compiled pyspark again.
NOT_A_USERS = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "SPARK_HOME",
)
NOT_A_USERS_PREFIXES = ("MQSPARK_", "SPARK_REMOTE", "AZURE_", "AWS_")
PIP = ["-m", "pip", "--disable-pip-version-check"]
# Where ./dev.sh keeps the wheel it builds of pyspark, which PyPI has only as a source distribution.
WHEELS = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mqspark" / "wheels"


def _wheel(tmp_path: Path) -> Path:
    """The project's wheel, built from a copy of its package files."""
    source = tmp_path / "source"
    shutil.copytree(PROJECT / "mqspark", source / "mqspark", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(PROJECT / name, source / name)
    subprocess.run(
        [sys.executable, *PIP, "--quiet", "wheel", "--no-deps", "-w", str(tmp_path / "wheel"), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "wheel").glob("mqspark-*.whl")
    return wheel


def _install(tmp_path: Path) -> Path:
    """Build the project's wheel and install it, without its dependencies, into a folder."""
    wheel = _wheel(tmp_path)
    pip = [sys.executable, *PIP, "--quiet"]
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


def _users_environment() -> dict[str, str]:
    """This process's environment as a user's shell would have it: no dev virtualenv on ``PATH``, and
    none of the variables that point at the dev environment."""
    dev = Path(sys.prefix).resolve()
    path = [
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and not Path(entry).resolve().is_relative_to(dev)
    ]
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in NOT_A_USERS and not key.startswith(NOT_A_USERS_PREFIXES)
    }
    environment["PATH"] = os.pathsep.join(path)
    return environment


def test_a_pip_install_into_a_fresh_virtualenv_runs_the_tour_of_the_install_guide(tmp_path):
    """The issue's user: a virtualenv made with ``python -m venv``, mqspark installed with pip (its
    dependencies at the project's pins), and the install guide's ``tour.py`` run with the
    virtualenv's Python, not activated, in a plain session built with delta-spark's
    ``configure_spark_with_delta_pip``."""
    wheel = _wheel(tmp_path)
    environment = _users_environment()
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, env=environment)
    install = subprocess.run(
        # --no-compile: byte-compiling pyspark takes a core for a minute, which starves the Spark tests
        # running beside this one; the tour compiles only what it imports. --find-links: pyspark from
        # the wheel ./dev.sh built of the pinned source distribution, as pip's own wheel cache gives it
        # on a user's second install; building it again downloaded 400 MB and took about a minute of CPU.
        [
            str(python),
            *PIP,
            "install",
            "--no-compile",
            "--find-links",
            str(WHEELS),
            "-c",
            str(PROJECT / "requirements.lock"),
            str(wheel),
        ],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    install_seconds = time.monotonic() - started
    print(f"venv and pip install: {install_seconds:.0f} s")
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    version = subprocess.run(
        [str(python), "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True, check=True
    )
    assert version.stdout.split() == [str(part) for part in sys.version_info[:2]]
    check = subprocess.run([str(python), *PIP, "check"], env=environment, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout

    tour = block_under(INSTALL_GUIDE, TOUR)
    (tmp_path / "tour.py").write_text(tour.code)
    folder = tmp_path / "tour-data"
    started = time.monotonic()
    run = subprocess.run(
        [str(python), "tour.py", str(folder)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(f"tour: {time.monotonic() - started:.0f} s")
    assert run.returncode == 0, run.stderr[-5000:]
    assert run.stdout.splitlines() == TOUR_PAYLOADS
    assert block_under(INSTALL_GUIDE, TOUR, "text").code.splitlines() == TOUR_PAYLOADS

    billed = DeltaTable(str(folder / "billed")).to_pyarrow_table().sort_by("delivery_seq")
    assert [bytes(payload).decode() for payload in billed["payload"].to_pylist()] == TOUR_PAYLOADS
    qm = QueueManager.open(folder / "qm1")
    assert qm.depth("ORDERS", consumer="billing") == 0
    assert qm.depth("ORDERS") == 0
