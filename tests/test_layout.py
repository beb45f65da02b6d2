"""The checkout's top level is the one the design card names, its ``setup.py`` gives the package's
version, and its ``conf/`` holds the Spark settings the package ships."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
# The design card's top level: name -> whether it is a folder.
TOP_LEVEL = {
    "setup.py": False,
    "mqspark": True,
    "tests": True,
    "notebooks": True,
    "conf": True,
    "README.md": False,
}
PACKAGED_CONF = PROJECT / "mqspark" / "spark" / "conf"


def test_the_top_level_has_what_the_design_card_names():
    assert {name: (PROJECT / name).is_dir() for name in TOP_LEVEL if (PROJECT / name).exists()} == TOP_LEVEL


@pytest.mark.slow
def test_setup_py_prints_the_installed_version():
    run = subprocess.run(
        [sys.executable, "setup.py", "--version"], cwd=PROJECT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == importlib.metadata.version("mqspark") + "\n", run.stderr


def test_conf_holds_the_spark_settings_the_package_ships():
    # conf/ is the copy a reader of the checkout edits; the package ships its own, so the two must agree.
    def files(folder: Path) -> dict[str, bytes]:
        return {path.name: path.read_bytes() for path in folder.iterdir()}

    assert not (PROJECT / "conf").is_symlink()
    assert files(PROJECT / "conf") == files(PACKAGED_CONF)
    assert {"spark-defaults.conf", "log4j2.properties"} <= files(PACKAGED_CONF).keys()
