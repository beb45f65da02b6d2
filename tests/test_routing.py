"""Cluster workload routing (spec section 7): exact targets, reasons and bindings for each rule, no Spark."""

from __future__ import annotations

import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pytest

from mqspark import MQValidationError
from mqspark.cluster.records import AdvertisedQueue, Binding, ClusterSnapshot, Member
from mqspark.cluster.routing import BIND_MODES, RouteRequest, route_messages
from mqspark.model.messages import MESSAGE_SCHEMA

A = "INVENTORY"
B = "PAYMENTS"
EARLY = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
LATE = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
ROUTING_FIELDS = ("group_id", "msg_seq_number", "offset", "last_in_group", "segmented", "last_segment")


def member(qmgr: str, cluster: str = A, **attributes) -> Member:
    return Member(cluster, qmgr, f"/qm/{qmgr}", **attributes)


def replica(qmgr: str, cluster: str = A, name: str = "ORDERS", **attributes) -> AdvertisedQueue:
    return AdvertisedQueue(cluster, qmgr, name, **attributes)


def snapshot(cluster: str, members=(), queues=(), bindings=()) -> ClusterSnapshot:
    return ClusterSnapshot(cluster, 1, tuple(members), tuple(queues), tuple(bindings))


def bound(qmgr: str, group_id: str | None = None, producer: str = "P1", cluster: str = A) -> Binding:
    return Binding(cluster, "ORDERS", producer, group_id, qmgr)


def inventory(*queues, members=None, bindings=()) -> list[ClusterSnapshot]:
    """Cluster INVENTORY with QM1 (the producer's) to QM4 as members, and ``queues`` advertised."""
    return [snapshot(A, members or [member(name) for name in ("QM1", "QM2", "QM3", "QM4")], queues, bindings)]


THREE = (replica("QM2"), replica("QM3"), replica("QM4"))


def plain(count: int) -> list[dict]:
    """``count`` whole messages outside groups."""
    return [{} for _ in range(count)]


def item(group_id: str, seq: int, *, last: bool = False) -> dict:
    return {"group_id": group_id, "msg_seq_number": seq, "last_in_group": last}


def segment(group_id: str, seq: int, offset: int, *, last_segment: bool = False, last: bool = False) -> dict:
    return {
        "group_id": group_id,
        "msg_seq_number": seq,
        "offset": offset,
        "segmented": True,
        "last_segment": last_segment,
        "last_in_group": last,
    }


def table(rows: list[dict]) -> pa.Table:
    """Message rows with the columns routing reads, typed as MESSAGE_SCHEMA, plus a payload it ignores."""
    defaults = {"group_id": None, "msg_seq_number": 1, "offset": 0}
    columns = {
        name: pa.array([row.get(name, defaults.get(name, False)) for row in rows], MESSAGE_SCHEMA.field(name).type)
        for name in ROUTING_FIELDS
    }
    columns["payload"] = pa.array([b"x"] * len(rows), pa.binary())
    return pa.table(columns)


@dataclass(frozen=True)
class Case:
    """One routing situation and its exact outcome.

    ``targets`` lists each row's target queue manager, or its reason code when dead-lettered; ``clusters``
    each routed row's cluster (INVENTORY when not given); ``texts`` the reason text of each code present.
    """

    snapshots: list[ClusterSnapshot]
    messages: list[dict]
    targets: str
    bind: str = "not_fixed"
    qmgr: str | None = None
    rotation: int = 0
    clusters: str | None = None
    texts: dict[int, str] = field(default_factory=dict)
    bindings: tuple[Binding, ...] = ()
    finished: tuple[str, ...] = ()


NOT_MEMBER = "MQRC_CLUSTER_RESOLUTION_ERROR (2189): cluster queue ORDERS: queue manager QM1 is not a member of "
ALL_INHIBITED = "MQRC_CLUSTER_PUT_INHIBITED (2268): cluster queue ORDERS: every replica is put-inhibited "
NOT_REBOUND = "so the message is not rebound"

