"""The console's REST API (``/api/v1``) over real queue managers: every endpoint, its errors with
their reason codes and HTTP statuses, who may write, and a put to get round trip."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from mqspark import MQError, QueueManager
from mqspark.console.app import build_app
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.services.monitor import Monitor

TOKEN = "s3cret-token"
ADMIN = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(qm: QueueManager, console_client) -> TestClient:
    return console_client([qm.root], admin=True, token=TOKEN)


def _error(response) -> tuple[int, int, str]:
    body = response.json()["error"]
    return response.status_code, body["reason"], body["text"]


def test_the_queue_managers_and_their_queues_with_depth(qm: QueueManager, tmp_path: Path, console_client) -> None:
    other = QueueManager.create(tmp_path / "qm2", "QM2")
    qm.define_queue("ORDERS", put_inhibited=True)
    qm.define_queue("ALIAS", type="alias", target_queue="ORDERS")
    qm.alter_queue("ORDERS", put_inhibited=False)
    qm.put("ORDERS", [{"payload": b"1"}, {"payload": b"2"}])
    qm.alter_queue("ORDERS", get_inhibited=True)
    client = console_client([qm.root, other.root])
    assert client.get("/api/v1/qmgr").json() == {
        "qmgr": [
            {"name": "QM1", "dead_letter_queue": "SYSTEM.DEAD.LETTER.QUEUE", "queues": 3},
            {"name": "QM2", "dead_letter_queue": "SYSTEM.DEAD.LETTER.QUEUE", "queues": 1},
        ]
    }
    queues = client.get("/api/v1/qmgr/QM1/queue").json()["queue"]
    assert [(q["name"], q["type"], q["depth"], q["put_inhibited"], q["get_inhibited"]) for q in queues] == [
        ("ALIAS", "alias", None, False, False),
        ("ORDERS", "local", 2, False, True),
        ("SYSTEM.DEAD.LETTER.QUEUE", "local", 0, False, False),
    ]
    assert queues[1]["oldest_age_s"] >= 0


def test_two_roots_of_one_queue_manager_name_are_refused(qm: QueueManager, tmp_path: Path) -> None:
    twin = QueueManager.create(tmp_path / "twin", "QM1")
    with pytest.raises(MQError, match=f"console: roots {qm.root} and {twin.root} both hold queue manager QM1"):
        build_app([qm.root, twin.root])


def test_a_queue_with_its_attributes_groups_and_failed_messages(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q.BACKOUT")
    qm.define_queue("Q", backout_queue="Q.BACKOUT", backout_threshold=1)
    qm.put("Q", [{"payload": b"a"}, {"payload": b"b"}, {"payload": b"c"}, {"payload": b"d"}])
    assert qm.get("Q", "billing")["payload"].to_pylist() == [b"a"]
    with pytest.raises(RuntimeError), qm.syncpoint_get("Q", "billing"):
        raise RuntimeError("poison")
    # The get after the failure moves the failed message to the backout queue.
    assert qm.get("Q", "billing")["payload"].to_pylist() == [b"c"]
    body = client.get("/api/v1/qmgr/QM1/queue/Q").json()
    assert (body["name"], body["depth"], body["attributes"]["backout_threshold"]) == ("Q", 1, 1)
    assert [(g["consumer"], g["depth"], g["held_by"]) for g in body["groups"]] == [("billing", 1, None)]
    assert body["failures"] == {
        "backout_queue": "Q.BACKOUT",
        "backed_out": 1,
        "error_queue": None,
        "errors": None,
        "dead_letter_queue": "SYSTEM.DEAD.LETTER.QUEUE",
        "dead_letters": 0,
    }


def test_browse_in_logical_order_with_the_clis_filters_and_pages(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"low", "priority": 1, "correl_id": "c1"}, {"payload": b"\xff\xfe", "priority": 5}])
    qm.put("Q", [{"payload": b"g1", "group_id": "G", "msg_seq_number": 1}])
    qm.put("Q", [{"payload": b"g2", "group_id": "G", "msg_seq_number": 2, "last_in_group": True}])
    url = "/api/v1/qmgr/QM1/queue/Q/message"
    page = client.get(url).json()
    assert [(m["payload"], m["payload_encoding"], m["priority"]) for m in page["messages"]] == [
        ("//4=", "base64", 5),
        ("low", "text", 1),
        ("g1", "text", 0),
        ("g2", "text", 0),
    ]
    assert (page["total"], page["more"], page["dead_letter_header"]) == (4, False, False)
    assert [m["payload"] for m in client.get(url, params={"group_id": "G"}).json()["messages"]] == ["g1", "g2"]
    assert [m["payload"] for m in client.get(url, params={"correl_id": "c1"}).json()["messages"]] == ["low"]
    assert [m["payload"] for m in client.get(url, params={"priority": "1"}).json()["messages"]] == ["low"]
    second = client.get(url, params={"offset": "1", "limit": "2"}).json()
    assert ([m["payload"] for m in second["messages"]], second["more"]) == (["low", "g1"], True)
    msg_id = page["messages"][1]["msg_id"]
    assert [m["payload"] for m in client.get(url, params={"msg_id": msg_id}).json()["messages"]] == ["low"]
    future = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    assert client.get(url, params={"put_after": future}).json()["messages"] == []
    assert len(client.get(url, params={"put_before": future}).json()["messages"]) == 4


@pytest.mark.parametrize(
    ("url", "status", "reason", "text"),
    [
        ("/api/v1/qmgr/QM1/queue/NOPE", 404, 2085, "queue NOPE is not defined in queue manager QM1"),
        ("/api/v1/qmgr/NOPE/queue", 404, 2085, "queue manager NOPE is not served here"),
        ("/api/v1/qmgr/QM1/queue/%2E%2E", 400, None, "queue name '..' must not be a path"),
        ("/api/v1/qmgr/QM1/queue/Q/message?limit=0", 400, None, "option limit must be 1-500, got 0"),
        ("/api/v1/qmgr/QM1/queue/Q/message?priority=x", 400, None, "option priority must be a whole number"),
        ("/api/v1/qmgr/QM1/queue/Q/message?put_after=2026-11-28", 400, None, "option put_after must name its time"),
        ("/api/v1/qmgr/QM1/queue/Q/message?order=random", 400, None, "option order must be one of"),
    ],
)
def test_bad_requests_answer_with_the_reason_and_a_status(
    qm: QueueManager, client: TestClient, url: str, status: int, reason: int | None, text: str
) -> None:
    qm.define_queue("Q")
    got_status, got_reason, got_text = _error(client.get(url))
    assert (got_status, got_reason) == (status, reason)
    assert text in got_text


def test_a_put_and_a_get_round_trip_with_the_message_fields(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q")
    url = "/api/v1/qmgr/QM1/queue/Q/message"
    headers = {**ADMIN, "mq-priority": "7", "mq-correl-id": "order-1", "mq-reply-to-queue": "REPLIES"}
    put = client.post(url, content=b'{"total": 3}', headers=[*headers.items(), ("mq-property", "region=eu")])
    assert put.status_code == 201 and put.headers["mq-msg-id"] == put.json()["msg_id"]
    grouped = {**ADMIN, "mq-group-id": "G", "mq-msg-seq-number": "1", "mq-last-in-group": "true"}
    assert client.post(url, content=b"only", headers=grouped).status_code == 201
    got = client.delete(url, params={"consumer": "app", "max": "5"}, headers=ADMIN)
    messages = got.json()["messages"]
    assert [(m["payload"], m["priority"], m["correl_id"], m["reply_to_queue"], m["properties"]) for m in messages] == [
        ('{"total": 3}', 7, "order-1", "REPLIES", {"region": "eu"}),
        ("only", 0, None, None, None),
    ]
    assert (messages[0]["msg_id"], messages[1]["group_id"], messages[1]["last_in_group"]) == (
        put.json()["msg_id"],
        "G",
        True,
    )
    assert client.delete(url, params={"consumer": "app"}, headers=ADMIN).status_code == 204
    assert qm.depth("Q", "app") == 0 and qm.depth("Q") == 0


def test_writes_answer_with_their_reason_and_status(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q", put_inhibited=True)
    url = "/api/v1/qmgr/QM1/queue/Q/message"
    assert _error(client.post(url, content=b"x", headers=ADMIN))[:2] == (403, 2051)
    qm.alter_queue("Q", put_inhibited=False, get_inhibited=True)
    assert _error(client.delete(url, params={"consumer": "g"}, headers=ADMIN))[:2] == (403, 2016)
    qm.alter_queue("Q", get_inhibited=False)
    ConsumerState(qm.root, "Q").acquire("g", "query-1", timedelta(seconds=30))
    status, reason, text = _error(client.delete(url, params={"consumer": "g"}, headers=ADMIN))
    assert (status, reason) == (409, 2042) and "already being read by a running query" in text
    assert _error(client.delete(url, headers=ADMIN))[:2] == (400, None)
    assert _error(client.delete(url, params={"consumer": "h", "wait": "61"}, headers=ADMIN))[2].endswith(
        "option wait must be 0-60 seconds, got 61.0"
    )
    bad = {**ADMIN, "mq-priority": "high"}
    assert _error(client.post(url, content=b"x", headers=bad))[2].endswith(
        "header mq-priority must be a whole number, got 'high'"
    )
    assert _error(client.post(url, content=b"x", headers={**ADMIN, "mq-priority": "12"}))[:2] == (400, 2050)
    assert qm.depth("Q") == 0
    qm.alter_queue("Q", max_depth=1, max_message_length=4)
    assert _error(client.post(url, content=b"too long", headers=ADMIN))[:2] == (413, 2030)
    assert client.post(url, content=b"fits", headers=ADMIN).status_code == 201
    status, reason, text = _error(client.post(url, content=b"full", headers=ADMIN))
    assert (status, reason, text) == (503, 2053, "MQRC_Q_FULL (2053): queue Q is full (max_depth 1, depth 1, put of 1)")


def test_writes_need_admin_and_its_token(qm: QueueManager, tmp_path: Path, console_client) -> None:
    qm.define_queue("Q")
    url = "/api/v1/qmgr/QM1/queue/Q/message"
    read_only = console_client([qm.root])
    status, reason, text = _error(read_only.post(url, content=b"x", headers=ADMIN))
    assert (status, reason) == (403, 2035) and text.endswith("console: writes need a console started with --admin")
    admin = console_client([qm.root], admin=True, token=TOKEN)
    assert _error(admin.post(url, content=b"x"))[:2] == (401, 2035)
    assert _error(admin.post(url, content=b"x", headers={"authorization": "Bearer wrong"}))[:2] == (401, 2035)
    assert _error(admin.delete(url, params={"consumer": "g"}))[:2] == (401, 2035)
    assert qm.depth("Q") == 0


def test_a_signed_in_browser_writes_only_with_its_csrf_token_from_the_consoles_origin(
    qm: QueueManager, console_client
) -> None:
    qm.define_queue("Q")
    url = "/api/v1/qmgr/QM1/queue/Q/message"
    client = console_client([qm.root], admin=True, token=TOKEN)
    assert client.post("/sign-in", data={"token": "wrong"}).status_code == 401
    signed = client.post("/sign-in", data={"token": TOKEN}, follow_redirects=False)
    assert signed.status_code == 303 and "httponly" in signed.headers["set-cookie"].lower()
    page = client.get("/").text
    csrf = page.split('name="csrf-token" content="')[1].split('"')[0]
    origin = {"origin": "http://localhost"}
    assert _error(client.post(url, content=b"x", headers=origin))[:2] == (401, 2035)
    assert _error(client.post(url, content=b"x", headers={"x-csrf-token": csrf, "origin": "http://evil.test"}))[:2] == (
        401,
        2035,
    )
    assert client.post(url, content=b"x", headers={"x-csrf-token": csrf, **origin}).status_code == 201
    assert qm.depth("Q") == 1


# Gets one message at a time for group ``g`` until none is left, printing each payload on a line.
PYTHON_GETS = """
import sys
from mqspark import QueueManager
qm = QueueManager.open(sys.argv[1])
while True:
    got = qm.get("Q", "g")
    if got.num_rows == 0 and qm.depth("Q", "g") == 0:
        break
    for payload in got["payload"].to_pylist():
        print(payload.decode(), flush=True)
