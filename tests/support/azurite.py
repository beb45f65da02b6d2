"""Azurite, the Azure Storage emulator, as the object store of the object-store tests: installed by
``./dev.sh setup`` into ``tools/azurite`` (with the Node.js it needs), started on 127.0.0.1 on a
free port with its data in a temporary folder, and stopped or restarted by the tests that need an
outage."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pyarrow.fs as pafs

from .processes import answers_http, held_port, start_server, stop_server

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "azurite" / "node_modules"
ACCOUNT = "devstoreaccount1"
# The emulator's published well-known key: not a secret.
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class Azurite:
    """One emulator process (its blob service) and the settings that reach it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        # Held while the emulator is not running (a bound socket refuses connections as a stopped
        # emulator does), so that no other process of the run takes the port meanwhile.
        self.holder: socket.socket | None = held_port()
        self.port = self.holder.getsockname()[1]
        self.process: subprocess.Popen | None = None
        self.log = folder / "azurite.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs's storage options for the emulator (mqspark takes the same)."""
        return {"account_name": ACCOUNT, "account_key": KEY, "endpoint": self.endpoint, "allow_http": "true"}

    @property
    def environment(self) -> dict[str, str]:
        """The same settings as the environment variables delta-rs and mqspark read."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": KEY,
            "AZURE_STORAGE_ENDPOINT": self.endpoint,
            "AZURE_ALLOW_HTTP": "true",
        }

    def start(self) -> None:
        node = TOOLS / ".bin" / "node"
        assert node.exists(), "Azurite is not installed: run ./dev.sh setup"
        self.folder.mkdir(parents=True, exist_ok=True)
        command = [
            str(node),
            str(TOOLS / "azurite" / "dist" / "src" / "blob" / "main.js"),
            *("--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", str(self.folder / "data")),
            *("--disableTelemetry", "--skipApiVersionCheck", "--silent"),
        ]
        if self.holder is not None:
            self.holder.close()
            self.holder = None
        self.process = start_server(command, self.log, self.port, "Azurite", ready=answers_http)

    def stop(self) -> None:
        """Stop the emulator: SIGTERM, so it saves its metadata (kept in memory, saved now and then)
        and a restart finds the data; SIGKILL if it has not ended within 30 s."""
        stop_server(self.process)
        self.process = None
        self.holder = held_port(self.port)

    def filesystem(self) -> pafs.AzureFileSystem:
        authority = f"127.0.0.1:{self.port}"
        return pafs.AzureFileSystem(
            ACCOUNT,
            account_key=KEY,
            blob_storage_authority=authority,
            blob_storage_scheme="http",
            dfs_storage_authority=authority,
            dfs_storage_scheme="http",
        )
