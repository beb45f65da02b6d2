"""Spark sessions with Delta and the ``mq`` data source, and the one-time resolution of their JVM jars.

delta-spark names its Maven artifact (``configure_spark_with_delta_pip``); hadoop-azure, at the
Hadoop version pyspark ships, lets Spark read queue tables on Azure (``abfs[s]://``). Spark's own
Ivy resolves both from Maven Central. That resolution costs seconds at every start, so it is done
once into a cache folder and later sessions load the cached jars directly.

The Azure credentials come from the same ``AZURE_STORAGE_*`` environment variables delta-rs reads
(see ``mqspark.store.filesystems``): a session made here passes them on to Hadoop's ABFS driver.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from delta import configure_spark_with_delta_pip
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from mqspark.errors import MQValidationError

# The shipped defaults live in the package, so a pip install has them too.
CONF_DIR = Path(os.environ.get("MQSPARK_CONF_DIR", Path(__file__).resolve().parent / "conf"))
# A folder to put on a Spark Connect server's Python path so that all its sessions know format "mq"
# without mqspark.register (Spark's static lookup of Python data sources; see pyspark_mqspark.py).
STATIC_SOURCES = Path(__file__).resolve().parent / "static"
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def jars_dir() -> Path:
    """Where resolved Delta jars are cached: ``$MQSPARK_JARS_DIR``, or the user cache folder."""
    if os.environ.get("MQSPARK_JARS_DIR"):
        return Path(os.environ["MQSPARK_JARS_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mqspark" / "jars"


def delta_packages() -> str:
    """The Maven coordinates delta-spark asks for, for the installed pyspark and delta-spark, and
    hadoop-azure at the version of the Hadoop client jars pyspark ships."""
    delta = configure_spark_with_delta_pip(SparkSession.Builder())._options["spark.jars.packages"]
    return f"{delta},org.apache.hadoop:hadoop-azure:{_hadoop_version()}"


def _hadoop_version() -> str:
    from pyspark.find_spark_home import _find_spark_home

    client = next((Path(_find_spark_home()) / "jars").glob("hadoop-client-api-*.jar"))
    return client.name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def delta_jars() -> list[str]:
    """Paths of the cached Delta and hadoop-azure jars, resolving them from Maven Central on first use."""
    packages = delta_packages()
    folder = jars_dir() / packages.replace(":", "_").replace(",", "+")
    manifest = folder / "manifest.json"
    if manifest.exists():
        jars = json.loads(manifest.read_text())
        if all(Path(jar).exists() for jar in jars):
            return jars
    return _resolve(packages, folder)


def _resolve(packages: str, folder: Path) -> list[str]:
    """Resolve ``packages`` with Spark's Ivy in a process of its own, whose output (Ivy's warnings
    about unreachable hosts and proxies included) goes to a log file, not to the user's screen."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "resolve.log"
    print(f"mqspark: resolving {packages} from Maven Central (once; Ivy's output: {log})", file=sys.stderr)
    with log.open("w") as output:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from mqspark.spark.session import _resolve_here; _resolve_here({packages!r}, {str(folder)!r})",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    manifest = folder / "manifest.json"
    if done.returncode != 0 or not manifest.exists():
        raise RuntimeError(f"resolving {packages} failed (exit code {done.returncode}); see {log}")
    jars = json.loads(manifest.read_text())
    print(f"mqspark: {len(jars)} jars in {folder / 'ivy' / 'jars'}", file=sys.stderr)
    return jars


def _resolve_here(packages: str, folder: str) -> None:
    """The resolution itself, in the process :func:`_resolve` starts."""
    ivy = Path(folder) / "ivy"
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("mqspark-resolve-jars")
        .config("spark.jars.packages", packages)
        .config("spark.jars.ivy", str(ivy))
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.stop()
    jars = sorted(str(jar) for jar in (ivy / "jars").glob("*.jar"))
    if not any("delta-spark" in Path(jar).name for jar in jars):
        raise RuntimeError(f"resolving {packages} gave no delta-spark jar in {ivy / 'jars'}")
    shutil.rmtree(ivy / "cache", ignore_errors=True)
    (Path(folder) / "manifest.json").write_text(json.dumps(jars))


def _spark_defaults() -> dict[str, str]:
    settings = {}
    defaults = CONF_DIR / "spark-defaults.conf"
    if defaults.exists():
        for line in defaults.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition(" ")
                settings[key] = value.strip()
    return settings


def _logging() -> dict[str, str]:
    """The driver JVM's logging: the shipped log4j2 configuration, read when the JVM starts."""
    log4j = CONF_DIR / "log4j2.properties"
    return {"spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{log4j}"} if log4j.exists() else {}


