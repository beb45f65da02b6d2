"""A plain Python script that uses the API (no Spark) exits with status 0 and a quiet stderr.

Reading a small Delta table (the catalog, for one) through deltalake's own pyarrow filesystem, a
Python object, left buffers of the read for Arrow's I/O threads to free after it returned. Freeing
one takes the GIL; when the interpreter was finalizing by then, the thread ended inside a C++
destructor and the process aborted: ``terminate called without an active exception``, exit 134.
The race is lost most often by a script whose last step reads the catalog (here: opening the queue
manager), so the script runs many times.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# Before the fix, from one run in seven (a quiet machine) to one in forty (a busy one) aborted.
RUNS = 40
# Two at a time, to take half as long.
AT_ONCE = 2
# Far above a run's second or two, for a loaded machine.
RUN_TIMEOUT = 120

SCRIPT = """
import sys

from mqspark import QueueManager

root = sys.argv[1]
qm = QueueManager.create(root, "QM1")
qm.define_queue("ORDERS")
qm.put("ORDERS", [{"payload": f"order {n}", "correl_id": f"C{n}"} for n in range(5)])
assert qm.get("ORDERS", max_messages=1).num_rows == 1
assert qm.browse("ORDERS").num_rows == 5  # a browse does not consume
QueueManager.open(root)  # the script's last step reads the catalog
"""


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


@pytest.mark.slow
def test_a_script_using_the_api_exits_cleanly(tmp_path: Path) -> None:
    with ThreadPoolExecutor(AT_ONCE) as pool:
        runs = list(pool.map(_run, (tmp_path / f"qm{n}" for n in range(RUNS))))
    failed = [run for run in runs if run.returncode != 0 or "terminate called" in run.stderr]
    assert not failed, (
        f"{len(failed)} of {RUNS} runs failed; exit codes {[run.returncode for run in failed]}; "
        f"first stderr: {failed[0].stderr[-2000:]}"
    )
    assert all(not run.stderr.strip() for run in runs), [run.stderr for run in runs if run.stderr.strip()]
