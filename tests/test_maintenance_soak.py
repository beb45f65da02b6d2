"""Maintenance under load: queues shrink while producers, consumers, browsers and other maintenance runs go on.

Real processes (``spawn``, never fork: deltalake panics in forked children) on real Delta tables:

- a soak: two producers and a consumer run together while maintenance runs every two seconds with a
  retention of two seconds; every message must arrive exactly once, in logical order, and the table,
  its folder and its log must stay bounded;
- four producers, two consumer groups and a browse loop while the maintenance process is SIGKILLed
  mid-run several times and restarted;
- two maintenance processes started at once, round after round: only one may ever compact;
- maintenance back to back with retention 0 under puts and browses, which must never fail;
- a running get whose pending index is built again between planning a batch and reading it.

Every process records what it did (puts, deliveries, maintenance summaries with the time each step
took, browse checks) in files under the test's tmp_path, which the test then checks; failures a
process survives (a put that raised, a batch read again) are findings too. The soak and the kill
test also copy every log entry of the queue table as it appears, so the whole history can be
checked although maintenance cleans up the log.

Consumers are the streaming get's planner called directly (``QueueStreamReader``), as Spark's
planner process would, with the query's own background maintenance switched off.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import time
import traceback
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql.streaming.datasource import ReadMaxRows

from mqspark import MQError, QueueManager, Reason, store
from mqspark.engine import maintenance
from mqspark.spark.datasource import _get_options
from mqspark.spark.stream import QueueStreamReader

# Soaks run for minutes by design: a longer limit than the suite's 900 s.
pytestmark = pytest.mark.timeout(1800)

PRIORITIES = (0, 4, 9)
PAYLOAD_BYTES = 100
OUTPUT_COLUMNS = ["delivery_seq", "msg_id", "group_id", "msg_seq_number", "priority"]
# spawn, not fork: a forked child using deltalake after its parent did panics.
CONTEXT = multiprocessing.get_context("spawn")


# What producers put


def _seed(producer: str) -> int:
    return 20261123 + int(producer[1:])


def _put_plan(producer: str, puts: int, size: int, seed: int, group_share: float = 0.15) -> list[list[dict]]:
    """Deterministic puts of ``size`` messages each (the last one may hold more, to close every group).

    Most messages are ungrouped, at one of PRIORITIES. Groups of 3-8 items (one priority each) are
    spread over 1-3 consecutive puts of their producer, with other messages between their items.
    """
    rng = random.Random(seed)
    open_groups: list[dict] = []
    groups = 0
    plan = []
    for put in range(puts):
        rows: list[dict] = []
        last_put = put == puts - 1
        for group in list(open_groups):
            take = group["items"] if last_put else rng.randint(1, 3)
            while take and group["next"] <= group["items"]:
                rows.append(_message(producer, put, len(rows), rng, group))
                take -= 1
            if group["next"] > group["items"]:
                open_groups.remove(group)
        while len(rows) < size:
            if not last_put and len(open_groups) < 8 and rng.random() < group_share / 3:
                groups += 1
                group = {"id": f"{producer}-G{groups:04d}", "priority": rng.choice(PRIORITIES), "next": 1}
                group["items"] = rng.randint(3, 8)
                for _ in range(rng.randint(1, 3)):
                    rows.append(_message(producer, put, len(rows), rng, group))
                open_groups.append(group)
            else:
                rows.append(_message(producer, put, len(rows), rng, None))
        plan.append(rows)
    assert not open_groups
    return plan


def _message(producer: str, put: int, index: int, rng: random.Random, group: dict | None) -> dict:
    """Message ``index`` of put ``put``: ungrouped, or the next item of ``group``."""
    msg_id = f"{producer}-{put:05d}-{index:03d}"
    message = {"msg_id": msg_id, "payload": msg_id.encode().ljust(PAYLOAD_BYTES, b".")}
    if group is None:
        message["priority"] = rng.choice(PRIORITIES)
    else:
        message.update(
            group_id=group["id"],
            msg_seq_number=group["next"],
            priority=group["priority"],
            last_in_group=group["next"] == group["items"],
        )
        group["next"] += 1
    return message


def _failure() -> str:
    """The current exception in one line, with the mqspark frame it came through."""
    lines = traceback.format_exc().strip().splitlines()
    frames = [line.strip() for line in lines if line.strip().startswith('File "') and "/mqspark/" in line]
    return f"{lines[-1][:300]} (at {frames[-1] if frames else '?'})"


def _landed(location: str, msg_id: str) -> bool:
    """Whether a message with ``msg_id`` is live in the queue table (asked again while opening fails)."""
    for _ in range(50):
        try:
            table = (
                DeltaTable(location)
                .to_pyarrow_dataset()
                .to_table(columns=["msg_id"], filter=pc.field("msg_id") == msg_id)
            )
            return table.num_rows > 0
        except Exception:  # noqa: BLE001 - the same races as the put's; ask again
            time.sleep(0.1)
    raise AssertionError(f"could not tell whether {msg_id} landed")


def _producer(root: str, producer: str, puts: int, size: int, seed: int, record: str, pause: float, go) -> None:
    """Put the plan of ``producer``; after each put returns, append its messages to ``record``.

    A put that raises is noted with whether its messages landed anyway (its commit was made), and put
    again only if they did not: what a careful producer does, so that every message is put once."""
    plan = _put_plan(producer, puts, size, seed)
    qm = QueueManager.open(root)
    location = store.queue_location(qm.root, "Q")
    go.wait(120)
    started = time.monotonic()
    slowest = 0.0
    failures: list[dict] = []
    with open(record, "w") as out:
        for put, rows in enumerate(plan):
            for _ in range(20):
                began = time.monotonic()
                try:
                    qm.put("Q", rows)
                    break
                except Exception:  # noqa: BLE001 - every failure is recorded for the test to judge
                    failures.append({"put": put, "error": _failure(), "landed": _landed(location, rows[0]["msg_id"])})
                    if failures[-1]["landed"]:
                        break
                    time.sleep(0.05)
                finally:
                    slowest = max(slowest, time.monotonic() - began)
            else:
                raise AssertionError(f"put {put} failed 20 times: {failures[-3:]}")
            out.write(
                "".join(
                    f"{r['msg_id']},{r.get('group_id', '')},{r.get('msg_seq_number', 1)},{r['priority']},{put}\n"
                    for r in rows
                )
            )
            out.flush()
            if pause:
                time.sleep(pause)
    Path(record + ".done").write_text(
        json.dumps(
            {
                "puts": len(plan),
                "seconds": round(time.monotonic() - started, 1),
                "slowest_put_s": round(slowest, 2),
                "failures": failures,
            }
        )
    )


def _put_failures(records: list[str]) -> list[str]:
    """What went wrong with puts: each failure, and whether the put had landed although it raised."""
    failures = [f for record in records for f in json.loads(Path(record + ".done").read_text())["failures"]]
    if not failures:
        return []
    landed = [f for f in failures if f["landed"]]
    kinds = Counter(f["error"] for f in failures)
    return [
        f"{len(failures)} puts raised ({len(landed)} of them after their commit had landed): "
        + "; ".join(f"{count} x {error}" for error, count in kinds.most_common(4))
    ]


def _read_records(paths: list[str]) -> dict[str, dict]:
    """What the producers recorded as put: msg_id -> producer, group, seq, priority, put number."""
    put = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            msg_id, group_id, seq, priority, number = line.split(",")
            assert msg_id not in put, f"{msg_id} recorded twice"
            put[msg_id] = {
                "producer": msg_id.split("-")[0],
                "group_id": group_id or None,
                "msg_seq_number": int(seq),
                "priority": int(priority),
                "put": int(number),
                "index": int(msg_id.rsplit("-", 1)[1]),
            }
    return put


# Consumers


def _consumer(
    root: str,
    consumer: str,
    batch: int,
    extra: dict,
    expected: int,
    done,
    output: str,
    idle_after_done: float,
    pause: float = 0.0,
) -> None:
    """Drain the queue for ``consumer`` with the planner-level reader until ``expected`` messages came, or
    (once the producers are ``done``) nothing came for ``idle_after_done`` seconds, ``pause`` seconds
    after each batch (what processing it would take). Writes what it got, batch by batch, to
    ``output`` (Parquet), and a summary (or the error) next to it."""
    options = {"path": root, "queue": "Q", "consumer": consumer, "maintenanceinterval": "0", **extra}
    reader = QueueStreamReader(_get_options(options))
    pieces: list[pa.Table] = []
    got = batches = 0
    started = time.monotonic()
    last_progress = time.monotonic()
    slowest = 0.0
    error = None
    failures: list[str] = []
    try:
        start = reader.initialOffset()
        end = None
        while True:
            began = time.monotonic()
            try:
                # A batch that failed is read again from the same offsets, as a restarted query would.
                if end is None:
                    end = reader.latestOffset(start, ReadMaxRows(batch))
                if end == start:
                    # Nothing new: the batch that ended at ``start`` has been recorded as consumed.
                    end = None
                    if got >= expected:
                        break
                    if done.is_set() and time.monotonic() - last_progress > idle_after_done:
                        break
                    time.sleep(0.05)
                    continue
                read = [
                    pa.Table.from_batches([data]).select(OUTPUT_COLUMNS)
                    for partition in reader.partitions(start, end)
                    for data in reader.read(partition)
                ]
            except Exception:  # noqa: BLE001 - recorded for the test to judge; the batch is tried again
                failures.append(_failure())
                if len(failures) > 100:
                    raise
                time.sleep(0.2)
                continue
            for table in read:
                pieces.append(table.append_column("batch", pa.repeat(pa.scalar(batches, pa.int32()), table.num_rows)))
                got += table.num_rows
            batches += 1
            slowest = max(slowest, time.monotonic() - began)
            last_progress = time.monotonic()
            start, end = end, None
            time.sleep(pause)
    except BaseException:
        error = traceback.format_exc()
    finally:
        try:
            reader.stop()
        except Exception:  # noqa: BLE001 - the error that matters is the one above
            pass
        if pieces:
            pq.write_table(pa.concat_tables(pieces), output)
        Path(output + ".json").write_text(
            json.dumps(
                {
                    "consumer": consumer,
                    "got": got,
                    "batches": batches,
                    "seconds": round(time.monotonic() - started, 1),
                    "slowest_batch_s": round(slowest, 2),
                    "failures": failures,
                    "error": error,
                }
            )
        )
    if error:
        raise SystemExit(1)


def _delivered(output: str) -> pa.Table:
    if not Path(output).exists():
        return pa.table({name: pa.array([], pa.string()) for name in OUTPUT_COLUMNS})
    return pq.read_table(output)


def _order_problems(name: str, delivered: pa.Table, put: dict[str, dict]) -> list[str]:
    """What is wrong with one consumer group's deliveries: duplicates, unknown messages, delivery_seq
    not 0, 1, 2, ... in arrival order, group items out of order, or a producer's ungrouped messages of
    one priority out of put order."""
    problems = []
    rows = delivered.to_pylist()
    seqs = np.array([row["delivery_seq"] for row in rows], dtype=np.int64)
    if len(seqs) and not np.array_equal(seqs, np.arange(len(seqs))):
        bad = int(np.flatnonzero(seqs != np.arange(len(seqs)))[0])
        problems.append(f"{name}: delivery_seq is not 0, 1, 2, ... in arrival order (row {bad}: {seqs[bad]})")
    counts = Counter(row["msg_id"] for row in rows)
    twice = [msg_id for msg_id, count in counts.items() if count > 1]
    if twice:
        problems.append(f"{name}: {len(twice)} messages delivered more than once, e.g. {twice[:5]}")
    unknown = [msg_id for msg_id in counts if msg_id not in put]
    if unknown:
        problems.append(f"{name}: {len(unknown)} messages delivered that no producer recorded, e.g. {unknown[:5]}")
    by_group = defaultdict(list)
    lanes = defaultdict(list)
    for row in rows:
        if row["group_id"] is not None:
            by_group[row["group_id"]].append(row["msg_seq_number"])
        elif row["msg_id"] in put:
            origin = put[row["msg_id"]]
            lanes[(origin["producer"], origin["priority"])].append((origin["put"], origin["index"]))
    disordered = [group for group, seq in by_group.items() if seq != list(range(1, len(seq) + 1))]
    if disordered:
        problems.append(
            f"{name}: {len(disordered)} groups not delivered as items 1, 2, 3, ..., e.g. "
            + "; ".join(f"{group}: {by_group[group][:10]}" for group in disordered[:3])
        )
    out_of_put_order = [lane for lane, keys in lanes.items() if keys != sorted(keys)]
    if out_of_put_order:
        problems.append(f"{name}: ungrouped messages out of put order in lanes {out_of_put_order[:5]}")
    return problems


def _missing_problems(name: str, delivered: pa.Table, put: dict[str, dict]) -> tuple[list[str], set[str]]:
    got = set(delivered["msg_id"].to_pylist())
    missing = set(put) - got
    if not missing:
        return [], missing
    grouped = {msg_id for msg_id in missing if put[msg_id]["group_id"] is not None}
    groups = {put[msg_id]["group_id"] for msg_id in grouped}
    partly = {put[msg_id]["group_id"] for msg_id in got if msg_id in put and put[msg_id]["group_id"] in groups}
    return [
        f"{name}: {len(missing)} of {len(put)} messages never delivered ({len(grouped)} of them items of "
        f"{len(groups)} groups, {len(partly)} of those groups partly delivered), e.g. {sorted(missing)[:5]}"
    ], missing


# Maintenance


def _table_stats(location: str) -> dict:
    """Files in the folder (listed first), then the live files and bytes, and the log's entries."""
    folder = [name for name in os.listdir(location) if name.endswith(".parquet")]
    log = os.listdir(f"{location}/_delta_log")
    table = DeltaTable(location)
    actions = pa.table(table.get_add_actions())
    return {
        "folder_parquet": len(folder),
        "live_files": actions.num_rows,
        "live_bytes": int(pc.sum(actions["size_bytes"]).as_py() or 0),
        "live_rows": int(pc.sum(actions["num_records"]).as_py() or 0),
        "log_json": sum(name.endswith(".json") for name in log),
        "log_checkpoints": sum(name.endswith(".checkpoint.parquet") for name in log),
        "version": table.version(),
    }


