"""``mqspark console`` as a command: the token it generates and prints once, or takes from
``$MQSPARK_CONSOLE_TOKEN``, and the roots it serves."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mqspark import QueueManager
from mqspark.console.app import SERVING_NICE
from mqspark.console.reader import NICE
from mqspark.console.security import TOKEN_VARIABLE

from .support.processes import PATIENCE, free_port, nice_values, spawned_children, start_server, stop_server

# Each test starts the console as a process of its own.
pytestmark = pytest.mark.slow


def _request(url: str, method: str = "GET", token: str | None = None, body: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        # The first answer waits for the console's reader, which runs at the lowest priority: on a
        # machine busy with other work it has taken over 10 s.
        with urllib.request.urlopen(request, timeout=PATIENCE) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _console(arguments: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """``mqspark console`` with ``arguments``, its output in ``log``, once it listens."""
    port = free_port()
    command = [sys.executable, "-m", "mqspark.cli", "console", "--port", str(port), *arguments]
    return start_server(command, log, port, "the console"), f"http://127.0.0.1:{port}"


def test_the_generated_token_is_printed_once_and_lets_writes_through(
    qm: QueueManager, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    other = QueueManager.create(tmp_path / "qm2", "QM2")
    qm.define_queue("Q")
    log = tmp_path / "console.log"
    process, base = _console(["--root", qm.root, "--root", other.root, "--admin"], log)
    try:
        # Both lines are printed before the console listens.
        first, second = log.read_text().splitlines()[:2]
        assert first.startswith("mqspark console: admin token ")
        token = first.removeprefix("mqspark console: admin token ")
        assert second.startswith(f"mqspark console: serving {qm.root}, {other.root} on ")
        served = json.loads(_request(f"{base}/api/v1/qmgr")[1])
        assert [qmgr["name"] for qmgr in served["qmgr"]] == ["QM1", "QM2"]
        assert _request(f"{base}/api/v1/qmgr/QM1/queue/Q/message", "POST", "wrong", b"x")[0] == 401
        assert _request(f"{base}/api/v1/qmgr/QM1/queue/Q/message", "POST", token, b"x")[0] == 201
        assert qm.depth("Q") == 1
    finally:
        stop_server(process)


def test_the_token_from_the_environment_is_not_printed(qm: QueueManager, tmp_path: Path, monkeypatch) -> None:
    qm.define_queue("Q")
    monkeypatch.setenv(TOKEN_VARIABLE, "from-the-environment")
    log = tmp_path / "console.log"
    process, base = _console(["--root", qm.root, "--admin"], log)
    try:
        status, _ = _request(f"{base}/api/v1/qmgr/QM1/queue/Q/message", "POST", "from-the-environment", b"x")
        assert status == 201
    finally:
        stop_server(process)
    printed = log.read_text()
    assert "from-the-environment" not in printed and "admin token" not in printed


def test_the_console_serves_at_a_low_priority_and_reads_at_the_lowest(qm: QueueManager, tmp_path: Path) -> None:
    qm.define_queue("Q")
    process, base = _console(["--root", qm.root], tmp_path / "console.log")
    try:
        assert _request(f"{base}/")[0] == 200
        [reader] = spawned_children(process.pid)
        # Every thread: the event loop's, the request workers', the refresher's.
        serving = nice_values(process.pid)
        assert (len(list(Path(f"/proc/{process.pid}/task").iterdir())) > 2, serving) == (True, {SERVING_NICE})
        assert nice_values(reader) == {NICE}
    finally:
        stop_server(process)
