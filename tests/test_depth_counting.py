"""Depth counted from ranges (issue 27's "count, don't scan"): ``qm.depth`` counts the messages of the
files a put wrote from the files' identity ranges and the groups' consumed ranges, and reads only
the other files; it must count exactly what the listed waiting messages are."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from mqspark import store
from mqspark.engine.depth import put_files
from mqspark.model.ranges import intersect_ranges, overlap_counts

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


def _listed(qm, consumer: str | None = None) -> int:
    return qm.waiting_messages("Q", consumer).num_rows


def test_depth_counts_what_waits_through_gets_expiry_and_maintenance_reading_only_other_files(qm, monkeypatch):
    qm.define_queue("Q")
    rng = random.Random(27)
    now = datetime.now(UTC)
    for put in range(8):
        # Puts of several messages (files described by their statistics), and some with an expiry,
        # one of them already past (files that must be read).
        expiry = [None, now + timedelta(hours=1), now - timedelta(seconds=1), None][put % 4]
        qm.put("Q", [{"payload": f"{put}-{n}".encode(), "expiry": expiry} for n in range(rng.randint(2, 6))])
    qm.declare_consumer("Q", "a")
    qm.declare_consumer("Q", "b")
    reads = []
    read_messages = store.read_messages

    def counted(*args, **kwargs):
        reads.append(args[1])
        return read_messages(*args, **kwargs)

    monkeypatch.setattr(store, "read_messages", counted)
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
    # Group a took more than b; c never read, so everything unexpired waits for it.
    assert 0 < steps[-1][0][1] < steps[-1][0][2] < steps[-1][0][3]
