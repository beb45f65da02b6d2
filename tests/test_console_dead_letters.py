"""Failed messages in the console: the dead-letters page with MQ's header, and redrive from the page
and from the REST API, at a rate, with its progress and its audit record."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

import pytest
from starlette.testclient import TestClient

from mqspark import QueueManager
from mqspark.clock import ManualClock
from mqspark.console import audit

TOKEN = "dl-token"
ADMIN = {"authorization": f"Bearer {TOKEN}"}


def _fail(qm: QueueManager, count: int) -> None:
    """``count`` messages of Q fail once each for group g and go to Q.BACKOUT (threshold 1)."""
    qm.define_queue("Q.BACKOUT")
    qm.define_queue("Q", backout_queue="Q.BACKOUT", backout_threshold=1)
    qm.put("Q", [{"payload": f"m{number}".encode()} for number in range(count)])
    for number in range(count):
        with pytest.raises(RuntimeError), qm.syncpoint_get("Q", "g"):
            raise RuntimeError(f"<b>failure {number}</b>")
    assert qm.get("Q", "g").num_rows == 0
    assert qm.depth("Q.BACKOUT") == count


def _until(client: TestClient, url: str, reached: Callable[[dict], bool], headers: dict | None = None) -> dict:
    """The redrive's state at ``url`` once ``reached`` holds for it, or after 60 s."""
    deadline = time.monotonic() + 60
    while True:
        state = client.get(url, headers=headers).json()
        if reached(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


def _until_ended(client: TestClient, url: str, headers: dict | None = None) -> dict:
    return _until(client, url, lambda state: state["state"] != "running", headers)


def test_the_page_shows_each_failure_queue_and_the_dead_letter_header(qm: QueueManager, console_client) -> None:
    _fail(qm, 2)
    client = console_client([qm.root])
    html = client.get("/qmgr/QM1/dead-letters", params={"queue": "Q.BACKOUT"}).text
    queues = html.split('id="failure-queues"')[1].split("</table>")[0]
    assert re.findall(r"<td>([^<]*)</td>", queues) == ["backout queue of Q", "dead-letter queue"]
    rows = re.findall(r"<tr>\s*<td><input(.*?)</tr>", html, re.S)
    assert len(rows) == 2
    assert "last error: RuntimeError: &lt;b&gt;failure 0&lt;/b&gt;" in rows[0] and "<b>" not in html
    assert re.findall(r'<td class="number">(\d+)</td>', rows[0]) == ["2362", "1"]
    assert "Redrive needs a console started with --admin." in html


def test_a_redrive_from_the_page_moves_the_selected_messages_back_at_its_rate(
    qm: QueueManager, console_client, clock: ManualClock
) -> None:
    _fail(qm, 3)
    client = console_client([qm.root], admin=True, token=TOKEN, clock=clock)
    client.post("/sign-in", data={"token": TOKEN})
    html = client.get("/qmgr/QM1/dead-letters", params={"queue": "Q.BACKOUT"}).text
    csrf = re.findall(r'name="csrf_token" value="([^"]+)"', html)[0]
    chosen = re.findall(r'name="msg_id" value="([^"]+)"', html)[:2]
    form = {"csrf_token": csrf, "msg_id": chosen, "rate": "1"}
    answer = client.post(
        "/qmgr/QM1/dead-letters/Q.BACKOUT/redrive",
        data=form,
        headers={"origin": "http://localhost"},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    progress = answer.headers["location"]
    api = "/api/v1/admin" + progress
    # One message a second of the console's clock: the first goes at once, the second a second later.
    state = _until(client, api, lambda state: state["done"] > 0)
    assert (state["state"], state["done"], state["moved"]) == ("running", 1, {"Q": 1})
    clock.advance(0.9)
    state = client.get(api).json()
    assert (state["state"], state["done"], state["moved"]) == ("running", 1, {"Q": 1})
    clock.advance(0.1)
    state = _until_ended(client, api)
    assert (state["state"], state["done"], state["moved"]) == ("done", 2, {"Q": 2})
    final = client.get(progress, headers={"hx-request": "true"})
    assert final.status_code == 286 and "2 of 2 selected messages, 1 a second: done" in final.text
    assert sorted(qm.get("Q", "g", max_messages=5)["msg_id"].to_pylist()) == sorted(chosen)
    assert qm.depth("Q.BACKOUT") == 1
    actions = audit.read(qm)
    assert [(a["action"], a["queue"], a["ok"], json.loads(a["result"])) for a in actions][0][:3] == (
        "redrive",
        "Q.BACKOUT",
        True,
    )
    assert json.loads(actions[0]["result"])["moved"] == {"Q": 2} and json.loads(actions[1]["result"]) == "started"


def test_a_redrive_of_all_through_the_api(qm: QueueManager, console_client) -> None:
    _fail(qm, 3)
    client = console_client([qm.root], admin=True, token=TOKEN)
    url = "/api/v1/admin/qmgr/QM1/queue/Q.BACKOUT/redrive"
    answer = client.post(url, json={"rate": 1000}, headers=ADMIN)
    assert answer.status_code == 202 and answer.json()["selected"] == 3
    state = _until_ended(client, f"/api/v1/admin/redrive/{answer.json()['id']}", ADMIN)
    # What a redrive did is for admins only.
    assert client.get(f"/api/v1/admin/redrive/{answer.json()['id']}").status_code == 401
    assert (state["state"], state["moved"]) == ("done", {"Q": 3})
    assert sorted(qm.get("Q", "g", max_messages=5)["payload"].to_pylist()) == [b"m0", b"m1", b"m2"]
    assert audit.read(qm)[0]["who"].startswith("token (")


@pytest.mark.parametrize(
    ("body", "headers", "status", "text"),
    [
        ({"rate": 0}, ADMIN, 400, "redrive: option rate must be 1-1000 messages a second, got 0"),
        ({"msg_ids": "abc"}, ADMIN, 400, "redrive: msg_ids must be a list of msg_ids, got 'abc'"),
        ({}, {}, 401, "a write needs the admin token"),
    ],
)
def test_a_bad_redrive_is_refused_and_moves_nothing(
    qm: QueueManager, body: dict, headers: dict, status: int, text: str, console_client
) -> None:
    _fail(qm, 1)
    client = console_client([qm.root], admin=True, token=TOKEN)
    answer = client.post("/api/v1/admin/qmgr/QM1/queue/Q.BACKOUT/redrive", json=body, headers=headers)
    assert answer.status_code == status and text in answer.json()["error"]["text"]
    assert qm.depth("Q.BACKOUT") == 1 and audit.read(qm) == []
    missing = client.get("/api/v1/admin/redrive/nope", headers=ADMIN)
    assert (missing.status_code, missing.json()["error"]["reason"]) == (404, 2085)


def test_the_page_of_an_empty_dead_letter_queue(qm: QueueManager, console_client) -> None:
    qm.define_queue("Q")
    page = console_client([qm.root]).get("/qmgr/QM1/dead-letters")
    assert page.status_code == 200
    assert "SYSTEM.DEAD.LETTER.QUEUE: 0 messages" in page.text and "No failed message waits here." in page.text
