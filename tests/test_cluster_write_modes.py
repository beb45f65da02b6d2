"""Every bind and reconnect mode of a put to a cluster queue from Spark lands each message once and returns.

QM1 puts; QM2 and QM3 host replicas of ORDERS in cluster INVENTORY. Each write is six messages: group
G1 complete (three items), group G2 left open (two items) and one message in no group. For every
mode the test checks that the write returns, every message landed exactly once, the replicas are
those the bind rule allows, and the bindings recorded are the write's own: the producer its replica
commits name.
"""

from __future__ import annotations

from collections import Counter

import pytest
from deltalake import DeltaTable

from mqspark import QueueManager, store
from mqspark.cluster.records import Binding
from mqspark.errors import MQError
from mqspark.qmgr import engine
from mqspark.spark.routing import TaskRouting, batch_routing, cluster_route

from .test_cluster_put import make_cluster
from .test_sink import STREAM_SCHEMA, _stream, _write_json_batch

REPLICAS = ("QM2", "QM3")
ROWS = [
    {"payload": "g1-1", "group_id": "G1", "msg_seq_number": 1, "last_in_group": False},
    {"payload": "g1-2", "group_id": "G1", "msg_seq_number": 2, "last_in_group": False},
    {"payload": "g1-3", "group_id": "G1", "msg_seq_number": 3, "last_in_group": True},
    {"payload": "g2-1", "group_id": "G2", "msg_seq_number": 1, "last_in_group": False},
    {"payload": "g2-2", "group_id": "G2", "msg_seq_number": 2, "last_in_group": False},
    {"payload": "alone", "group_id": None, "msg_seq_number": None, "last_in_group": None},
]


@pytest.fixture
def cluster(tmp_path) -> dict:
    # The queue's default bind is on_open, so as_q_def binds on open.
    return make_cluster(tmp_path, REPLICAS)


def _landed(qm: QueueManager) -> list[str]:
    """The payloads committed to a replica, in put order. Browsing would hide a group's items that
    wait for an earlier one, which not_fixed may put on another replica."""
    table = DeltaTable(store.queue_location(qm.root, "ORDERS")).to_pyarrow_table(columns=["put_seq", "payload"])
    return [payload.decode() for payload in table.sort_by("put_seq").column("payload").to_pylist()]


def _placed(cluster: dict) -> dict[str, str]:
    """Each landed payload and the replica it is on; fails if any landed twice."""
    landed = {name: _landed(cluster[name]) for name in REPLICAS}
    seen = Counter(payload for payloads in landed.values() for payload in payloads)
    assert seen == Counter(row["payload"] for row in ROWS), "every message lands exactly once"
    return {payload: name for name, payloads in landed.items() for payload in payloads}


def _commit_producers(cluster: dict) -> set[str]:
    """The producers named by the replicas' put commits (every commit after the queue's creation)."""
    producers = set()
    for name in REPLICAS:
        for commit in DeltaTable(store.queue_location(cluster[name].root, "ORDERS")).history():
            if commit["version"] > 0:
                producers.add(commit["mqspark.producer"])
    return producers


def _check_bind_rule(cluster: dict, bind: str) -> None:
    placed = _placed(cluster)
    bindings = cluster["repository"].snapshot().bindings
    producers = _commit_producers(cluster)
    assert len(producers) == 1, f"one producer identity for the whole write, got {producers}"
    (producer,) = producers
    assert all(binding.producer == producer for binding in bindings), (bindings, producer)
    assert {(b.cluster, b.queue) for b in bindings} <= {("INVENTORY", "ORDERS")}
    if bind in ("on_open", "as_q_def"):
        (replica,) = set(placed.values())
        assert [(b.group_id, b.qmgr) for b in bindings] == [(None, replica)]
    elif bind == "on_group":
        g1 = {placed[p] for p in ("g1-1", "g1-2", "g1-3")}
        g2 = {placed[p] for p in ("g2-1", "g2-2")}
        assert len(g1) == 1 and len(g2) == 1, placed
        # G1 is complete, so only the open G2 stays bound.
        assert [(b.group_id, b.qmgr) for b in bindings] == [("G2", g2.pop())]
    else:
        assert bind == "not_fixed"
        assert set(placed.values()) == set(REPLICAS), placed
        assert bindings == ()


