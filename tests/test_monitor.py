"""The backlog monitor against real queues and state tables: exact points, group health, claimable
age, MQ events, the history table, the abort of a running query, and the CLI. The queue manager reads
a :class:`~mqspark.clock.ManualClock` the tests move, but for a running query's, whose pace is real."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from chispa import assert_df_equality

from mqspark import MQError, MQValidationError, QueueManager, Reason, store
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.waiting import waiting_messages
from mqspark.qmgr import engine
from mqspark.services.backlog_judge import Verdict
from mqspark.services.monitor import GroupStatus, Monitor, group_health

from .support.cli import mqspark

LEASE = timedelta(seconds=30)


@pytest.fixture
def qm(clocked_qm) -> QueueManager:
    return clocked_qm


@pytest.fixture
def system_qm(tmp_path) -> QueueManager:
    """A queue manager on the system's clock, for a monitor beside a running query."""
    return QueueManager.create(tmp_path / "qm", "QM1")


def _put(qm, count: int, queue: str = "Q", **fields) -> list[str]:
    return qm.put(queue, [{"payload": f"m{n}".encode(), **fields} for n in range(count)])


def _monitor(qm, **options) -> Monitor:
    """A monitor of group G, declared first as a monitor needs (declaring again changes nothing)."""
    qm.declare_consumer("Q", "G")
    given = {"watch_interval": 1.0, "watch_count": 1, "expected_count": 5, **options}
    return Monitor(qm, "Q", "G", **given)


def _active(qm, owner: str = "query-1") -> ConsumerState:
    """Hold the group's lease as a running query does (a real lease record in the state table)."""
    state = ConsumerState(qm.root, "Q", engine(qm).storage_options, clock=engine(qm).clock)
    state.acquire("G", owner, LEASE)
    return state


def _get_while_active(qm, count: int, owner: str = "query-1") -> None:
    """The group's running query consumes ``count`` messages: a get between its lease records."""
    state = ConsumerState(qm.root, "Q", engine(qm).storage_options, clock=engine(qm).clock)
    state.release("G", owner)
    assert qm.get("Q", "G", max_messages=count).num_rows == count
    state.acquire("G", owner, LEASE)


def test_a_point_counts_which_messages_of_the_previous_backlog_still_wait(qm, clock):
    qm.define_queue("Q")
    _put(qm, 10)
    monitor = _monitor(qm, history=False, expected_count=4)
    first = monitor.point()
    assert (first.backlog, first.judgement.still_waiting, first.judgement.processed) == (10, None, None)
    got = qm.get("Q", "G", max_messages=4)
    assert got["payload"].to_pylist() == [b"m0", b"m1", b"m2", b"m3"]
    # Five new messages replace the four got: the backlog grew by one, yet four were processed.
    _put(qm, 5)
    clock.advance(2)
    second = monitor.point()
    judgement = second.judgement
    assert (judgement.backlog, judgement.still_waiting, judgement.processed, judgement.previous_backlog) == (
        11,
        6,
        4,
        10,
    )
    assert (second.state.value, second.verdict.value) == ("judging", "continue")
    assert (second.at - first.at, second.rate_per_s) == (timedelta(seconds=2), 2.0)


@pytest.mark.parametrize("consumer", ["G", "H", "NEVER.READ"])
def test_a_points_backlog_and_depth_are_what_depth_counts_with_several_groups(qm, clock, consumer):
    qm.define_queue("Q")
    for group in ("G", "H", "NEVER.READ"):
        qm.declare_consumer("Q", group)
    _put(qm, 6)
    qm.put("Q", [{"payload": b"expired", "expiry": clock.now() + timedelta(seconds=0.5)}])
    assert qm.get("Q", "G", max_messages=4).num_rows == 4
    assert qm.get("Q", "H", max_messages=2).num_rows == 2
    clock.advance(0.6)
    point = Monitor(qm, "Q", consumer, watch_interval=1, watch_count=1, expected_count=1, history=False).point()
    assert (point.backlog, point.depth) == (qm.depth("Q", consumer), qm.depth("Q"))
    # NEVER.READ, declared and never read, still waits for all six: so does CURDEPTH.
    assert (point.backlog, point.depth) == ({"G": 2, "H": 4, "NEVER.READ": 6}[consumer], 6)


