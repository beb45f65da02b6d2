"""A Spark standalone cluster on 127.0.0.1 for the standalone-cluster tests: one master and two
workers of one core each, started with the ``spark-class`` that pyspark ships, their executors
separate JVMs with Python workers of their own. Jobs reach it through ``spark-submit --master``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyspark

from .processes import SHORT_LIVED_JVM, driver_jvm_options, free_port

SPARK_CLASS = str(Path(sys.executable).parent / "spark-class")
SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
REPOSITORY = Path(__file__).resolve().parents[2]
# spark-class looks for Spark with the interpreter it finds first on the PATH, unless told.
SPARK_ENV = {"SPARK_HOME": str(Path(pyspark.__file__).parent), "PYSPARK_PYTHON": sys.executable}


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a worker's executors, their Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


class Standalone:
    """The master and its workers, each in a process session of its own."""

    def __init__(self, folder: Path, workers: int = 2) -> None:
        self.folder = folder
        self.port = free_port()
        self.workers_wanted = workers
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        # The worker's environment is its executors' too: all of them short-lived JVMs.
        env = {
            **os.environ,
            **SPARK_ENV,
            "SPARK_LOG_DIR": str(self.folder),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "JDK_JAVA_OPTIONS": SHORT_LIVED_JVM,
        }
        with (self.folder / f"{name}.log").open("a") as out:
            return subprocess.Popen(
                [SPARK_CLASS, *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.master = self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(free_port()),
        )
        for number in range(self.workers_wanted):
            self.start_worker(number)
        self.wait_for_workers(self.workers_wanted)

    def start_worker(self, number: int) -> None:
        work = self.folder / f"work-{number}-{len(self.workers)}"
        self.workers.append(
            self._start(
                f"worker-{number}",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--work-dir", str(work)),
                *("--webui-port", str(free_port()), self.url),
            )
        )

    def wait_for_workers(self, count: int, timeout: float = 120) -> None:
        """Until the master has registered ``count`` workers in all."""
        log = self.folder / "master.log"
        deadline = time.monotonic() + timeout
        while len(re.findall(r"Registering worker", log.read_text() if log.exists() else "")) < count:
            assert self.master is not None and self.master.poll() is None, f"master ended: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"{count} workers not registered: {log.read_text()[-2000:]}"
            time.sleep(0.2)

    def kill_worker(self, number: int) -> list[int]:
        """SIGKILL worker ``number``'s JVM, its executors and their Python workers; returns the pids."""
        worker = self.workers[number]
        pids = [worker.pid, *_descendants(worker.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        worker.wait(30)
        return pids

    def executors(self, number: int) -> list[int]:
        """The executor JVMs worker ``number`` runs now."""
        return [
            pid
            for pid in _descendants(self.workers[number].pid)
            if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]

    def stop(self) -> None:
        for process in [*self.workers, self.master]:
            if process is not None and process.poll() is None:
                for pid in [*_descendants(process.pid), process.pid]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                process.wait(30)

    def submit(
        self,
        script: Path,
        args: list[str],
        log: Path,
        jars: str,
        env: dict[str, str] | None = None,
        master: str | None = None,
    ) -> subprocess.Popen:
        """``spark-submit`` ``script`` to the cluster (client mode; or to ``master``), with mqspark's
        jars and the repository on the executors' Python path."""
        command = [
            SPARK_SUBMIT,
            *("--master", master or self.url, "--jars", jars),
            *("--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m"),
            *("--conf", f"spark.executorEnv.PYTHONPATH={REPOSITORY}"),
            *("--conf", f"spark.pyspark.python={sys.executable}"),
            str(script),
            *args,
        ]
        full = {
            **os.environ,
            **SPARK_ENV,
            "PYTHONPATH": str(REPOSITORY),
            "JDK_JAVA_OPTIONS": driver_jvm_options(),
            **(env or {}),
        }
        with log.open("w") as out:
            return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=full, start_new_session=True)