CASES = [
    # Round robin from the least recently used (here: never used, so by name).
    pytest.param(Case(inventory(*THREE), plain(10), "QM2 QM3 QM4 QM2 QM3 QM4 QM2 QM3 QM4 QM2"), id="round robin 10"),
    pytest.param(
        Case(inventory(*THREE), plain(11), "QM2 QM3 QM4 QM2 QM3 QM4 QM2 QM3 QM4 QM2 QM3"), id="round robin 11"
    ),
    pytest.param(Case(inventory(*THREE), plain(4), "QM4 QM2 QM3 QM4", rotation=2), id="rotation"),
    pytest.param(Case(inventory(*THREE), plain(3), "QM3 QM4 QM2", rotation=7), id="rotation past the QM count"),
    # Step 1.
    pytest.param(
        Case(
            inventory(replica("QM2"), replica("QM3", put_inhibited=True), replica("QM4")), plain(4), "QM2 QM4 QM2 QM4"
        ),
        id="put-inhibited replica left out",
    ),
    pytest.param(
        Case(
            [
                snapshot(A, [member("QM1"), member("QM2")], [replica("QM2")]),
                snapshot(B, [member("QM3", B), member("QM4", B)], [replica("QM4", B)]),
            ],
            plain(3),
            "QM2 QM2 QM2",
        ),
        id="replica in a cluster the producer QM is not in left out",
    ),
    pytest.param(
        Case(
            [
                # QM3's route in INVENTORY's repository is a channel of PAYMENTS, where ORDERS is not advertised.
                snapshot(A, [member("QM1"), member("QM2"), member("QM3", B)], [replica("QM2"), replica("QM3")]),
                snapshot(B, [member("QM1", B), member("QM3", B)]),
            ],
            plain(3),
            "QM2 QM2 QM2",
        ),
        id="route not in the queue's cluster left out",
    ),
    pytest.param(
        Case(
            [
                snapshot(A, [member("QM1"), member("QM2")], [replica("QM2")]),
                snapshot(B, [member("QM1", B), member("QM3", B)], [replica("QM3", A)]),
            ],
            plain(3),
            "QM2 QM2 QM2",
        ),
        id="advertisement of another cluster left out",
    ),
    pytest.param(Case(inventory(*THREE), plain(3), "QM3 QM3 QM3", qmgr="QM3"), id="named qmgr"),
    pytest.param(
        Case(inventory(replica("QM1"), *THREE), plain(2), "QM4 QM4", qmgr="QM4"), id="named qmgr over local replica"
    ),
    pytest.param(
        Case(
            inventory(*THREE),
            plain(2),
            "2270 2270",
            qmgr="QM9",
            texts={
                2270: "MQRC_NO_DESTINATIONS_AVAILABLE (2270): cluster queue ORDERS: queue manager QM9, named by the "
                "put, hosts no replica in cluster INVENTORY"
            },
        ),
        id="named qmgr hosting no replica",
    ),
    pytest.param(
        Case(
            inventory(replica("QM2"), replica("QM3", put_inhibited=True)),
            plain(2),
            "2270 2270",
            qmgr="QM3",
            texts={
                2270: "MQRC_NO_DESTINATIONS_AVAILABLE (2270): cluster queue ORDERS: its replica on queue manager QM3, "
                "named by the put, is put-inhibited in cluster INVENTORY"
            },
        ),
        id="named qmgr put-inhibited",
    ),
    # Step 2.
    pytest.param(
        Case(inventory(replica("QM1"), *THREE), plain(3), "QM1 QM1 QM1", rotation=1), id="local replica preferred"
    ),
    pytest.param(
        Case(
            inventory(
                replica("QM1"),
                *THREE,
                members=[member("QM1", suspended=True, route_state="unavailable"), member("QM2"), member("QM3")],
            ),
            plain(2),
            "QM1 QM1",
        ),
        id="local replica preferred whatever its route",
    ),
    pytest.param(
        Case(inventory(replica("QM1", put_inhibited=True), *THREE), plain(3), "QM2 QM3 QM4"),
        id="local put-inhibited falls through to remote",
    ),
    pytest.param(
        Case(
            [
                snapshot(A, [member("QM1"), member("QM2")], [replica("QM1"), replica("QM2")]),
                snapshot(B, [member("QM1", B, network_priority=5)], [replica("QM1", B)]),
            ],
            plain(2),
            "QM1 QM1",
            clusters=f"{B} {B}",
        ),
        id="local reached through two clusters takes the higher network priority",
    ),
    # Step 3.
    pytest.param(
        Case(
            inventory(*THREE, members=[member("QM1"), member("QM2"), member("QM3", suspended=True), member("QM4")]),
            plain(3),
            "QM2 QM4 QM2",
        ),
        id="suspended remote left out",
    ),
    pytest.param(
        Case(
            inventory(
                *THREE,
                members=[member("QM1"), member("QM2", suspended=True), member("QM3", suspended=True)],
            ),
            plain(3),
            "QM2 QM3 QM2",
        ),
        id="suspended remote chosen when no resumed one",
    ),
    pytest.param(
        Case(
            inventory(
                *THREE,
                members=[member("QM1"), member("QM2", suspended=True), member("QM3", route_state="unavailable")],
            ),
            plain(2),
            "QM3 QM3",
        ),
        id="resumed beats suspended before route state counts",
    ),
    # Step 4.
    pytest.param(
        Case(
            inventory(
                *THREE,
                members=[
                    member("QM1"),
                    member("QM2", route_state="stopped"),
                    member("QM3"),
                    member("QM4", route_state="retrying"),
                ],
            ),
            plain(4),
            "QM2 QM3 QM2 QM3",
        ),
        id="running and stopped before retrying",
    ),
    pytest.param(
        Case(
            inventory(
                *THREE,
                members=[
                    member("QM1"),
                    member("QM2", route_state="unavailable"),
                    member("QM3", route_state="retrying"),
                    member("QM4", route_state="unavailable"),
                ],
            ),
            plain(2),
            "QM3 QM3",
        ),
        id="retrying before unavailable",
    ),
    pytest.param(
        Case(
            inventory(
                *THREE,
                members=[member("QM1")] + [member(name, route_state="unavailable") for name in ("QM2", "QM3", "QM4")],
            ),
            plain(3),
            "QM2 QM3 QM4",
        ),
        id="unavailable only",
    ),
    # Step 5.
    pytest.param(
        Case(
            [
                snapshot(A, [member("QM1"), member("QM2", network_priority=1)], [replica("QM2")]),
                snapshot(B, [member("QM1", B), member("QM2", B, network_priority=7)], [replica("QM2", B)]),
            ],
            plain(2),
            "QM2 QM2",
            clusters=f"{B} {B}",
        ),
        id="highest network priority of two routes",
    ),
    pytest.param(
        Case(
            [
                snapshot(B, [member("QM1", B), member("QM2", B, network_priority=3)], [replica("QM2", B)]),
                snapshot(A, [member("QM1"), member("QM2", network_priority=3)], [replica("QM2")]),
            ],
            plain(2),
            "QM2 QM2",
            clusters=f"{A} {A}",
        ),
        id="equal network priority takes the first cluster by name",
    ),
    pytest.param(
        Case(
            [
                snapshot(A, [member("QM1"), member("QM2")], [replica("QM2")]),
                snapshot(
                    B,
                    [member("QM1", B), member("QM2", B, route_state="retrying", network_priority=9)],
                    [replica("QM2", B)],
                ),
            ],
            plain(2),
            "QM2 QM2",
            clusters=f"{A} {A}",
        ),
        id="route state before network priority",
    ),
    # Step 6.
    pytest.param(
        Case(
            inventory(
                *THREE,
                members=[
                    member("QM1"),
                    member("QM2", last_used=LATE),
                    member("QM3"),
                    member("QM4", last_used=EARLY),
                ],
            ),
            plain(4),
            "QM3 QM4 QM2 QM3",
        ),
        id="least recently used first, never used before all",
    ),
    pytest.param(
        Case(
            inventory(
                *THREE,
                members=[
                    member("QM1"),
                    member("QM2", last_used=EARLY),
                    member("QM3", last_used=LATE),
                    member("QM4", last_used=EARLY),
                ],
            ),
            plain(3),
            "QM2 QM4 QM3",
        ),
        id="equal last use ordered by name",
    ),
    # Bind on open.
    pytest.param(
        Case(
            inventory(*THREE, members=[member("QM1"), member("QM2", last_used=EARLY), member("QM3"), member("QM4")]),
            plain(3),
            "QM3 QM3 QM3",
            bind="on_open",
            rotation=2,
            bindings=(bound("QM3"),),
        ),
        id="on_open new binding ignores rotation",
    ),
    pytest.param(
        Case(inventory(*THREE, bindings=[bound("QM4")]), plain(3), "QM4 QM4 QM4", bind="on_open"),
        id="on_open existing binding",
    ),
    pytest.param(
        Case(
            inventory(*THREE, bindings=[bound("QM4", producer="P2")]),
            plain(2),
            "QM2 QM2",
            bind="on_open",
            bindings=(bound("QM2"),),
        ),
        id="on_open binding of another producer ignored",
    ),
    pytest.param(
        Case(
            inventory(
                *THREE,
                members=[member("QM1"), member("QM2"), member("QM4", suspended=True, route_state="unavailable")],
                bindings=[bound("QM4")],
            ),
            plain(2),
            "QM4 QM4",
            bind="on_open",
        ),
        id="on_open bound QM kept though suspended and unavailable",
    ),
    pytest.param(
        Case(
            inventory(replica("QM2"), replica("QM3"), replica("QM4", put_inhibited=True), bindings=[bound("QM4")]),
            plain(3),
            "2051 2051 2051",
            bind="on_open",
            texts={
                2051: "MQRC_PUT_INHIBITED (2051): cluster queue ORDERS: its replica on queue manager QM4 is "
                f"put-inhibited in cluster INVENTORY; producer P1 is bound to QM4 on open, {NOT_REBOUND}"
            },
        ),
        id="on_open bound QM put-inhibited",
    ),
    pytest.param(
        Case(
            inventory(*THREE, bindings=[bound("QM5")]),
            plain(1),
            "2270",
            bind="on_open",
            texts={
                2270: "MQRC_NO_DESTINATIONS_AVAILABLE (2270): cluster queue ORDERS: queue manager QM5 no longer hosts "
                f"a replica reachable from QM1 in cluster INVENTORY; producer P1 is bound to QM5 on open, {NOT_REBOUND}"
            },
        ),
        id="on_open bound QM gone",
    ),
    pytest.param(
        Case(
            inventory(*THREE, bindings=[bound("QM4")]),
            plain(1),
            "2270",
            bind="on_open",
            qmgr="QM2",
            texts={
                2270: "MQRC_NO_DESTINATIONS_AVAILABLE (2270): cluster queue ORDERS: the put names queue manager QM2; "
                f"producer P1 is bound to QM4 on open, {NOT_REBOUND}"
            },
        ),
        id="on_open bound QM excluded by named qmgr",
    ),
    pytest.param(
        Case(inventory(*THREE), [], "", bind="on_open"),
        id="on_open empty batch binds nothing",
    ),
    # Bind on group.
    pytest.param(
        Case(
            inventory(*THREE),
            [item("G1", 1), {}, item("G2", 1), item("G1", 2), {}, item("G2", 2), item("G1", 3, last=True)],
            "QM2 QM3 QM4 QM2 QM2 QM4 QM2",
            bind="on_group",
            bindings=(bound("QM4", "G2"),),
            finished=("G1",),
        ),
        id="on_group one choice per group, per message outside groups",
    ),
    pytest.param(
        Case(
            inventory(*THREE, bindings=[bound("QM4", "G1"), bound("QM2", "G1", producer="P2")]),
            [item("G3", 1), item("G1", 2), {}, item("G1", 3, last=True)],
            "QM2 QM4 QM3 QM4",
            bind="on_group",
            bindings=(bound("QM2", "G3"),),
            finished=("G1",),
        ),
        id="on_group group spanning calls keeps its binding",
    ),
    pytest.param(
        Case(
            inventory(*THREE),
            [segment("S1", 1, 0), segment("S1", 1, 10), {}],
            "QM2 QM2 QM3",
            bind="on_group",
            bindings=(bound("QM2", "S1"),),
        ),
        id="on_group segmented message not complete binds its group",
    ),
    pytest.param(
        Case(
            inventory(
                replica("QM2"), replica("QM3", put_inhibited=True), replica("QM4"), bindings=[bound("QM3", "G1")]
            ),
            [item("G1", 2), item("G2", 1, last=True), item("G1", 3, last=True)],
            "2051 QM2 2051",
            bind="on_group",
            finished=("G2",),
            texts={
                2051: "MQRC_PUT_INHIBITED (2051): cluster queue ORDERS: its replica on queue manager QM3 is "
                f"put-inhibited in cluster INVENTORY; group G1 of producer P1 is bound to QM3, {NOT_REBOUND}"
            },
        ),
        id="on_group bound QM put-inhibited",
    ),
    # Bind not fixed.
    pytest.param(
        Case(
            inventory(*THREE),
            [
                segment("S1", 1, 0),
                segment("S1", 1, 10),
                {},
                segment("S1", 1, 20, last_segment=True, last=True),
                segment("G1", 1, 0),
                segment("G1", 1, 5, last_segment=True),
                item("G1", 2, last=True),
            ],
            "QM2 QM2 QM3 QM2 QM4 QM4 QM2",
        ),
        id="not_fixed never splits segments",
    ),
    pytest.param(
        Case(inventory(*THREE), [item("G1", 1), item("G1", 2), item("G1", 3, last=True)], "QM2 QM3 QM4"),
        id="not_fixed spreads the items of a group",
    ),
    # Bind as the queue defines.
    pytest.param(
        Case(
            inventory(
                replica("QM0", default_bind="on_open"),
                replica("QM1", put_inhibited=True, default_bind="not_fixed"),
                replica("QM2", default_bind="on_open"),
                members=[member("QM0"), member("QM1"), member("QM2")],
            ),
            plain(3),
            "QM0 QM2 QM0",
            bind="as_q_def",
        ),
        id="as_q_def takes the local default bind",
    ),
    pytest.param(
        Case(
            inventory(
                replica("QM4", default_bind="not_fixed"),
                replica("QM2", default_bind="on_open"),
                replica("QM3", default_bind="not_fixed"),
                members=[member("QM1"), member("QM2", last_used=LATE), member("QM3"), member("QM4")],
            ),
            plain(3),
            "QM3 QM3 QM3",
            bind="as_q_def",
            bindings=(bound("QM3"),),
        ),
        id="as_q_def takes the default bind of the first QM by name",
    ),
    # No eligible route at all.
    pytest.param(
        Case(
            inventory(*THREE, members=[member("QM2"), member("QM3")]),
            plain(2),
            "2189 2189",
            texts={2189: NOT_MEMBER + "cluster INVENTORY"},
        ),
        id="2189 producer QM not in the cluster",
    ),
    pytest.param(
        Case(
            [snapshot(A, [member("QM2")], THREE), snapshot(B, [member("QM3", B)])],
            plain(1),
            "2189",
            bind="on_open",
            texts={2189: NOT_MEMBER + "clusters INVENTORY, PAYMENTS"},
        ),
        id="2189 producer QM in none of two clusters",
    ),
    pytest.param(
        Case([], plain(1), "2189", bind="as_q_def", texts={2189: NOT_MEMBER + "any cluster"}),
        id="2189 no cluster given",
    ),
    pytest.param(
        Case(
            inventory(*THREE, members=[member("QM2")], bindings=[bound("QM2")]),
            plain(1),
            "2189",
            bind="as_q_def",
            texts={2189: NOT_MEMBER + "cluster INVENTORY"},
        ),
        id="2189 as_q_def without a replica to read the default bind from",
    ),
    pytest.param(
        Case(
            inventory(replica("QM2", name="INVOICES")),
            plain(1),
            "2189",
            bind="as_q_def",
            texts={
                2189: "MQRC_CLUSTER_RESOLUTION_ERROR (2189): cluster queue ORDERS: no member of cluster INVENTORY "
                "advertises it"
            },
        ),
        id="2189 queue not advertised",
    ),
    pytest.param(
        Case(
            inventory(*(replica(name, put_inhibited=True) for name in ("QM1", "QM2", "QM3"))),
            [item("G1", 1), {}],
            "2268 2268",
            bind="on_group",
            texts={2268: ALL_INHIBITED + "(QM1, QM2, QM3) in cluster INVENTORY"},
        ),
        id="2268 every replica put-inhibited",
    ),
    pytest.param(
        Case(
            [
                snapshot(A, [member("QM1"), member("QM2")], [replica("QM2", put_inhibited=True)]),
                snapshot(B, [member("QM1", B), member("QM3", B)], [replica("QM3", B, put_inhibited=True)]),
            ],
            plain(1),
            "2268",
            bind="on_open",
            texts={2268: ALL_INHIBITED + "(QM2, QM3) in clusters INVENTORY, PAYMENTS"},
        ),
        id="2268 every replica put-inhibited in two clusters",
    ),
    pytest.param(
        Case(
            inventory(replica("QM2", put_inhibited=True), replica("QM3"), bindings=[bound("QM3")]),
            plain(2),
            "QM3 QM3",
            bind="on_open",
            qmgr="QM3",
        ),
        id="on_open bound QM that is the named one",
    ),
    pytest.param(
        Case(
            inventory(*THREE, bindings=[bound("QM2", "G1")]),
            [item("G1", 2), item("G2", 1), item("G1", 3, last=True)],
            "2270 QM3 2270",
            bind="on_group",
            qmgr="QM3",
            bindings=(bound("QM3", "G2"),),
            texts={
                2270: "MQRC_NO_DESTINATIONS_AVAILABLE (2270): cluster queue ORDERS: the put names queue manager QM3; "
                f"group G1 of producer P1 is bound to QM2, {NOT_REBOUND}"
            },
        ),
        id="on_group bound QM excluded by named qmgr",
    ),
]


