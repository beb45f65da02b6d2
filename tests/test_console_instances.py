"""The console's page of service instances (active and standby, switchover) and clusters (replicas,
advertised queues with what each replica holds, routing bindings)."""

from __future__ import annotations

import os
import re
import socket
from datetime import timedelta
from pathlib import Path

import pytest

from mqspark import MQError, QueueManager
from mqspark.cluster.repository import Cluster
from mqspark.console import audit
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.services.instances import Instance

TOKEN = "instances-token"


def _rows(html: str, table: str) -> list[list[str]]:
    body = html.split(f'id="{table}"')[1].split("</table>")[0].split("<tbody>")[1]
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    ]


def test_the_active_and_standby_instances_and_a_switchover(qm: QueueManager, console_client) -> None:
    qm.define_queue("Q")
    qm.declare_consumer("Q", "G")
    active, standby = (Instance(qm, "Q", "G", lease_timeout=timedelta(seconds=30)) for _ in range(2))
    try:
        active.wait_until_active(timeout=10)
        with pytest.raises(MQError, match="did not become active"):
            standby.wait_until_active(timeout=0.5)
        client = console_client([qm.root], admin=True, token=TOKEN)
        client.post("/sign-in", data={"token": TOKEN})
        html = client.get("/qmgr/QM1/instances").text
        rows = _rows(html, "instances")
        assert [(row[0], row[1], row[2], row[4]) for row in rows] == [
            ("Q", "G", active.id, "active"),
            ("Q", "G", standby.id, "standby"),
        ]
        here = f"{socket.gethostname()}:{os.getpid()}"
        group = _rows(client.get("/qmgr/QM1/queue/Q").text, "groups")[0]
        assert (group[0], group[-1]) == ("G", f"active {here}, standby {here}")
        csrf = html.split('name="csrf-token" content="')[1].split('"')[0]
        done = client.post(
            "/qmgr/QM1/queue/Q/admin/switchover",
            data={"csrf_token": csrf, "consumer": "G", "confirm": "Q"},
            headers={"origin": "http://localhost"},
            follow_redirects=False,
        )
        assert done.status_code == 303
        events = ConsumerState(qm.root, "Q").events("G", ("switchover",))
        assert events.num_rows == 1
        assert [(row["action"], row["ok"], row["detail"]) for row in audit.read(qm)] == [
            ("switchover", True, '{"consumer": "G"}')
        ]
    finally:
        active.stop()
        standby.stop()


def test_a_cluster_with_its_replicas_queues_and_bindings(qm: QueueManager, tmp_path: Path, console_client) -> None:
    other = QueueManager.create(tmp_path / "qm2", "QM2")
    cluster = Cluster.create(tmp_path / "repo", "SHOP")
    for member in (qm, other):
        member.define_queue("ORDERS")
        cluster.join(member)
        cluster.advertise(member, "ORDERS")
    other.put("ORDERS", [{"payload": b"1"}, {"payload": b"2"}])
    html = console_client([qm.root]).get("/qmgr/QM1/instances").text
    assert "Cluster SHOP" in html
    assert [row[:3] for row in _rows(html, "members-1")] == [["QM1", "running", "no"], ["QM2", "running", "no"]]
    queues = html.split("Advertised queues")[1].split("</table>")[0]
    cells = [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", queues, re.S)
    ]
    assert [(row[0], row[1], row[4]) for row in cells if row] == [("ORDERS", "QM1", "0"), ("ORDERS", "QM2", "2")]
    assert "No service instance is running or recently stopped." in html
