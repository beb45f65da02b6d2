"""moto's S3 server as the S3 store of the object-store tests: a PyPI package in the dev extras,
started on 127.0.0.1 on a port this process holds from its start (its data in memory), one request at
a time (see ``moto_serial.py``), answering conditional puts (``If-None-Match: *``) as S3 does, with
412 for a key that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs

from .processes import answers_http, held_port, start_server, stop_server

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
# moto accepts any credentials: these are not secrets.
KEY_ID, SECRET, REGION = "testing", "testing", "us-east-1"


class MotoS3:
    """One moto server process and the settings that reach it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        # Held (listening) for the whole run and handed to each server started: the port is chosen
        # at the run's start, for the environment Spark inherits, long before the server starts.
        self.listener = held_port(listening=True)
        self.port = self.listener.getsockname()[1]
        self.process: subprocess.Popen | None = None
        self.log = folder / "moto.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs's storage options for the server (mqspark takes the same)."""
        return {
            "aws_access_key_id": KEY_ID,
            "aws_secret_access_key": SECRET,
            "aws_region": REGION,
            "aws_endpoint_url": self.endpoint,
            "aws_allow_http": "true",
        }

    @property
    def environment(self) -> dict[str, str]:
        """The same settings as the environment variables delta-rs and mqspark read."""
        return {name.upper(): value for name, value in self.storage_options.items()}

    def start(self) -> None:
        assert MOTO_SERVER.exists(), "moto is not installed: run ./dev.sh setup"
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = self.listener.fileno()
        command = [
            sys.executable,
            str(Path(__file__).with_name("moto_serial.py")),
            "127.0.0.1",
            str(self.port),
            str(fd),
        ]
        self.process = start_server(command, self.log, self.port, "moto", ready=answers_http, pass_fds=(fd,))

    def stop(self) -> None:
        stop_server(self.process)
        self.process = None

    def filesystem(self) -> pafs.S3FileSystem:
        # The AWS SDK's one-second connect timeout and three attempts failed twice in CI on a loaded
        # machine (``Connection timed out after 3100 milliseconds`` making a test's bucket).
        return pafs.S3FileSystem(
            connect_timeout=30,
            request_timeout=60,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=10),
            access_key=KEY_ID,
            secret_key=SECRET,
            region=REGION,
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            allow_bucket_creation=True,
        )

    def refused_log_entries(self, bucket: str) -> int:
        """How many puts of a ``_delta_log`` entry in ``bucket`` the server refused (412)."""
        plain = re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text())
        return len(re.findall(rf'"PUT /{re.escape(bucket)}/\S*/_delta_log/\S+ HTTP/1\.1" 412 ', plain))