def _route(case: Case):
    request = RouteRequest("ORDERS", "QM1", "P1", bind=case.bind, qmgr=case.qmgr)
    return route_messages(table(case.messages), case.snapshots, request, rotation=case.rotation)


def _last_use_order(targets: list[str | None]) -> tuple[str, ...]:
    last = {target: index for index, target in enumerate(targets) if target is not None}
    return tuple(sorted(last, key=last.__getitem__))


@pytest.mark.parametrize("case", CASES)
def test_route(case: Case) -> None:
    routing = _route(case)
    tokens = case.targets.split()
    dead = [token.isdigit() for token in tokens]
    targets = [None if is_dead else token for token, is_dead in zip(tokens, dead, strict=True)]
    clusters = case.clusters.split() if case.clusters else [A] * len(tokens)
    assert routing.target_qmgr.to_pylist() == targets
    assert routing.target_cluster.to_pylist() == [None if d else c for d, c in zip(dead, clusters, strict=True)]
    reasons = [int(token) if is_dead else None for token, is_dead in zip(tokens, dead, strict=True)]
    assert routing.reason.to_pylist() == reasons
    assert routing.reason_text.to_pylist() == [None if reason is None else case.texts[reason] for reason in reasons]
    assert routing.target_qmgr.type == pa.string() and routing.reason.type == pa.int32()
    assert routing.bindings == case.bindings
    assert routing.finished_groups == case.finished
    assert routing.used == _last_use_order(targets)


