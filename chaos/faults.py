"""Faults inside a process of a chaos run: its wall clock skewed by some seconds, and its file writes
slowed (a slow disk). ``faults.c``, built here and loaded into every actor with ``LD_PRELOAD``, does
both; the run turns them on and off at any moment through each actor's control file (:class:`Control`).

Only the wall clock is skewed: leases, locks and retention compare times that different processes
wrote, which on a cluster come from different machines' clocks. The monotonic clocks that timeouts
and sleeps use stay true, as they do on a machine whose clock is set a few seconds wrong.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("faults.c")
# Two int64 values: the skew in nanoseconds, the delay before each file write in microseconds.
_LAYOUT = struct.Struct("<qq")


def build(folder: Path) -> Path:
    """Compile ``faults.c`` into ``folder``; the shared library's path."""
    compiler = shutil.which("cc")
    if compiler is None:
        raise RuntimeError("chaos: needs a C compiler (cc) to build chaos/faults.c (./dev.sh setup installs gcc)")
    library = folder / "libchaosfaults.so"
    command = [compiler, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(library), str(SOURCE), "-ldl"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"chaos: building {SOURCE.name} failed: {result.stderr.strip()}")
    return library


class Control:
    """One process's faults, set through the file its ``faults.c`` maps: none at first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.set()

    def set(self, skew: float = 0.0, write_delay: float = 0.0) -> None:
        """Skew the wall clock by ``skew`` seconds and sleep ``write_delay`` seconds before each file write."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, _LAYOUT.pack(round(skew * 1e9), round(write_delay * 1e6)), 0)
        finally:
            os.close(fd)

    def environment(self, library: Path) -> dict[str, str]:
        """The variables that load ``library`` into a process and point it at this control file."""
        return {"LD_PRELOAD": str(library), "MQSPARK_CHAOS_CONTROL": str(self.path)}
