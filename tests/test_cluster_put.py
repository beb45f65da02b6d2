"""Puts to a cluster queue from Spark: three queue managers on local disk, real streaming queries.

QM1 puts; QM2, QM3 and QM4 host replicas of ORDERS in cluster INVENTORY.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter

import pytest
from chispa import assert_df_equality
from pyspark.errors import AnalysisException

from mqspark import QueueManager
from mqspark.cluster.repository import Cluster
from mqspark.spark.routing import route

from .test_sink import _stream, _write_json_batch

REPLICAS = ("QM2", "QM3", "QM4")


def make_cluster(tmp_path, replicas: tuple[str, ...]) -> dict:
    """QM1 and ``replicas``, all members of cluster INVENTORY, each replica hosting ORDERS (whose
    default bind is on_open); the repository under ``"repository"``, the queue managers by name."""
    managers = {name: QueueManager.create(tmp_path / name, name) for name in ("QM1", *replicas)}
    repository = Cluster.create(tmp_path / "cluster", "INVENTORY")
    for name, qm in managers.items():
        repository.join(qm)
        if name in replicas:
            qm.define_queue("ORDERS")
            repository.advertise(qm, "ORDERS")
    return {"repository": repository, **managers}


@pytest.fixture
def cluster(tmp_path) -> dict:
    return make_cluster(tmp_path, REPLICAS)


def _payloads(qm: QueueManager) -> list[str]:
    return [payload.decode() for payload in qm.browse("ORDERS").column("payload").to_pylist()]


def test_a_streaming_producer_not_fixed_spreads_messages_evenly(spark, cluster, tmp_path):
    source = tmp_path / "input"
    for batch in range(6):
        _write_json_batch(source, str(batch), [{"payload": f"b{batch}-m{number}"} for number in range(7)])
    _stream(
        spark, source, cluster["QM1"], tmp_path / "checkpoint", queue="ORDERS", cluster="INVENTORY", bind="not_fixed"
    )

    placed = {name: _payloads(cluster[name]) for name in REPLICAS}
    every = [payload for payloads in placed.values() for payload in payloads]
    assert sorted(every) == sorted(f"b{batch}-m{number}" for batch in range(6) for number in range(7))
    # Round robin goes on across micro-batches from the least recently used queue manager: 42 = 3 x 14.
    assert {name: len(payloads) for name, payloads in placed.items()} == {"QM2": 14, "QM3": 14, "QM4": 14}
    # The first batch starts at the queue managers never used, by name.
    assert [payload for payload in placed["QM2"] if payload.startswith("b0")] == ["b0-m0", "b0-m3", "b0-m6"]
    journal = cluster["repository"].snapshot()
    assert all(member.last_used is not None for member in journal.members if member.qmgr in REPLICAS)


def test_on_group_keeps_each_group_whole_on_one_queue_manager(spark, cluster, tmp_path):
    source = tmp_path / "input"
    groups = [f"G{number}" for number in range(1, 7)]
    for seq in (1, 2, 3):
        rows = [
            {"payload": f"{group}-{seq}", "group_id": group, "msg_seq_number": seq, "last_in_group": seq == 3}
            for group in groups
        ]
        _write_json_batch(source, str(seq), rows)
    _stream(
        spark, source, cluster["QM1"], tmp_path / "checkpoint", queue="ORDERS", cluster="INVENTORY", bind="on_group"
    )

    # Each group goes where its id's hash points in the first batch's least-recently-used order, and
    # its later items follow the binding recorded with that batch.
    expected = {name: [] for name in REPLICAS}
    for group in groups:
        expected[REPLICAS[zlib.crc32(group.encode()) % 3]] += [f"{group}-{seq}" for seq in (1, 2, 3)]
    placed = {name: _payloads(cluster[name]) for name in REPLICAS}
    assert {name: sorted(payloads) for name, payloads in placed.items()} == {
        name: sorted(payloads) for name, payloads in expected.items()
    }
    for name in REPLICAS:
        # Logical order on each replica: every group complete, items in order.
        for group in {payload.split("-")[0] for payload in placed[name]}:
            assert [p for p in placed[name] if p.startswith(f"{group}-")] == [f"{group}-{seq}" for seq in (1, 2, 3)]
    # Finished groups leave no binding behind.
    assert cluster["repository"].snapshot().bindings == ()


def test_no_eligible_replica_sends_the_messages_to_the_dead_letter_queue(spark, cluster):
    for name in REPLICAS:
        cluster[name].alter_queue("ORDERS", put_inhibited=True)
    cluster["repository"].refresh()
    given = spark.createDataFrame([("a",), ("b",)], "payload string")
    given.write.format("mq").option("queue", "ORDERS").option("cluster", "INVENTORY").mode("append").save(
        cluster["QM1"].root
    )

    assert [cluster[name].depth("ORDERS") for name in REPLICAS] == [0, 0, 0]
    dead = cluster["QM1"].browse("SYSTEM.DEAD.LETTER.QUEUE").to_pylist()
    text = (
        "MQRC_CLUSTER_PUT_INHIBITED (2268): cluster queue ORDERS: every replica is put-inhibited "
        "(QM2, QM3, QM4) in cluster INVENTORY"
    )
    assert [
        (row["payload"], row["dlq_reason"], row["dlq_reason_text"], row["dlq_original_queue"], row["dlq_original_qmgr"])
        for row in dead
    ] == [(b"a", 2268, text, "ORDERS", "QM1"), (b"b", 2268, text, "ORDERS", "QM1")]
    assert all(row["dlq_time"] is not None for row in dead)


def test_route_adds_the_target_of_each_message(spark, cluster):
    given = spark.createDataFrame([(f"m{number}",) for number in range(5)], "payload string").coalesce(1)
    routed = route(given, cluster="INVENTORY", queue="ORDERS", from_qmgr=cluster["QM1"], bind="not_fixed")
    expected = spark.createDataFrame(
        [(f"m{number}", REPLICAS[number % 3], "INVENTORY", None, None) for number in range(5)],
        "payload string, target_qmgr string, target_cluster string, dlq_reason int, dlq_reason_text string",
    )
    assert_df_equality(routed, expected, ignore_nullable=True)
    # route() records nothing: the cluster still has every replica unused.
    assert Counter(member.last_used for member in cluster["repository"].snapshot().members) == Counter({None: 4})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"cluster": "PAYMENTS"},
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue manager QM1 is not a member of cluster PAYMENTS",
        ),
        (
            {"cluster": "INVENTORY", "bind": "sometimes"},
            "option bind must be one of as_q_def, on_open, not_fixed, on_group; got 'sometimes'",
        ),
        ({"cluster": " , "}, "option cluster must name at least one cluster; got ' , '"),
        ({"bind": "on_open"}, "options bind and qmgr route a put to a cluster queue: give option cluster too"),
    ],
)
def test_cluster_options_are_checked_before_anything_is_written(spark, cluster, options, message):
    given = spark.createDataFrame([("a",)], "payload string")
    with pytest.raises(AnalysisException, match=re.escape(message)):
        given.write.format("mq").option("queue", "ORDERS").options(**options).mode("append").save(cluster["QM1"].root)
    assert [cluster[name].depth("ORDERS") for name in REPLICAS] == [0, 0, 0]
    assert cluster["QM1"].depth("SYSTEM.DEAD.LETTER.QUEUE") == 0


def test_empty_partitions_are_skipped(spark, cluster):
    """Four partitions, one of them with rows: route() and the routed put both take the empty tasks."""
    given = spark.createDataFrame([("a",)], "payload string").repartition(4)
    assert sorted(len(rows) for rows in given.rdd.glom().collect()) == [0, 0, 0, 1]
    routed = route(given, cluster="INVENTORY", queue="ORDERS", from_qmgr=cluster["QM1"], bind="not_fixed")
    assert [row.payload for row in routed.collect()] == ["a"]
    given.write.format("mq").option("queue", "ORDERS").option("cluster", "INVENTORY").option("bind", "not_fixed").mode(
        "append"
    ).save(cluster["QM1"].root)
    assert sum(cluster[name].depth("ORDERS") for name in REPLICAS) == 1
