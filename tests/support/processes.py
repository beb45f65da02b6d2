"""Killing a Spark driver the hard way: SIGKILL for its process group and every process it started.

A driver is spawned in a session of its own (``start_new_session=True``) with ``MQSPARK_TEST_RUN``
set to a token in its environment, which its JVM and PySpark's Python daemons inherit.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pyspark.find_spark_home import _find_spark_home

from mqspark import store
from mqspark.spark.session import jars_dir

# How long a process test waits for a Spark driver to start or make progress before it fails. Far
# above a quiet run's times: on 2 loaded cores a driver's start alone has taken over 120 s.
PATIENCE = 300


def python_child(script: str) -> subprocess.Popen:
    """A Python process running ``script`` with this checkout importable, its stdin and stdout text
    pipes (read its output by whole lines)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
    )


def last_spark_commit(checkpoint: Path) -> int:
    """The last micro-batch Spark recorded as done in the checkpoint's commit log (-1: none)."""
    commits = checkpoint / "commits"
    done = [int(name) for name in os.listdir(commits) if name.isdigit()] if commits.exists() else []
    return max(done, default=-1)


def log_version(location: str | Path, known: int = -1) -> int:
    """The latest version in a Delta table's log (-1: no table yet), from its entries' names only.

    Cheap enough to poll every millisecond while a driver starts: pass the last answer as ``known``
    and it costs one file lookup when nothing changed. Opening the table instead took about half a
    core, which the driver being waited for then lacked on a loaded machine.
    """
    return store.newest_version(str(location), known)


def spawned_children(parent: int) -> list[int]:
    """The processes ``parent`` started with multiprocessing's ``spawn`` (a process pool's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(stat.rpartition(")")[2].split()[1]) == parent and b"spawn_main" in command:
            found.append(int(entry.name))
    return sorted(found)


def nice_values(pid: int) -> set[int]:
    """The nice values of process ``pid``'s threads (the 19th field of /proc/PID/task/TID/stat)."""
    return _thread_fields(pid, 19)


def scheduling_policies(pid: int) -> set[int]:
    """The scheduling policies of process ``pid``'s threads (the 41st field of /proc/PID/task/TID/stat)."""
    return _thread_fields(pid, 41)


def _thread_fields(pid: int, field: int) -> set[int]:
    """The values of the ``field``-th field (counted from 1, as proc(5) does) of /proc/PID/task/TID/stat
    over process ``pid``'s threads."""
    return {
        int((thread / "stat").read_text().rpartition(")")[2].split()[field - 3])
        for thread in Path(f"/proc/{pid}/task").iterdir()
    }


def marked_processes(token: str) -> list[int]:
    """Live processes (the JVM's Python daemons included) started with MQSPARK_TEST_RUN=token."""
    marker = f"MQSPARK_TEST_RUN={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                found.append(int(entry))
    return found


def log_tail(log: Path) -> str:
    """The end of a run's log without the JVM's stack frames."""
    lines = [line for line in log.read_text().splitlines() if not line.lstrip().startswith("at ")]
    return "\n".join(lines)[-4000:]


def whole_lines(log: Path) -> list[str]:
    """The lines of ``log`` its process has finished writing (the last may be partial)."""
    return log.read_text().split("\n")[:-1]


def wait_printed(process: subprocess.Popen, log: Path, word: str, timeout: float) -> str:
    """What follows ``word`` on the first whole line of ``log`` that starts with it (the process may
    be writing the last line), once ``process`` printed it; fails if the process ends first or
    ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        for line in whole_lines(log):
            if line.startswith(f"{word} "):
                return line.split(maxsplit=1)[1]
        assert process.poll() is None, f"process ended (rc {process.returncode}) before {word!r}: {log_tail(log)}"
        assert time.monotonic() < deadline, f"process printed no {word!r} within {timeout} s: {log_tail(log)}"
        time.sleep(0.1)


def first_printed(runs: Sequence[tuple[subprocess.Popen, Path]], lines: Sequence[str], timeout: float) -> int:
    """The index of the first of ``runs`` (process, log) whose log holds the whole line ``lines[i]``;
    fails if one of them ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        for number, ((_, log), line) in enumerate(zip(runs, lines, strict=True)):
            if line in whole_lines(log):
                return number
        for process, log in runs:
            assert process.poll() is None, f"process ended (rc {process.returncode}): {log_tail(log)}"
        if time.monotonic() >= deadline:
            tails = "\n".join(f"--- {log.name}:\n{log_tail(log)}" for _, log in runs)
            raise AssertionError(f"none of {list(lines)} printed within {timeout} s:\n{tails}")
        time.sleep(0.1)