def _profile() -> dict[str, list[float]]:
    """Time the steps of maintenance runs in this process: calls and seconds per step, and commit attempts
    that lost to a concurrent commit (``CommitFailedError``)."""
    from deltalake.exceptions import CommitFailedError

    from mqspark.engine import depth
    from mqspark.engine import maintenance as module
    from mqspark.engine.consumer_groups import ConsumerState
    from mqspark.engine.state_compaction import Compaction

    totals: dict[str, list[float]] = {}
    steps = [
        (module, "_prepared_table"),
        (depth, "live_messages"),
        (ConsumerState, "acquire"),
        (ConsumerState, "release"),
        (ConsumerState, "all_groups"),
        (module, "_kept_rows"),
        (module, "_write"),
        (module, "_commit"),
        (module, "_tidy"),
        (store, "delete_removed_files"),
        (Compaction, "compact"),
        (store, "commit_files"),
    ]
    for owner, name in steps:
        setattr(owner, name, _timed(getattr(owner, name), name, totals, CommitFailedError))
    return totals


def _timed(original, name: str, totals: dict[str, list[float]], lost: type[Exception]):
    def timed(*args, **kwargs):
        began = time.monotonic()
        entry = totals.setdefault(name, [0, 0.0, 0])
        try:
            return original(*args, **kwargs)
        except lost:
            entry[2] += 1
            raise
        finally:
            entry[0] += 1
            entry[1] = round(entry[1] + time.monotonic() - began, 3)

    return timed