"""


def test_delete_gets_competing_with_a_python_get_deliver_each_message_once(
    qm: QueueManager, client: TestClient
) -> None:
    qm.define_queue("Q")
    payloads = [f"m{number}" for number in range(40)]
    qm.put("Q", [{"payload": payload.encode()} for payload in payloads])
    python = subprocess.Popen([sys.executable, "-c", PYTHON_GETS, qm.root], stdout=subprocess.PIPE, text=True)
    rest = []
    url = "/api/v1/qmgr/QM1/queue/Q/message"
    while True:
        got = client.delete(url, params={"consumer": "g"}, headers=ADMIN)
        if got.status_code == 204 and qm.depth("Q", "g") == 0:
            break
        assert got.status_code in (200, 204), got.text
        if got.status_code == 200:
            rest.extend(message["payload"] for message in got.json()["messages"])
    out, _ = python.communicate(timeout=120)
    assert python.returncode == 0
    by_python = out.splitlines()
    assert sorted(rest + by_python) == sorted(payloads)


def test_the_monitor_history_of_a_queue_per_group_with_its_warn_verdicts(qm: QueueManager, client: TestClient) -> None:
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"x"}] * 5)
    qm.declare_consumer("Q", "g")
    monitor = Monitor(qm, "Q", "g", watch_interval=1, watch_count=1, expected_count=10)
    start = datetime.now(UTC) - timedelta(minutes=5)
    verdicts = [monitor.point(start + timedelta(seconds=second)).judgement.verdict for second in range(3)]
    assert verdicts == ["continue", "warn", "warn"]
    old = Monitor(qm, "Q", "g", watch_interval=1, watch_count=1, expected_count=10)
    old.point(start - timedelta(hours=2))
    history = client.get("/api/v1/qmgr/QM1/queue/Q/history", params={"minutes": "60"}).json()
    group = history["groups"]["g"]
    times = [(start + timedelta(seconds=second)).timestamp() for second in range(3)]
    assert (group["at"], group["depth"], group["rate_per_s"]) == (times, [5, 5, 5], [None, 0.0, 0.0])
    assert (group["warn"], group["abort"]) == (times[1:], [])
    assert (
        len(client.get("/api/v1/qmgr/QM1/queue/Q/history", params={"minutes": "180"}).json()["groups"]["g"]["at"]) == 4
    )
    refused = client.get("/api/v1/qmgr/QM1/queue/Q/history", params={"minutes": "0"})
    assert (refused.status_code, refused.json()["error"]["text"]) == (400, "option minutes must be 1-10080, got 0")


def test_only_the_local_host_names_are_answered(qm: QueueManager, console_client) -> None:
    assert console_client([qm.root], base_url="http://evil.test").get("/api/v1/qmgr").status_code == 400
    assert console_client([qm.root], base_url="http://127.0.0.1").get("/api/v1/qmgr").status_code == 200
    named = console_client([qm.root], base_url="http://mq.example.com", hosts=["mq.example.com"])
    assert named.get("/api/v1/qmgr").status_code == 200


def test_a_put_body_longer_than_the_queue_allows_is_refused_before_it_is_read(
    qm: QueueManager, client: TestClient
) -> None:
    qm.define_queue("Q", max_message_length=10)
    url = "/api/v1/qmgr/QM1/queue/Q/message"
    refused = client.post(url, content=b"x" * 11, headers=ADMIN)
    assert (refused.status_code, refused.json()["error"]["text"]) == (
        413,
        "MQRC_MSG_TOO_BIG_FOR_Q (2030): queue Q: the body is longer than 10 bytes",
    )
    unsigned = client.post(url, content=b"x" * 11)
    assert unsigned.status_code == 401 and unsigned.headers["www-authenticate"].startswith("Bearer")
    assert qm.depth("Q") == 0
