"""The console's admin actions (put a test message, purge, inhibit and allow, alter attributes) from
the page, with their confirmation, and from the REST API; each recorded in the audit table."""

from __future__ import annotations

import json
import re

import pytest
from starlette.testclient import TestClient

from mqspark import QueueManager
from mqspark.console import audit

TOKEN = "admin-token"
ADMIN = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def signed_in(qm: QueueManager, console_client) -> tuple[TestClient, str]:
    """A browser signed in to an admin console, and its CSRF token."""
    client = console_client([qm.root], admin=True, token=TOKEN)
    client.post("/sign-in", data={"token": TOKEN})
    page = client.get("/").text
    return client, page.split('name="csrf-token" content="')[1].split('"')[0]


def _post(client: TestClient, csrf: str, action: str, **fields: str):
    return client.post(
        f"/qmgr/QM1/queue/Q/admin/{action}",
        data={"csrf_token": csrf, **fields},
        headers={"origin": "http://localhost"},
        follow_redirects=False,
    )


def test_page_actions_ask_for_the_queues_name_and_are_audited(qm: QueueManager, signed_in) -> None:
    client, csrf = signed_in
    qm.define_queue("Q")
    refused = _post(client, csrf, "put", payload="hello", confirm="q")
    assert refused.status_code == 400 and "put: type the queue&#39;s name (Q) to confirm" in refused.text
    assert qm.depth("Q") == 0
    assert _post(client, csrf, "put", payload="hello", priority="7", confirm="Q").headers["location"] == (
        "/qmgr/QM1/queue/Q/admin?done=put"
    )
    assert [(m["payload"], m["priority"]) for m in qm.browse("Q").to_pylist()] == [(b"hello", 7)]
    assert _post(client, csrf, "inhibit_put", confirm="Q").status_code == 303
    assert qm.inquire_queue("Q").put_inhibited
    failed = _post(client, csrf, "put", payload="again", confirm="Q")
    assert failed.status_code == 403 and "queue Q is put-inhibited" in failed.text
    assert _post(client, csrf, "allow_put", confirm="Q").status_code == 303
    assert _post(client, csrf, "alter", confirm="Q", max_depth="10", description="<i>orders</i>").status_code == 303
    definition = qm.inquire_queue("Q")
    assert (definition.put_inhibited, definition.max_depth, definition.description) == (False, 10, "<i>orders</i>")
    assert _post(client, csrf, "purge", confirm="Q").status_code == 303
    assert qm.depth("Q") == 0
    actions = [(a["action"], a["ok"]) for a in reversed(audit.read(qm))]
    assert actions == [
        ("put", True),
        ("inhibit_put", True),
        ("put", False),
        ("allow_put", True),
        ("alter", True),
        ("purge", True),
    ]
    html = client.get("/qmgr/QM1/queue/Q/admin").text
    assert len(re.findall(r"<tr class=\"[^\"]*\"><td>", html)) == 6
    assert "<i>orders</i>" not in html and "&lt;i&gt;orders&lt;/i&gt;" in html


def test_an_admin_action_without_the_token_or_its_csrf_token_is_refused(
    qm: QueueManager, signed_in, console_client
) -> None:
    client, csrf = signed_in
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"keep"}])
    anonymous = console_client([qm.root], admin=True, token=TOKEN)
    refused = anonymous.post(
        "/qmgr/QM1/queue/Q/admin/purge", data={"confirm": "Q"}, headers={"origin": "http://localhost"}
    )
    assert refused.status_code == 401 and "a write needs the admin token" in refused.text
    forged = _post(client, "not-the-token", "purge", confirm="Q")
    assert forged.status_code == 401 and "CSRF token or origin" in forged.text
    read_only = console_client([qm.root])
    assert read_only.post("/api/v1/admin/qmgr/QM1/queue/Q/purge", headers=ADMIN).status_code == 403
    assert qm.depth("Q") == 1 and audit.read(qm) == []


def test_the_admin_api_acts_and_answers_with_the_result(qm: QueueManager, console_client) -> None:
    qm.define_queue("Q")
    client = console_client([qm.root], admin=True, token=TOKEN)
    url = "/api/v1/admin/qmgr/QM1/queue/Q"
    put = client.post(f"{url}/put", json={"payload": "test", "priority": 3}, headers=ADMIN)
    assert put.status_code == 200 and len(put.json()["msg_ids"]) == 1
    assert client.post(f"{url}/inhibit_get", headers=ADMIN).json() == {"get_inhibited": True}
    assert client.post(f"{url}/alter", json={"attributes": {"max_depth": 5}}, headers=ADMIN).json() == {"max_depth": 5}
    refused = client.post(f"{url}/alter", json={"attributes": {"type": "alias"}}, headers=ADMIN)
    assert (refused.status_code, refused.json()["error"]["text"]) == (
        400,
        "alter: queue Q: attribute 'type' cannot be altered here",
    )
    unknown = client.post(f"{url}/explode", headers=ADMIN)
    assert unknown.status_code == 400 and "admin: action must be one of put, purge" in unknown.json()["error"]["text"]
    assert client.post(f"{url}/purge", headers=ADMIN).json() == {"purged": 1}
    rows = client.get("/api/v1/admin/qmgr/QM1/audit", headers=ADMIN).json()["audit"]
    assert [(row["action"], row["ok"]) for row in rows] == [
        ("purge", True),
        ("explode", False),
        ("alter", False),
        ("alter", True),
        ("inhibit_get", True),
        ("put", True),
    ]
    assert json.loads(rows[0]["result"]) == {"purged": 1}


def test_what_admins_did_shows_only_to_a_signed_in_admin(qm: QueueManager, signed_in, console_client) -> None:
    client, csrf = signed_in
    qm.define_queue("Q")
    assert _post(client, csrf, "inhibit_put", confirm="Q").status_code == 303
    assert "inhibit_put" in client.get("/qmgr/QM1/queue/Q/admin").text.split('id="audit"')[1]
    anonymous = console_client([qm.root], admin=True, token=TOKEN)
    assert "inhibit_put" not in anonymous.get("/qmgr/QM1/queue/Q/admin").text.split('id="audit"')[1]
    assert anonymous.get("/api/v1/admin/qmgr/QM1/audit").status_code == 401