def _maintainer(root: str, retention_s: float, interval: float, stop, log: str, lease_s: float | None = None) -> None:
    """Maintenance every ``interval`` seconds until ``stop``. Each run appends to ``log`` a ``begin`` line,
    then its summary (with the files its commit removed, the table's stats after it, and the time its
    steps took: calls, seconds, lost commits), a 2042 refusal, or any other error. With ``lease_s``, the
    maintenance lease this process takes, and judges others' by, lapses after that many seconds."""
    if lease_s is not None:
        maintenance.LEASE_TIMEOUT = timedelta(seconds=lease_s)
    qm = QueueManager.open(root)
    location = store.queue_location(qm.root, "Q")
    steps = _profile()
    with open(log, "a") as out:

        def note(**entry) -> None:
            out.write(json.dumps({"pid": os.getpid(), "t": time.time(), **entry}) + "\n")
            out.flush()

        run = 0
        while not stop.is_set():
            run += 1
            steps.clear()
            note(event="begin", run=run)
            try:
                summary = qm.maintain("Q", retention=timedelta(seconds=retention_s))
            except MQError as error:
                if error.reason == Reason.MQRC_OBJECT_IN_USE:
                    note(event="refused", run=run)
                else:
                    note(event="error", run=run, error=_failure())
            except Exception:  # noqa: BLE001 - recorded for the test to judge
                note(event="error", run=run, error=_failure())
            else:
                removed = len(store.log_entry(location, summary.version).removed) if summary.version else 0
                stats = _table_stats(location)
                note(event="done", run=run, summary=summary.as_dict(), removed=removed, stats=stats, steps=steps)
            stop.wait(interval)


def _archiver(location: str, archive: str, stop) -> None:
    """Copy every log entry of the table into ``archive`` as soon as it appears, before maintenance cleans
    it up, so the test can check the whole history afterwards."""
    os.makedirs(archive, exist_ok=True)
    seen: set[str] = set()
    while True:
        final = stop.is_set()
        for name in sorted(os.listdir(f"{location}/_delta_log")):
            if name.endswith(".json") and name not in seen:
                try:
                    shutil.copyfile(f"{location}/_delta_log/{name}", f"{archive}/{name}")
                    seen.add(name)
                except FileNotFoundError:
                    pass  # cleaned up before it was copied: a gap the history check reports
        if final:
            return
        time.sleep(0.02)


def _history(archive: Path) -> tuple[list[dict], list[str]]:
    """The archived log entries in version order (operation, added and removed paths, put messages), and
    what is wrong with that history: versions missing from the archive, a file added twice, a file
    removed that was not live, a maintenance commit whose count of removed files is off."""
    entries, problems = [], []
    versions = sorted(int(name.split(".")[0]) for name in os.listdir(archive))
    missing = sorted(set(range(versions[0], versions[-1] + 1)) - set(versions)) if versions else []
    if missing:
        problems.append(f"the archive missed {len(missing)} log entries, e.g. {missing[:5]}")
    live: set[str] = set()
    added_at: dict[str, int] = {}
    for version in versions:
        actions = [json.loads(line) for line in (archive / f"{version:020d}.json").read_text().splitlines() if line]
        info = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
        added = [action["add"]["path"] for action in actions if "add" in action]
        removed = [action["remove"]["path"] for action in actions if "remove" in action]
        entry = {
            "version": version,
            "operation": info.get("mqspark.operation") or info.get("operation"),
            "added": added,
            "removed": removed,
            "messages": info.get("mqspark.messages"),
        }
        entries.append(entry)
        for path in added:
            if path in added_at:
                problems.append(
                    f"version {version} ({entry['operation']}) added {path}, added before at {added_at[path]}"
                )
            added_at[path] = version
        for path in removed:
            if path not in live and not missing:
                problems.append(f"version {version} ({entry['operation']}) removed {path}, which was not live")
            live.discard(path)
        live |= set(added)
        if entry["operation"] == "maintain" and info.get("mqspark.files_removed") != len(removed):
            problems.append(f"version {version}: maintain commit says {info.get('mqspark.files_removed')} removed")
    return entries, problems