def test_judging_warns_when_the_group_falls_behind(qm, caplog):
    qm.define_queue("Q")
    _put(qm, 20)
    monitor = _monitor(qm, history=False, watch_count=10, expected_count=5)
    assert monitor.point().verdict is Verdict.CONTINUE
    qm.get("Q", "G", max_messages=2)
    with caplog.at_level("WARNING", logger="mqspark.monitor"):
        point = monitor.point()
    assert (point.verdict, point.judgement.processed) == (Verdict.WARN, 2)
    assert [record.getMessage() for record in caplog.records] == [
        "queue Q: consumer group 'G' is falling behind: it processed A=2 messages since the previous point, "
        "fewer than expected B=5 and than the previous backlog C=20; backlog now 18 (watch_count 10, "
        "watch_interval 1 s)"
    ]
    qm.get("Q", "G", max_messages=5)
    assert monitor.point().verdict is Verdict.CONTINUE


def test_the_claimable_age_leaves_out_delayed_and_retry_parked_messages(qm, clock):
    qm.define_queue("Q", retry_count=3, retry_delay=600)
    later = clock.now() + timedelta(hours=1)
    qm.put("Q", [{"payload": b"delayed", "available_at": later}])
    # Puts a second apart on the queue manager's clock: each message has a put time of its own.
    clock.advance(1)
    qm.put("Q", [{"payload": b"parked"}])
    clock.advance(1)
    qm.put("Q", [{"payload": b"ready"}])
    with pytest.raises(RuntimeError), qm.syncpoint_get("Q", "G") as got:
        assert got["payload"].to_pylist() == [b"parked"]
        raise RuntimeError("service failed")
    ready_put = waiting_messages(engine(qm), "Q", "G", ["put_time", "payload"])
    put_times = dict(zip(ready_put["payload"].to_pylist(), ready_put["put_time"].to_pylist(), strict=True))
    assert put_times[b"ready"] - put_times[b"parked"] == timedelta(seconds=1)
    clock.advance(1)
    now = clock.now()
    point = _monitor(qm, history=False).point(now)
    assert (point.backlog, point.claimable) == (3, 1)
    assert point.oldest_claimable_age_s == pytest.approx((now - put_times[b"ready"]).total_seconds())
    # Once its retry delay has passed, the parked message is claimable again and the oldest.
    after = now + timedelta(seconds=601)
    point = _monitor(qm, history=False).point(after)
    assert (point.claimable, point.oldest_claimable_age_s) == (2, (after - put_times[b"parked"]).total_seconds())


def test_stop_when_messages_wait_and_no_query_holds_the_lease(qm):
    qm.define_queue("Q")
    qm.declare_consumer("Q", "G")
    monitor = _monitor(qm, history=False)
    assert monitor.point().status is GroupStatus.OK
    _put(qm, 3)
    assert monitor.point().status is GroupStatus.STOP
    _active(qm)
    assert monitor.point().status is GroupStatus.STALL


def test_stall_when_an_active_group_processes_nothing_and_ok_once_it_does(qm):
    qm.define_queue("Q")
    _put(qm, 6)
    _active(qm)
    monitor = _monitor(qm, history=False)
    assert [monitor.point().status for _ in range(3)] == [GroupStatus.OK, GroupStatus.STALL, GroupStatus.STALL]
    # The window still holds points without progress, but this one processed: no longer a stall.
    _get_while_active(qm, 2)
    point = monitor.point()
    assert (point.status, point.judgement.processed) == (GroupStatus.OK, 2)


