"""The forwarding service as a spark-submit job: a drained run, a refused service, and a forwarder
killed with SIGKILL at random points, which must leave every request with exactly one reply.

Real ``spark-submit`` (the one pyspark ships), real processes and real Delta tables."""

from __future__ import annotations

import functools
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mqspark import QueueManager, store
from mqspark.engine.consumer_groups import ConsumerState

from .support.processes import (
    PATIENCE,
    finish_driver,
    first_printed,
    kill_marked,
    kill_run,
    last_spark_commit,
    log_version,
    start_process,
    wait_printed,
)

# Each forward job runs under spark-submit.
pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.xdist_group("drivers-a")]

SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
# The services the jobs run, importable as module:function by the driver and Spark's Python workers.
SERVICES = "tests.support.service_functions"
# The consumer group's lease: a run after a kill waits up to this long for the killed run's lease to
# lapse. Renewals commit every third of it, so a kill "at the state table's next commit" mostly hits a
# plan or a consumption record.
LEASE_S = 10


@functools.cache
def _job() -> str:
    found = subprocess.run(
        [sys.executable, "-m", "mqspark.cli", "job", "forward"], capture_output=True, text=True, check=True
    )
    return found.stdout.strip()


def _submit(root: str, *args: str) -> list[str]:
    return [
        SPARK_SUBMIT,
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        _job(),
        "--root",
        root,
        "--queue",
        "REQUESTS",
        *args,
    ]


def _requests(qm, count: int) -> list[str]:
    """Define the request and reply queues, and put ``count`` requests: their correlation ids."""
    qm.define_queue("REQUESTS")
    qm.define_queue("REPLIES")
    # Declared, as its depth is asked before the forwarder first reads.
    qm.declare_consumer("REQUESTS", "forward")
    return _put_requests(qm, range(count)) if count else []


def _put_requests(qm, numbers: range) -> list[str]:
    """Put request ``r{i}`` with correlation id ``c{i}`` for each i of ``numbers``: their correlation ids."""
    qm.put("REQUESTS", [{"payload": f"r{i}", "correl_id": f"c{i}", "reply_to_queue": "REPLIES"} for i in numbers])
    return [f"c{i}" for i in numbers]


def _top_up(qm, expected: list[str], waiting: int) -> None:
    """Put new requests until ``waiting`` wait for the forwarder: a run never drains the queue before
    its kill, however fast it goes, and little is left to drain after the last kill."""
    missing = waiting - qm.depth("REQUESTS", consumer="forward")
    if missing > 0:
        expected += _put_requests(qm, range(len(expected), len(expected) + missing))


def test_the_forward_job_drains_the_queue_under_spark_submit(qm, tmp_path):
    expected = _requests(qm, 20)
    token = uuid.uuid4().hex
    log = tmp_path / "forward.log"
    process = start_process(_submit(qm.root, "--service", f"{SERVICES}:upper", "--exit-when-empty"), log, token)
    assert finish_driver(process, token) == 0, log.read_text()[-3000:]
    replies = qm.browse("REPLIES")
    assert sorted(replies["correl_id"].to_pylist()) == sorted(expected)
    assert {c: p for c, p in zip(replies["correl_id"].to_pylist(), replies["payload"].to_pylist(), strict=True)} == {
        f"c{i}": f"R{i}".encode() for i in range(20)
    }
    assert qm.depth("REQUESTS", consumer="forward") == 0


def test_the_forward_job_refuses_a_service_it_cannot_import(qm, tmp_path):
    _requests(qm, 1)
    token = uuid.uuid4().hex
    log = tmp_path / "forward.log"
    process = start_process(_submit(qm.root, "--service", f"{SERVICES}:no_such_service"), log, token)
    assert finish_driver(process, token) == 1
    errors = [line for line in log.read_text().splitlines() if line.startswith("forward: error:")]
    assert errors == [
        "forward: error: forward: service 'tests.support.service_functions:no_such_service' cannot be imported: "
        "module 'tests.support.service_functions' has no attribute 'no_such_service'"
    ]
    assert qm.depth("REQUESTS", consumer="forward") == 1