@pytest.mark.parametrize(
    ("count", "rotation", "expected"),
    [
        (10, 0, {"QM2": 4, "QM3": 3, "QM4": 3}),
        (10, 2, {"QM2": 3, "QM3": 3, "QM4": 4}),
        (11, 0, {"QM2": 4, "QM3": 4, "QM4": 3}),
        (11, 1, {"QM2": 3, "QM3": 4, "QM4": 4}),
        (11, 2, {"QM2": 4, "QM3": 3, "QM4": 4}),
    ],
)
def test_round_robin_spread(count: int, rotation: int, expected: dict[str, int]) -> None:
    request = RouteRequest("ORDERS", "QM1", "P1", bind="not_fixed")
    routing = route_messages(table(plain(count)), inventory(*THREE), request, rotation=rotation)
    counts = Counter(routing.target_qmgr.to_pylist())
    assert counts == expected
    assert max(counts.values()) - min(counts.values()) <= 1


def test_used_orders_queue_managers_by_last_use() -> None:
    snapshots = inventory(*THREE, bindings=[bound("QM4", "G1")])
    messages = table([item("G1", 1), {}, {}, item("G2", 1), {}, item("G1", 2)])
    request = RouteRequest("ORDERS", "QM1", "P1", bind="on_group")
    routing = route_messages(messages, snapshots, request)
    assert routing.target_qmgr.to_pylist() == ["QM4", "QM2", "QM3", "QM4", "QM2", "QM4"]
    assert routing.used == ("QM3", "QM2", "QM4")


