"""The pending index forgets exactly what no group in flight needs, however its rows are marked
consumed: in steps of any size, with its rows in physical order (found by bisection) or in any
order (found among runs of keys)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqspark import QueueManager, store
from mqspark.engine.pending import PendingMessages
from mqspark.model.ranges import NO_RANGES

# A put: items of groups (group number, how many items, whether the last one is marked last) or
# ungrouped messages (None).
put_items = st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(1, 3), st.booleans())), max_size=5)


def _rows(put: list, seq: dict[int, int], closed: set[int]) -> list[dict]:
    rows = []
    for item in put:
        if item is None:
            rows.append({"payload": b"m"})
            continue
        group, count, last = item
        if group in closed:
            continue
        for n in range(count):
            seq[group] = seq.get(group, 0) + 1
            ends = last and n == count - 1
            rows.append({"payload": b"g", "group_id": f"g{group}", "msg_seq_number": seq[group], "last_in_group": ends})
        if last:
            closed.add(group)
    return rows


def _kept_after(index: pa.Table, keys: np.ndarray, kept: set[int], consumed: set[int]) -> set[int]:
    """What the index holds after a step that marked ``consumed`` (all so far), given what it held
    (``kept``): it forgets a consumed message that is ungrouped, or an item of a finished group: one
    whose last item it holds consumed and none of whose items it holds waits (a move consumes a
    group's last item before the items before it, which still need the group's first)."""
    group_of = dict(zip(keys.tolist(), index["group_id"].to_pylist(), strict=True))
    ends = {key for key, end in zip(keys.tolist(), index["last_in_group"].to_pylist(), strict=True) if end}
    waiting = {group_of[key] for key in kept - consumed}
    finished = {group_of[key] for key in kept & consumed & ends if group_of[key] is not None} - waiting
    return {key for key in kept if key not in consumed or (group_of[key] is not None and group_of[key] not in finished)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    puts=st.lists(put_items, min_size=1, max_size=5),
    steps=st.lists(st.lists(st.integers(0, 40), max_size=8), max_size=5),
    shuffled=st.booleans(),
)
def test_marking_messages_consumed_keeps_what_groups_in_flight_need(tmp_path_factory, puts, steps, shuffled):
    qm = QueueManager.create(tmp_path_factory.mktemp("qm"), "QM1")
    qm.define_queue("Q")
    seq: dict[int, int] = {}
    closed: set[int] = set()
    for put in puts:
        rows = _rows(put, seq, closed)
        if rows:
            qm.put("Q", rows)
    pending = PendingMessages(store.queue_location(qm.root, "Q"))
    pending.load(NO_RANGES)
    if shuffled:
        pending.rows = pending.rows.take(np.random.default_rng(len(steps)).permutation(pending.rows.num_rows))
    whole = pending.rows
    keys = pending.keys(whole)
    consumed: set[int] = set()
    kept = set(keys.tolist())
    for step in steps:
        chosen = np.unique(keys[[n for n in step if n < len(keys)]])
        consumed |= {int(key) for key in chosen}
        pending.mark_consumed(chosen)
        kept = _kept_after(whole, keys, kept, consumed)
        held = pending.keys()
        flags = pending.rows["consumed"].to_pylist()
        assert set(held.tolist()) == kept
        assert {int(key) for key, flag in zip(held, flags, strict=True) if flag} == kept & consumed
        assert len(held) == len(kept)
