"""Depth counted from ranges (issue 27's "count, don't scan"): ``qm.depth`` counts the messages of the
files a put wrote from the files' identity ranges and the groups' consumed ranges, and reads only
the other files; it must count exactly what the listed waiting messages are."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqspark import QueueManager, store
from mqspark.clock import ManualClock
from mqspark.engine.depth import put_files
from mqspark.engine.waiting import waiting_messages
from mqspark.model.ranges import (
    in_ranges,
    intersect_ranges,
    merge_ranges,
    overlap_counts,
    subtract_messages,
    subtract_ranges,
)
from mqspark.qmgr import engine

from .support.calls import record_calls

ORIGINS = ["1:0", "2:0", "10:3"]

range_rows = st.lists(
    st.tuples(st.sampled_from(ORIGINS), st.integers(0, 40), st.integers(0, 9)),
    max_size=6,
)


def _ranges(rows: list[tuple[str, int, int]]) -> pa.Table:
    return pa.table(
        {
            "origin": pa.array([origin for origin, _, _ in rows], pa.string()),
            "row": pa.array([row for _, row, _ in rows], pa.int64()),
            "count": pa.array([count for _, _, count in rows], pa.int64()),
        }
    )


def _identities(rows: list[tuple[str, int, int]]) -> set[tuple[str, int]]:
    return {(origin, row + n) for origin, row, count in rows for n in range(count)}


@settings(max_examples=300, deadline=None)
@given(st.lists(range_rows, min_size=1, max_size=3), range_rows)
def test_intersections_and_overlaps_of_ranges_are_those_of_their_identities(sets, probes):
    common = intersect_ranges([_ranges(rows) for rows in sets])
    expected = set.intersection(*(_identities(rows) for rows in sets))
    assert _identities(list(zip(*(common[name].to_pylist() for name in ("origin", "row", "count")), strict=True))) == (
        expected
    )
    assert sum(common["count"].to_pylist()) == len(expected)

    within = _identities(sets[0])
    overlaps = overlap_counts(_ranges(probes), _ranges(sets[0]))
    assert overlaps.tolist() == [len(_identities([probe]) & within) for probe in probes]


@settings(max_examples=300, deadline=None)
@given(range_rows, range_rows)
def test_a_difference_of_ranges_is_that_of_their_identities(ranges, minus):
    left = subtract_ranges(_ranges(ranges), _ranges(minus))
    rows = list(zip(*(left[name].to_pylist() for name in ("origin", "row", "count")), strict=True))
    assert _identities(rows) == _identities(ranges) - _identities(minus)
    # Merged: disjoint, none empty, none adjacent to the next of its origin.
    assert all(count > 0 for _, _, count in rows)
    assert all(a[0] != b[0] or a[1] + a[2] < b[1] for a, b in zip(rows, rows[1:], strict=False))


NO_POSITION = pa.table(
    {"origin": pa.nulls(1, pa.string()), "row": pa.nulls(1, pa.int64()), "count": pa.nulls(1, pa.int64())}
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([*ORIGINS, None]), st.integers(0, 40), st.integers(0, 9)), max_size=8),
    st.lists(st.tuples(st.sampled_from([*ORIGINS, "3:1"]), st.integers(0, 50)), max_size=8),
)
def test_merged_ranges_hold_the_same_identities_sorted_and_apart(rows, probes):
    # A checkpoint row holding only a position has no origin, row or count.
    merged = merge_ranges(pa.concat_tables([_ranges(rows), NO_POSITION]))
    kept = [row for row in rows if row[0] is not None]
    left = list(zip(*(merged[name].to_pylist() for name in ("origin", "row", "count")), strict=True))
    assert _identities(left) == _identities(kept)
    # Sorted by origin and row, none empty, none overlapping or adjacent to the next of its origin.
    assert left == sorted(left)
    assert all(count > 0 for _, _, count in left)
    assert all(a[0] != b[0] or a[1] + a[2] < b[1] for a, b in zip(left, left[1:], strict=False))
    origin = pa.array([origin for origin, _ in probes], pa.string())
    row = pa.array([row for _, row in probes], pa.int64())
    assert in_ranges(origin, row, _ranges(rows)).to_pylist() == [probe in _identities(kept) for probe in probes]
    without = subtract_messages(_ranges(rows), pa.table({"origin": origin, "row": row}))
    rest = list(zip(*(without[name].to_pylist() for name in ("origin", "row", "count")), strict=True))
    assert _identities(rest) == _identities(kept) - set(probes)
    assert rest == sorted(rest) and all(count > 0 for _, _, count in rest)


def _listed(qm, consumer: str | None = None) -> int:
    return waiting_messages(engine(qm), "Q", consumer).num_rows


def test_depth_counts_what_waits_through_gets_expiry_and_maintenance_reading_only_other_files(qm, monkeypatch):
    qm.define_queue("Q")
    rng = random.Random(27)
    now = datetime.now(UTC)
    for put in range(8):
        # Puts of several messages (files described by their statistics), and some with an expiry,
        # one of them already past (files that must be read).
        expiry = [None, now + timedelta(hours=1), now - timedelta(seconds=1), None][put % 4]
        qm.put("Q", [{"payload": f"{put}-{n}".encode(), "expiry": expiry} for n in range(rng.randint(2, 6))])
    for consumer in ("a", "b", "c"):
        qm.declare_consumer("Q", consumer)
    reads = record_calls(monkeypatch, store, "read_messages", 1)
    steps = []
    for step in range(6):
        qm.get("Q", "a", max_messages=rng.randint(1, 5))
        if step % 2:
            qm.get("Q", "b", max_messages=rng.randint(1, 4))
        if step == 3:
            qm.maintain("Q", timedelta(0))  # one file, rewritten: read
            qm.put("Q", [{"payload": f"after-{n}".encode()} for n in range(3)])
        reads.clear()
        counts = (qm.depth("Q"), qm.depth("Q", "a"), qm.depth("Q", "b"), qm.depth("Q", "c"))
        read = len(reads)
        listed = (_listed(qm), _listed(qm, "a"), _listed(qm, "b"), _listed(qm, "c"))
        steps.append((counts, listed))
        assert counts == listed, steps
        # Each depth read only the files a put did not describe by their statistics: those with an
        # expiry, and those maintenance rewrote.
        described = put_files(store.live_files(store.open_table(store.queue_location(qm.root, "Q"), None)))
        assert described.any() and not described.all()
        assert read == 4 * int((~described).sum()), (step, read, described)
    # Group a took more than b; c was declared and never read, so everything unexpired waits for it.
    assert 0 < steps[-1][0][1] < steps[-1][0][2] < steps[-1][0][3]


def test_a_groups_backlog_counted_from_ranges_is_what_listing_finds(qm, monkeypatch):
    """The monitor's measure of a group (waiting, CURDEPTH, claimable, oldest claimable put time), and
    the depth and oldest put time of each group and of the queue (``oldest_waiting``), agree with
    those computed from every listed message, through gets, failures parked by the retry delay,
    delayed and expiring messages and maintenance. Row groups of two rows: the oldest put time is
    looked for row group by row group. The producers' clocks disagree by minutes, so the files' put
    times are not in their order, and some files have no put time statistic (as files written
    before puts recorded it)."""
    from mqspark.engine.consumer_groups import ConsumerState
    from mqspark.model import put as put_module
    from mqspark.store import files

    class SkewedClock(datetime):
        skew = timedelta(0)

        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + cls.skew

    class Statistics(files._Stats):
        timestamps = True

        def to_json(self) -> str:
            if not self.timestamps:
                for bounds in (self.minimum, self.maximum):
                    bounds.pop("put_time", None)
            return super().to_json()

    monkeypatch.setattr(files, "ROW_GROUP_ROWS", 2)
    monkeypatch.setattr(put_module, "datetime", SkewedClock)
    monkeypatch.setattr(files, "_Stats", Statistics)
    from mqspark.engine.depth import waiting
    from mqspark.model.ranges import in_ranges
    from mqspark.services.monitor import parked_messages

    definition = qm.define_queue("Q", retry_delay=3600)
    rng = random.Random(7)
    now = datetime.now(UTC)
    for put in range(8):
        SkewedClock.skew = timedelta(minutes=rng.randint(-30, 30))
        Statistics.timestamps = put % 3 != 0
        later = now + timedelta(hours=1)
        kind = put % 4
        rows = [
            {"payload": f"{put}-{n}".encode(), "expiry": later if kind == 1 else None}
            | ({"available_at": later} if kind == 2 and n % 2 else {})
            for n in range(rng.randint(2, 5))
        ]
        qm.put("Q", rows)
    for consumer in ("a", "b", "c"):
        qm.declare_consumer("Q", consumer)
    state = ConsumerState(qm.root, "Q", None)
    for step in range(5):
        qm.get("Q", "a", max_messages=rng.randint(1, 3))
        with pytest.raises(RuntimeError), qm.syncpoint_get("Q", "b", max_messages=2):
            raise RuntimeError("parked for the retry delay")
        if step == 2:
            qm.maintain("Q", timedelta(0))
        moment = datetime.now(UTC)
        _, live = engine(qm).live_messages("Q", ["put_time", "available_at"])
        groups = state.all_groups()
        for consumer in ("a", "b", "c"):
            parked = parked_messages(definition, state, consumer, moment)
            backlog = engine(qm).group_backlog("Q", groups, moment, consumer, parked)
            mine = live.filter(pa.array(waiting(live, groups, moment, consumer)))
            delayed = pc.fill_null(
                pc.greater(mine["available_at"], pa.scalar(moment, mine["available_at"].type)), False
            )
            free = mine.filter(pc.invert(pc.or_(delayed, in_ranges(mine["origin"], mine["row"], parked))))
            expected = (
                set(zip(mine["origin"].to_pylist(), mine["row"].to_pylist(), strict=True)),
                mine.num_rows,
                int(waiting(live, groups, moment).sum()),
                free.num_rows,
                pc.min(free["put_time"]).as_py(),
            )
            rows = list(zip(*(backlog.waiting[name].to_pylist() for name in ("origin", "row", "count")), strict=True))
            found = (_identities(rows), backlog.count, backlog.depth, backlog.claimable, backlog.oldest_claimable)
            assert found == expected, (step, consumer)
        for consumer in ("a", "b", "c", None):
            mine = live.filter(pa.array(waiting(live, groups, moment, consumer)))
            expected_oldest = (mine.num_rows, pc.min(mine["put_time"]).as_py())
            assert engine(qm).oldest_waiting("Q", consumer) == expected_oldest, (step, consumer)
    # The groups differ: a consumed, b has parked messages, c waits for everything unexpired.
    assert backlog.claimable == backlog.count - sum(1 for row in live.to_pylist() if row["available_at"] is not None)
    assert parked_messages(definition, state, "b", moment).num_rows


def test_a_queues_backlog_asked_again_is_counted_again_only_after_a_commit_or_an_expiry(tmp_path, monkeypatch):
    """Pollers ask a queue's depth and oldest put time again and again: the answer is kept while the
    table version, the groups' records and every expiry stay as they were, and counted again once
    an expiry is reached (no commit), after a get, a group declared and a put. The queue manager
    reads a clock the test moves."""
    from mqspark.engine import queues

    clock = ManualClock()
    qm = QueueManager.create(tmp_path / "qm", "QM1", clock=clock)
    counted = record_calls(monkeypatch, queues, "oldest_waiting", 3)
    qm.define_queue("Q")
    qm.declare_consumer("Q", "a")
    qm.put("Q", [{"payload": b"first"}, {"payload": b"second"}])
    expiry = clock.now() + timedelta(hours=1)
    qm.put("Q", [{"payload": b"expiring", "expiry": expiry}])
    first_put = qm.browse("Q", order="physical")["put_time"][0].as_py()

    def backlog(consumer=None):
        found = qm.backlog("Q", consumer)
        return found.depth, found.oldest_put_time

    assert [backlog(), backlog("a"), backlog(), backlog("a")] == [(3, first_put), (3, first_put)] * 2
    assert counted == [None, "a"]
    clock.advance(timedelta(hours=1) - timedelta(microseconds=1))
    assert [backlog(), backlog("a")] == [(3, first_put)] * 2
    assert counted == [None, "a"]
    clock.advance(timedelta(microseconds=1))
    assert clock.now() == expiry
    assert [backlog(), backlog("a"), backlog()] == [(2, first_put)] * 3
    assert counted == [None, "a", None, "a"]
    qm.get("Q", "a", max_messages=1)
    assert [backlog(), backlog("a")] == [(1, first_put), (1, first_put)]
    qm.declare_consumer("Q", "b")
    assert [backlog(), backlog("b")] == [(2, first_put), (2, first_put)]
    qm.put("Q", [{"payload": b"third"}])
    assert [backlog(), backlog("b"), backlog("b")] == [(3, first_put), (3, first_put), (3, first_put)]
    assert counted == [None, "a", None, "a", None, "a", None, "b", None, "b"]


def test_a_groups_backlog_asked_again_is_counted_again_only_after_a_commit_a_delay_or_parked_messages(qm, monkeypatch):
    """A queue page asks each group's backlog again and again: the answer is kept while the table
    version, the groups' records and the parked messages stay as they were and no message it counts
    stopped being delayed or expired, and counted again after each of those."""
    from mqspark.engine import queues
    from mqspark.model.ranges import NO_RANGES, single_ranges

    counted = record_calls(monkeypatch, queues, "group_backlog", 2)
    qm.define_queue("Q")
    qm.declare_consumer("Q", "a")
    now = datetime.now(UTC)
    available = now + timedelta(hours=1)
    qm.put("Q", [{"payload": b"first"}, {"payload": b"delayed", "available_at": available}])
    state = engine(qm).consumer_state("Q")

    def claimable(at, parked=NO_RANGES):
        found = engine(qm).group_backlog("Q", state.all_groups(), at, "a", parked)
        return found.count, found.claimable

    assert [claimable(now), claimable(now + timedelta(minutes=1))] == [(2, 1), (2, 1)]
    assert counted == [now]
    assert claimable(available) == (2, 2)  # the delay ended: counted again
    assert counted == [now, available]
    assert claimable(now) == (2, 1)  # asked for a moment before the one counted for
    assert claimable(available) == (2, 2)
    assert counted == [now, available, now, available]
    _, live = engine(qm).live_messages("Q", [])
    first = live.sort_by("row").slice(0, 1)  # parked after a failure
    assert claimable(available, single_ranges(first)) == (2, 1)
    assert len(counted) == 5
    qm.get("Q", "a", max_messages=1)
    assert claimable(available) == (1, 1)
    assert len(counted) == 6