def kill_run(process: subprocess.Popen, token: str) -> None:
    """SIGKILL the driver's process group (Python driver and JVM), then every Python daemon it started.

    PySpark's worker daemons put themselves into process groups of their own; they are killed too, by
    pid, so nothing of the run (a commit in flight included) outlives the crash.
    """
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    kill_marked(token)


# The drivers these tests start live for seconds to minutes and are often killed: the JIT's first tier
# and the serial collector start a local session and run its first job about 15% faster on 2 cores
# (13.8 s to 12.1 s, and 5.2 s to 3.7 s), and leave more CPU to the other processes of a test.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# What a training driver does so that its JVM loads the classes every test driver needs: a session, a
# Delta write, and a streaming get delivering through foreachBatch and into a Delta sink.
TRAINING_SCRIPT = """
import sys
from pathlib import Path

import mqspark
from mqspark import QueueManager

folder = Path(sys.argv[1])
qm = QueueManager.create(folder / "qm", "QM1")
qm.define_queue("Q")
qm.put("Q", [{"payload": str(n)} for n in range(10)])
spark = mqspark.session(
    app_name="mqspark-class-archive",
    master="local[2]",
    **{"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
)
spark.range(1).write.format("delta").save(str(folder / "warm"))


def deliver(batch, batch_id):
    batch.count()
    batch.write.format("delta").mode("append").save(str(folder / "batches"))


stream = spark.readStream.format("mq").option("queue", "Q").option("maxMessagesPerTrigger", 5)
for consumer, sink in (("a", "foreach"), ("b", "delta")):
    writer = stream.option("consumer", consumer).load(qm.root).writeStream.trigger(availableNow=True)
    writer = writer.option("checkpointLocation", str(folder / f"checkpoint-{consumer}"))
    if sink == "foreach":
        query = writer.foreachBatch(deliver).start()
    else:
        query = writer.format("delta").start(str(folder / "sink"))
    query.awaitTermination()
spark.stop()
"""


def driver_jvm_options() -> str:
    """``SHORT_LIVED_JVM`` and, once built, a class-data sharing archive of a driver's classes: a
    driver's JVM maps them instead of loading and verifying each of its ~16,000 classes again. From
    start to first micro-batch: 31-33 s to 25-29 s, and about 3.5 s less CPU (2 cores, busy). A JVM
    whose class path differs from the archive's (a launcher, an executor) ignores it, silently."""
    archive = class_archive()
    return f"{SHORT_LIVED_JVM} -XX:SharedArchiveFile={archive} -Xlog:cds*=off" if archive else SHORT_LIVED_JVM


@functools.cache
def class_archive() -> Path | None:
    """The archive for this Java and Spark installation, built once per machine by a training driver
    (40-90 s; the other xdist worker waits for it); None if that failed (drivers start without it)."""
    java = shutil.which("java", path=str(Path(os.environ["JAVA_HOME"]) / "bin")) if "JAVA_HOME" in os.environ else None
    java = java or shutil.which("java")
    if java is None:
        return None
    java = os.path.realpath(java)
    # The JVM checks the class path's jars by path, size and time, as here.
    spark_jars = Path(_find_spark_home()) / "jars"
    identity = [java, os.stat(java).st_mtime, SHORT_LIVED_JVM, str(spark_jars)]
    identity += sorted((jar.name, jar.stat().st_size, jar.stat().st_mtime) for jar in spark_jars.iterdir())
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
    folder = jars_dir() / "class-archives"
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / f"{key}.jsa"
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():
            return archive
        # ~200 MB each: those of other Spark installations (virtualenvs) go after a day unused.
        for stale in folder.glob("*.jsa*"):
            if time.time() - stale.stat().st_atime > 86400:
                stale.unlink()
        partial = folder / f"{key}.jsa.partial"
        with tempfile.TemporaryDirectory(prefix="mqspark-class-archive-") as work:
            env = {
                **os.environ,
                "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
                "JDK_JAVA_OPTIONS": f"{SHORT_LIVED_JVM} -XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off",
            }
            command = [sys.executable, "-c", TRAINING_SCRIPT, work]
            try:
                done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=PATIENCE)
                failure = "" if done.returncode == 0 else f"rc {done.returncode}: {done.stderr[-2000:]}"
            except subprocess.TimeoutExpired:
                failure = f"no end within {PATIENCE} s"
        # The launcher's JVM (spark-class) writes the archive too, before the driver's JVM replaces it.
        if failure or not partial.exists():
            print(f"no class archive for the drivers ({failure or 'none written'})", file=sys.stderr)
            partial.unlink(missing_ok=True)
            return None
        partial.rename(archive)
        return archive


