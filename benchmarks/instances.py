"""Active/standby takeover: from the SIGKILL of the active instance to the first micro-batch the
new active instance delivers.

Instances of the streaming get of one group run as separate Spark applications (driver, JVM,
Python workers) sharing the queue manager root and one checkpoint, each as
:class:`mqspark.services.instances.Instance` runs them, delivering into one Delta table with
idempotent writes and logging every micro-batch it delivered with the time. Two instances run at a
time: after each kill of the active one (its whole process tree), a new instance starts, so a
standby is always there. ``kills`` takeovers give ``takeover_s_p50`` / ``takeover_s_p99``.

The JSON also splits each takeover: until the standby took the lease, until its query started,
and until the query delivered its first batch (medians). The next standby is started only once the
takeover was measured, so its start-up does not compete for the two cores.

The anchor is the issue's target, in the same units: ``lease_timeout_s`` + 5 s
(``ratio_p50_to_target`` at most 1 meets it). The instances are this process's children and
PySpark's daemons, so the CPU use of other processes is not reported here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from mqspark import QueueManager

from .stream_get import _p

SCRIPT = """
import os
import sys
import time
from datetime import timedelta

import mqspark
from mqspark import QueueManager
from mqspark.services.instances import Instance

root, output, checkpoint, deliveries, lease = sys.argv[1:6]
spark = mqspark.session(
    app_name="mqspark-bench-instance",
    master="local[2]",
    **{"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "2"},
)
spark.range(1).write.format("delta").mode("overwrite").save(output + "-warm-up-" + str(os.getpid()))
instance = Instance(
    QueueManager.open(root), "Q", "bench", lease_timeout=timedelta(seconds=int(lease)), spark=spark
)
print("standby", instance.id, flush=True)


def deliver(batch, batch_id):
    batch.write.format("delta").mode("append").option("txnAppId", "bench").option("txnVersion", batch_id).save(output)
    with open(deliveries, "a") as log:
        log.write(f"{instance.id} {batch_id} {time.time()}\\n")


def start(instance_id):
    return (
        spark.readStream.format("mq").option("queue", "Q").option("consumer", "bench")
        .option("maxMessagesPerTrigger", 10).option("leaseTimeout", int(lease)).option("instance", instance_id)
        .load(root).select("msg_id", "payload", "delivery_seq")
        .writeStream.foreachBatch(instance.fence(deliver))
        .option("checkpointLocation", checkpoint).trigger(processingTime="500 milliseconds").start()
    )


query = instance.run(start)
print("active", instance.id, instance.active_since.timestamp(), time.time(), flush=True)
query.awaitTermination()
"""


class _Instance:
    def __init__(self, work: Path, number: int, args: list[str]) -> None:
        self.token = uuid.uuid4().hex
        self.log = work / f"instance-{number}.log"
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "MQSPARK_BENCH_RUN": self.token}
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def instance_id(self, role: str, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.line(role)
            if line:
                return line[1]
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"instance not {role}: {self.log.read_text()[-2000:]}")

    def line(self, role: str) -> list[str] | None:
        """The words of the instance's first log line for ``role`` (standby, active), None before it."""
        for line in self.log.read_text().splitlines():
            if line.startswith(f"{role} "):
                return line.split()
        return None

    def kill(self) -> None:
        """SIGKILL the process group, then every process (PySpark's daemons included) of this run."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        marker = f"MQSPARK_BENCH_RUN={self.token}".encode()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                        os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass


def taken_line(instance: _Instance, timeout: float = 60) -> list[str]:
    """The active line of an instance that took over (printed once its query started)."""
    deadline = time.monotonic() + timeout
    while (line := instance.line("active")) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"instance never printed its active line: {instance.log.read_text()[-2000:]}")
        time.sleep(0.05)
    return line


def _deliveries(path: Path) -> list[tuple[str, int, float]]:
    return [(i, int(b), float(t)) for i, b, t in (line.split() for line in path.read_text().splitlines() if line)]


def run(kills: int = 10, lease_timeout_s: int = 5, messages: int = 3_000) -> dict:
    work = Path(tempfile.mkdtemp(prefix="mqspark-bench-instances-"))
    running: list[_Instance] = []
    try:
        qm = QueueManager.create(work / "qm", "QM1")
        qm.define_queue("Q")
        for start in range(0, messages, 500):
            qm.put("Q", [{"payload": f"m{n}".encode()} for n in range(start, start + 500)])
        script, deliveries = work / "instance.py", work / "deliveries.log"
        script.write_text(SCRIPT)
        deliveries.touch()
        args = [str(script), qm.root, str(work / "output"), str(work / "checkpoint"), str(deliveries)]
        args.append(str(lease_timeout_s))

        def start() -> _Instance:
            instance = _Instance(work, len(running), args)
            running.append(instance)
            return instance

        active = start()
        active_id = active.instance_id("active")
        standby = start()
        standby.instance_id("standby")
        by_id = {active_id: active}
        takeovers = []
        # Per takeover: kill -> lease taken, lease taken -> query started, query started -> first batch.
        phases: list[tuple[float, float, float]] = []
        for _ in range(kills):
            done = sum(1 for d in _deliveries(deliveries) if d[0] == active_id)
            deadline = time.monotonic() + 180
            while sum(1 for d in _deliveries(deliveries) if d[0] == active_id) < done + 2:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{active_id} delivered nothing for 180 s")
                time.sleep(0.05)
            killed_at = time.time()
            by_id.pop(active_id).kill()
            deadline = time.monotonic() + 300
            while not (after := [d for d in _deliveries(deliveries) if d[2] > killed_at and d[0] != active_id]):
                if time.monotonic() > deadline:
                    raise RuntimeError("no standby took over within 300 s")
                time.sleep(0.05)
            active_id, _, first = after[0]
            takeovers.append(first - killed_at)
            taken = next(i for i in running if i.instance_id("standby") == active_id)
            by_id[active_id] = taken
            _, _, acquired, started = taken_line(taken)
            phases.append((float(acquired) - killed_at, float(started) - float(acquired), first - float(started)))
            # The next standby starts once the takeover is measured: its start-up would share the cores.
            start().instance_id("standby")
        target = lease_timeout_s + 5
        p50 = _p(takeovers, 0.5)
        return {
            "benchmark": "instances_takeover",
            "kills": kills,
            "lease_timeout_s": lease_timeout_s,
            "takeover_s": [round(t, 2) for t in takeovers],
            "takeover_s_p50": round(p50, 2),
            "takeover_s_p99": round(_p(takeovers, 0.99), 2),
            "lease_taken_s_p50": round(_p([p[0] for p in phases], 0.5), 2),
            "query_started_s_p50": round(_p([p[1] for p in phases], 0.5), 2),
            "first_batch_s_p50": round(_p([p[2] for p in phases], 0.5), 2),
            "target_s": target,
            "ratio_p50_to_target": round(p50 / target, 3),
        }
    finally:
        for instance in running:
            if instance.process.poll() is None:
                instance.kill()
        shutil.rmtree(work, ignore_errors=True)
