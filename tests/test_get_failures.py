"""The streaming get under failures: a consumer driver killed with SIGKILL, groups in flight, and restarted.

Real processes, real Spark and real Delta tables on disk. The queue is filled before the consumer
starts, so its whole logical order is known up front; the consumer writes what it gets to a Delta
table (a sink that is itself exactly once per micro-batch), which must end up holding that order,
every message once, whatever the kills interrupted.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable

from mqspark import store
from mqspark.model.messages import MESSAGE_SCHEMA

from .support import reference_model
from .support.processes import (
    PATIENCE,
    kill_marked,
    kill_run,
    last_spark_commit,
    log_tail,
    log_version,
    start_driver,
)

# Every test runs consumers that are Spark drivers of their own (mqspark.session()).
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("drivers-a")]

PRIORITIES = (0, 3, 5, 9)
BATCH = 7
# A run after a kill waits up to this long for the killed run's lease to lapse; renewals commit every
# third of it, so a kill at the state table's next commit mostly hits a plan or a consumption record.
LEASE_S = 10
OUTPUT = ["msg_id", "group_id", "msg_seq_number", "offset", "priority", "payload", "delivery_seq"]

# A streaming get in its own process: BATCH messages per micro-batch (its fourth argument) into a Delta
# table, until drained.
CONSUMER_SCRIPT = f"""
import sys

import mqspark