def _step_totals(runs: list[dict]) -> dict[str, list[float]]:
    """Calls, seconds and lost commits of each maintenance step, summed over ``runs``."""
    totals: dict[str, list[float]] = {}
    for run in runs:
        for name, (calls, seconds, lost) in run.get("steps", {}).items():
            entry = totals.setdefault(name, [0, 0.0, 0])
            entry[0] += calls
            entry[1] = round(entry[1] + seconds, 3)
            entry[2] += lost
    return totals


def _runs(log: Path) -> list[dict]:
    """The maintenance log's entries; a line a SIGKILL cut short (or one being written) is skipped."""
    entries = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            entries.append(json.loads(line))
        except ValueError:
            pass
    return entries


def _maintain_until_done(qm, retention: timedelta, deadline: float):
    """One maintenance run, waiting out a lease left by a killed run."""
    while True:
        try:
            return qm.maintain("Q", retention=retention)
        except MQError as error:
            if error.reason != Reason.MQRC_OBJECT_IN_USE or time.monotonic() > deadline:
                raise
            time.sleep(1)


def _stop(processes: list) -> None:
    """Kill (by pid) whichever of our processes is still alive."""
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(10)


# 1. The soak

SOAK_PRODUCERS = 2
SOAK_PUTS = 500  # per producer: 2 x 500 puts of ~100 messages, ~100k messages
SOAK_PUT_SIZE = 100
SOAK_BATCH = 2000
SOAK_RETENTION = timedelta(seconds=2)
SOAK_INTERVAL = 2.0


@pytest.mark.slow
def test_soak_producers_consumer_and_maintenance_every_two_seconds(qm, tmp_path, record_property):
    qm.define_queue("Q", delivery_sequence="priority")
    location = store.queue_location(qm.root, "Q")
    names = [f"P{n}" for n in range(SOAK_PRODUCERS)]
    expected = sum(len(rows) for name in names for rows in _put_plan(name, SOAK_PUTS, SOAK_PUT_SIZE, seed=_seed(name)))
    go, done, stop = CONTEXT.Event(), CONTEXT.Event(), CONTEXT.Event()
    records = [str(tmp_path / f"{name}.csv") for name in names]
    output = str(tmp_path / "consumer.parquet")
    maintenance_log = tmp_path / "maintenance.jsonl"
    producers = [
        CONTEXT.Process(
            target=_producer,
            args=(qm.root, name, SOAK_PUTS, SOAK_PUT_SIZE, _seed(name), record, 0.0, go),
        )
        for name, record in zip(names, records, strict=True)
    ]
    consumer = CONTEXT.Process(target=_consumer, args=(qm.root, "c", SOAK_BATCH, {}, expected, done, output, 20.0))
    maintainer = CONTEXT.Process(
        target=_maintainer,
        args=(qm.root, SOAK_RETENTION.total_seconds(), SOAK_INTERVAL, stop, str(maintenance_log)),
    )
    archived = CONTEXT.Event()
    archive = tmp_path / "log"
    # A daemon: whatever fails, it does not outlive the test.
    archiver = CONTEXT.Process(target=_archiver, args=(location, str(archive), archived), daemon=True)
    everything = [*producers, consumer, maintainer, archiver]
    started = time.monotonic()
    try:
        for process in everything:
            process.start()
        go.set()
        for process in producers:
            process.join(300)
        produced_in = time.monotonic() - started
        done.set()
        consumer.join(180)
        stop.set()
        maintainer.join(120)
    except BaseException:
        archived.set()
        raise
    finally:
        done.set()
        stop.set()
        _stop([process for process in everything if process is not archiver])
    assert [p.exitcode for p in producers] == [0] * len(producers), "a producer failed (see its output above)"
    consumer_report = json.loads(Path(output + ".json").read_text())
    assert consumer_report["error"] is None, consumer_report["error"]
    assert consumer.exitcode == 0
    assert maintainer.exitcode == 0

    runs = _runs(maintenance_log)
    done_runs = [run for run in runs if run["event"] == "done"]
    errors = [run["error"] for run in runs if run["event"] == "error"]
    compactions = [run for run in done_runs if run["summary"]["version"] is not None]
    removing = [run for run in done_runs if run["summary"]["removed_consumed"]]

    # The end: everything consumed is recorded, so a run removes it; one more after the retention deletes
    # the files that run removed and cleans up the log behind its checkpoint.
    final = [qm.maintain("Q", retention=SOAK_RETENTION).as_dict()]
    time.sleep(SOAK_RETENTION.total_seconds() + 0.5)
    final.append(qm.maintain("Q", retention=SOAK_RETENTION).as_dict())
    archived.set()
    archiver.join(60)
    _stop([archiver])
    entries, history_problems = _history(archive)
    stats = _table_stats(location)
    waiting = qm.depth("Q")
    log_names = os.listdir(f"{location}/_delta_log")

    put = _read_records(records)
    delivered = _delivered(output)
    in_run = max(done_runs, key=lambda run: run["stats"]["folder_parquet"])["stats"] if done_runs else {}
    report = {
        "messages": len(put),
        "delivered": delivered.num_rows,
        "producers": [json.loads(Path(r + ".done").read_text()) for r in records],
        "produced_in_s": round(produced_in, 1),
        "consumer": consumer_report,
        "maintenance_runs": len(done_runs),
        # Refused while a put ran maintenance itself (a put that leaves 256 files or more does).
        "maintenance_refused": sum(1 for run in runs if run["event"] == "refused"),
        "compactions": len(compactions),
        "runs_removing": len(removing),
        "slowest_run_s": max((run["summary"]["seconds"] for run in done_runs), default=None),
        "max_live_files_after_run": max((run["stats"]["live_files"] for run in done_runs), default=None),
        "max_folder_parquet_after_run": in_run.get("folder_parquet"),
        "max_log_json_after_run": max((run["stats"]["log_json"] for run in done_runs), default=None),
        "puts_in_log": sum(1 for entry in entries if entry["operation"] == "put"),
        "maintenance_steps": _step_totals(done_runs),
        "slowest_run_steps": max(done_runs, key=lambda run: run["summary"]["seconds"])["steps"] if done_runs else {},
        "final_runs": final,
        "final": stats,
        "waiting": waiting,
        "seconds": round(time.monotonic() - started, 1),
    }
    record_property("soak", json.dumps(report))
    print("\nsoak:", json.dumps(report, indent=1))

    assert len(put) == expected
    assert expected >= 50_000 and SOAK_PRODUCERS * SOAK_PUTS >= 1_000
    # Maintenance really ran while the producers and the consumer did, and removed what was consumed.
    assert len(compactions) >= 10, report
    assert len(removing) >= 5, report
    assert min(run["t"] for run in removing) - runs[0]["t"] < produced_in, "nothing was removed while producing"

    # Failures of a process that it survived (see _producer and _consumer) are findings as well.
    problems = _put_failures(records)
    if consumer_report["failures"]:
        failed = consumer_report["failures"]
        problems.append(f"the consumer failed {len(failed)} times: {failed[:3]}")
    if errors:
        problems.append(f"{len(errors)} maintenance runs failed: {errors[:2]}")
    problems += _order_problems("soak consumer", delivered, put)
    missing_problems, missing = _missing_problems("soak consumer", delivered, put)
    problems += missing_problems
    problems += history_problems
    # Bounds while it ran. After each run, the folder holds the live files; the files removed by the
    # maintenance commits since the end of the run before the last one (the older ones were deleted once
    # their commit was older than the retention; a put that leaves 256 files runs maintenance too); and
    # at most one file per producer written but not yet committed.
    removed_at = {entry["version"]: len(entry["removed"]) for entry in entries if entry["operation"] == "maintain"}
    ends = [-1, -1] + [run["stats"]["version"] for run in done_runs]
    for number, run in enumerate(done_runs):
        window = sum(count for version, count in removed_at.items() if ends[number] < version <= ends[number + 2])
        allowed = run["stats"]["live_files"] + window + SOAK_PRODUCERS
        if run["stats"]["folder_parquet"] > allowed:
            problems.append(f"run {run['run']}: folder holds {run['stats']} beyond {allowed}")
    # Bounds at the end: only what waits is live (the messages the consumer never got), in at most one
    # compacted file; no removed file is left in the folder; the log is a checkpoint and a few entries.
    if stats["live_rows"] != waiting or waiting != len(missing):
        problems.append(f"live rows {stats['live_rows']}, waiting {waiting}, never delivered {len(missing)}")
    if stats["live_files"] > (1 if waiting else 0):
        problems.append(f"{stats['live_files']} live files for {waiting} waiting messages")
    if stats["live_bytes"] > 64 * 1024 + 400 * waiting:
        problems.append(f"{stats['live_bytes']} live bytes for {waiting} waiting messages")
    if stats["folder_parquet"] != stats["live_files"]:
        problems.append(f"folder holds {stats['folder_parquet']} parquet files, {stats['live_files']} live")
    if not any(name.endswith(".checkpoint.parquet") for name in log_names) or stats["log_json"] > 5:
        problems.append(f"log not cleaned up: {sorted(log_names)}")
    assert not problems, "\n".join(problems)


