"""Adds bytecode to the zip archives Spark's Python workers import pyspark and py4j from.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on the path of every Python
process it starts (a daemon per kind of worker; five before a streaming query's first batch). The
archives hold only sources, and Python never writes bytecode into an archive, so each of those
processes compiled pyspark again: about 1.4 s of CPU each. With a hash-checked ``.pyc`` beside each
module in the archive, zipimport loads the bytecode (and falls back to the source if it ever differs).

Usage: python tools/zip_bytecode.py, with the Python of the virtualenv whose pyspark it is for (an
archive that already has bytecode is left alone).
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import py_compile
import sys
import tempfile
import zipfile
from pathlib import Path


def add_bytecode(archive: Path) -> None:
    """Rewrite ``archive`` with a ``.pyc`` beside each ``.py``, compiled by this Python, unless it
    has bytecode already."""
    with zipfile.ZipFile(archive) as source:
        if any(name.endswith(".pyc") for name in source.namelist()):
            return
        with tempfile.TemporaryDirectory() as folder:
            source.extractall(folder)
            # legacy: foo.pyc beside foo.py, where zipimport looks (it never reads __pycache__). ddir:
            # the code's file names are those zipimport gives the sources (archive/pyspark/...), which
            # pyspark's tracebacks of a worker's error look for to leave its own frames out.
            compileall.compile_dir(
                folder,
                ddir=str(archive),
                quiet=2,
                legacy=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
            partial = archive.with_name(archive.name + ".partial")
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as target:
                for info in source.infolist():
                    target.writestr(info, source.read(info))
                    compiled = Path(folder, info.filename + "c")
                    if info.filename.endswith(".py") and compiled.is_file():
                        target.write(compiled, info.filename + "c")
    os.replace(partial, archive)


def spark_archives() -> list[Path]:
    """The archives under this Python's pyspark that Spark puts on its workers' path."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        sys.exit("zip_bytecode: pyspark is not installed for this Python")
    return sorted(Path(spec.origin).parent.joinpath("python", "lib").glob("*.zip"))


if __name__ == "__main__":
    for archive in spark_archives():
        add_bytecode(archive)
