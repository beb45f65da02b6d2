"""``mqspark console`` as a command: the token it generates and prints once, or takes from
``$MQSPARK_CONSOLE_TOKEN``, and the roots it serves."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from mqspark import QueueManager


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _request(url: str, method: str = "GET", token: str | None = None, body: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _wait_answering(base: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if _request(f"{base}/api/v1/qmgr")[0] == 200:
                return
        except OSError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, "the console did not answer"
        time.sleep(0.1)


def _console(arguments: list[str], environment: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mqspark.cli", "console", "--port", str(port), *arguments],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **environment},
    )
    return process, f"http://127.0.0.1:{port}"


def test_the_generated_token_is_printed_once_and_lets_writes_through(qm: QueueManager, tmp_path: Path) -> None:
    other = QueueManager.create(tmp_path / "qm2", "QM2")
    qm.define_queue("Q")
    process, base = _console(["--root", qm.root, "--root", other.root, "--admin"], {})
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        assert first.startswith("mqspark console: admin token ")
        token = first.removeprefix("mqspark console: admin token ").strip()
        assert process.stderr.readline().startswith(f"mqspark console: serving {qm.root}, {other.root} on ")
        _wait_answering(base, process)
        served = json.loads(_request(f"{base}/api/v1/qmgr")[1])
        assert [qmgr["name"] for qmgr in served["qmgr"]] == ["QM1", "QM2"]
        assert _request(f"{base}/api/v1/qmgr/QM1/queue/Q/message", "POST", "wrong", b"x")[0] == 401
        assert _request(f"{base}/api/v1/qmgr/QM1/queue/Q/message", "POST", token, b"x")[0] == 201
        assert qm.depth("Q") == 1
    finally:
        process.kill()
        process.communicate()


def test_the_token_from_the_environment_is_not_printed(qm: QueueManager) -> None:
    qm.define_queue("Q")
    process, base = _console(["--root", qm.root, "--admin"], {"MQSPARK_CONSOLE_TOKEN": "from-the-environment"})
    try:
        _wait_answering(base, process)
        status, _ = _request(f"{base}/api/v1/qmgr/QM1/queue/Q/message", "POST", "from-the-environment", b"x")
        assert status == 201
    finally:
        process.kill()
        _, printed = process.communicate()
    assert "from-the-environment" not in printed and "admin token" not in printed