# 2. Many processes, and maintenance killed mid-run

BUSY_PRODUCERS = 4
BUSY_PUTS = 90  # per producer
BUSY_PUT_SIZE = 30
BUSY_PAUSE = 0.4
BUSY_RETENTION = 2.0
KILLS = 3
MORE_KILLS = 6
# The maintenance processes' lease: a kill inside a run leaves it held until it lapses, and every run
# is refused meanwhile. With the default 30 s, three kills took over 60 s of a workload that lasts about
# 40, and the runs that removed messages came down to the 4 the test needs (4 of 76 runs, 70 refused).
BUSY_LEASE_S = 5.0
# Group a takes whole groups per batch (allMessagesAvailable), group b lets a batch end inside a group.
CONSUMERS = {"a": (300, {"allmessagesavailable": "true"}), "b": (1000, {})}
# Each batch takes this long to process: the groups commit to the state table a few times a second, not
# at every put (they contend with the maintenance lease there).
CONSUMER_PAUSE = 0.3


def _browser(root: str, stop, report: str, pause: float = 0.2) -> None:
    """Browse the queue in logical order again and again until ``stop``. Every browse must succeed and
    be consistent: delivery_seq 0, 1, 2, ...; each group's items together as 1, 2, 3, ...; each
    producer's ungrouped messages of one priority in put order; and the messages two successive
    browses share in the same relative order."""
    qm = QueueManager.open(root)
    browses = failures = 0
    problems: list[str] = []
    largest = 0
    previous: dict[str, int] = {}
    while not stop.is_set():
        try:
            table = qm.browse("Q")
        except Exception:  # noqa: BLE001 - every failure is a finding
            failures += 1
            problems.append(f"browse {browses + failures} failed: {_failure()}")
            if len(problems) > 20:
                break
            stop.wait(0.2)
            continue
        browses += 1
        largest = max(largest, table.num_rows)
        rows = table.select(["msg_id", "group_id", "msg_seq_number", "priority", "delivery_seq"]).to_pylist()
        if [row["delivery_seq"] for row in rows] != list(range(len(rows))):
            problems.append(f"browse {browses}: delivery_seq not 0..n-1")
        groups: dict[str, list[tuple[int, int]]] = defaultdict(list)
        lanes: dict[tuple, list[str]] = defaultdict(list)
        for position, row in enumerate(rows):
            if row["group_id"] is not None:
                groups[row["group_id"]].append((position, row["msg_seq_number"]))
            else:
                lanes[(row["msg_id"].split("-")[0], row["priority"])].append(row["msg_id"])
        for group, items in groups.items():
            positions = [p for p, _ in items]
            if [s for _, s in items] != list(range(1, len(items) + 1)) or positions[-1] - positions[0] != len(
                items
            ) - 1:
                problems.append(f"browse {browses}: group {group} shown as {items[:10]}")
        for lane, ids in lanes.items():
            if ids != sorted(ids):
                problems.append(f"browse {browses}: lane {lane} out of put order")
        current = {row["msg_id"]: position for position, row in enumerate(rows)}
        common = [msg_id for msg_id in previous if msg_id in current]
        now = np.array([current[msg_id] for msg_id in common])
        if len(now) > 1 and not (np.diff(now) > 0).all():
            problems.append(f"browse {browses}: the {len(common)} messages it shares with the one before moved")
        previous = current
        if len(problems) > 20:
            break
        stop.wait(pause)
    Path(report).write_text(
        json.dumps({"browses": browses, "failures": failures, "largest": largest, "problems": problems[:20]})
    )