def test_group_health_measures_now_and_takes_warning_and_stall_from_the_monitors_newest_point(qm, clock):
    qm.define_queue("Q")
    qm.declare_consumer("Q", "G")
    _put(qm, 3)
    stopped = group_health(qm, "Q", "G")
    assert (stopped.status, stopped.backlog, stopped.claimable, stopped.active, stopped.rate_per_s) == (
        GroupStatus.STOP,
        3,
        3,
        False,
        None,
    )
    _active(qm)
    # Messages wait and a query holds the lease: only a monitor's window of points can tell more.
    assert (group_health(qm, "Q", "G").status, group_health(qm, "Q", "G").status_at) == (None, None)
    monitor = _monitor(qm)
    monitor.point()
    # A watch interval on: points at one moment have no rate.
    clock.advance(1)
    stalled = monitor.point()
    assert stalled.status is GroupStatus.STALL
    health = group_health(qm, "Q", "G")
    assert (health.status, health.status_at, health.rate_per_s) == (GroupStatus.STALL, stalled.at, 0.0)
    _get_while_active(qm, 3)
    assert (group_health(qm, "Q", "G").status, group_health(qm, "Q", "G").oldest_claimable_age_s) == (
        GroupStatus.OK,
        None,
    )


def test_depth_shows_each_groups_status_claimable_age_and_rate(qm, clock):
    qm.define_queue("Q")
    qm.declare_consumer("Q", "G")
    qm.put("Q", [{"payload": b"delayed", "available_at": clock.now() + timedelta(hours=1)}])
    clock.advance(1.5)
    qm.put("Q", [{"payload": b"ready"}])
    _active(qm)
    _monitor(qm).point()
    queue_row, group_row = json.loads(mqspark(qm.root, "--json", "depth", "Q", clock=clock).stdout)
    assert {key: queue_row[key] for key in ("consumer", "depth", "status", "claimable_age_s", "rate_per_s")} == {
        "consumer": None,
        "depth": 2,
        "status": None,
        "claimable_age_s": None,
        "rate_per_s": None,
    }
    assert {key: group_row[key] for key in ("consumer", "depth", "status", "rate_per_s")} == {
        "consumer": "G",
        "depth": 2,
        "status": "OK",
        "rate_per_s": None,
    }
    # The delayed message is the oldest waiting, not the oldest claimable: put 1.5 s before the ready one.
    assert (group_row["claimable_age_s"], group_row["oldest_age_s"]) == (0.0, 1.5)
    header, queue_line, group_line = mqspark(qm.root, "depth", "Q", clock=clock).stdout.splitlines()
    assert header.split() == [
        "queue",
        "consumer",
        "depth",
        "oldest_age_s",
        "status",
        "claimable_age_s",
        "rate_per_s",
        "held_by",
    ]
    assert group_line.split()[:3] + group_line.split()[4:5] + group_line.split()[-1:] == [
        "Q",
        "G",
        "2",
        "OK",
        "query-1",
    ]
    assert group_row["held_by"] == "query-1"


def test_warning_when_the_backlog_grows_across_the_window(qm):
    qm.define_queue("Q")
    _active(qm)
    monitor = _monitor(qm, history=False, window=3)
    statuses = []
    for _ in range(4):
        _put(qm, 4)
        _get_while_active(qm, 1)
        statuses.append(monitor.point().status)
    assert statuses == [GroupStatus.OK, GroupStatus.OK, GroupStatus.WARNING, GroupStatus.WARNING]
    _get_while_active(qm, 12)
    assert monitor.point().status is GroupStatus.OK


