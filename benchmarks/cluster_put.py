"""Routed streaming put: ``writeStream.format("mq").option("cluster", ...)`` against the plain streaming sink.

The input is :mod:`benchmarks.stream_put`'s (Parquet files of ``file_rows`` random 1 KB payloads,
written once before anything is timed), read ``maxFilesPerTrigger`` files per micro-batch with
``trigger(availableNow=True)`` in one SparkSession, after a warm-up stream through both sinks. The
plain sink puts to one queue of the producer's queue manager QM1; the routed sink puts to a cluster
queue whose replicas are on QM2, QM3 and QM4 (QM1 hosts none), with bind ``not_fixed``.

Both sinks run ``rounds`` times over the same input, alternating which goes first, each round into
queues of its own; the throughputs are those of the median wall times (start() to
awaitTermination()), because on a shared machine one run can be off by half. The routed put's
driver-side commit is split per micro-batch from the Delta logs (see :func:`_routed_commit_fields`).
The run fails instead of reporting when any table does not hold exactly what the input says.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from deltalake import DeltaTable

import mqspark
from mqspark import QueueManager, store
from mqspark.cluster.repository import Cluster
from mqspark.qmgr import engine

from .stream_put import _commits, _progress_fields, _run_stream, _summary, _write_input, check_run

REPLICAS = ("QM2", "QM3", "QM4")


def _journal_batch(cluster: Cluster, producer: str, queue: str) -> int | None:
    """The last batch the cluster journal recorded for ``producer`` on ``queue`` (None: no journal)."""
    rows = DeltaTable(cluster.location).to_pyarrow_table().to_pylist()
    journals = {(r["producer"], r["queue"]): r["routed_batch"] for r in rows if r["kind"] == "producer"}
    return journals.get((producer, queue))


def _routed_commit_fields(replica_commits: list[dict], records: list[dict]) -> dict:
    """Per micro-batch, from the Delta logs: ``replica_commits`` = last replica commit - the commit start
    mqspark records (the same moment on every replica of a batch); ``journal_record`` = the repository
    commit that recorded the batch - the last replica commit; ``commit`` = the two together.

    ``replica_commits`` are one round's, ``records`` its journal records in batch order."""
    by_batch: dict[int, list[dict]] = {}
    for commit in replica_commits:
        by_batch.setdefault(commit["info"]["mqspark.batch_id"], []).append(commit["info"])
    started = [by_batch[b][0]["mqspark.commit_started_ms"] for b in sorted(by_batch)]
    replicas_done = [max(info["timestamp"] for info in by_batch[b]) for b in sorted(by_batch)]
    recorded = [record["info"]["timestamp"] for record in records]
    return {
        "commit": [r - s for r, s in zip(recorded, started, strict=True)],
        "replica_commits": [d - s for d, s in zip(replicas_done, started, strict=True)],
        "journal_record": [r - d for r, d in zip(recorded, replicas_done, strict=True)],
    }