root, output, checkpoint, batch = sys.argv[1:5]
spark = mqspark.session(
    app_name="mqspark-killed-consumer",
    master="local[2]",
    **{{
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
    }},
)
query = (
    spark.readStream.format("mq")
    .option("queue", "Q")
    .option("consumer", "crash")
    .option("maxMessagesPerTrigger", batch)
    .option("leaseTimeout", {LEASE_S})
    .load(root)
    .select({", ".join(repr(name) for name in OUTPUT)})
    .writeStream.format("delta")
    .option("checkpointLocation", checkpoint)
    .trigger(availableNow=True)
    .start(output)
)
query.awaitTermination()
spark.stop()
"""


def _group_items(rng: random.Random, group: int) -> list[dict]:
    """The items of one complete group, 3-8 logical messages at one priority, some of them in segments."""
    group_id, priority, count = f"G{group:02d}", rng.choice(PRIORITIES), rng.randint(3, 8)
    items = []
    for seq in range(1, count + 1):
        item = {
            "msg_id": f"{group_id}-{seq}",
            "group_id": group_id,
            "msg_seq_number": seq,
            "priority": priority,
            "last_in_group": seq == count,
        }
        if rng.random() < 0.3:
            offset, segments = 0, rng.randint(2, 3)
            for segment in range(segments):
                payload = f"{group_id}.{seq}.{segment}:" + "x" * rng.randint(0, 5)
                items.append(
                    {
                        **item,
                        "payload": payload,
                        "segmented": True,
                        "offset": offset,
                        "last_segment": segment == segments - 1,
                    }
                )
                offset += len(payload)
        else:
            items.append({**item, "payload": f"{group_id}.{seq}"})
    return items


def _fill(qm, rng: random.Random, groups: int, plain: int) -> int:
    """Put ``groups`` complete groups and ``plain`` ungrouped messages, interleaved over many puts.

    A group's items go in order but spread over 1-3 pieces, each put with whatever else comes along,
    so groups straddle puts with other messages between their items. Returns the number of puts.
    """
    pieces: dict[str, list[list[dict]]] = {}
    for group in range(groups):
        items = _group_items(rng, group)
        cuts = sorted(rng.sample(range(1, len(items)), rng.randint(0, 2)))
        bounds = [0, *cuts, len(items)]
        pieces[items[0]["group_id"]] = [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    tokens = [group_id for group_id, chunks in pieces.items() for _ in chunks] + list(range(plain))
    rng.shuffle(tokens)
    stream: list[list[dict]] = []
    for token in tokens:
        if isinstance(token, str):
            stream.append(pieces[token].pop(0))
        else:
            stream.append([{"msg_id": f"M{token:03d}", "payload": f"M{token}", "priority": rng.choice(PRIORITIES)}])
    puts = 0
    while stream:
        size = rng.randint(2, 8)
        qm.put("Q", [row for piece in stream[:size] for row in piece])
        stream = stream[size:]
        puts += 1
    return puts


def _pending_batches(checkpoint: Path) -> list[int]:
    """Micro-batches whose offsets Spark logged but whose commit it did not: a restart replays them."""
    offsets = checkpoint / "offsets"
    planned = {int(name) for name in os.listdir(offsets) if name.isdigit()} if offsets.exists() else set()
    return sorted(batch for batch in planned if batch > last_spark_commit(checkpoint))


def _output_rows(output: Path) -> list[dict]:
    if log_version(output) < 0:
        return []
    return DeltaTable(str(output)).to_pyarrow_table(columns=["group_id", "msg_seq_number", "offset"]).to_pylist()


def _last_state_event(location: Path) -> str:
    """The newest record of the state table other than a lease renewal."""
    events = DeltaTable(str(location)).to_pyarrow_table(columns=["event", "at"]).to_pylist()
    return max((row for row in events if row["event"] != "lease"), key=lambda row: row["at"])["event"]


def _groups_in_flight(delivered: list[dict], group_sizes: Counter) -> list[str]:
    """Groups of which some items, but not all, have reached the output table."""
    got = Counter(row["group_id"] for row in delivered if row["group_id"] is not None)
    return sorted(group_id for group_id, count in got.items() if count < group_sizes[group_id])


@pytest.mark.slow
def test_consumer_killed_with_sigkill_delivers_each_message_once_in_order(spark, qm, tmp_path, record_property):
    kills = 3  # one of each moment below
    rng = random.Random(20261122)
    qm.define_queue("Q", delivery_sequence="priority")
    puts = _fill(qm, rng, groups=12, plain=40)
    location = store.queue_location(qm.root, "Q")
    committed = store.read_committed(DeltaTable(location), MESSAGE_SCHEMA.names, MESSAGE_SCHEMA)
    rows = committed.to_pylist()
    expected = reference_model.delivered(rows, "priority", datetime.now(UTC))
    assert len(expected) == len(rows), "every message of the filled queue is deliverable"
    group_sizes = Counter(row["group_id"] for row in rows if row["group_id"] is not None)
    spread = {row["group_id"]: set() for row in rows if row["group_id"] is not None}
    for row in rows:
        if row["group_id"] is not None:
            spread[row["group_id"]].add(row["commit_version"])
    assert sum(len(versions) > 1 for versions in spread.values()) >= 5, "groups spread over several puts"
    assert any(row["segmented"] for row in rows)

    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER_SCRIPT)
    output, checkpoint = tmp_path / "output", tmp_path / "checkpoint"
    state_location = Path(store.state_location(qm.root, "Q"))
    token = uuid.uuid4().hex
    started = time.monotonic()

    def run(number: int, batch: int = BATCH) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"run-{number}.log"
        return start_driver([str(script), qm.root, str(output), str(checkpoint), str(batch)], log, token), log

    def wait_for(condition, process: subprocess.Popen, number: int, log: Path) -> None:
        deadline = time.monotonic() + PATIENCE
        while not condition():
            assert process.poll() is None, (
                f"run {number} ended (rc {process.returncode}) before its kill: {log_tail(log)}"
            )
            assert time.monotonic() < deadline, f"run {number} made no progress in {PATIENCE} s: {log_tail(log)}"
            time.sleep(0.002)

    killed: list[dict] = []
    replayed = 0
    process = None
    try:
        for number in range(kills):
            # When to kill: after the run's k-th new output commit (the JVM start takes 5-20 s, so a
            # wall-clock moment would often fall before the stream runs), then one of: at once (between
            # the sink's commit and Spark's commit log, so the restart replays the batch), after a random
            # delay (anywhere in the next micro-batch), or at the state table's next commit or the one
            # after (the last batch's consumption record, then the next plan, recorded before Spark logs
            # its offsets). The first kill hits batch 0. With 7 messages a batch and groups of 3-8 items,
            # some in segments, a group is mostly in flight.
            moment = ("at-commit", "delay", "state-commit")[number % 3]
            new_commits = 1 if number == 0 else rng.randint(1, 3)
            delay = rng.uniform(0.05, 0.8) if moment == "delay" else 0.0
            state_commits = rng.randint(1, 2) if moment == "state-commit" else 0
            target = log_version(output) + new_commits
            process, log = run(number)
            wait_for(lambda target=target: log_version(output) >= target, process, number, log)
            if state_commits:
                state_target = log_version(state_location) + state_commits
                wait_for(lambda target=state_target: log_version(state_location) >= target, process, number, log)
            time.sleep(delay)
            assert process.poll() is None, (
                f"run {number} ended (rc {process.returncode}) before its kill: {log_tail(log)}"
            )
            kill_run(process, token)
            delivered = _output_rows(output)
            pending = _pending_batches(checkpoint)
            replayed += len(pending)
            killed.append(
                {
                    "run": number,
                    "moment": moment + (f"+{state_commits}" if state_commits else ""),
                    "delay_s": round(delay, 3),
                    "output_version": log_version(output),
                    "rows_out": len(delivered),
                    "consumed": len(rows) - qm.depth("Q", consumer="crash"),
                    "last_state_event": _last_state_event(state_location),
                    "last_spark_batch": last_spark_commit(checkpoint),
                    "replays": pending,
                    "groups_in_flight": _groups_in_flight(delivered, group_sizes),
                }
            )
            # A message recorded consumed has reached the sink: a crash can redeliver, never lose.
            assert killed[-1]["consumed"] <= killed[-1]["rows_out"], killed[-1]

        # The last run drains what is left in large batches: only its replays and the order matter.
        process, log = run(kills, batch=1000)
        final_rc = process.wait(timeout=300)
    finally:
        if process is not None and process.poll() is None:
            kill_run(process, token)
        kill_marked(token)
        record_property("replayed_batches", replayed)
        record_property("kills", json.dumps(killed))
        table = "\n".join(json.dumps(kill) for kill in killed)
        print(
            f"\n{len(rows)} messages in {puts} puts, {len(group_sizes)} groups\nkills:\n{table}\n"
            f"replayed batches: {replayed}; {time.monotonic() - started:.1f} s in all"
        )

    assert final_rc == 0, log_tail(log)
    assert killed[-1]["rows_out"] < len(rows), "the stream had drained before the last kill"
    assert any(kill["groups_in_flight"] for kill in killed), "no kill landed with a group partly delivered"

    # Every message exactly once, delivery_seq 0..n-1 without repeats, in the reference model's order.
    got = spark.read.format("delta").load(str(output)).select(*OUTPUT)
    got_rows = got.collect()
    assert len(got_rows) == len(rows)
    assert Counter((row.msg_id, row.offset) for row in got_rows) == Counter(
        (row["msg_id"], row["offset"]) for row in rows
    )
    assert sorted(row.delivery_seq for row in got_rows) == list(range(len(rows)))
    wanted = spark.createDataFrame(
        [
            (row["msg_id"], row["group_id"], row["msg_seq_number"], row["offset"], row["priority"], row["payload"], seq)
            for seq, row in enumerate(expected)
        ],
        got.schema,
    )
    assert_df_equality(got.orderBy("delivery_seq"), wanted.orderBy("delivery_seq"), ignore_nullable=True)
    assert qm.depth("Q", consumer="crash") == 0