def start_driver(args: list[str], log: Path, token: str) -> subprocess.Popen:
    """Start a driver script (``python args...``) in a session of its own, marked with ``token``,
    its output in ``log``."""
    return start_process([sys.executable, *args], log, token)


def start_process(
    command: list[str], log: Path, token: str, pyspark_python: bool = True, python_path: tuple[Path, ...] = ()
) -> subprocess.Popen:
    """Start ``command`` (a driver, or ``spark-submit``) in a session of its own, marked with
    ``token``, with this interpreter for PySpark (unless not ``pyspark_python``: then as the user's
    environment has it) and the repository (and ``python_path``) on its path, its output in ``log``
    (``spark-submit`` passes a Python driver's stderr on to its stdout)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(map(str, (Path(__file__).resolve().parents[2], *python_path))),
        "MQSPARK_TEST_RUN": token,
        "JDK_JAVA_OPTIONS": driver_jvm_options(),
    }
    if pyspark_python:
        env.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    with log.open("w") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def finish_driver(process: subprocess.Popen, token: str, timeout: float = 240) -> int:
    """Wait for the last (unkilled) run to end and return its exit code; nothing of it outlives the test."""
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            kill_run(process, token)
        kill_marked(token)


def kill_marked(token: str) -> None:
    """SIGKILL, by pid, every process still alive that was started with MQSPARK_TEST_RUN=token."""
    deadline = time.monotonic() + 30
    while stragglers := marked_processes(token):
        assert time.monotonic() < deadline, f"processes of the killed run still alive: {stragglers}"
        for pid in stragglers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def held_port(port: int = 0, listening: bool = False) -> socket.socket:
    """A socket bound to ``port`` of 127.0.0.1 (0: a free one), which holds the port for a server
    started later: a port only chosen early was taken meanwhile by one of the run's JVMs (their ports
    are chosen by the system from the same range), and a CI run's S3 server was never reached. A
    listening one can be handed to the server (``pass_fds``); a bound one refuses connections and is
    closed just before the server starts, so a free port is chosen below the system's ephemeral
    range, where no client's or JVM's port comes from: chosen inside it, Azurite found its port taken
    in that moment (EADDRINUSE) in a run with three xdist workers."""
    if port:
        holder = socket.socket()
        # The server that had the port may leave connections in TIME_WAIT.
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
    else:
        holder = _below_ephemeral_ports()
    if listening:
        holder.listen(128)
    return holder


def _below_ephemeral_ports() -> socket.socket:
    """A socket bound to a free port below ``ip_local_port_range``; bound without ``SO_REUSEADDR``,
    so another process of the run choosing the same port finds it taken."""
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    choices = list(range(max(1024, low - 16384), low))
    random.shuffle(choices)
    for port in choices:
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", port))
        except OSError:
            holder.close()
            continue
        return holder
    raise AssertionError(f"no free port below {low}")


def listens(port: int) -> bool:
    """Whether something accepts connections on ``port`` of 127.0.0.1."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def answers_http(port: int) -> bool:
    """Whether a server on ``port`` of 127.0.0.1 answers ``GET /`` (with any status) within 30 s: for
    a server handed a socket that listened before it started, where a connection proves nothing."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/")
        connection.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def start_server(
    command: list[str],
    log: Path,
    port: int,
    name: str,
    ready: Callable[[int], bool] = listens,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen:
    """Start a server (an emulator, a console) in a session of its own, its output appended to
    ``log``, and wait until it is ``ready`` on ``port`` of 127.0.0.1 (``PATIENCE`` at most) and still
    running, so that what answered was this server."""
    with log.open("a") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=pass_fds
        )
    deadline = time.monotonic() + PATIENCE
    while not ready(port):
        assert process.poll() is None, f"{name} ended: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"{name} was not ready within {PATIENCE} s: {log.read_text()[-2000:]}"
        time.sleep(0.1)
    assert process.poll() is None, f"{name} ended: {log.read_text()[-2000:]}"
    return process


def stop_server(process: subprocess.Popen | None) -> None:
    """SIGTERM to a server's session, so it can save what it holds; SIGKILL if it has not ended
    within 30 s."""
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
