"""The console's pages as the server renders them: what each shows, in which order, and that
payloads, properties and names are escaped (a ``<script>`` payload shows as text)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from starlette.testclient import TestClient

from mqspark import QueueManager
from mqspark.console.pages import segment

SCRIPT = "<script>alert('x')</script>"


@pytest.fixture
def client(qm: QueueManager, console_client) -> TestClient:
    return console_client([qm.root])


def _cells(html: str, table: str) -> list[list[str]]:
    """The text of each body row's cells of the table with id ``table``."""
    body = html.split(f'id="{table}"')[1].split("</table>")[0].split("<tbody")[1]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows
    ]


def test_the_overview_sorts_and_filters_the_queues(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("A.ORDERS")
    qm.define_queue("B.ORDERS")
    qm.define_queue("C.PAYMENTS")
    qm.put("B.ORDERS", [{"payload": b"1"}, {"payload": b"2"}])
    qm.put("C.PAYMENTS", [{"payload": b"1"}])
    by_depth = _cells(client.get("/?sort=depth&desc=1").text, "queues")
    assert [row[1] for row in by_depth] == ["B.ORDERS", "C.PAYMENTS", "A.ORDERS", "SYSTEM.DEAD.LETTER.QUEUE"]
    assert (by_depth[0][3], by_depth[0][5:]) == ("2", ["allowed", "allowed"])
    filtered = client.get("/?filter=orders&sort=name&desc=1", headers={"hx-request": "true"}).text
    assert "<html" not in filtered
    assert re.findall(r">([A-Z.]+)</a>", filtered) == ["B.ORDERS", "A.ORDERS"]
    refused = client.get("/?sort=secret")
    assert (
        refused.status_code == 400
        and "option sort must be one of qmgr, name, type, depth, oldest_age_s" in refused.text
    )


def test_the_overview_rows_polled_show_a_put_through_the_console(qm: QueueManager, console_client) -> None:
    qm.define_queue("Q")
    client = console_client([qm.root], admin=True, token="t0ken")
    polled = {"hx-request": "true"}
    assert re.findall(r'class="number">(\d+)<', client.get("/?sort=name", headers=polled).text)[:1] == ["0"]
    put = client.post("/api/v1/qmgr/QM1/queue/Q/message", content=b"x", headers={"authorization": "Bearer t0ken"})
    assert put.status_code == 201
    assert re.findall(r'class="number">(\d+)<', client.get("/?sort=name", headers=polled).text)[:1] == ["1"]
    assert _cells(client.get("/?sort=name").text, "queues")[0][:4] == ["QM1", "Q", "local", "1"]


def _updated(html: str) -> datetime:
    """When the page says the console read what it shows (its "Last update")."""
    [shown] = re.findall(r'<span id="updated"[^>]*>([^<]+)</span>', html)
    return datetime.strptime(shown, "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC)


def test_pages_show_when_their_answers_were_read(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q")
    before = datetime.now(UTC).replace(microsecond=0)
    page = client.get("/").text
    read = _updated(page)
    assert before <= read <= datetime.now(UTC)
    # Clients are served that answer until it is read again: the time is the answer's, not the page's.
    while datetime.now(UTC) < read + timedelta(seconds=1):
        time.sleep(0.05)
    polled = client.get("/", headers={"hx-request": "true"}).text
    assert (_updated(client.get("/").text), _updated(polled)) == (read, read)
    assert '<span id="updated" hx-swap-oob="true"' in polled
    for path in ("/qmgr/QM1/queue/Q", "/qmgr/QM1/instances", "/qmgr/QM1/dead-letters"):
        assert before <= _updated(client.get(path).text) <= datetime.now(UTC), path
    assert "Last update" not in client.get("/qmgr/QM1/queue/Q/messages").text


def test_a_script_payload_shows_as_text_in_lists_and_on_its_page(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q")
    [msg_id] = qm.put(
        "Q",
        [
            {
                "payload": SCRIPT.encode(),
                "properties": {SCRIPT: SCRIPT},
                "group_id": "<b>g</b>",
                "msg_seq_number": 1,
                "last_in_group": True,
            }
        ],
    )
    listed = client.get("/qmgr/QM1/queue/Q/messages").text
    page = client.get(f"/qmgr/QM1/queue/Q/messages/{msg_id}").text
    for html in (listed, page):
        assert "<script>alert" not in html and "<b>g</b>" not in html
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html
    assert _cells(listed, "messages")[0][1:4] == [msg_id, "0", "&lt;b&gt;g&lt;/b&gt;"]


def test_a_message_page_shows_its_payload_as_text_json_or_hex(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q")
    [msg_id] = qm.put("Q", [{"payload": b'{"a": [1, 2]}', "correl_id": "c-1"}])
    url = f"/qmgr/QM1/queue/Q/messages/{msg_id}"
    payload = re.compile(r'<pre class="payload" id="payload">(.*?)</pre>', re.S)
    assert payload.findall(client.get(url).text) == ["{&#34;a&#34;: [1, 2]}"]
    assert payload.findall(client.get(url, params={"payload": "json"}).text) == [
        "{\n  &#34;a&#34;: [\n    1,\n    2\n  ]\n}"
    ]
    assert payload.findall(client.get(url, params={"payload": "hex"}).text) == [b'{"a": [1, 2]}'.hex()]
    header = dict(row for row in (cells[:2] for cells in _header_rows(client.get(url).text)))
    assert (header["correl_id"], header["payload_length"], header["priority"]) == ("c-1", "13", "0")
    missing = client.get("/qmgr/QM1/queue/Q/messages/nothing-here")
    assert missing.status_code == 404 and "queue Q: no message nothing-here" in missing.text


def _header_rows(html: str) -> list[list[str]]:
    table = html.split('id="header"')[1].split("</table>")[0]
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)
    ]


def test_a_queue_page_shows_its_groups_and_an_unknown_queue_is_a_404(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"1"}, {"payload": b"2"}])
    qm.get("Q", "billing")
    html = client.get("/qmgr/QM1/queue/Q").text
    # The queue's depth counts what any group still waits for.
    assert re.findall(r'id="depth">(\d+)<', html) == ["1"]
    assert [row[:2] for row in _cells(html, "groups")] == [["billing", "1"]]
    missing = client.get("/qmgr/QM1/queue/NOPE")
    assert missing.status_code == 404 and "queue NOPE is not defined in queue manager QM1" in missing.text


def test_every_page_forbids_scripts_other_than_the_consoles_own(client: TestClient) -> None:
    response = client.get("/")
    assert response.headers["content-security-policy"].startswith("default-src 'self'; script-src 'self';")
    assert response.headers["x-frame-options"] == "DENY"
    assert client.get("/static/htmx.min.js").status_code == 200


def test_a_bad_option_is_named_on_the_page_and_what_it_echoes_is_escaped(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q")
    bad_priority = client.get("/qmgr/QM1/queue/Q/messages", params={"priority": "12"})
    assert bad_priority.status_code == 400 and "option priority must be 0-9, got 12" in bad_priority.text
    bad_offset = client.get("/qmgr/QM1/queue/Q/messages", params={"offset": "x"})
    assert "option offset must be a whole number, got &#39;x&#39;" in bad_offset.text
    echoed = client.get("/", params={"sort": SCRIPT})
    assert echoed.status_code == 400 and "<script>alert" not in echoed.text and "&lt;script&gt;" in echoed.text


def test_names_with_a_percent_sign_link_to_their_own_pages(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q%41")
    qm.define_queue("QA")
    qm.put("Q%41", [{"payload": b"mine"}])
    html = client.get("/").text
    assert 'href="/qmgr/QM1/queue/Q%2541"' in html and 'href="/qmgr/QM1/queue/QA"' in html
    # (The test client decodes a path twice; tests/test_console_browser.py follows such a link.)
    assert segment("A/B%") == "A%2FB%25"
