"""Cluster repositories (spec section 7): create/open, membership, advertisements, routes, the health check,
the producer journal for deterministic routing, the catalog mapping of clusters, and the cluster CLI.

Everything runs on real Delta tables under tmp_path with real queue managers; no Spark.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import multiprocessing
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from mqspark import MQError, MQValidationError, QueueDefinition, QueueManager, Reason, store
from mqspark.cli.main import main
from mqspark.cluster.records import REPOSITORY_SCHEMA, AdvertisedQueue, Binding, ClusterSnapshot, Member
from mqspark.cluster.repository import Cluster
from mqspark.engine.catalog import CATALOG_SCHEMA, Catalog, rewrite_until_landed
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.engine.queues import Queues
from mqspark.qmgr import engine

from .support.error_checks import refused, unchanged

T0 = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
LEASE = timedelta(minutes=5)


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster.create(tmp_path / "repo", "C1")


@pytest.fixture
def qm1(tmp_path: Path) -> QueueManager:
    return QueueManager.create(tmp_path / "qm1", "QM1")


@pytest.fixture
def qm2(tmp_path: Path) -> QueueManager:
    return QueueManager.create(tmp_path / "qm2", "QM2")


def version_of(cluster: Cluster) -> int:
    return DeltaTable(cluster.location).version()


def table_rows(cluster: Cluster) -> list[dict]:
    return DeltaTable(cluster.location).to_pyarrow_table().to_pylist()


@contextmanager
def cluster_unchanged(cluster: Cluster) -> Iterator[None]:
    before = (version_of(cluster), cluster.snapshot())
    yield
    assert (version_of(cluster), cluster.snapshot()) == before


def member_of(cluster: Cluster, qmgr: str, version: int | None = None) -> Member:
    [member] = [m for m in cluster.snapshot(version).members if m.qmgr == qmgr]
    return member


def joined_with_orders(cluster: Cluster, *qms: QueueManager, **attributes) -> None:
    for qm in qms:
        qm.define_queue("ORDERS", **attributes)
        cluster.join(qm)
        cluster.advertise(qm, "ORDERS")


# Create and open


def test_create_then_open_round_trip(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(tmp_path / "repo")
    assert (cluster.name, cluster.root, cluster.location) == ("C1", root, f"{root}/_cluster")
    assert (tmp_path / "repo" / "_cluster" / "_delta_log").is_dir()
    assert cluster.snapshot() == ClusterSnapshot("C1", 0)
    assert table_rows(cluster) == [
        {name: None for name in REPOSITORY_SCHEMA.names} | {"kind": "cluster", "cluster": "C1"}
    ]
    reopened = Cluster.open(tmp_path / "repo")
    assert (reopened.name, reopened.root) == ("C1", root)
    monkeypatch.chdir(tmp_path)
    assert Cluster.open("repo").root == root
    # Every snapshot must stay readable: the log is never cleaned up; checkpoints keep reads cheap.
    assert DeltaTable(cluster.location).metadata().configuration == {
        "delta.checkpointInterval": "100",
        "delta.enableExpiredLogCleanup": "false",
    }


def test_create_where_a_cluster_exists_is_refused(cluster: Cluster) -> None:
    with (
        cluster_unchanged(cluster),
        refused(
            MQError,
            f"MQRC_OBJECT_IN_USE (2042): cluster C1 already exists at {cluster.root}",
            Reason.MQRC_OBJECT_IN_USE,
        ),
    ):
        Cluster.create(cluster.root, "C2")
    assert Cluster.open(cluster.root).name == "C1"


def test_open_where_no_cluster_exists_is_unknown_object(tmp_path: Path) -> None:
    root = tmp_path / "absent"
    with refused(
        MQError, f"MQRC_UNKNOWN_OBJECT_NAME (2085): no cluster repository at {root}", Reason.MQRC_UNKNOWN_OBJECT_NAME
    ):
        Cluster.open(root)
    assert not root.exists()


def test_create_with_bad_name_writes_nothing(tmp_path: Path) -> None:
    with refused(MQValidationError, "cluster name 'C 1' may only use the characters A-Z a-z 0-9 . _ / %"):
        Cluster.create(tmp_path / "repo", "C 1")
    assert not (tmp_path / "repo").exists()


# Membership


def test_join_records_the_member_and_the_cluster_in_the_catalog(cluster: Cluster, qm1: QueueManager) -> None:
    member = cluster.join(qm1, network_priority=4)
    assert member == Member("C1", "QM1", qm1.root, network_priority=4)
    assert cluster.snapshot() == ClusterSnapshot("C1", 1, members=(member,))
    assert engine(qm1).cluster_repository("C1") == cluster.root
    assert Queues.open(qm1.root).cluster_repository("C1") == cluster.root
    state = Catalog(qm1.root).read()
    assert (state.qmgr.cluster, state.clusters) == (("C1",), {"C1": cluster.root})
    [row] = [
        r for r in DeltaTable(store.catalog_location(qm1.root)).to_pyarrow_table().to_pylist() if r["name"] == "C1"
    ]
    assert (row["object_type"], row["repository"]) == ("cluster", cluster.root)


def test_cluster_repository_of_a_cluster_not_joined(qm1: QueueManager) -> None:
    with refused(
        MQError,
        "MQRC_UNKNOWN_OBJECT_NAME (2085): queue manager QM1 is not a member of cluster C9",
        Reason.MQRC_UNKNOWN_OBJECT_NAME,
    ):
        engine(qm1).cluster_repository("C9")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (10, "attribute network_priority must be between 0 and 9, got 10"),
        (-1, "attribute network_priority must be between 0 and 9, got -1"),
        (True, "attribute network_priority must be an integer, got bool True"),
        ("1", "attribute network_priority must be an integer, got str '1'"),
    ],
    ids=["10", "-1", "bool", "text"],
)
def test_join_with_bad_network_priority_changes_nothing(
    cluster: Cluster, qm1: QueueManager, value: object, message: str
) -> None:
    with unchanged(qm1), cluster_unchanged(cluster), refused(MQValidationError, message):
        cluster.join(qm1, network_priority=value)
    assert Catalog(qm1.root).read().clusters == {}


def test_join_of_a_name_already_in_the_cluster_is_refused(cluster: Cluster, qm1: QueueManager, tmp_path: Path) -> None:
    cluster.join(qm1)
    namesake = QueueManager.create(tmp_path / "namesake", "QM1")
    for qm in (qm1, namesake):
        with (
            unchanged(qm),
            cluster_unchanged(cluster),
            refused(MQValidationError, f"queue manager QM1 is already a member of cluster C1 (root {qm1.root})"),
        ):
            cluster.join(qm)
    assert Catalog(namesake.root).read().clusters == {}


def test_join_of_a_second_cluster_of_the_same_name_is_refused(
    cluster: Cluster, qm1: QueueManager, tmp_path: Path
) -> None:
    other = Cluster.create(tmp_path / "other", "C1")
    cluster.join(qm1)
    with (
        unchanged(qm1),
        cluster_unchanged(other),
        refused(
            MQValidationError,
            f"queue manager QM1 is already a member of another cluster C1 (repository {cluster.root})",
        ),
    ):
        other.join(qm1)
    assert engine(qm1).cluster_repository("C1") == cluster.root


def test_leave_removes_the_member_its_advertisements_and_the_catalog_entry(
    cluster: Cluster, qm1: QueueManager, qm2: QueueManager
) -> None:
    joined_with_orders(cluster, qm1, qm2)
    bound = Binding("C1", "ORDERS", "P1", None, "QM2")
    cluster.record_routing("P1", "ORDERS", None, 0, [], [bound], [], T0)
    cluster.leave("QM2")
    snapshot = cluster.snapshot()
    assert [m.qmgr for m in snapshot.members] == ["QM1"]
    assert [(q.qmgr, q.name) for q in snapshot.queues] == [("QM1", "ORDERS")]
    # Bindings stay: routing decides what a binding to a queue manager gone means.
    assert snapshot.bindings == (bound,)
    assert Catalog(qm2.root).read().clusters == {}
    assert Catalog(qm2.root).read().qmgr.cluster == ()
    with refused(
        MQError,
        "MQRC_UNKNOWN_OBJECT_NAME (2085): queue manager QM2 is not a member of cluster C1",
        Reason.MQRC_UNKNOWN_OBJECT_NAME,
    ):
        engine(qm2).cluster_repository("C1")
    cluster.leave(qm1)
    assert cluster.snapshot().members == ()
    assert Catalog(qm1.root).read().clusters == {}


def test_leave_of_a_member_whose_root_is_gone(cluster: Cluster, qm2: QueueManager) -> None:
    cluster.join(qm2)
    shutil.rmtree(qm2.root)
    cluster.leave("QM2")
    assert cluster.snapshot().members == ()


def test_leave_of_an_unknown_member_is_refused(cluster: Cluster, qm1: QueueManager) -> None:
    cluster.join(qm1)
    with (
        cluster_unchanged(cluster),
        refused(
            MQError,
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue manager QM9 is not a member of cluster C1",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ),
    ):
        cluster.leave("QM9")


# Advertisements


def test_advertise_copies_the_cluster_visible_attributes(cluster: Cluster, qm1: QueueManager) -> None:
    qm1.define_queue(
        "ORDERS",
        default_bind="on_group",
        default_priority=7,
        put_inhibited=True,
        get_inhibited=True,
        max_depth=5,
        description="orders",
    )
    cluster.join(qm1)
    expected = AdvertisedQueue("C1", "QM1", "ORDERS", "local", "on_group", 7, True, "orders")
    assert cluster.advertise(qm1, "ORDERS") == expected
    assert cluster.snapshot().queues == (expected,)
    qm1.alter_queue("ORDERS", put_inhibited=False, default_bind="not_fixed")
    again = dataclasses.replace(expected, put_inhibited=False, default_bind="not_fixed")
    assert cluster.advertise(qm1, "ORDERS") == again
    assert cluster.snapshot().queues == (again,)


@pytest.fixture
def impostor(tmp_path: Path) -> QueueManager:
    qm = QueueManager.create(tmp_path / "impostor", "QM1")
    qm.define_queue("ORDERS")
    return qm


@pytest.mark.parametrize(
    ("who", "queue", "error", "message", "reason"),
    [
        (
            "qm1",
            "NOPE",
            MQError,
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ),
        (
            "qm1",
            "ALIAS",
            MQValidationError,
            "queue ALIAS of queue manager QM1 is an alias queue; only local queues can be advertised",
            None,
        ),
        (
            "qm2",
            "ORDERS",
            MQError,
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue manager QM2 is not a member of cluster C1",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ),
        (
            "impostor",
            "ORDERS",
            MQValidationError,
            "queue manager QM1 at {impostor} is not the member QM1 of cluster C1 (root {qm1})",
            None,
        ),
        (
            "qm1",
            "BAD NAME",
            MQValidationError,
            "queue name 'BAD NAME' may only use the characters A-Z a-z 0-9 . _ / %",
            None,
        ),
    ],
    ids=["unknown-queue", "alias", "not-a-member", "same-name-other-root", "bad-name"],
)
def test_advertise_errors_change_nothing(
    cluster: Cluster,
    qm1: QueueManager,
    qm2: QueueManager,
    impostor: QueueManager,
    who: str,
    queue: str,
    error: type[MQError],
    message: str,
    reason: Reason | None,
) -> None:
    qms = {"qm1": qm1, "qm2": qm2, "impostor": impostor}
    for qm in (qm1, qm2):
        qm.define_queue("ORDERS")
    qm1.define_queue("ALIAS", type="alias", target_queue="ORDERS")
    cluster.join(qm1)
    message = message.format(impostor=impostor.root, qm1=qm1.root)
    with cluster_unchanged(cluster), refused(error, message, reason):
        cluster.advertise(qms[who], queue)


def test_unadvertise(cluster: Cluster, qm1: QueueManager, qm2: QueueManager) -> None:
    joined_with_orders(cluster, qm1, qm2)
    cluster.unadvertise("QM1", "ORDERS")
    assert [(q.qmgr, q.name) for q in cluster.snapshot().queues] == [("QM2", "ORDERS")]
    with (
        cluster_unchanged(cluster),
        refused(
            MQError,
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue ORDERS is not advertised by queue manager QM1 in cluster C1",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ),
    ):
        cluster.unadvertise(qm1, "ORDERS")
    cluster.unadvertise(qm2, "ORDERS")
    assert cluster.snapshot().queues == ()


# Routes


def test_suspend_resume_and_network_priority(cluster: Cluster, qm1: QueueManager) -> None:
    cluster.join(qm1)
    assert cluster.suspend("QM1") == Member("C1", "QM1", qm1.root, suspended=True)
    assert member_of(cluster, "QM1").suspended
    version = version_of(cluster)
    cluster.suspend(qm1)
    assert version_of(cluster) == version  # nothing changed, nothing committed
    assert cluster.resume("QM1").suspended is False
    assert member_of(cluster, "QM1").suspended is False
    assert cluster.set_network_priority("QM1", 9).network_priority == 9
    assert member_of(cluster, "QM1").network_priority == 9
    with (
        cluster_unchanged(cluster),
        refused(MQValidationError, "attribute network_priority must be between 0 and 9, got 10"),
    ):
        cluster.set_network_priority("QM1", 10)


def test_set_route_state_records_who_set_it(cluster: Cluster, qm1: QueueManager) -> None:
    cluster.join(qm1)
    member = cluster.set_route_state("QM1", "unavailable", by="alice", now=T0)
    assert (member.route_state, member.route_state_by, member.route_state_at) == ("unavailable", "alice", T0)
    assert member_of(cluster, "QM1") == member
    assert cluster.set_route_state(qm1, "retrying").route_state_by == getpass.getuser()
    handed_back = cluster.set_route_state("QM1", None)
    assert (handed_back.route_state, handed_back.route_state_by) == ("retrying", None)
    assert member_of(cluster, "QM1") == handed_back


@pytest.mark.parametrize(
    ("call", "error", "message", "reason"),
    [
        (
            lambda c: c.set_route_state("QM1", "broken"),
            MQValidationError,
            "attribute route_state must be one of running, stopped, retrying, unavailable; got 'broken'",
            None,
        ),
        (
            lambda c: c.set_route_state("QM1", "running", by=""),
            MQValidationError,
            "option by must name an administrator, got ''",
            None,
        ),
        *[
            (
                call,
                MQError,
                "MQRC_UNKNOWN_OBJECT_NAME (2085): queue manager QM9 is not a member of cluster C1",
                Reason.MQRC_UNKNOWN_OBJECT_NAME,
            )
            for call in (
                lambda c: c.suspend("QM9"),
                lambda c: c.resume("QM9"),
                lambda c: c.set_network_priority("QM9", 1),
                lambda c: c.set_route_state("QM9", "running"),
                lambda c: c.set_route_state("QM9", None),
            )
        ],
        (
            lambda c: c.suspend("QM 9"),
            MQValidationError,
            "queue manager name 'QM 9' may only use the characters A-Z a-z 0-9 . _ / %",
            None,
        ),
    ],
    ids=[
        "bad-state",
        "empty-by",
        "suspend-unknown",
        "resume-unknown",
        "priority-unknown",
        "state-unknown",
        "auto-unknown",
        "bad-name",
    ],
)
def test_route_errors_change_nothing(cluster: Cluster, qm1: QueueManager, call, error, message, reason) -> None:
    cluster.join(qm1)
    with cluster_unchanged(cluster), refused(error, message, reason):
        call(cluster)


def test_snapshot_travels_in_time(cluster: Cluster, qm1: QueueManager) -> None:
    cluster.join(qm1)
    joined = cluster.snapshot()
    cluster.suspend("QM1")
    assert cluster.snapshot(1) == joined
    assert cluster.snapshot(0) == ClusterSnapshot("C1", 0)
    assert cluster.snapshot(2).members[0].suspended
    for version in (3, -1, True, "1"):
        with refused(
            MQError,
            f"MQRC_UNKNOWN_OBJECT_NAME (2085): cluster C1 has no version {version!r} (latest is 2)",
            Reason.MQRC_UNKNOWN_OBJECT_NAME,
        ):
            cluster.snapshot(version)


def test_inquire_queue_of_the_cluster(cluster: Cluster, qm1: QueueManager, qm2: QueueManager) -> None:
    joined_with_orders(cluster, qm2, qm1)
    qm2.alter_queue("ORDERS", default_priority=3)
    cluster.advertise(qm2, "ORDERS")
    first = AdvertisedQueue("C1", "QM1", "ORDERS")
    assert cluster.inquire_queue(None, "ORDERS") == first
    assert cluster.inquire_queue("QM2", "ORDERS") == AdvertisedQueue("C1", "QM2", "ORDERS", default_priority=3)
    assert cluster.inquire_queue(qm1, "ORDERS") == first
    for qmgr, message in (
        ("QM3", "queue ORDERS is not advertised by queue manager QM3 in cluster C1"),
        (None, "queue NOPE is not advertised in cluster C1"),
    ):
        with refused(MQError, f"MQRC_UNKNOWN_OBJECT_NAME (2085): {message}", Reason.MQRC_UNKNOWN_OBJECT_NAME):
            cluster.inquire_queue(qmgr, "NOPE" if qmgr is None else "ORDERS")


# The health check


def test_refresh_follows_reachability_and_consumers(cluster: Cluster, qm1: QueueManager, tmp_path: Path) -> None:
    joined_with_orders(cluster, qm1)
    assert member_of(cluster, "QM1").route_state == "running"  # the default until a check

    def checked(**options) -> tuple[str, str | None]:
        member = member_of_snapshot(cluster.refresh(**options), "QM1")
        assert member == member_of(cluster, "QM1")
        return member.route_state, member.route_state_by

    assert checked() == ("stopped", None)
    state = ConsumerState(qm1.root, "ORDERS")
    state.acquire("G1", "query-1", LEASE)
    assert checked() == ("running", None)
    later = datetime.now(UTC) + timedelta(seconds=301)
    assert checked(now=later) == ("stopped", None)
    assert checked(now=later, active_within=600) == ("running", None)

    away = tmp_path / "qm1.away"
    os.rename(qm1.root, away)
    assert checked() == ("retrying", None)
    assert checked() == ("unavailable", None)
    version = version_of(cluster)
    assert checked() == ("unavailable", None)
    assert version_of(cluster) == version  # nothing changed, nothing committed
    os.rename(away, qm1.root)
    assert checked() == ("running", None)

    state.release("G1", "query-1")
    assert checked() == ("stopped", None)
    os.rename(qm1.root, away)
    assert checked() == ("retrying", None)


def member_of_snapshot(snapshot: ClusterSnapshot, qmgr: str) -> Member:
    [member] = [m for m in snapshot.members if m.qmgr == qmgr]
    return member


def test_refresh_records_when_the_state_changed(cluster: Cluster, qm1: QueueManager) -> None:
    joined_with_orders(cluster, qm1)
    cluster.refresh(now=T0)
    assert member_of(cluster, "QM1").route_state_at == T0
    cluster.refresh(now=T0 + timedelta(hours=1))
    assert member_of(cluster, "QM1").route_state_at == T0


def test_refresh_keeps_a_route_state_set_by_an_administrator(
    cluster: Cluster, qm1: QueueManager, tmp_path: Path
) -> None:
    joined_with_orders(cluster, qm1)
    cluster.set_route_state("QM1", "unavailable", by="alice")
    cluster.refresh()
    assert (member_of(cluster, "QM1").route_state, member_of(cluster, "QM1").route_state_by) == ("unavailable", "alice")
    os.rename(qm1.root, tmp_path / "away")
    cluster.set_route_state("QM1", "running", by="bob")
    cluster.refresh()
    cluster.refresh()
    assert (member_of(cluster, "QM1").route_state, member_of(cluster, "QM1").route_state_by) == ("running", "bob")
    os.rename(tmp_path / "away", qm1.root)
    cluster.set_route_state("QM1", None)
    assert (member_of(cluster, "QM1").route_state, member_of(cluster, "QM1").route_state_by) == ("running", None)
    cluster.refresh()
    assert (member_of(cluster, "QM1").route_state, member_of(cluster, "QM1").route_state_by) == ("stopped", None)


def test_refresh_copies_current_attributes_and_drops_deleted_queues(
    cluster: Cluster, qm1: QueueManager, qm2: QueueManager, tmp_path: Path
) -> None:
    joined_with_orders(cluster, qm1, qm2)
    for qm in (qm1, qm2):
        qm.define_queue("OLD")
        cluster.advertise(qm, "OLD")
    qm1.alter_queue("ORDERS", put_inhibited=True, description="closed")
    qm1.delete_queue("OLD")
    qm2.alter_queue("ORDERS", put_inhibited=True)
    qm2.delete_queue("OLD")
    os.rename(qm2.root, tmp_path / "away")
    snapshot = cluster.refresh()
    assert snapshot.queues == (
        AdvertisedQueue("C1", "QM2", "OLD"),  # an unreachable member's advertisements stay as they were
        AdvertisedQueue("C1", "QM1", "ORDERS", put_inhibited=True, description="closed"),
        AdvertisedQueue("C1", "QM2", "ORDERS"),
    )
    assert cluster.snapshot() == snapshot
    os.rename(tmp_path / "away", qm2.root)
    assert cluster.refresh().queues == (
        AdvertisedQueue("C1", "QM1", "ORDERS", put_inhibited=True, description="closed"),
        AdvertisedQueue("C1", "QM2", "ORDERS", put_inhibited=True),
    )


def test_refresh_with_bad_window_changes_nothing(cluster: Cluster, qm1: QueueManager) -> None:
    joined_with_orders(cluster, qm1)
    for value in (-1, "300", True):
        with (
            cluster_unchanged(cluster),
            refused(MQValidationError, f"option active_within must be a number of seconds >= 0, got {value!r}"),
        ):
            cluster.refresh(active_within=value)


# The producer journal


def producer_rows(cluster: Cluster) -> list[tuple]:
    return [
        (r["producer"], r["queue"], r["routed_batch"], r["routed_with"], r["next_snapshot"])
        for r in table_rows(cluster)
        if r["kind"] == "producer"
    ]


def test_routing_snapshot_gives_one_snapshot_per_batch(cluster: Cluster, qm1: QueueManager, qm2: QueueManager) -> None:
    joined_with_orders(cluster, qm1, qm2)
    base = version_of(cluster)

    first = cluster.routing_snapshot("P1", "ORDERS", 0)
    assert first.version == base + 1 == version_of(cluster)
    assert producer_rows(cluster) == [("P1", "ORDERS", -1, None, base + 1)]
    assert first == dataclasses.replace(cluster.snapshot(base), version=base + 1)
    # Another task of the same batch, after an unrelated change: the same snapshot, nothing committed.
    cluster.suspend("QM2")
    assert cluster.routing_snapshot("P1", "ORDERS", 0) == first
    assert version_of(cluster) == base + 2

    bound = Binding("C1", "ORDERS", "P1", None, "QM1")
    recorded = cluster.record_routing("P1", "ORDERS", 0, first.version, ["QM1"], [bound], [], T0)
    assert recorded == base + 3 == version_of(cluster)
    assert producer_rows(cluster) == [("P1", "ORDERS", 0, base + 1, base + 3)]
    # A replay of the recorded batch routes with its snapshot again.
    assert cluster.routing_snapshot("P1", "ORDERS", 0) == first
    # The next batch routes with the recording commit: bindings, last_used and the suspension are in it.
    second = cluster.routing_snapshot("P1", "ORDERS", 1)
    assert second == cluster.snapshot(base + 3)
    assert second.bindings == (bound,)
    assert member_of_snapshot(second, "QM2").suspended
    assert member_of_snapshot(second, "QM1").last_used == T0
    # So does any later batch, until one is recorded (batch 2 had no messages, say).
    assert cluster.routing_snapshot("P1", "ORDERS", 3) == second
    assert version_of(cluster) == base + 3


def test_record_routing_is_idempotent(cluster: Cluster, qm1: QueueManager) -> None:
    joined_with_orders(cluster, qm1)
    snapshot = cluster.routing_snapshot("P1", "ORDERS", 0)
    version = cluster.record_routing("P1", "ORDERS", 0, snapshot.version, ["QM1"], [], [], T0)
    assert version == snapshot.version + 1
    with cluster_unchanged(cluster):
        later = T0 + timedelta(hours=1)
        bound = Binding("C1", "ORDERS", "P1", "G", "QM1")
        assert cluster.record_routing("P1", "ORDERS", 0, snapshot.version, ["QM1"], [bound], [], later) is None
    cluster.record_routing("P1", "ORDERS", 1, version, [], [], [], T0)
    with cluster_unchanged(cluster):
        assert cluster.record_routing("P1", "ORDERS", 0, snapshot.version, ["QM1"], [], [], T0) is None


def test_routing_snapshot_of_a_batch_before_the_recorded_one_is_refused(cluster: Cluster, qm1: QueueManager) -> None:
    joined_with_orders(cluster, qm1)
    snapshot = cluster.routing_snapshot("P1", "ORDERS", 4)
    cluster.record_routing("P1", "ORDERS", 4, snapshot.version, [], [], [], T0)
    with (
        cluster_unchanged(cluster),
        refused(
            MQError,
            "MQRC_CLUSTER_RESOLUTION_ERROR (2189): producer P1 on cluster queue ORDERS: batch 3 asked for after "
            "batch 4 was routed; a producer's batches never go back",
            Reason.MQRC_CLUSTER_RESOLUTION_ERROR,
        ),
    ):
        cluster.routing_snapshot("P1", "ORDERS", 3)


def test_journal_rows_are_per_producer_and_queue(cluster: Cluster, qm1: QueueManager) -> None:
    joined_with_orders(cluster, qm1)
    base = version_of(cluster)
    assert cluster.routing_snapshot("P1", "ORDERS", 0).version == base + 1
    assert cluster.routing_snapshot("P2", "ORDERS", 0).version == base + 2
    assert cluster.routing_snapshot("P1", "REPLIES", 7).version == base + 3
    assert sorted(producer_rows(cluster)) == [
        ("P1", "ORDERS", -1, None, base + 1),
        ("P1", "REPLIES", -1, None, base + 3),
        ("P2", "ORDERS", -1, None, base + 2),
    ]


def test_one_off_batches_route_with_the_latest_version(cluster: Cluster, qm1: QueueManager) -> None:
    joined_with_orders(cluster, qm1)
    with cluster_unchanged(cluster):
        assert cluster.routing_snapshot("P1", "ORDERS", None) == cluster.snapshot()
    bound = Binding("C1", "ORDERS", "P1", None, "QM1")
    version = cluster.record_routing("P1", "ORDERS", None, 0, ["QM1"], [bound], [], T0)
    assert version == version_of(cluster)
    assert cluster.snapshot().bindings == (bound,)
    assert member_of(cluster, "QM1").last_used == T0
    assert producer_rows(cluster) == []
    with cluster_unchanged(cluster):
        assert cluster.record_routing("P1", "ORDERS", None, 0, [], [], [], T0) is None


def test_record_routing_orders_last_used_for_round_robin(
    cluster: Cluster, qm1: QueueManager, qm2: QueueManager, tmp_path: Path
) -> None:
    qm3 = QueueManager.create(tmp_path / "qm3", "QM3")
    joined_with_orders(cluster, qm1, qm2, qm3)
    cluster.record_routing("P1", "ORDERS", 0, 0, ["QM3", "QM1", "QM9", "QM2"], [], [], T0)
    used = {m.qmgr: m.last_used for m in cluster.snapshot().members}
    assert used == {
        "QM3": T0,
        "QM1": T0 + timedelta(microseconds=1),
        "QM2": T0 + timedelta(microseconds=3),
    }
    assert [m.qmgr for m in sorted(cluster.snapshot().members, key=lambda m: m.last_used)] == ["QM3", "QM1", "QM2"]


def test_record_routing_adds_bindings_and_drops_finished_groups(
    cluster: Cluster, qm1: QueueManager, qm2: QueueManager
) -> None:
    joined_with_orders(cluster, qm1, qm2)

    def bind(group: str | None, qmgr: str, producer: str = "P1") -> Binding:
        return Binding("C1", "ORDERS", producer, group, qmgr)

    cluster.record_routing("P2", "ORDERS", 0, 0, [], [bind("G1", "QM1", "P2")], [], T0)
    cluster.record_routing("P1", "ORDERS", 0, 0, [], [bind(None, "QM1"), bind("G1", "QM2"), bind("G2", "QM1")], [], T0)
    cluster.record_routing("P1", "ORDERS", 1, 0, [], [bind("G3", "QM2"), bind("G4", "QM1")], ["G1", "G4"], T0)
    assert cluster.snapshot().bindings == (
        bind(None, "QM1"),
        bind("G2", "QM1"),
        bind("G3", "QM2"),
        bind("G1", "QM1", "P2"),
    )
    # A binding given again replaces the one of the same producer, queue and group.
    cluster.record_routing("P1", "ORDERS", 2, 0, [], [bind(None, "QM2")], [], T0)
    assert cluster.snapshot().bindings[0] == bind(None, "QM2")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"bindings": [Binding("C1", "ORDERS", "P2", None, "QM1")]},
            "Binding(cluster='C1', queue='ORDERS', producer='P2', group_id=None, qmgr='QM1') is not a binding of "
            "producer P1 on queue ORDERS in cluster C1",
        ),
        (
            {"bindings": [Binding("C2", "ORDERS", "P1", None, "QM1")]},
            "Binding(cluster='C2', queue='ORDERS', producer='P1', group_id=None, qmgr='QM1') is not a binding of "
            "producer P1 on queue ORDERS in cluster C1",
        ),
        ({"at": datetime(2026, 1, 1)}, "at must be a timezone-aware datetime, got datetime.datetime(2026, 1, 1, 0, 0)"),
        ({"batch_id": -1}, "batch_id must be a whole number >= 0 or None, got -1"),
        ({"batch_id": True}, "batch_id must be a whole number >= 0 or None, got True"),
        ({"snapshot_version": -1}, "snapshot_version must be a version number >= 0, got -1"),
        ({"producer": ""}, "producer must be a non-empty string, got ''"),
        ({"queue": "../x"}, "queue name '../x' must not be a path (no '..', no leading '/', not '.')"),
    ],
    ids=[
        "other-producer",
        "other-cluster",
        "naive-at",
        "negative-batch",
        "bool-batch",
        "negative-version",
        "no-producer",
        "bad-queue",
    ],
)
def test_record_routing_errors_change_nothing(cluster: Cluster, qm1: QueueManager, change: dict, message: str) -> None:
    joined_with_orders(cluster, qm1)
    given = {
        "producer": "P1",
        "queue": "ORDERS",
        "batch_id": 0,
        "snapshot_version": 0,
        "used": ["QM1"],
        "bindings": [],
        "finished_groups": [],
        "at": T0,
    } | change
    with cluster_unchanged(cluster), refused(MQValidationError, message):
        cluster.record_routing(**given)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "ORDERS", 0), "producer must be a non-empty string, got ''"),
        (("P1", "ORDERS", -2), "batch_id must be a whole number >= 0 or None, got -2"),
        (("P1", "ORDERS", "0"), "batch_id must be a whole number >= 0 or None, got '0'"),
        (("P1", "/ORDERS", 0), "queue name '/ORDERS' must not be a path (no '..', no leading '/', not '.')"),
    ],
    ids=["no-producer", "negative-batch", "text-batch", "bad-queue"],
)
def test_routing_snapshot_errors_change_nothing(cluster: Cluster, args: tuple, message: str) -> None:
    with cluster_unchanged(cluster), refused(MQValidationError, message):
        cluster.routing_snapshot(*args)


def _route_first_batches(root: str, producers: list[str], start, results) -> None:
    cluster = Cluster.open(root)
    start.wait(60)  # both processes ready, so that their calls overlap
    results.put({producer: cluster.routing_snapshot(producer, "ORDERS", 0).version for producer in producers})


@pytest.mark.slow
def test_concurrent_callers_of_a_first_batch_get_one_snapshot(cluster: Cluster) -> None:
    producers = [f"P{n}" for n in range(8)]
    # spawn, not fork: a forked child using deltalake after its parent did panics.
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(2), context.Queue()
    # In opposite orders: each process opens journals the other has not asked for yet, so that a
    # change committed over a concurrent one, instead of after it, would lose journals.
    processes = [
        context.Process(target=_route_first_batches, args=(cluster.root, order, start, results))
        for order in (producers, producers[::-1])
    ]
    for process in processes:
        process.start()
    got = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=120)
    assert [process.exitcode for process in processes] == [0, 0]
    assert got[0] == got[1]
    # Each producer's journal was opened exactly once, by the commit whose version both processes got.
    assert sorted(got[0].values()) == list(range(1, len(producers) + 1))
    assert version_of(cluster) == len(producers)
    assert sorted(producer_rows(cluster)) == [
        (producer, "ORDERS", -1, None, got[0][producer]) for producer in producers
    ]


# The shared commit loop and the table


def test_rewrite_until_landed_prepares_again_after_losing_to_a_concurrent_commit(tmp_path: Path) -> None:
    location = str(tmp_path / "t")
    write_deltalake(location, pa.table({"a": [0]}))
    reads = []

    def prepare() -> tuple[DeltaTable, pa.Table, int]:
        table = DeltaTable(location)
        reads.append(table.version())
        if len(reads) == 1:
            write_deltalake(location, pa.table({"a": [99]}), mode="append")  # a rival commits after the read
        return table, pa.table({"a": [len(reads)]}), table.version() + 1

    assert rewrite_until_landed(prepare, "table t") == 2
    assert reads == [0, 1]
    assert DeltaTable(location).version() == 2
    assert DeltaTable(location).to_pyarrow_table()["a"].to_pylist() == [2]


def test_rewrite_until_landed_gives_up_and_commits_nothing_when_told(tmp_path: Path) -> None:
    location = str(tmp_path / "t")
    write_deltalake(location, pa.table({"a": [0]}))

    def losing() -> tuple[DeltaTable, pa.Table, None]:
        table = DeltaTable(location)
        write_deltalake(location, pa.table({"a": [1]}), mode="append")
        return table, pa.table({"a": [2]}), None

    with refused(MQError, "table t is changing too often; gave up after 3 attempts"):
        rewrite_until_landed(losing, "table t", attempts=3)
    assert DeltaTable(location).version() == 3
    assert rewrite_until_landed(lambda: (DeltaTable(location), None, "kept"), "table t") == "kept"
    assert DeltaTable(location).version() == 3


def test_table_layout(cluster: Cluster, qm1: QueueManager) -> None:
    joined_with_orders(cluster, qm1)
    assert cluster.routing_snapshot("P1", "ORDERS", 0).version == 3
    assert (
        cluster.record_routing("P1", "ORDERS", 0, 3, ["QM1"], [Binding("C1", "ORDERS", "P1", "G", "QM1")], [], T0) == 4
    )
    table = DeltaTable(cluster.location).to_pyarrow_table()
    assert table.schema == REPOSITORY_SCHEMA
    empty = dict.fromkeys(REPOSITORY_SCHEMA.names)
    assert table.to_pylist() == [
        empty | {"kind": "cluster", "cluster": "C1"},
        empty
        | {
            "kind": "member",
            "qmgr": "QM1",
            "root": qm1.root,
            "suspended": False,
            "route_state": "running",
            "network_priority": 0,
            "last_used": T0,
        },
        empty
        | {
            "kind": "queue",
            "qmgr": "QM1",
            "queue": "ORDERS",
            "type": "local",
            "default_bind": "on_open",
            "default_priority": 0,
            "put_inhibited": False,
            "description": "",
        },
        empty | {"kind": "binding", "queue": "ORDERS", "producer": "P1", "group_id": "G", "qmgr": "QM1"},
        empty
        | {
            "kind": "producer",
            "producer": "P1",
            "queue": "ORDERS",
            "routed_batch": 0,
            "routed_with": 3,
            "next_snapshot": 4,
        },
    ]


@pytest.mark.slow
def test_checkpoints_keep_every_snapshot_readable(cluster: Cluster, qm1: QueueManager) -> None:
    cluster.join(qm1)
    joined = cluster.snapshot()
    # Without the table's own setting, a log older than this would be cleaned up at the next checkpoint.
    DeltaTable(cluster.location).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    for _ in range(50):
        cluster.suspend("QM1")
        cluster.resume("QM1")
    log = Path(cluster.location) / "_delta_log"
    assert version_of(cluster) == 102
    assert (log / f"{99:020d}.checkpoint.parquet").is_file()
    assert (log / f"{0:020d}.json").is_file()
    assert cluster.snapshot(1) == joined
    assert cluster.snapshot(101).members[0].suspended
    assert cluster.snapshot(100) == dataclasses.replace(cluster.snapshot(), version=100)


# The queue manager's side


def old_catalog(qm: QueueManager) -> None:
    """Rewrite the catalog as a version without the ``repository`` column wrote it."""
    location = store.catalog_location(qm.root)
    schema = pa.schema([f for f in CATALOG_SCHEMA if f.name != "repository"])
    rows = DeltaTable(location).to_pyarrow_table().select(schema.names).cast(schema)
    shutil.rmtree(location)
    store.create_table(location, schema, None)
    write_deltalake(location, rows, mode="append")
    assert "repository" not in DeltaTable(location).schema().to_arrow().names


def test_a_catalog_written_before_clusters_opens_and_joins(cluster: Cluster, qm1: QueueManager) -> None:
    qm1.define_queue("ORDERS", description="kept")
    old_catalog(qm1)
    reopened = QueueManager.open(qm1.root)
    assert reopened.inquire_queue("ORDERS") == QueueDefinition("ORDERS", description="kept")
    with refused(
        MQError,
        "MQRC_UNKNOWN_OBJECT_NAME (2085): queue manager QM1 is not a member of cluster C1",
        Reason.MQRC_UNKNOWN_OBJECT_NAME,
    ):
        engine(reopened).cluster_repository("C1")
    reopened.alter_queue("ORDERS", default_priority=2)
    cluster.join(reopened)
    assert engine(reopened).cluster_repository("C1") == cluster.root
    assert QueueManager.open(qm1.root).inquire_queue("ORDERS") == QueueDefinition(
        "ORDERS", default_priority=2, description="kept"
    )
    assert "repository" in DeltaTable(store.catalog_location(qm1.root)).schema().to_arrow().names


def test_inquire_of_a_cluster_queue_defined_elsewhere_shows_advertised_attributes(
    cluster: Cluster, qm1: QueueManager, qm2: QueueManager, tmp_path: Path
) -> None:
    qm3 = QueueManager.create(tmp_path / "qm3", "QM3")
    joined_with_orders(cluster, qm2, qm1, put_inhibited=True, max_depth=5, description="orders")
    qm2.alter_queue("ORDERS", put_inhibited=False)
    cluster.advertise(qm2, "ORDERS")
    with refused(
        MQError,
        "MQRC_UNKNOWN_OBJECT_NAME (2085): queue ORDERS is not defined in queue manager QM3",
        Reason.MQRC_UNKNOWN_OBJECT_NAME,
    ):
        qm3.inquire_queue("ORDERS")
    cluster.join(qm3)
    first = AdvertisedQueue("C1", "QM1", "ORDERS", put_inhibited=True, description="orders")
    assert qm3.inquire_queue("ORDERS") == first
    assert QueueManager.open(qm3.root).inquire_queue("ORDERS") == first
    assert qm1.inquire_queue("ORDERS") == QueueDefinition(
        "ORDERS", put_inhibited=True, max_depth=5, description="orders"
    )
    with refused(
        MQError,
        "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM3",
        Reason.MQRC_UNKNOWN_OBJECT_NAME,
    ):
        qm3.inquire_queue("NOPE")
    # A queue manager's own advertisement, stale until the next refresh, is not a replica elsewhere.
    qm1.delete_queue("ORDERS")
    assert qm1.inquire_queue("ORDERS") == AdvertisedQueue("C1", "QM2", "ORDERS", description="orders")
    # Over every cluster joined, the first queue manager by name.
    other = Cluster.create(tmp_path / "repo2", "C2")
    qm0 = QueueManager.create(tmp_path / "qm0", "QM0")
    joined_with_orders(other, qm0)
    other.join(qm3)
    assert qm3.inquire_queue("ORDERS") == AdvertisedQueue("C2", "QM0", "ORDERS")


# The command line


def cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_ok(capsys: pytest.CaptureFixture[str], *args: object) -> str:
    code, out, err = cli(capsys, *args)
    assert (code, err) == (0, ""), err
    return out


def cli_json(capsys: pytest.CaptureFixture[str], *args: object):
    return json.loads(cli_ok(capsys, "--json", *args))


def cli_fails(capsys: pytest.CaptureFixture[str], *args: object) -> str:
    code, out, err = cli(capsys, *args)
    assert (code, out) == (1, ""), (code, out, err)
    assert len(err.splitlines()) == 1, err
    return err.rstrip("\n")


def test_cli_cluster_administration(
    capsys: pytest.CaptureFixture[str], qm1: QueueManager, qm2: QueueManager, tmp_path: Path
) -> None:
    repo = str(tmp_path / "repo")
    assert cli_json(capsys, "cluster", "create", "C1", repo) == {"cluster": "C1", "root": repo}
    assert cli_fails(capsys, "cluster", "create", "C2", repo) == (
        f"mqspark: error: MQRC_OBJECT_IN_USE (2042): cluster C1 already exists at {repo}"
    )
    qm1.define_queue("ORDERS", default_priority=4, description="orders")
    qm2.define_queue("ORDERS")
    # Before joining, the cluster can only be named by its root.
    assert cli_fails(capsys, "--root", qm1.root, "cluster", "join", "--cluster", "C1") == (
        "mqspark: error: MQRC_UNKNOWN_OBJECT_NAME (2085): queue manager QM1 is not a member of cluster C1"
    )
    joined = cli_json(capsys, "--root", qm1.root, "cluster", "join", "--cluster-root", repo, "--network-priority", "2")
    assert joined == {
        "cluster": "C1",
        "qmgr": "QM1",
        "root": qm1.root,
        "suspended": False,
        "route_state": "running",
        "network_priority": 2,
        "last_used": None,
        "route_state_by": None,
        "route_state_at": None,
    }
    assert cli_fails(
        capsys, "--root", qm2.root, "cluster", "join", "--cluster-root", repo, "--network-priority", "10"
    ) == ("mqspark: error: attribute network_priority must be between 0 and 9, got 10")
    assert [m.qmgr for m in Cluster.open(repo).snapshot().members] == ["QM1"]
    cli_ok(capsys, "--root", qm2.root, "cluster", "join", "--cluster-root", repo)

    assert cli_ok(capsys, "--root", qm1.root, "cluster", "advertise", "--cluster", "C1", "ORDERS").splitlines() == [
        "cluster: C1",
        "qmgr: QM1",
        "name: ORDERS",
        "type: local",
        "default_bind: on_open",
        "default_priority: 4",
        "put_inhibited: False",
        "description: orders",
    ]
    cli_ok(capsys, "--root", qm2.root, "cluster", "advertise", "--cluster", "C1", "ORDERS")
    assert cli_json(capsys, "--root", qm1.root, "cluster", "show", "--cluster", "C1", "--queues") == [
        {
            "qmgr": qm,
            "name": "ORDERS",
            "type": "local",
            "default_bind": "on_open",
            "default_priority": priority,
            "put_inhibited": False,
            "description": description,
        }
        for qm, priority, description in (("QM1", 4, "orders"), ("QM2", 0, ""))
    ]

    routes = ("--cluster-root", repo, "--qmgr", "QM2")
    assert cli_json(capsys, "cluster", "suspend", *routes)["suspended"] is True
    assert cli_json(capsys, "cluster", "priority", *routes, "7")["network_priority"] == 7
    admin = cli_json(capsys, "cluster", "route-state", *routes, "retrying", "--by", "alice")
    assert (admin["route_state"], admin["route_state_by"]) == ("retrying", "alice")
    # --qmgr defaults to the --root queue manager.
    assert cli_json(capsys, "--root", qm1.root, "cluster", "suspend", "--cluster", "C1")["qmgr"] == "QM1"
    assert cli_json(capsys, "--root", qm1.root, "cluster", "resume", "--cluster", "C1")["suspended"] is False
    assert cli_fails(capsys, "cluster", "resume", "--cluster-root", repo, "--qmgr", "QM9") == (
        "mqspark: error: MQRC_UNKNOWN_OBJECT_NAME (2085): queue manager QM9 is not a member of cluster C1"
    )

    table = cli_ok(capsys, "cluster", "show", "--cluster-root", repo).splitlines()
    assert table[0].split() == [
        "qmgr",
        "root",
        "suspended",
        "route_state",
        "network_priority",
        "last_used",
        "route_state_by",
        "route_state_at",
    ]
    # Cells longer than 40 characters are cut.
    assert len(qm1.root) > 40
    assert [line.split()[:5] for line in table[1:]] == [
        ["QM1", qm1.root[:37] + "...", "False", "running", "2"],
        ["QM2", qm2.root[:37] + "...", "True", "retrying", "7"],
    ]

    refreshed = cli_json(capsys, "cluster", "refresh", "--cluster-root", repo, "--active-within", "60")
    assert [(m["qmgr"], m["route_state"], m["route_state_by"]) for m in refreshed] == [
        ("QM1", "stopped", None),
        ("QM2", "retrying", "alice"),
    ]
    cli_ok(capsys, "cluster", "route-state", *routes, "auto")
    refreshed = cli_json(capsys, "cluster", "refresh", "--cluster-root", repo)
    assert [(m["qmgr"], m["route_state"], m["route_state_by"]) for m in refreshed] == [
        ("QM1", "stopped", None),
        ("QM2", "stopped", None),
    ]
    before = Cluster.open(repo).snapshot().version
    assert cli_json(capsys, "cluster", "show", "--cluster-root", repo, "--snapshot", "1") == [
        {key: value for key, value in joined.items() if key != "cluster"}
    ]

    Cluster.open(repo).record_routing(
        "P1", "ORDERS", None, before, [], [Binding("C1", "ORDERS", "P1", "G", "QM2")], [], T0
    )
    assert cli_ok(capsys, "cluster", "show", "--cluster-root", repo, "--bindings").splitlines() == [
        "queue   producer  group_id  qmgr",
        "ORDERS  P1        G         QM2",
    ]

    assert cli_json(capsys, "cluster", "unadvertise", *routes, "ORDERS") == {
        "cluster": "C1",
        "qmgr": "QM2",
        "unadvertised": "ORDERS",
    }
    assert cli_fails(capsys, "cluster", "unadvertise", *routes, "ORDERS") == (
        "mqspark: error: MQRC_UNKNOWN_OBJECT_NAME (2085): queue ORDERS is not advertised by queue manager QM2 in "
        "cluster C1"
    )
    assert cli_ok(capsys, "--root", qm2.root, "cluster", "leave", "--cluster", "C1") == "cluster: C1\nleft: QM2\n"
    assert [m.qmgr for m in Cluster.open(repo).snapshot().members] == ["QM1"]
    assert Catalog(qm2.root).read().clusters == {}


def test_cli_queue_show_of_a_cluster_queue_defined_elsewhere(
    capsys: pytest.CaptureFixture[str], cluster: Cluster, qm1: QueueManager, qm2: QueueManager
) -> None:
    joined_with_orders(cluster, qm1, put_inhibited=True)
    cluster.join(qm2)
    assert cli_json(capsys, "--root", qm2.root, "queue", "show", "ORDERS") == {
        "cluster": "C1",
        "qmgr": "QM1",
        "name": "ORDERS",
        "type": "local",
        "default_bind": "on_open",
        "default_priority": 0,
        "put_inhibited": True,
        "description": "",
    }


def test_cli_cluster_usage(capsys: pytest.CaptureFixture[str], cluster: Cluster) -> None:
    with pytest.raises(SystemExit) as help_exit:
        main(["cluster", "--help"])
    assert help_exit.value.code == 0
    shown = capsys.readouterr().out
    for action in (
        "create",
        "join",
        "leave",
        "advertise",
        "unadvertise",
        "suspend",
        "resume",
        "route-state",
        "priority",
        "show",
        "refresh",
    ):
        assert f"    {action} " in shown
    assert "--cluster-root CLUSTER_ROOT" in shown and "--cluster NAME" in shown
    with pytest.raises(SystemExit) as missing:
        main(["cluster", "show"])
    assert missing.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "mqspark cluster show: error: one of the arguments --cluster-root --cluster is required"
    )
    with pytest.raises(SystemExit) as bad_state:
        main(["cluster", "route-state", "--cluster-root", cluster.root, "--qmgr", "QM1", "broken"])
    assert bad_state.value.code == 2
    assert "argument STATE: invalid choice: 'broken'" in capsys.readouterr().err


def test_maintain_trims_history_but_keeps_every_snapshot_a_replay_routes_with(
    cluster: Cluster, qm1: QueueManager, qm2: QueueManager
) -> None:
    joined_with_orders(cluster, qm1, qm2)
    log = Path(cluster.root) / "_cluster" / "_delta_log"
    # A retention applies from the version that sets it on: set it first.
    cluster.maintain(retention=timedelta(0))
    first = cluster.routing_snapshot("P1", "ORDERS", 0)
    recorded = cluster.record_routing("P1", "ORDERS", 0, first.version, ["QM1"], [], [], T0)
    for priority in range(1, 6):
        cluster.set_network_priority("QM2", priority)
    summary = cluster.maintain(retention=timedelta(0))
    assert summary == {
        "version": recorded + 5,
        "kept_from": first.version,
        "log_entries_removed": first.version,
        "files_vacuumed": 0,
    }
    assert min(int(name.split(".")[0]) for name in os.listdir(log) if name.endswith(".json")) == first.version
    # A replay of batch 0 and the next batch still get their snapshots; the latest state is intact.
    assert cluster.routing_snapshot("P1", "ORDERS", 0) == first
    assert cluster.routing_snapshot("P1", "ORDERS", 1) == cluster.snapshot(recorded)
    assert [m.network_priority for m in cluster.snapshot().members] == [0, 5]
    with pytest.raises(MQValidationError, match=re.escape("retention must be 0 or more, got -1 seconds")):
        cluster.maintain(retention=timedelta(seconds=-1))