@pytest.mark.parametrize("reconnect", ["no", "yes", "qmgr"])
@pytest.mark.parametrize("bind", ["on_open", "on_group", "not_fixed", "as_q_def"])
def test_a_batch_write_lands_once_and_returns(spark, cluster, bind, reconnect):
    given = spark.createDataFrame(ROWS, STREAM_SCHEMA)
    given.write.format("mq").option("queue", "ORDERS").option("cluster", "INVENTORY").option("bind", bind).option(
        "reconnect", reconnect
    ).mode("append").save(cluster["QM1"].root)

    _check_bind_rule(cluster, bind)


@pytest.mark.parametrize("bind", ["on_open", "on_group"])
def test_a_streaming_write_with_reconnect_lands_once_and_returns(spark, cluster, tmp_path, bind):
    source = tmp_path / "input"
    _write_json_batch(source, "0", ROWS)
    query = _stream(
        spark,
        source,
        cluster["QM1"],
        tmp_path / "checkpoint",
        queue="ORDERS",
        cluster="INVENTORY",
        bind=bind,
        reconnect="yes",
    )

    assert query.exception() is None
    _check_bind_rule(cluster, bind)
    # A streaming put's producer is its query.
    assert _commit_producers(cluster) == {str(query.id)}


def test_a_write_that_fails_after_a_commit_says_exactly_what_landed(spark, cluster):
    # Not fixed spreads three messages to each replica; QM3's replica holds only one.
    cluster["QM3"].alter_queue("ORDERS", max_depth=1)
    given = spark.createDataFrame(ROWS, STREAM_SCHEMA).coalesce(1)
    writer = given.write.format("mq").option("queue", "ORDERS").option("cluster", "INVENTORY")
    with pytest.raises(Exception) as raised:
        writer.option("bind", "not_fixed").option("producerId", "P1").mode("append").save(cluster["QM1"].root)

    (producer,) = _commit_producers(cluster)
    assert producer == "P1"
    lines = [line for line in str(raised.value).splitlines() if "MQRC_" in line]
    assert lines[0].split("MQError: ")[-1] == (
        "MQRC_Q_FULL (2053): put to queue ORDERS, write of producer P1: queue ORDERS is full "
        "(max_depth 1, depth 0, put of 3); already committed: queue ORDERS of QM2 (3 messages); "
        "its routing was not recorded"
    )
    assert _landed(cluster["QM2"]) == ["g1-1", "g1-3", "g2-2"]
    assert _landed(cluster["QM3"]) == []


def _task(versions: dict[str, int], *bindings: Binding) -> TaskRouting:
    return TaskRouting(versions, ("QM2",), bindings, ())


def test_tasks_that_disagree_back_the_batch_out_before_any_commit(cluster):
    route = cluster_route(engine(cluster["QM1"]), ("INVENTORY",), "ORDERS", "on_open", None)
    (root,) = route.repositories
    with pytest.raises(MQError) as raised:
        batch_routing(route, "ORDERS", "P1", 4, [_task({root: 1}), None, _task({root: 2})])
    assert str(raised.value) == (
        f"MQRC_BACKED_OUT (2003): cluster queue ORDERS: batch 4 of producer P1: its tasks routed with different "
        f"snapshots of {root} (versions [1, 2]); nothing was committed"
    )
    stranger = Binding("INVENTORY", "ORDERS", "P2", None, "QM2")
    with pytest.raises(MQError) as raised:
        batch_routing(route, "ORDERS", "P1", None, [_task({root: 1}, stranger)])
    assert str(raised.value) == (
        "MQRC_BACKED_OUT (2003): cluster queue ORDERS: write of producer P1: its tasks made bindings for "
        "producers P2; nothing was committed"
    )
    assert batch_routing(route, "ORDERS", "P1", None, [None]) is None