def test_deterministic_whatever_the_snapshot_order_and_chunks() -> None:
    snapshots = [
        snapshot(A, [member("QM1"), member("QM2", last_used=EARLY), member("QM3")], [replica("QM2"), replica("QM3")]),
        snapshot(
            B,
            [member("QM1", B), member("QM3", B, network_priority=2), member("QM4", B)],
            [replica("QM3", B), replica("QM4", B)],
            [bound("QM3", "G1", cluster=B), bound("QM4", "G1")],
        ),
    ]
    rows = [item("G1", 1), {}, item("G2", 1), {}, {}, item("G1", 2, last=True)]
    request = RouteRequest("ORDERS", "QM1", "P1", bind="on_group")
    whole = route_messages(table(rows), snapshots, request, rotation=1)
    chunked = pa.concat_tables([table(rows[:2]), table(rows[2:])])
    again = route_messages(chunked, snapshots[::-1], request, rotation=1)
    # The first binding by (cluster, qmgr) wins when a group has two; the rest go round robin from QM4.
    assert whole.target_qmgr.to_pylist() == ["QM4", "QM4", "QM2", "QM3", "QM4", "QM4"]
    assert whole.target_cluster.to_pylist() == [B, B, A, B, B, B]
    for name in ("target_qmgr", "target_cluster", "reason", "reason_text"):
        assert getattr(again, name).equals(getattr(whole, name))
    assert (again.bindings, again.finished_groups, again.used) == (whole.bindings, whole.finished_groups, whole.used)
    assert whole.bindings == (bound("QM2", "G2"),)
    assert whole.finished_groups == ("G1",)
    assert whole.used == ("QM2", "QM3", "QM4")