def test_a_forwarder_killed_with_sigkill_leaves_exactly_one_reply_per_request(qm, tmp_path):
    kills = 3  # one of each moment below
    rng = random.Random(20261124)
    expected = _requests(qm, 0)
    replies = store.queue_location(qm.root, "REPLIES")
    state = store.state_location(qm.root, "REQUESTS")
    token = uuid.uuid4().hex
    command = _submit(
        qm.root,
        *("--service", f"{SERVICES}:upper", "--max-messages-per-trigger", "7", "--idle-interval", "0.1"),
        *("--lease-timeout", str(LEASE_S)),
    )
    moments = []
    for number in range(kills):
        # A run is killed within 4 batches of 7 (3 reply puts, then a delay or one more state commit).
        _top_up(qm, expected, 50)
        log = tmp_path / f"run-{number}.log"
        process = start_process(command, log, token)
        try:
            # Kill after the run's first or later reply put (the JVM start takes seconds), at once,
            # after a random delay, or at the state table's next commit (a reply record or a plan).
            target = log_version(replies) + rng.randint(1, 3)
            deadline = time.monotonic() + PATIENCE
            while log_version(replies) < target:
                assert process.poll() is None, f"run {number} ended: {log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"run {number} made no progress: {log.read_text()[-3000:]}"
                time.sleep(0.002)
            moment = ("at-put", "delay", "state-commit")[number % 3]
            if moment == "delay":
                time.sleep(rng.uniform(0.05, 0.8))
            elif moment == "state-commit":
                state_target = log_version(state) + 1
                while log_version(state) < state_target and process.poll() is None:
                    time.sleep(0.001)
            moments.append(moment)
        finally:
            kill_run(process, token)
    # The last run drains what is left in large batches: only its replay of the killed batch matters.
    log = tmp_path / "run-last.log"
    process = start_process([*command, "--max-messages-per-trigger", "1000", "--exit-when-empty"], log, token)
    assert finish_driver(process, token, timeout=300) == 0, log.read_text()[-3000:]
    kill_marked(token)
    got = qm.browse("REPLIES")["correl_id"].to_pylist()
    assert len(got) == len(set(got)), f"duplicated replies after kills at {moments}"
    assert sorted(got) == sorted(expected), f"lost replies after kills at {moments}"
    assert qm.depth("REQUESTS", consumer="forward") == 0


# How many times the test below sets up its state before it gives up: each kill races Spark's record of
# the batch, which it loses now and then on a loaded machine (once in the suite, on 2 cores).
GIVEN_UP_ATTEMPTS = 3


def test_a_batch_given_up_after_its_replies_were_put_gets_no_second_reply(tmp_path):
    """The batch's replies land, then the batch and its replay are both killed before Spark records
    it done: the next run gives the batch up and delivers its requests again in new batches, whose
    transactions are new. The reply records keep them from being answered twice."""
    for attempt in range(GIVEN_UP_ATTEMPTS):
        folder = tmp_path / f"attempt-{attempt}"
        qm = QueueManager.create(folder / "qm", "QM1")
        expected = _requests(qm, 10)
        if _killed_twice_before_the_batch_was_recorded_done(qm, folder):
            break
    else:
        pytest.fail(f"in {GIVEN_UP_ATTEMPTS} attempts, Spark recorded the batch done before a kill landed each time")
    log = folder / "run-last.log"
    token = uuid.uuid4().hex
    process = start_process([*_given_up_command(qm), "--exit-when-empty"], log, token)
    assert finish_driver(process, token, timeout=300) == 0, log.read_text()[-3000:]
    got = qm.browse("REPLIES")["correl_id"].to_pylist()
    assert sorted(got) == sorted(expected)
    assert qm.depth("REQUESTS", consumer="forward") == 0


def _given_up_command(qm) -> list[str]:
    return _submit(qm.root, "--service", f"{SERVICES}:upper", "--idle-interval", "0.1", "--lease-timeout", str(LEASE_S))