@pytest.mark.slow
def test_producers_two_groups_browse_and_a_maintenance_process_killed_mid_run(qm, tmp_path, record_property):
    qm.define_queue("Q", delivery_sequence="priority")
    location = store.queue_location(qm.root, "Q")
    names = [f"P{n}" for n in range(BUSY_PRODUCERS)]
    expected = sum(len(rows) for name in names for rows in _put_plan(name, BUSY_PUTS, BUSY_PUT_SIZE, seed=_seed(name)))
    # Both groups declared up front, so maintenance never removes what one of them has not consumed yet.
    for consumer in CONSUMERS:
        qm.declare_consumer("Q", consumer)
    go, done, stop, archived = CONTEXT.Event(), CONTEXT.Event(), CONTEXT.Event(), CONTEXT.Event()
    records = [str(tmp_path / f"{name}.csv") for name in names]
    outputs = {consumer: str(tmp_path / f"{consumer}.parquet") for consumer in CONSUMERS}
    maintenance_log = tmp_path / "maintenance.jsonl"
    browse_report = tmp_path / "browse.json"
    archive = tmp_path / "log"
    producers = [
        CONTEXT.Process(
            target=_producer,
            args=(qm.root, name, BUSY_PUTS, BUSY_PUT_SIZE, _seed(name), record, BUSY_PAUSE, go),
        )
        for name, record in zip(names, records, strict=True)
    ]
    consumers = [
        CONTEXT.Process(
            target=_consumer, args=(qm.root, name, batch, extra, expected, done, outputs[name], 20.0, CONSUMER_PAUSE)
        )
        for name, (batch, extra) in CONSUMERS.items()
    ]
    browser = CONTEXT.Process(target=_browser, args=(qm.root, stop, str(browse_report)))
    archiver = CONTEXT.Process(target=_archiver, args=(location, str(archive), archived), daemon=True)
    rng = random.Random(20261123)

    # Each maintenance process has a stop event of its own: a process SIGKILLed inside ``wait()`` or
    # ``is_set()`` leaves the event's lock taken, which would hang every other user of that event.
    stops = []

    def start_maintainer():
        stops.append(CONTEXT.Event())
        process = CONTEXT.Process(
            target=_maintainer,
            args=(qm.root, BUSY_RETENTION, 0.5, stops[-1], str(maintenance_log), BUSY_LEASE_S),
        )
        process.start()
        return process

    archiver.start()
    maintainers = [start_maintainer()]
    everything = [*producers, *consumers, browser]
    kills: list[dict] = []
    started = time.monotonic()
    try:
        for process in everything:
            process.start()
        go.set()
        # A kill often lands after its run ended (a run the groups' leases refused ends at once): kill
        # again, up to MORE_KILLS times, until one landed inside a run.
        while len(kills) < KILLS or (not any(k["mid_run"] for k in kills) and len(kills) < KILLS + MORE_KILLS):
            # Wait for a run that began after a successful one (the lease is free), then SIGKILL the
            # process somewhere inside that run: the last run's duration tells how long a run takes.
            deadline = time.monotonic() + 150
            while True:
                runs = [run for run in _runs(maintenance_log) if run["pid"] == maintainers[-1].pid]
                done_runs = [run for run in runs if run["event"] == "done"]
                if done_runs and runs[-1]["event"] == "begin" and runs[-1]["run"] > done_runs[-1]["run"]:
                    break
                assert maintainers[-1].is_alive(), "the maintenance process died"
                assert time.monotonic() < deadline, f"no maintenance run succeeded in 150 s: {runs[-3:]}"
                time.sleep(0.01)
            delay = rng.uniform(0, max(0.05, done_runs[-1]["summary"]["seconds"]))
            time.sleep(delay)
            maintainers[-1].kill()
            maintainers[-1].join(10)
            after = [run for run in _runs(maintenance_log) if run["pid"] == maintainers[-1].pid]
            kills.append(
                {
                    "at_s": round(time.monotonic() - started, 1),
                    "delay_s": round(delay, 3),
                    "mid_run": after[-1]["event"] == "begin",
                }
            )
            maintainers.append(start_maintainer())
        for process in producers:
            process.join(300)
        done.set()
        for process in consumers:
            process.join(240)
        stop.set()
        stops[-1].set()
        maintainers[-1].join(120)
        browser.join(120)
    finally:
        done.set()
        stop.set()
        stops[-1].set()
        _stop([*everything, *maintainers])
    assert [p.exitcode for p in producers] == [0] * len(producers)
    reports = {name: json.loads(Path(outputs[name] + ".json").read_text()) for name in CONSUMERS}
    for name, consumer_report in reports.items():
        assert consumer_report["error"] is None, f"consumer {name}: {consumer_report['error']}"
    assert [p.exitcode for p in consumers] == [0] * len(consumers)
    assert browser.exitcode == 0 and maintainers[-1].exitcode == 0

    # A last run (after a lease a kill left behind lapses) removes what both groups consumed.
    deadline = time.monotonic() + 3 * maintenance.LEASE_TIMEOUT.total_seconds()
    final = _maintain_until_done(qm, timedelta(seconds=BUSY_RETENTION), deadline)
    time.sleep(BUSY_RETENTION + 0.5)
    final_again = qm.maintain("Q", retention=timedelta(seconds=BUSY_RETENTION))
    stats = _table_stats(location)
    waiting = qm.depth("Q")
    archived.set()
    archiver.join(60)
    _stop([archiver])
    entries, history_problems = _history(archive)

    runs = _runs(maintenance_log)
    errors = [run["error"] for run in runs if run["event"] == "error"]
    browsing = json.loads(browse_report.read_text())
    put = _read_records(records)
    report = {
        "messages": len(put),
        "kills": kills,
        "runs": Counter(run["event"] for run in runs),
        "compactions": sum(1 for run in runs if run["event"] == "done" and run["summary"]["version"] is not None),
        "maintenance_steps": _step_totals([run for run in runs if run["event"] == "done"]),
        "producers": [json.loads(Path(r + ".done").read_text()) for r in records],
        "consumers": reports,
        "browse": {key: browsing[key] for key in ("browses", "failures", "largest")},
        "versions": len(entries),
        "final": [final.as_dict(), final_again.as_dict()],
        "table": stats,
        "seconds": round(time.monotonic() - started, 1),
    }
    record_property("busy", json.dumps(report))
    print("\nbusy:", json.dumps(report, indent=1, default=str))

    assert len(put) == expected
    assert any(kill["mid_run"] for kill in kills), "no kill landed inside a maintenance run"
    assert report["compactions"] >= KILLS + 1
    assert browsing["browses"] >= 50
    problems = _put_failures(records) + history_problems
    if errors:
        problems.append(f"{len(errors)} maintenance runs failed: {errors[:2]}")
    if browsing["failures"] or browsing["problems"]:
        problems.append(f"{browsing['failures']} browses failed; browse problems: {browsing['problems'][:3]}")
    for name in CONSUMERS:
        delivered = _delivered(outputs[name])
        if reports[name]["failures"]:
            problems.append(
                f"consumer {name} failed {len(reports[name]['failures'])} times: {reports[name]['failures'][:3]}"
            )
        problems += _order_problems(f"group {name}", delivered, put)
        problems += _missing_problems(f"group {name}", delivered, put)[0]
    # Everything consumed by both groups is gone; a killed run's written but uncommitted file stays (at
    # most one per kill inside a run: a run here writes one file).
    if stats["live_rows"] != 0 or waiting != 0:
        problems.append(f"after the last run: {stats}, depth {waiting}")
    orphans = stats["folder_parquet"] - stats["live_files"]
    if orphans > sum(kill["mid_run"] for kill in kills):
        problems.append(f"{orphans} parquet files in the folder are not live: {stats}, kills {kills}")
    assert not problems, "\n".join(problems)


