"""The streaming get's planner on its own: the calls Spark makes, made directly, on real Delta tables.

Spark runs these methods in a planner process and replays them after crashes; calling them here
shows exactly what a replay, a rolled-back plan or an idle poll does.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from deltalake import DeltaTable
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from mqspark import MQError, Reason, store
from mqspark.cli.main import main
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.pending import is_in_runs
from mqspark.engine.state_table import COMPACT_EVERY
from mqspark.spark.stream import OFFSET_KEYS

from .support.samples import spec_example
from .support.stream_batches import read_batch


def _state_version(qm) -> int:
    return DeltaTable(store.state_location(qm.root, "Q")).version()


def test_offsets_have_one_fixed_key_order(qm, new_reader):
    spec_example(qm)
    reader = new_reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert tuple(start) == tuple(end) == OFFSET_KEYS
    assert (end["seq"], end["delivered"]) == (1, 8)


def test_a_replay_in_a_new_process_delivers_the_same_rows(qm, new_reader):
    spec_example(qm)
    reader = new_reader(maxMessagesPerTrigger="3")
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(3))
    first = read_batch(reader, start, end)
    # More messages arrive; a new planner (after a crash) asked for the same offsets reads the recorded plan.
    qm.put("Q", [{"payload": "late", "priority": 9}])
    assert read_batch(new_reader(), start, end) == first == [(0, "A"), (1, "Y1"), (2, "Y2")]


def test_a_crash_in_the_first_batch_is_replayed_by_the_restarted_query(qm, new_reader):
    spec_example(qm)
    crashed = new_reader()
    end = crashed.latestOffset(crashed.initialOffset(), ReadMaxRows(2))
    first = read_batch(crashed, crashed.initialOffset(), end)
    # The restarted planner: Spark asks for the initial offset again, then replays batch 0 and goes on,
    # while the crashed run's lease is still fresh.
    restarted = new_reader()
    start = restarted.initialOffset()
    assert start["owner"] != end["owner"]
    assert read_batch(restarted, start, end) == first == [(0, "A"), (1, "Y1")]
    after = restarted.latestOffset(end, ReadMaxRows(2))
    assert read_batch(restarted, end, after) == [(2, "Y2")]


def test_a_plan_that_never_ran_is_rolled_back(qm, new_reader):
    spec_example(qm)
    reader = new_reader()
    start = reader.initialOffset()
    abandoned = reader.latestOffset(start, ReadMaxRows(2))
    # Spark asks again from the same start: the first plan was never run, so its messages wait again.
    again = reader.latestOffset(start, ReadMaxRows(2))
    assert again["plan"] != abandoned["plan"]
    assert read_batch(reader, start, again) == [(0, "A"), (1, "Y1")]
    assert qm.depth("Q", consumer="default") == 8


def test_consumption_is_recorded_when_the_next_batch_is_planned(qm, new_reader):
    spec_example(qm)
    reader = new_reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(2))
    assert qm.depth("Q", consumer="default") == 8
    reader.latestOffset(end, ReadMaxRows(2))
    assert qm.depth("Q", consumer="default") == 6


def test_idle_polling_writes_nothing_and_returns_the_start(qm, new_reader):
    spec_example(qm)
    reader = new_reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    reader.latestOffset(end, ReadAllAvailable())
    version = _state_version(qm)
    for _ in range(50):
        assert reader.latestOffset(end, ReadAllAvailable()) == end
    assert _state_version(qm) == version
    qm.put("Q", [{"payload": "new"}])
    later = reader.latestOffset(end, ReadAllAvailable())
    assert read_batch(reader, end, later) == [(8, "new")]


def test_available_now_stops_at_what_was_there_at_start(qm, new_reader):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "before"}])
    reader = new_reader()
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    qm.put("Q", [{"payload": "after"}])
    end = reader.latestOffset(start, ReadAllAvailable())
    assert read_batch(reader, start, end) == [(0, "before")]
    assert reader.latestOffset(end, ReadAllAvailable()) == end


def test_a_message_put_before_another_while_the_query_runs_is_delivered_just_before_it(qm, new_reader):
    # The index reads msg_ids only from the first before_msg_id on: here, after it was built.
    qm.define_queue("Q", delivery_sequence="fifo")
    qm.put("Q", [{"payload": "a"}, {"payload": "b", "msg_id": "B"}, {"payload": "c", "msg_id": "C"}])
    reader = new_reader()
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(1))
    assert read_batch(reader, start, first) == [(0, "a")]
    qm.put("Q", [{"payload": "x", "before_msg_id": "C"}])
    qm.put("Q", [{"payload": "y", "before_msg_id": "B"}])
    second = reader.latestOffset(first, ReadAllAvailable())
    assert read_batch(reader, first, second) == [(1, "y"), (2, "b"), (3, "x"), (4, "c")]


def test_a_second_reader_of_the_group_is_refused_while_the_lease_lives(qm, new_reader):
    qm.define_queue("Q")
    first = new_reader()
    first.latestOffset(first.initialOffset(), ReadAllAvailable())
    second = new_reader()
    with pytest.raises(MQError) as refused:
        second.latestOffset(second.initialOffset(), ReadAllAvailable())
    assert refused.value.reason == Reason.MQRC_OBJECT_IN_USE
    assert re.fullmatch(
        r"MQRC_OBJECT_IN_USE \(2042\): queue Q: consumer group 'default' is already being read by a running query "
        r"\(last seen \d+\.\d s ago\); stop it, wait 30 s after it died, or read with another consumer",
        str(refused.value),
    )
    other = new_reader(consumer="other")
    other.latestOffset(other.initialOffset(), ReadAllAvailable())
    first.stop()
    third = new_reader()
    third.latestOffset(third.initialOffset(), ReadAllAvailable())


def test_an_expired_message_is_discarded_by_a_batch_and_leaves_the_depth(qm, new_reader):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "gone", "expiry": datetime.now(UTC) - timedelta(seconds=1)}, {"payload": "kept"}])
    reader = new_reader()
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert read_batch(reader, start, end) == [(0, "kept")]
    reader.latestOffset(end, ReadAllAvailable())
    assert qm.depth("Q", consumer="default") == 0


def test_cli_depth_shows_each_consumer_group(qm, capsys, new_reader):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "one"}, {"payload": "two"}])
    reader = new_reader(consumer="billing")
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(1))
    reader.latestOffset(end, ReadMaxRows(1))
    assert main(["--root", qm.root, "depth", "Q", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    # "one" is consumed by the only counted group, so CURDEPTH is 1.
    assert [(r["queue"], r["consumer"], r["depth"]) for r in rows] == [("Q", None, 1), ("Q", "billing", 1)]
    assert all(isinstance(r["oldest_age_s"], float) for r in rows)


def test_a_delete_behind_mqspark_s_back_stops_the_get(qm, new_reader):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": "one"}])
    DeltaTable(store.queue_location(qm.root, "Q")).delete()
    reader = new_reader()
    with pytest.raises(MQError, match=r"version 2 removed data; queue tables are append-only"):
        reader.latestOffset(reader.initialOffset(), ReadAllAvailable())


def _state_rows(qm) -> list[tuple]:
    table = DeltaTable(store.state_location(qm.root, "Q")).to_pyarrow_table()
    return sorted(
        (
            r["event"],
            r["plan_id"] is not None,
            r["origin"] is not None,
            r["row"],
            r["count"],
            r["seq"],
            r["delivery_seq"],
        )
        for r in table.to_pylist()
    )


def test_compaction_folds_consumed_plans_and_keeps_the_plan_in_flight(qm, new_reader):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"m{i}"} for i in range(10)])
    reader = new_reader()
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadMaxRows(3))
    second = reader.latestOffset(first, ReadMaxRows(3))
    abandoned = reader.latestOffset(second, ReadMaxRows(3))
    third = reader.latestOffset(second, ReadMaxRows(3))
    assert abandoned["plan"] != third["plan"]
    # Plans 1 and 2 are consumed; 4 is planned, numbered past the abandoned plan 3, which goes once
    # a later plan is consumed.
    assert ConsumerState(qm.root, "Q").compact()
    assert _state_rows(qm) == [
        ("checkpoint", False, True, 0, 6, 2, 6),
        # A lease record carries its holder's lease timeout, in milliseconds.
        ("lease", False, False, None, 30_000, None, None),
        ("plan", True, True, 6, 3, 3, 6),
        ("plan", True, True, 6, 3, 4, 6),
    ]
    assert qm.depth("Q", consumer="default") == 4
    assert qm.backlog("Q", consumer="default").depth == 4
    # A replay of the batch in flight, and the rest after a restart, see the compacted state.
    assert read_batch(new_reader(), second, third) == [(6, "m6"), (7, "m7"), (8, "m8")]
    reader.stop()
    restarted = new_reader()
    start = restarted.initialOffset()
    assert (start["seq"], start["delivered"]) == (4, 9)
    end = restarted.latestOffset(start, ReadAllAvailable())
    # Plan 4 never became consumed (its batch did not finish): its messages come again, then the rest.
    assert read_batch(restarted, start, end) == [(9, "m6"), (10, "m7"), (11, "m8"), (12, "m9")]


@pytest.mark.slow  # 3 * COMPACT_EVERY (300) batches, one by one
def test_the_state_table_stays_small_as_batches_go_by(qm, new_reader):
    qm.define_queue("Q")
    qm.put("Q", [{"payload": f"m{i}"} for i in range(3 * COMPACT_EVERY)])
    reader = new_reader()
    start = reader.initialOffset()
    delivered = []
    for _ in range(3 * COMPACT_EVERY):
        end = reader.latestOffset(start, ReadMaxRows(1))
        delivered += read_batch(reader, start, end)
        start = end
    assert delivered == [(i, f"m{i}") for i in range(3 * COMPACT_EVERY)]
    table = DeltaTable(store.state_location(qm.root, "Q"))
    assert table.version() >= 3 * COMPACT_EVERY
    # Compacted at every COMPACT_EVERY versions: what is left is at most one round of batches.
    assert len(table.file_uris()) <= COMPACT_EVERY
    assert table.to_pyarrow_table().num_rows <= 2 * COMPACT_EVERY
    assert qm.depth("Q", consumer="default") == 1


def test_membership_by_runs_of_keys_agrees_with_numpy_isin():
    generator = np.random.default_rng(7)
    for _ in range(500):
        keys = generator.integers(0, 60, generator.integers(1, 30))
        values = generator.integers(-5, 70, generator.integers(0, 40))
        assert is_in_runs(values, keys).tolist() == np.isin(values, keys).tolist()