def _killed_twice_before_the_batch_was_recorded_done(qm, folder: Path) -> bool:
    """Run 0 is killed as soon as its replies have landed, run 1 as soon as it counts the replay; True
    when Spark had recorded neither batch done by then (the state the test needs)."""
    replies = store.queue_location(qm.root, "REPLIES")
    checkpoint = Path(store.forward_location(qm.root, "REQUESTS", "forward"))
    rows = ConsumerState(qm.root, "REQUESTS")
    token = uuid.uuid4().hex

    def run_until(number: int, done) -> None:
        log = folder / f"run-{number}.log"
        process = start_process(_given_up_command(qm), log, token)
        try:
            deadline = time.monotonic() + PATIENCE
            while not done():
                assert process.poll() is None, f"run {number} ended: {log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"run {number} made no progress: {log.read_text()[-3000:]}"
                time.sleep(0.001)
        finally:
            kill_run(process, token)

    run_until(0, lambda: log_version(replies) >= 1)
    if last_spark_commit(checkpoint) != -1:
        return False
    state = store.state_location(qm.root, "REQUESTS")
    read_at = -2

    def replay_counted() -> bool:
        # Read the state table only when its log has moved on: reading it every millisecond took a core.
        nonlocal read_at
        version = log_version(state, read_at)
        if version == read_at:
            return False
        read_at = version
        return rows.events("forward", ("rollback",)).num_rows > 0

    run_until(1, replay_counted)
    return last_spark_commit(checkpoint) == -1


def test_forwarder_instances_take_over_from_a_killed_active_one_with_exactly_one_reply_per_request(qm, tmp_path):
    """Two forward jobs run as instances of the forwarding service; the active one is SIGKILLed
    (its whole process tree) twice, and each time the standby takes over: first the one started with
    it, then the replacement started after the first kill (a third kill would repeat the second's
    case). Requests are put as they are answered, so the queue is not drained before the last kill,
    however fast the instances go."""
    expected = _requests(qm, 0)
    replies = store.queue_location(qm.root, "REPLIES")
    command = _submit(
        qm.root,
        *("--service", f"{SERVICES}:upper", "--max-messages-per-trigger", "5", "--idle-interval", "0.1"),
        *("--instance", "--lease-timeout", "5"),
    )
    running: dict[str, tuple[subprocess.Popen, Path]] = {}

    def start() -> str:
        token = uuid.uuid4().hex
        log = tmp_path / f"instance-{len(running)}.log"
        running[token] = (start_process(command, log, token), log)
        return token

    def reached(token: str, role: str, timeout: float = PATIENCE) -> str:
        return wait_printed(*running[token], role, timeout)

    try:
        _top_up(qm, expected, 20)
        # Both started at once: whichever takes the consumer group first is the active one.
        pair = [start(), start()]
        first = [reached(token, "standby") for token in pair]
        number = first_printed([running[token] for token in pair], [f"active {i}" for i in first], PATIENCE)
        active, standby = pair[number], pair[1 - number]
        ids = [first[number]]
        for kill in range(2):
            target = log_version(replies) + 2
            deadline = time.monotonic() + PATIENCE
            while log_version(replies) < target:
                _top_up(qm, expected, 20)
                assert time.monotonic() < deadline, f"no replies: {running[active][1].read_text()[-3000:]}"
                time.sleep(0.05)
            kill_run(running[active][0], active)
            ids.append(reached(standby, "active"))
            active = standby
            if kill == 0:
                standby = start()
                reached(standby, "standby")
        deadline = time.monotonic() + PATIENCE
        while qm.depth("REQUESTS", consumer="forward"):
            assert time.monotonic() < deadline, f"requests left: {running[active][1].read_text()[-3000:]}"
            time.sleep(0.2)
    finally:
        for token, (process, _) in running.items():
            if process.poll() is None:
                kill_run(process, token)
            kill_marked(token)
    assert len(set(ids)) == 3
    got = qm.browse("REPLIES")["correl_id"].to_pylist()
    assert len(got) == len(set(got)), "a request got two replies"
    assert sorted(got) == sorted(expected)