# 3. Two maintenance processes at once

ROUNDS = 40
ROUND_PUTS = 8
ROUND_PUT_SIZE = 5


def _racing_maintainer(root: str, barrier, rounds: int, seed: int, log: str) -> None:
    """Each round: wait at ``barrier`` with the other maintainer and the test, run maintenance at once (in
    odd rounds after a random pause of up to 0.2 s, so that one run may also start as the other ends),
    note what happened, and wait at ``barrier`` again."""
    qm = QueueManager.open(root)
    rng = random.Random(seed)
    with open(log, "w") as out:
        for number in range(rounds):
            barrier.wait(120)
            if number % 2:
                time.sleep(rng.uniform(0, 0.2))
            entry = {"round": number}
            try:
                entry["summary"] = qm.maintain("Q", retention=timedelta(hours=1)).as_dict()
            except MQError as error:
                entry["reason"] = int(error.reason) if error.reason else None
                entry["error"] = str(error)
            except Exception:  # noqa: BLE001 - recorded for the test to judge
                entry["error"] = traceback.format_exc()
            out.write(json.dumps(entry) + "\n")
            out.flush()
            barrier.wait(120)


@pytest.mark.slow
def test_two_maintenance_processes_started_at_once_never_both_compact(qm, tmp_path, record_property):
    qm.define_queue("Q")
    location = store.queue_location(qm.root, "Q")
    barrier = CONTEXT.Barrier(3)
    logs = [tmp_path / f"maintainer-{n}.jsonl" for n in range(2)]
    racers = [
        CONTEXT.Process(target=_racing_maintainer, args=(qm.root, barrier, ROUNDS, seed, str(log)))
        for seed, log in enumerate(logs)
    ]
    reader = QueueStreamReader(
        _get_options({"path": qm.root, "queue": "Q", "consumer": "c", "maintenanceinterval": "0"})
    )
    put_ids: list[str] = []
    consumed: list[str] = []
    in_flight: list[str] = []
    rounds: list[dict] = []
    started = time.monotonic()
    try:
        for process in racers:
            process.start()
        start = reader.initialOffset()
        for number in range(ROUNDS):
            for put in range(ROUND_PUTS):
                put_ids += qm.put("Q", [{"payload": f"{number}-{put}-{n}"} for n in range(ROUND_PUT_SIZE)])
            # Consume about half of what came: the batch before is recorded consumed as this one is planned.
            end = reader.latestOffset(start, ReadMaxRows(ROUND_PUTS * ROUND_PUT_SIZE // 2))
            consumed += in_flight
            in_flight = []
            for partition in reader.partitions(start, end):
                for data in reader.read(partition):
                    in_flight += data.column("msg_id").to_pylist()
            start = end
            version = DeltaTable(location).version()
            barrier.wait(120)  # both maintainers go
            barrier.wait(120)  # both are done
            entries = [json.loads(log.read_text().splitlines()[number]) for log in logs]
            ids = DeltaTable(location).to_pyarrow_table(columns=["msg_id"])["msg_id"].to_pylist()
            rounds.append({"round": number, "version_before": version, "entries": entries, "rows": len(ids)})
            live = Counter(ids)
            expected = set(put_ids) - set(consumed)
            assert max(live.values(), default=1) == 1, f"round {number}: rows duplicated: {entries}"
            assert set(live) == expected, f"round {number}: {len(live)} rows, {len(expected)} expected: {entries}"
        for process in racers:
            process.join(60)
    finally:
        reader.stop()
        barrier.abort()
        _stop(racers)
    assert [p.exitcode for p in racers] == [0, 0]
    outcomes = Counter()
    for entry in rounds:
        ran = [e for e in entry["entries"] if "summary" in e and e["summary"]["version"] is not None]
        idle = [e for e in entry["entries"] if "summary" in e and e["summary"]["version"] is None]
        refused = [e for e in entry["entries"] if e.get("reason") == Reason.MQRC_OBJECT_IN_USE]
        assert len(ran) == 1 and len(idle) + len(refused) == 1, entry
        outcomes["refused" if refused else "found nothing to do"] += 1

    # The log (kept whole: retention 1 h) replayed: every maintenance commit removes only files live just
    # before it, so no two of them rewrote the same files, and its files are each removed at most once.
    live: set[str] = set()
    removed_by: dict[str, int] = {}
    maintain_commits = []
    for version in range(DeltaTable(location).version() + 1):
        entry = Path(f"{location}/_delta_log/{version:020d}.json").read_text()
        lines = [json.loads(line) for line in entry.splitlines() if line.strip()]
        info = next((line["commitInfo"] for line in lines if "commitInfo" in line), {})
        removes = [line["remove"]["path"] for line in lines if "remove" in line]
        for path in removes:
            assert path in live, f"version {version} ({info.get('mqspark.operation')}) removed {path}, not live"
            assert path not in removed_by, f"{path} removed by versions {removed_by[path]} and {version}"
            removed_by[path] = version
            live.discard(path)
        live |= {line["add"]["path"] for line in lines if "add" in line}
        if info.get("mqspark.operation") == "maintain":
            maintain_commits.append(version)
            assert info["mqspark.files_removed"] == len(removes)
    assert maintain_commits == [
        e["summary"]["version"] for entry in rounds for e in entry["entries"] if e.get("summary", {}).get("version")
    ]
    assert len(live) == len(DeltaTable(location).file_uris())
    report = {"rounds": len(rounds), "outcomes": outcomes, "seconds": round(time.monotonic() - started, 1)}
    record_property("race", json.dumps(report))
    print("\nrace:", report)
    assert outcomes["refused"] >= ROUNDS // 3, "the two runs hardly ever overlapped"


# 4. Log clean-up under readers and writers

CLEANUP_PUTS = 150  # per producer
CLEANUP_PUT_SIZE = 20


@pytest.mark.slow
def test_puts_and_browses_never_fail_while_maintenance_cleans_up_the_log(qm, tmp_path, record_property):
    """Maintenance back to back with retention 0 (every run checkpoints and cleans up the log behind it)
    while two producers put and a browse loop reads: no put and no browse may fail, and every message
    is on the queue once."""
    qm.define_queue("Q", delivery_sequence="priority")
    names = ["P0", "P1"]
    go, stop, browsing = CONTEXT.Event(), CONTEXT.Event(), CONTEXT.Event()
    records = [str(tmp_path / f"{name}.csv") for name in names]
    maintenance_log = tmp_path / "maintenance.jsonl"
    browse_report = tmp_path / "browse.json"
    producers = [
        CONTEXT.Process(
            target=_producer, args=(qm.root, name, CLEANUP_PUTS, CLEANUP_PUT_SIZE, _seed(name), record, 0.0, go)
        )
        for name, record in zip(names, records, strict=True)
    ]
    maintainer = CONTEXT.Process(target=_maintainer, args=(qm.root, 0.0, 0.0, stop, str(maintenance_log)))
    browser = CONTEXT.Process(target=_browser, args=(qm.root, browsing, str(browse_report), 0.0))
    everything = [*producers, maintainer, browser]
    started = time.monotonic()
    try:
        for process in everything:
            process.start()
        go.set()
        for process in producers:
            process.join(300)
        stop.set()
        browsing.set()
        maintainer.join(120)
        browser.join(120)
    finally:
        stop.set()
        browsing.set()
        _stop(everything)
    assert [p.exitcode for p in everything] == [0] * len(everything)
    runs = _runs(maintenance_log)
    done_runs = [run for run in runs if run["event"] == "done"]
    errors = [run["error"] for run in runs if run["event"] == "error"]
    browse = json.loads(browse_report.read_text())
    put = _read_records(records)
    shown = Counter(qm.browse("Q")["msg_id"].to_pylist())
    report = {
        "messages": len(put),
        "maintenance_runs": len(done_runs),
        "log_entries_removed": sum(run["summary"]["log_entries_removed"] for run in done_runs),
        "producers": [json.loads(Path(r + ".done").read_text()) for r in records],
        "browse": browse,
        "seconds": round(time.monotonic() - started, 1),
    }
    record_property("cleanup", json.dumps(report))
    print("\ncleanup:", json.dumps(report, indent=1))

    assert len(done_runs) >= 10 and report["log_entries_removed"] >= 100, "maintenance hardly cleaned up the log"
    problems = _put_failures(records)
    if errors:
        problems.append(f"{len(errors)} maintenance runs failed: {errors[:2]}")
    if browse["failures"] or browse["problems"]:
        problems.append(f"{browse['failures']} of {browse['browses']} browses failed: {browse['problems'][:3]}")
    if shown != Counter(list(put)):
        problems.append(f"the queue holds {sum(shown.values())} messages ({len(shown)} distinct), {len(put)} were put")
    assert not problems, "\n".join(problems)


# 5. The pending index built again between planning a batch and reading it


@pytest.mark.slow
def test_a_batch_planned_before_the_pending_index_is_built_again_is_consumed_once(qm):
    """A running get whose pending index maintenance left behind (it cleaned up the log entries after
    the index's version) builds the index again, here in partitions(), between planning a batch and
    recording it consumed. The batch must still count as consumed: delivered once, and nothing else
    taken for it."""
    qm.define_queue("Q")
    options = {"path": qm.root, "queue": "Q", "consumer": "c", "maintenanceinterval": "0"}
    reader = QueueStreamReader(_get_options(options))

    def read(start: dict, end: dict) -> list[str]:
        return [
            row["payload"].decode()
            for partition in reader.partitions(start, end)
            for data in reader.read(partition)
            for row in data.to_pylist()
        ]

    try:
        qm.put("Q", [{"payload": "x"}])
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadMaxRows(1))
        batches = [read(start, first)]
        qm.put("Q", [{"payload": f"y{n}"} for n in range(3)])
        # The first batch is recorded consumed; the second (y0..y2) is planned.
        second = reader.latestOffset(first, ReadMaxRows(3))
        qm.put("Q", [{"payload": f"z{n}"} for n in range(3)])
        qm.put("Q", [{"payload": "w"}])
        # Removes x, keeps y (planned), and cleans up every log entry behind the reader's index.
        summary = qm.maintain("Q", retention=timedelta(0))
        batches.append(read(first, second))
        third = reader.latestOffset(second, ReadMaxRows(100))
        batches.append(read(second, third))
        fourth = reader.latestOffset(third, ReadMaxRows(100))
        batches.append(read(third, fourth))
        waiting = qm.depth("Q", consumer="c")
    finally:
        reader.stop()
    assert summary.removed_consumed == 1 and summary.log_entries_removed > 0
    assert (batches, waiting) == ([["x"], ["y0", "y1", "y2"], ["z0", "z1", "z2", "w"], []], 0)
