"""The faults a chaos run injects inside a process (chaos/faults.c): a skewed wall clock and slow file
writes, turned on and off through the process's control file while it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.faults import Control, build

pytestmark = pytest.mark.slow

# Reports, for each line it reads: its wall clock before and after it creates a file, the file's
# modification time (stamped by the kernel, not skewed), and how long five small writes to it took
# by the monotonic clock.
PROBE = """
import json, os, sys, time
for number, _ in enumerate(sys.stdin):
    path = f"probe-{number}"
    before = time.time()
    with open(path, "w") as file:
        after = time.time()
        made = os.fstat(file.fileno()).st_mtime
        started = time.monotonic()
        for _ in range(5):
            file.write("x")
            file.flush()
        writes = time.monotonic() - started
    print(json.dumps({"before": before, "after": after, "mtime": made, "writes": writes}), flush=True)
"""


def test_a_process_clock_is_skewed_and_its_file_writes_slowed_while_the_control_file_says_so(tmp_path: Path) -> None:
    control = Control(tmp_path / "P.control")
    probe = subprocess.Popen(
        [sys.executable, "-c", PROBE],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=control.environment(build(tmp_path)),
    )
    assert probe.stdin is not None and probe.stdout is not None

    def measure() -> dict[str, float]:
        assert probe.stdin is not None and probe.stdout is not None
        probe.stdin.write("\n")
        probe.stdin.flush()
        return json.loads(probe.stdout.readline())

    def skew(seen: dict[str, float]) -> tuple[float, float]:
        # The file was made between the two readings of the clock (the kernel's coarse clock may
        # stamp it a few milliseconds early).
        return seen["before"] - seen["mtime"], seen["after"] - seen["mtime"]

    try:
        plain = measure()
        low, high = skew(plain)
        assert low <= 0.05 and high >= -0.05, plain
        control.set(skew=-4.0, write_delay=0.1)
        skewed = measure()
        low, high = skew(skewed)
        assert low <= -4.0 + 0.05 and high >= -4.0 - 0.05, skewed
        assert skewed["writes"] >= 0.5, skewed  # five writes, each after 0.1 s
        control.set()
        low, high = skew(measure())
        assert low <= 0.05 and high >= -0.05
    finally:
        probe.stdin.close()
        assert probe.wait(30) == 0