def test_a_million_ungrouped_rows_spread_evenly() -> None:
    rows = 1_000_000
    false = pa.array(np.zeros(rows, dtype=bool))
    messages = pa.table(
        {
            "group_id": pa.nulls(rows, pa.string()),
            "msg_seq_number": pa.array(np.ones(rows, dtype=np.int32)),
            "last_in_group": false,
            "segmented": false,
            "last_segment": false,
        }
    )
    request = RouteRequest("ORDERS", "QM1", "P1", bind="not_fixed")
    routing = route_messages(messages, inventory(*THREE), request, rotation=1)
    assert routing.target_qmgr.value_counts().to_pylist() == [
        {"values": "QM3", "counts": 333_334},
        {"values": "QM4", "counts": 333_333},
        {"values": "QM2", "counts": 333_333},
    ]
    assert routing.reason.null_count == rows
    assert routing.used == ("QM4", "QM2", "QM3")


def test_bind_modes() -> None:
    assert BIND_MODES == ("as_q_def", "on_open", "not_fixed", "on_group")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: RouteRequest("ORDERS", "QM1", "P1", bind="x"),
            "option bind must be one of as_q_def, on_open, not_fixed, on_group; got 'x'",
        ),
        (
            lambda: route_messages(
                table(plain(1)),
                inventory(*THREE, members=[member("QM1"), member("QM2", route_state="broken")]),
                RouteRequest("ORDERS", "QM1", "P1"),
            ),
            "cluster INVENTORY: route_state of member QM2 must be one of running, stopped, retrying, unavailable; "
            "got 'broken'",
        ),
        (
            lambda: route_messages(
                table(plain(1)),
                inventory(*THREE) + [ClusterSnapshot(A, 2)],
                RouteRequest("ORDERS", "QM1", "P1"),
            ),
            "cluster INVENTORY is given twice (versions 1 and 2); give one snapshot per cluster",
        ),
        (
            lambda: route_messages(
                table(plain(1)),
                inventory(replica("QM2", default_bind="as_q_def")),
                RouteRequest("ORDERS", "QM1", "P1"),
            ),
            "cluster INVENTORY: default_bind of queue ORDERS on QM2 must be one of on_open, not_fixed, on_group; "
            "got 'as_q_def'",
        ),
    ],
    ids=["bind", "route_state", "cluster twice", "default_bind"],
)
def test_validation_errors(make, message: str) -> None:
    with pytest.raises(MQValidationError, match=f"^{re.escape(message)}$"):
        make()


