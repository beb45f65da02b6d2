"""The routed streaming put under failures: a producer putting to a cluster queue, killed with SIGKILL and restarted.

Real processes, real Spark and real Delta tables on disk: three queue managers host replicas of ORDERS,
the producer's own queue manager hosts none. Each micro-batch reads one input file, commits each
replica's share in its own Delta commit and then records the batch in the cluster journal, so a kill
can land between two replica commits, between the last of them and the journal, or between the
journal and Spark's commit log.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from deltalake import DeltaTable

from mqspark import QueueManager, store
from mqspark.cluster.repository import Cluster
from mqspark.qmgr import engine

from .support.processes import PATIENCE, finish_driver, kill_run, last_spark_commit, log_version, start_driver

# Every test runs producers that are Spark drivers of their own (mqspark.session()).
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("drivers-b")]

REPLICAS = ("QM2", "QM3", "QM4")
# The sink's report of a replica share it found committed already (mqspark.spark.sink.commit_batch).
REPLAYED = re.compile(r"batch (\d+) of producer \S+ was committed before")

# A streaming producer in its own process, putting to the cluster queue: one file per micro-batch.
PRODUCER_SCRIPT = """
import sys

import mqspark

root, source, checkpoint, bind = sys.argv[1:5]
spark = mqspark.session(
    app_name="mqspark-killed-cluster-producer",
    master="local[2]",
    **{"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
)
query = (
    spark.readStream.schema("payload string, group_id string, msg_seq_number int, last_in_group boolean")
    .option("maxFilesPerTrigger", 1)
    .json(source)
    .writeStream.format("mq")
    .option("queue", "ORDERS")
    .option("cluster", "INV")
    .option("bind", bind)
    .option("checkpointLocation", checkpoint)
    .trigger(availableNow=True)
    .start(root)
)
query.awaitTermination()
spark.stop()
"""


def _write_input(folder: Path, files: int, rows: int, rng: random.Random) -> tuple[list[str], dict[str, int]]:
    """JSON-lines files named and timed in creation order: ``rows`` ungrouped messages each, mixed with
    items of groups. A group starts in every file and runs over 1-3 files with 1-3 items in each.

    Returns every payload, and each group's number of items.
    """
    folder.mkdir(parents=True)
    # The file source orders files by modification time: give each file its own second.
    base = int(time.time()) - files - 60
    payloads: list[str] = []
    sizes: dict[str, int] = {}
    open_groups: dict[str, int] = {}  # group -> files it still runs over
    for f in range(files):
        open_groups[f"G{f}"] = min(rng.randint(1, 3), files - f)
        lines = [{"payload": f"f{f}-r{r}"} for r in range(rows)]
        for group in list(open_groups):
            open_groups[group] -= 1
            items = rng.randint(1, 3)
            for item in range(items):
                sizes[group] = sizes.get(group, 0) + 1
                last = open_groups[group] == 0 and item == items - 1
                lines.append(
                    {
                        "payload": f"{group}-{sizes[group]}",
                        "group_id": group,
                        "msg_seq_number": sizes[group],
                        "last_in_group": last,
                    }
                )
            if open_groups[group] == 0:
                del open_groups[group]
        # Mix group items among the other messages, each group's items still in sequence order.
        rng.shuffle(lines)
        for group in {line["group_id"] for line in lines if "group_id" in line}:
            places = [i for i, line in enumerate(lines) if line.get("group_id") == group]
            ordered = sorted((lines[i] for i in places), key=lambda line: line["msg_seq_number"])
            for i, line in zip(places, ordered, strict=True):
                lines[i] = line
        path = folder / f"part-{f:04d}.json"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        os.utime(path, (base + f, base + f))
        payloads += [line["payload"] for line in lines]
    return payloads, sizes


def _journal(location: str, producer: str | None) -> dict | None:
    rows = DeltaTable(location).to_pyarrow_table().to_pylist()
    found = [row for row in rows if row["kind"] == "producer" and row["producer"] == producer]
    return found[0] if found else None


def _query_id(checkpoint: Path) -> str | None:
    metadata = checkpoint / "metadata"
    return json.loads(metadata.read_text())["id"] if metadata.exists() else None


@pytest.mark.slow
# on_group is the demanding bind: groups span micro-batches, so bindings go through the journal. not_fixed
# passes the same test but would double the runtime.
@pytest.mark.parametrize("bind", ["on_group"])
def test_routed_producer_killed_with_sigkill_puts_each_message_once(bind, tmp_path, record_property):
    files, rows, kills = 8, 8, 3  # one of each mode below; a run is killed within 4 files
    qms = {name: QueueManager.create(tmp_path / name, name) for name in ("QM1", *REPLICAS)}
    cluster = Cluster.create(tmp_path / "cluster", "INV")
    for qm in qms.values():
        cluster.join(qm)
    for name in REPLICAS:
        qms[name].define_queue("ORDERS")
        cluster.advertise(qms[name], "ORDERS")
    locations = {name: store.queue_location(qms[name].root, "ORDERS") for name in REPLICAS}

    rng = random.Random(20261122)
    expected, sizes = _write_input(tmp_path / "input", files, rows, rng)
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER_SCRIPT)
    checkpoint = tmp_path / "checkpoint"
    token = uuid.uuid4().hex
    started = time.monotonic()

    def run(number: int) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"run-{number}.log"
        return start_driver(
            [str(script), qms["QM1"].root, str(tmp_path / "input"), str(checkpoint), bind], log, token
        ), log

    logs: list[Path] = []
    killed: list[dict] = []
    versions = dict.fromkeys(REPLICAS, 0)
    for number in range(kills):
        # When to kill, by what the run has committed (the JVM start takes 5-20 s on a loaded machine,
        # so a wall-clock moment would often fall before the stream runs):
        # - "replica": at once after the run's k-th new replica commit, which lands between the replica
        #   commits of a batch or between its last one and the journal; the first kill hits batch 0;
        # - "journal": at once after the run's first journal record, between it and Spark's commit log;
        # - "random": a random delay after 1-2 journal records, anywhere in a micro-batch.
        mode = ("replica", "journal", "random")[number % 3]
        journal_before = _journal(cluster.location, _query_id(checkpoint))
        # The producer's first batch opens its journal in a commit of its own before it is recorded.
        records = 1 if mode == "journal" else rng.randint(1, 2)
        journal_target = log_version(cluster.location, 0) + records + (journal_before is None)
        replica_target = sum(versions.values()) + (1 if number == 0 else rng.randint(1, 4))
        delay = rng.uniform(0.05, 0.8) if mode == "random" else 0.0
        process, log = run(number)
        logs.append(log)
        deadline = time.monotonic() + PATIENCE
        journal_version = 0
        while True:
            if mode == "replica":
                versions = {name: log_version(location, versions[name]) for name, location in locations.items()}
                if sum(versions.values()) >= replica_target:
                    break
            else:
                journal_version = log_version(cluster.location, journal_version)
                if journal_version >= journal_target:
                    break
            assert process.poll() is None, f"run {number} ended (rc {process.returncode}) before its kill"
            assert time.monotonic() < deadline, (
                f"run {number} made no progress in {PATIENCE} s: {log.read_text()[-3000:]}"
            )
            time.sleep(0.002)
        time.sleep(delay)
        assert process.poll() is None, f"run {number} ended (rc {process.returncode}) before its kill"
        kill_run(process, token)
        versions = {name: log_version(location, versions[name]) for name, location in locations.items()}
        query_id = _query_id(checkpoint)
        journal = _journal(cluster.location, query_id)
        replica_batches = {
            name: DeltaTable(location).transaction_version(query_id) for name, location in locations.items()
        }
        killed.append(
            {
                "run": number,
                "mode": mode,
                "delay_s": round(delay, 3),
                "messages_committed": sum(qms[name].depth("ORDERS") for name in REPLICAS),
                "last_replica_batches": replica_batches,
                "last_journal_batch": -1 if journal is None else journal["routed_batch"],
                "last_spark_batch": last_spark_commit(checkpoint),
            }
        )

    process, log = run(kills)
    logs.append(log)
    final_rc = finish_driver(process, token)
    elapsed = time.monotonic() - started

    # A replayed batch is one a run found (partly) committed: its log reports the skipped replica shares.
    # A run killed at once after a replay may lose those lines (its Python worker's output passes through
    # the JVM), but then Spark had not recorded the batch either, and the next run replays it again.
    replayed_batches = {int(n) for log in logs for n in REPLAYED.findall(log.read_text())}
    replayed = sum(len(set(REPLAYED.findall(log.read_text()))) for log in logs)
    # A kill after any replica commit of batch N and before Spark's commit log recorded N must make the
    # next run replay N, commit only the shares not yet committed, and skip the others.
    pending_batches = {
        max((b for b in kill["last_replica_batches"].values() if b is not None), default=-1)
        for kill in killed
        if max((b for b in kill["last_replica_batches"].values() if b is not None), default=-1)
        > kill["last_spark_batch"]
    }
    # Of those, the kills that left the batch's replica commits without their journal record.
    unrecorded = sum(
        max((b for b in kill["last_replica_batches"].values() if b is not None), default=-1)
        > kill["last_journal_batch"]
        for kill in killed
    )
    record_property("kills", json.dumps(killed))
    record_property("replayed_batches", replayed)
    print(
        f"\nkills: {len(killed)}: {killed}\nreplayed batches: {replayed} of {sorted(replayed_batches)} "
        f"(expected {sorted(pending_batches)}; {unrecorded} of them killed before the journal record); "
        f"{elapsed:.1f} s in all"
    )

    assert final_rc == 0, logs[-1].read_text()[-3000:]
    assert killed[-1]["messages_committed"] < len(expected), "the stream had drained before the last kill"

    # Every message on exactly one replica, once; nothing dead-lettered anywhere.
    placed = {name: qms[name].browse("ORDERS", order="physical") for name in REPLICAS}
    payloads = {name: [p.decode() for p in table["payload"].to_pylist()] for name, table in placed.items()}
    assert Counter(p for name in REPLICAS for p in payloads[name]) == Counter(expected)
    assert sum(qms[name].depth("ORDERS") for name in REPLICAS) == len(expected)
    assert all(payloads[name] for name in REPLICAS), {name: len(payloads[name]) for name in REPLICAS}
    assert {name: qm.depth(engine(qm).dead_letter_queue) for name, qm in qms.items()} == dict.fromkeys(qms, 0)

    # on_group: each group whole on one queue manager, its items in msg_seq_number order in logical
    # order, the last one last. Not in physical order: a restart may fold two input files into one
    # micro-batch, and one commit holds its tasks' rows in partition order (Spark packs the larger
    # file first), so a group's items 3-4 may stand before its items 1-2 in the same commit.
    if bind == "on_group":
        where: dict[str, set[str]] = defaultdict(set)
        items: dict[str, list[tuple[int, bool]]] = defaultdict(list)
        for name in REPLICAS:
            table = qms[name].browse("ORDERS")
            for group, seq, last in zip(
                table["group_id"].to_pylist(),
                table["msg_seq_number"].to_pylist(),
                table["last_in_group"].to_pylist(),
                strict=True,
            ):
                if group is not None:
                    where[group].add(name)
                    items[group].append((seq, last))
        assert {group: len(names) for group, names in where.items()} == dict.fromkeys(sizes, 1)
        for group, size in sizes.items():
            assert items[group] == [(seq, seq == size) for seq in range(1, size + 1)], group

    # One commit per replica per micro-batch at most, all by the one producer the restarts kept; every
    # batch 0..n-1 committed somewhere. A kill between Spark's file-source log and its offset log can
    # make the restarted source fold two input files into one micro-batch, so n may be below the
    # number of files.
    query_id = _query_id(checkpoint)
    last_batch = last_spark_commit(checkpoint)
    batches: list[int] = []
    for location in locations.values():
        puts = [commit for commit in DeltaTable(location).history() if commit.get("mqspark.operation") == "put"]
        assert {commit["mqspark.producer"] for commit in puts} == {query_id}
        own = [commit["mqspark.batch_id"] for commit in puts]
        assert len(own) == len(set(own)), f"a batch committed twice on {location}: {sorted(own)}"
        batches += own
    assert set(batches) == set(range(last_batch + 1))

    # The journal ended at the last batch, recorded by the repository's last commit, and every group
    # finished, so no binding of the producer is left.
    journal = _journal(cluster.location, query_id)
    assert journal is not None
    assert journal["routed_batch"] == last_batch
    assert journal["next_snapshot"] == DeltaTable(cluster.location).version()
    assert journal["routed_with"] < journal["next_snapshot"]
    bindings = [
        row
        for row in DeltaTable(cluster.location).to_pyarrow_table().to_pylist()
        if row["kind"] == "binding" and row["producer"] == query_id
    ]
    assert bindings == []

    assert replayed_batches == pending_batches