def run(
    batch_rows: int = 100_000,
    messages: int = 1_000_000,
    file_rows: int = 10_000,
    payload_bytes: int = 1024,
    bind: str = "not_fixed",
    rounds: int = 3,
    keep: bool = False,
) -> dict:
    """Put ``messages`` through the plain and the routed sink, ``rounds`` times each, in micro-batches of
    ``batch_rows`` rows. ``keep`` leaves the temporary folder in place for inspection.
    """
    if batch_rows % file_rows or messages % batch_rows:
        raise ValueError(f"batch_rows {batch_rows} must be a multiple of {file_rows} and divide {messages}")
    files_per_trigger = batch_rows // file_rows
    batches = messages // batch_rows
    root = Path(tempfile.mkdtemp(prefix="mqspark-bench-cluster-"))
    spark = None
    previous = None
    progress_key = "spark.sql.streaming.numRecentProgressUpdates"
    try:
        _write_input(root / "input", messages // file_rows, file_rows, payload_bytes, seed=1)
        _write_input(root / "warmup-input", 4, 2_500, payload_bytes, seed=2)
        load_at_start = os.getloadavg()[0]

        spark = mqspark.session(
            app_name="mqspark-bench", master="local[2]", **{"spark.ui.showConsoleProgress": "false"}
        )
        # Keep every micro-batch's progress (Spark keeps 100 by default).
        previous = spark.conf.get(progress_key, None)
        spark.conf.set(progress_key, "10000")

        qms = {name: QueueManager.create(root / name, name) for name in ("QM1", *REPLICAS)}
        cluster = Cluster.create(root / "cluster", "BENCH")
        for qm in qms.values():
            cluster.join(qm)
        producer = qms["QM1"]
        names = ["WARMUP", *(f"R{r}" for r in range(rounds))]
        for name in names:
            producer.define_queue(f"PLAIN_{name}")
            for replica in REPLICAS:
                qms[replica].define_queue(f"ORDERS_{name}")
                cluster.advertise(qms[replica], f"ORDERS_{name}")

        def plain(name: str, source: Path, per_trigger: int):
            checkpoint = root / f"ckpt-plain-{name}"
            return _run_stream(spark, source, per_trigger, "mq", producer.root, checkpoint, queue=f"PLAIN_{name}")

        def routed(name: str, source: Path, per_trigger: int):
            checkpoint = root / f"ckpt-cluster-{name}"
            options = {"queue": f"ORDERS_{name}", "cluster": cluster.name, "bind": bind}
            return _run_stream(spark, source, per_trigger, "mq", producer.root, checkpoint, **options)

        # Warm-up: JVM code paths, Python workers and the commit path of both sinks, on a few small batches.
        plain("WARMUP", root / "warmup-input", 2)
        routed("WARMUP", root / "warmup-input", 2)

        seconds: dict[str, list[float]] = {"plain": [], "cluster": []}
        progress: dict[str, list] = {"plain": [], "cluster": []}
        plain_commit_ms: list[float] = []
        routed_ms: dict[str, list[float]] = {"commit": [], "replica_commits": [], "journal_record": []}
        spreads, checks = [], {}
        records: list[dict] = []
        for r in range(rounds):
            name = f"R{r}"
            # Which sink goes first alternates, so neither always meets the other's leftovers (JIT, GC, cache).
            for sink in ("plain", "cluster") if r % 2 == 0 else ("cluster", "plain"):
                repository_before = DeltaTable(cluster.location).version()
                elapsed, batch_progress = (plain if sink == "plain" else routed)(
                    name, root / "input", files_per_trigger
                )
                seconds[sink].append(elapsed)
                progress[sink] += batch_progress
                if sink == "cluster":
                    # The stream's first batch opens its journal in a commit of its own; each batch then records once.
                    records = [c for c in _commits(cluster.location) if c["version"] > repository_before]

            # A broken run must not report a number.
            plain_commits = _commits(store.queue_location(producer.root, f"PLAIN_{name}"))
            replica_commits = {
                replica: _commits(store.queue_location(qms[replica].root, f"ORDERS_{name}")) for replica in REPLICAS
            }
            spread = {replica: qms[replica].depth(f"ORDERS_{name}") for replica in REPLICAS}
            query_id = json.loads((root / f"ckpt-cluster-{name}" / "metadata").read_text())["id"]
            checks.update(
                {
                    f"{name} plain queue depth": (producer.depth(f"PLAIN_{name}"), messages),
                    f"{name} replica depth total": (sum(spread.values()), messages),
                    f"{name} plain put commits": (
                        sum(c["info"].get("mqspark.operation") == "put" for c in plain_commits),
                        batches,
                    ),
                    **{
                        f"{name} {replica} batches": (
                            sorted(c["info"]["mqspark.batch_id"] for c in commits),
                            list(range(batches)),
                        )
                        for replica, commits in replica_commits.items()
                    },
                    f"{name} repository commits": (len(records), batches + 1),
                    f"{name} journal batch": (_journal_batch(cluster, query_id, f"ORDERS_{name}"), batches - 1),
                }
            )
            spreads.append(spread)
            plain_commit_ms += [c["info"]["timestamp"] - c["info"]["mqspark.commit_started_ms"] for c in plain_commits]
            split = _routed_commit_fields([c for cs in replica_commits.values() for c in cs], records[1:])
            for key, values in split.items():
                routed_ms[key] += values
        checks["dead letters"] = (producer.depth(engine(producer).dead_letter_queue), 0)
        checks["progress batches"] = (
            (len(progress["plain"]), len(progress["cluster"])),
            (rounds * batches, rounds * batches),
        )
        check_run("cluster_put", checks)

        plain_seconds = statistics.median(seconds["plain"])
        cluster_seconds = statistics.median(seconds["cluster"])
        return {
            "benchmark": "cluster_put",
            "messages": messages,
            "batch_rows": batch_rows,
            "payload_bytes": payload_bytes,
            "bind": bind,
            "replicas": len(REPLICAS),
            "rounds": rounds,
            "plain_seconds": [round(s, 2) for s in seconds["plain"]],
            "cluster_seconds": [round(s, 2) for s in seconds["cluster"]],
            "plain_messages_per_s": round(messages / plain_seconds),
            "cluster_messages_per_s": round(messages / cluster_seconds),
            "ratio_to_plain": round(plain_seconds / cluster_seconds, 3),
            # Messages per replica queue manager, each round.
            "replica_messages": spreads,
            **_progress_fields("plain", progress["plain"]),
            **_progress_fields("cluster", progress["cluster"]),
            # From the Delta logs, per micro-batch: plain commit = commitInfo timestamp - the commit start
            # mqspark records; the routed commit is split in replica commits and the journal record.
            **_summary("plain_commit_ms", plain_commit_ms),
            **{k: v for key, values in routed_ms.items() for k, v in _summary(f"cluster_{key}_ms", values).items()},
            "load_avg_1m_at_start": round(load_at_start, 2),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        }
    finally:
        if spark is not None:
            if previous is None:
                spark.conf.unset(progress_key)
            else:
                spark.conf.set(progress_key, previous)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