def test_hashed_groups_agree_across_partitions() -> None:
    """Two partitions each holding part of groups G1..G6 (different rotations) send each group to one
    replica, the one its id's hash picks from the least-recently-used order (QM2, QM3, QM4)."""
    request = RouteRequest("ORDERS", "QM1", "P1", bind="on_group")
    groups = [f"G{number}" for number in range(1, 7)]
    first = table([item(group, 1) for group in groups] + plain(2))
    second = table([item(group, 2, last=True) for group in reversed(groups)] + plain(2))
    one = route_messages(first, inventory(*THREE), request, rotation=0, hash_groups=True)
    two = route_messages(second, inventory(*THREE), request, rotation=1, hash_groups=True)
    order = ["QM2", "QM3", "QM4"]
    expected = {group: order[zlib.crc32(group.encode()) % 3] for group in groups}
    assert dict(zip(groups, one.target_qmgr.to_pylist()[:6], strict=True)) == expected
    assert dict(zip(reversed(groups), two.target_qmgr.to_pylist()[:6], strict=True)) == expected
    assert len(set(expected.values())) > 1
    # Rows outside groups keep the round robin, from each partition's rotation.
    assert one.target_qmgr.to_pylist()[6:] == ["QM2", "QM3"]
    assert two.target_qmgr.to_pylist()[6:] == ["QM3", "QM4"]