def session(app_name: str = "mqspark", master: str | None = None, **conf: Any) -> SparkSession:
    """A SparkSession with Delta's extension and catalog and the ``mq`` data source registered.

    ``master`` defaults to ``local[*]``, except under ``spark-submit``, whose ``--master`` stands
    (there, also give ``--jars "$(mqspark jars)"``: the driver's JVM is already running). ``conf``
    entries (``**{"spark.sql.shuffle.partitions": "4"}``) override the shipped ``spark-defaults.conf``
    (see ``CONF_DIR``).
    """
    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        raise MQValidationError(
            f"mqspark.session() starts a Spark driver here, but SPARK_REMOTE={remote} asks for Spark Connect: "
            f"use SparkSession.builder.remote({remote!r}).getOrCreate(), then mqspark.register(spark) "
            "(the Connect server needs Delta's jars and mqspark installed)"
        )
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"
    settings = {**_spark_defaults(), **DELTA_CONF, **_logging()}
    settings["spark.jars"] = ",".join(delta_jars())
    # Python workers (and the data-source planner, which reads only the environment) must run the
    # interpreter that has mqspark and its dependencies; the JVM inherits this variable.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings.update(azure_settings(os.environ))
    settings.update({key: str(value) for key, value in conf.items()})
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def submit_command(arguments: list[str], environment: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The ``spark-submit`` command line and environment that run ``arguments`` (spark-submit's own,
    which come last and so win) with Delta's jars and extension, the shipped logging, pyspark's Spark
    home, and this interpreter for the driver and the Python workers unless ``environment`` names
    others. Outside an activated virtualenv, pyspark's ``spark-submit`` looks for its Spark home with
    ``python3`` from ``PATH``, which may not have pyspark."""
    from pyspark.find_spark_home import _find_spark_home

    home = environment.get("SPARK_HOME") or _find_spark_home()
    conf = [item for key, value in {**DELTA_CONF, **_logging()}.items() for item in ("--conf", f"{key}={value}")]
    command = [str(Path(home) / "bin" / "spark-submit"), "--jars", ",".join(delta_jars()), *conf, *arguments]
    python = environment.get("PYSPARK_PYTHON", sys.executable)
    driver = environment.get("PYSPARK_DRIVER_PYTHON", python)
    return command, {**environment, "SPARK_HOME": home, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": driver}


def azure_settings(environment: Mapping[str, str]) -> dict[str, str]:
    """Hadoop's ABFS settings for the account the ``AZURE_STORAGE_*`` variables name, so Spark
    reads ``abfs[s]://container@account.dfs.core.windows.net/...`` with the credentials delta-rs
    uses. With ``AZURE_STORAGE_ENDPOINT`` (an emulator such as Azurite, which serves only the
    blob endpoint): that host and scheme, through the blob endpoint of a flat-namespace account.

    Always: no ABFS metrics collection. hadoop-azure 3.5 runs it on non-daemon threads that keep a
    ``spark-submit`` driver's JVM alive after its Python program has ended."""
    settings = {"spark.hadoop.fs.azure.metrics.collection.enabled": "false"}
    account = environment.get("AZURE_STORAGE_ACCOUNT_NAME")
    key = environment.get("AZURE_STORAGE_ACCOUNT_KEY")
    if not account or not key:
        return settings
    host = f"{account}.dfs.core.windows.net"
    settings[f"spark.hadoop.fs.azure.account.auth.type.{host}"] = "SharedKey"
    settings[f"spark.hadoop.fs.azure.account.key.{host}"] = key
    endpoint = environment.get("AZURE_STORAGE_ENDPOINT")
    if endpoint:
        url = urlparse(endpoint)
        settings.update(
            {
                "spark.hadoop.fs.azure.abfs.endpoint": url.netloc,
                "spark.hadoop.fs.azure.always.use.https": str(url.scheme == "https").lower(),
                "spark.hadoop.fs.azure.fns.account.service.type": "BLOB",
                "spark.hadoop.fs.azure.account.hns.enabled": "false",
                "spark.hadoop.fs.azure.ssl.channel.mode": "Default_JSSE",
                "spark.hadoop.fs.azure.networking.library": "JDK_HTTP_URL_CONNECTION",
            }
        )
    return settings


# The consumption listener :func:`register` added to each session.
_LISTENERS: weakref.WeakKeyDictionary[SparkSession, ConsumptionListener] = weakref.WeakKeyDictionary()


def register(spark: SparkSession) -> SparkSession:
    """Register mqspark's data sources (format ``mq``) on an existing session, and the listener
    that records the last micro-batch of a streaming get as consumed when its query ends."""
    from mqspark.spark.datasource import MQDataSource

    if spark not in _LISTENERS and not _is_connect(spark):
        # Once per session: the check starts a process.
        _check_worker_python(spark.sparkContext.pythonExec)
    spark.dataSource.register(MQDataSource)
    if spark not in _LISTENERS:
        # The listener may run during interpreter exit, when modules that start threads (as
        # pyarrow.dataset does, through concurrent.futures) can no longer be imported.
        import pyarrow.dataset  # noqa: F401

        listener = ConsumptionListener()
        spark.streams.addListener(listener)
        _LISTENERS[spark] = listener
        if _is_connect(spark):
            # A Spark Connect client receives listener events on a non-daemon thread that only ends
            # when the last listener is removed; the interpreter joins such threads before it runs
            # atexit handlers, so the hand-over must run at thread shutdown (as concurrent.futures does).
            # A private function of CPython's threading module (since 3.9), left out of typeshed.
            threading._register_atexit(_release_connect_listener, spark)  # type: ignore[attr-defined]
        else:
            atexit.register(_drain_listener_events, spark)
    return spark


def _check_worker_python(python: str) -> None:
    """Refuse a session whose Python processes (the mq data source's planner and readers, started
    with ``python``: ``PYSPARK_PYTHON`` when the session started, else ``python3`` from ``PATH``)
    cannot import mqspark: the first read would fail with ``No module named 'mqspark'``."""
    found = shutil.which(python)
    # Not resolved: a virtualenv's python links to a base interpreter that lacks its packages.
    if found is not None and os.path.abspath(found) == os.path.abspath(sys.executable):
        return
    check = "import importlib.util, sys; sys.exit(importlib.util.find_spec('mqspark') is None)"
    # From the root folder: the current one (on ``-c``'s path) may hold a checkout of mqspark.
    if found is None or subprocess.run([found, "-c", check], capture_output=True, cwd="/", timeout=60).returncode:
        raise MQValidationError(
            f"Spark runs the mq data source with Python {python!r} ({found or 'not found'}), which cannot "
            f"import mqspark: start the session with PYSPARK_PYTHON={sys.executable} in the environment, "
            "or use mqspark.session()"
        )


def _is_connect(spark: SparkSession) -> bool:
    return spark.__class__.__module__.startswith("pyspark.sql.connect")


class ConsumptionListener(StreamingQueryListener):
    """Records the last finished micro-batch of every streaming get as consumed when its query ends.

    ``latestOffset`` records each batch as consumed when the next one is planned; after the last
    batch of a run (``stop()``, a failure, the end of ``availableNow``) that never happens. Progress
    events name each finished batch's end offset; at termination the last one is recorded and the
    consumer group's lease is released.
    """

    def __init__(self) -> None:
        self._last_offsets: dict[str, list[str]] = {}
        self._running: set[str] = set()
        self._idle = threading.Condition()

    def onQueryStarted(self, event: Any) -> None:
        with self._idle:
            self._running.add(str(event.id))
            self._idle.notify_all()

    def onQueryProgress(self, event: Any) -> None:
        self._last_offsets[str(event.progress.id)] = [source.endOffset for source in event.progress.sources]

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        from mqspark.spark.stream import record_finished_batch

        for end_offset in self._last_offsets.pop(str(event.id), []):
            try:
                record_finished_batch(end_offset)
            except Exception as error:  # a listener must not break the session; the next run redelivers
                print(
                    f"mqspark: could not record the last batch of query {event.id} as consumed: {error}",
                    file=sys.stderr,
                )
        with self._idle:
            self._running.discard(str(event.id))
            self._idle.notify_all()

    def wait_for_ends(self, still_active: set[str], timeout: float) -> None:
        """Until every query whose start the listener saw, other than ``still_active``, has had its
        end handled (or ``timeout``)."""
        with self._idle:
            self._idle.wait_for(lambda: not (self._running - still_active), timeout)


def _release_connect_listener(spark: SparkSession) -> None:
    """At exit of a Spark Connect client: let the listener handle the end of queries that ended just
    before (their events arrive asynchronously from the server), then remove it so that the event
    thread ends and the interpreter can exit. Queries still running on the server keep running."""
    listener = _LISTENERS[spark]
    if getattr(spark, "is_stopped", False):
        # Stopped before exit (spark-pipelines stops its session): the server dropped the session's
        # queries and listeners with it, and a stopped client can no longer ask for either.
        return
    try:
        active = {str(query.id) for query in spark.streams.active}
        listener.wait_for_ends(active, 30)
        spark.streams.removeListener(listener)
    except Exception as error:
        print(f"mqspark: could not remove the consumption listener: {error}", file=sys.stderr)


def _drain_listener_events(spark: SparkSession) -> None:
    """At exit, let the listener see the end of queries stopped just before (events are asynchronous)."""
    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(30_000)
    except Exception:
        pass  # the session is already gone: nothing left to wait for


if __name__ == "__main__":
    print("\n".join(delta_jars()))
