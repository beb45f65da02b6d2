"""Ctrl-C ends every ``mqspark`` command with exit code 130 and one line, and a reader that closes
the output ends it quietly: real processes, interrupted where they wait (for a message, for stdin,
between monitor points, serving the console), which each test first sees them reach.

A test knows a process waits by what it printed, or else by where the kernel put its main thread
to sleep (``/proc/PID/wchan``): a sleep for ``get --wait``, a read of a pipe on stdin for ``put``.
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqspark import QueueManager

from .support.processes import free_port, listens

INTERRUPTED = "mqspark: interrupted"
# A process the test has seen waiting ends this soon after its signal, or the test fails.
PATIENCE = 60


def _default_sigint() -> None:
    # A shell starts background jobs with SIGINT ignored, and a child inherits that: Python then
    # leaves Ctrl-C ignored, and the test would wait for nothing.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(root: str, *args: str, stdin: int = subprocess.DEVNULL) -> subprocess.Popen[str]:
    """``python -m mqspark.cli --root ROOT ARGS...`` with its stdout and stderr text pipes."""
    return subprocess.Popen(
        [sys.executable, "-m", "mqspark.cli", "--root", root, *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def _wait_until(process: subprocess.Popen[str], waiting: str, condition) -> None:
    """Poll ``condition()`` until it holds; fails if the process ends first or within PATIENCE s it does not."""
    deadline = time.monotonic() + PATIENCE
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the process ended (rc {process.returncode}) before {waiting}: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the process was not seen {waiting} within {PATIENCE} s: {process.communicate()}")
        time.sleep(0.01)


def _asleep_in(process: subprocess.Popen[str], kernel_function: str, fd: int | None = None) -> bool:
    """True when the process's main thread sleeps in a kernel function whose name has ``kernel_function``,
    in a system call whose first argument is ``fd`` when given."""
    try:
        where = Path(f"/proc/{process.pid}/wchan").read_text()
        call = Path(f"/proc/{process.pid}/syscall").read_text().split()
    except OSError:  # the process ended; the caller says so
        return False
    return kernel_function in where and (fd is None or call[1:2] == [hex(fd)])


def _interrupted(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """SIGINT (Ctrl-C) to the process: its exit code, stdout and stderr."""
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=PATIENCE)
    return process.returncode, stdout, stderr


@pytest.fixture
def queue(qm: QueueManager) -> QueueManager:
    """Queue ``Q``, empty, with consumer group ``w`` declared (a new group would print a warning)."""
    qm.define_queue("Q")
    qm.declare_consumer("Q", "w")
    return qm


def test_ctrl_c_ends_a_get_waiting_for_a_message_with_130_and_one_line(queue):
    process = _start(queue.root, "get", "Q", "--consumer", "w", "--wait", "30")
    _wait_until(process, "waiting for a message", lambda: _asleep_in(process, "nanosleep"))
    assert _interrupted(process) == (130, "", f"{INTERRUPTED}\n")
    assert queue.depth("Q", consumer="w") == 0


def test_ctrl_c_ends_a_put_reading_stdin_with_130_one_line_and_nothing_put(queue):
    process = _start(queue.root, "put", "Q", stdin=subprocess.PIPE)
    assert process.stdin is not None
    process.stdin.write("order 1\n")
    process.stdin.flush()
    _wait_until(process, "reading stdin", lambda: _asleep_in(process, "pipe", fd=0))
    assert _interrupted(process) == (130, "", f"{INTERRUPTED}\n")
    assert queue.depth("Q") == 0


def test_ctrl_c_ends_the_monitor_between_points_with_130_and_one_line(queue):
    process = _start(
        queue.root,
        "monitor",
        "--queue",
        "Q",
        "--consumer",
        "w",
        "--watch-interval",
        "60",
        "--watch-count",
        "10",
        "--expected-count",
        "1",
    )
    assert process.stdout is not None
    first = process.stdout.readline()  # the first point; the next is a minute away
    assert first.split()[1:3] == ["Q", "w"], first
    assert _interrupted(process) == (130, "", f"{INTERRUPTED}\n")


@pytest.mark.slow  # the console's start takes seconds
def test_ctrl_c_ends_the_console_with_130_after_its_serving_line(queue):
    port = free_port()
    process = _start(queue.root, "console", "--port", str(port))
    _wait_until(process, "listening", lambda: listens(port))
    code, stdout, stderr = _interrupted(process)
    assert (code, stdout, stderr) == (
        130,
        "",
        f"mqspark console: serving {queue.root} on http://127.0.0.1:{port}\n{INTERRUPTED}\n",
    )


def test_a_reader_that_closes_the_monitors_output_ends_it_quietly(queue):
    """``mqspark monitor ... | head -1``: the next point finds no reader."""
    process = _start(
        queue.root,
        "monitor",
        "--queue",
        "Q",
        "--consumer",
        "w",
        "--watch-interval",
        "0.1",
        "--watch-count",
        "10",
        "--expected-count",
        "1",
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline().split()[1:3] == ["Q", "w"]
    process.stdout.close()
    assert (process.wait(timeout=PATIENCE), process.stderr.read()) == (1, "")


def test_put_on_a_terminal_says_it_reads_stdin_and_ctrl_d_ends_the_messages(queue):
    terminal, stdin = pty.openpty()
    try:
        process = _start(queue.root, "--json", "put", "Q", stdin=stdin)
        os.close(stdin)
        assert process.stderr is not None
        assert process.stderr.readline() == (
            "mqspark put: reading messages from standard input, one per line; end them with Ctrl-D\n"
        )
        # Typed lines, then Ctrl-D at the start of a line: the end of the input.
        os.write(terminal, b"order 1\norder 2\n\x04")
        stdout, stderr = process.communicate(timeout=PATIENCE)
    finally:
        os.close(terminal)
    assert (process.returncode, stderr) == (0, "")
    assert '"queue": "Q"' in stdout
    assert queue.browse("Q").column("payload").to_pylist() == [b"order 1", b"order 2"]