def test_depth_high_low_and_service_interval_events(qm, clock):
    qm.define_queue("Q", max_depth=10)
    monitor = _monitor(qm, history=False, depth_high=80, depth_low=20, service_interval=0.05)
    _put(qm, 8)
    # The clock moves only when told, so a slow machine cannot stretch the idle time between points.
    assert monitor.point().events == ("MQRC_Q_DEPTH_HIGH (2224)",)
    clock.advance(0.04)
    assert monitor.point().events == ()
    clock.advance(0.06)
    assert monitor.point().events == ("MQRC_Q_SERVICE_INTERVAL_HIGH (2226)",)
    qm.get("Q", "G", max_messages=6)
    clock.advance(0.1)
    assert monitor.point().events == (
        "MQRC_Q_DEPTH_LOW (2225)",
        "MQRC_Q_SERVICE_INTERVAL_OK (2227)",
    )
    clock.advance(0.04)
    assert monitor.point().events == ()
    clock.advance(0.06)
    assert monitor.point().events == ("MQRC_Q_SERVICE_INTERVAL_HIGH (2226)",)


def test_failed_messages_waiting_on_the_backout_and_dead_letter_queues_are_reported(qm):
    qm.define_queue("BQ")
    qm.define_queue("Q", backout_threshold=1, backout_queue="BQ")
    _put(qm, 2)
    with pytest.raises(RuntimeError), qm.syncpoint_get("Q", "G"):
        raise RuntimeError("bad")
    # The next get moves the message that reached the threshold, then gets the other one.
    assert qm.get("Q", "G")["payload"].to_pylist() == [b"m1"]
    point = _monitor(qm, history=False).point()
    assert (point.backed_out, point.errors, point.dead_letters) == (1, None, 0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"watch_interval": 0}, "monitor parameter watch_interval must be a number of seconds > 0, got 0"),
        ({"watch_count": -2}, "monitor parameter watch_count must be an integer >= 0, got -2"),
        ({"expected_count": 0}, "monitor parameter expected_count must be an integer >= 1, got 0"),
        ({"window": 1}, "monitor parameter window must be an integer >= 2, got 1"),
        ({"depth_high": 120}, "monitor parameter depth_high must be a percentage 0-100, got 120"),
        ({"depth_low": 90}, "monitor parameter depth_low (90) must not be above depth_high (80.0)"),
    ],
)
def test_parameter_errors(qm, options, message):
    qm.define_queue("Q")
    with pytest.raises(MQValidationError) as raised:
        _monitor(qm, **options)
    assert str(raised.value) == message


def test_an_unknown_queue_is_refused(qm):
    with pytest.raises(MQError) as raised:
        Monitor(qm, "NOPE", "G", watch_interval=1, watch_count=1, expected_count=1)
    assert raised.value.reason == Reason.MQRC_UNKNOWN_OBJECT_NAME


def test_every_point_is_in_the_history_table(qm, clock, spark):
    qm.define_queue("Q")
    _put(qm, 3)
    monitor = _monitor(qm, watch_count=2, expected_count=1)
    monitor.point()
    qm.get("Q", "G", max_messages=1)
    # A watch interval on, so that the points are ordered by their times.
    clock.advance(1)
    monitor.point()
    history = spark.read.format("delta").load(store.monitor_location(qm.root, "Q"))
    columns = ["consumer", "backlog", "still_waiting", "processed", "state", "verdict", "judged", "status"]
    expected = spark.createDataFrame(
        [
            ("G", 3, None, None, "judging", "continue", False, "STOP"),
            ("G", 2, 2, 1, "judging", "continue", True, "STOP"),
        ],
        history.select(columns).schema,
    )
    assert_df_equality(history.select(columns).orderBy("at"), expected)
    assert history.select("monitor").distinct().collect()[0][0] == monitor.id


def test_a_slow_consumer_gets_warn_points_then_abort_stops_its_query(system_qm, spark, tmp_path, caplog):
    # The query and its monitors run on the system's clock: the test polls for what they do.
    qm = system_qm
    qm.define_queue("Q")
    _put(qm, 300)
    processed = []

    def slow(batch, batch_id):
        processed.extend(row.payload for row in batch.select("payload").collect())
        time.sleep(0.5)

    query = (
        spark.readStream.format("mq")
        .option("path", qm.root)
        .option("queue", "Q")
        .option("consumer", "G")
        .option("maxMessagesPerTrigger", "5")
        .load()
        .writeStream.foreachBatch(slow)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        deadline = time.monotonic() + 60
        while not processed:
            assert time.monotonic() < deadline, "the query delivered nothing within 60 s"
            time.sleep(0.1)
        with caplog.at_level("WARNING", logger="mqspark.monitor"):
            warn = _monitor(qm, watch_interval=1.0, watch_count=10, expected_count=100).attach(query)
            deadline = time.monotonic() + 60
            while sum(1 for r in caplog.records if "is falling behind" in r.getMessage()) < 2:
                assert time.monotonic() < deadline, "no warn points within 60 s"
                assert warn.error is None
                time.sleep(0.2)
            warn.stop()
        assert query.isActive
        aborting = _monitor(qm, watch_interval=1.0, watch_count=10, expected_count=100, abort=True).attach(query)
        with pytest.raises(Exception) as raised:
            query.awaitTermination(120)
        aborting.stop()
    finally:
        query.stop()
    assert aborting.error is not None
    assert type(raised.value).__name__ == "StreamingQueryException"
    assert str(aborting.error) in str(raised.value)
    assert str(aborting.error).startswith(
        "MQRC_Q_SERVICE_INTERVAL_HIGH (2226): queue Q: consumer group 'G' is falling behind: it processed A="
    )
    history = spark.read.format("delta").load(store.monitor_location(qm.root, "Q"))
    points = {row["monitor"]: row["count"] for row in history.groupBy("monitor").count().collect()}
    assert points == {warn.id: warn.taken, aborting.id: aborting.taken}
    verdicts = [row.verdict for row in history.filter(history.monitor == aborting.id).orderBy("at").collect()]
    assert verdicts[-1] == "abort" and verdicts[:-1] == ["continue"] * (len(verdicts) - 1)
    # Nothing was lost: what the query did not process still waits for the group.
    assert qm.depth("Q", "G") == 300 - len(processed)


def test_cli_prints_a_line_per_point_and_exits_non_zero_on_abort(qm):
    qm.define_queue("Q")
    qm.declare_consumer("Q", "G")
    _put(qm, 4)
    common = ("monitor", "--queue", "Q", "--consumer", "G", "--watch-interval", "0.2", "--watch-count", "1")
    warned = mqspark(qm.root, *common, "--expected-count", "5", "--abort", "no", "--points", "2", "--json")
    assert (warned.returncode, warned.stderr) == (
        0,
        "mqspark: warning: queue Q: consumer group 'G' is falling behind: it processed A=0 messages since the "
        "previous point, fewer than expected B=5 and than the previous backlog C=4; backlog now 4 (watch_count 1, "
        "watch_interval 0.2 s)\n",
    )
    lines = [json.loads(line) for line in warned.stdout.splitlines()]
    assert [(p["backlog"], p["state"], p["verdict"], p["processed"], p["status"]) for p in lines] == [
        (4, "judging", "continue", None, "STOP"),
        (4, "judging", "warn", 0, "STOP"),
    ]
    aborted = mqspark(qm.root, *common, "--expected-count", "5", "--abort", "yes")
    assert aborted.returncode == 2
    first, second = aborted.stdout.splitlines()
    assert " Q G backlog=4 A=- B=5 C=- judging continue status=STOP " in first
    assert " Q G backlog=4 A=0 B=5 C=4 judging abort status=STOP " in second
    assert aborted.stderr == (
        "mqspark: error: MQRC_Q_SERVICE_INTERVAL_HIGH (2226): queue Q: consumer group 'G' is falling behind: it "
        "processed A=0 messages since the previous point, fewer than expected B=5 and than the previous backlog "
        "C=4; backlog now 4 (watch_count 1, watch_interval 0.2 s)\n"
    )
    bad = mqspark(qm.root, *common, "--expected-count", "0", "--abort", "no")
    assert (bad.returncode, bad.stderr) == (
        1,
        "mqspark: error: monitor parameter expected_count must be an integer >= 1, got 0\n",
    )
