"""End-to-end tests of the ``mqspark`` command on real Delta tables, no Spark.

Commands run in this process (:func:`.support.cli.mqspark`: ``main()`` with stdin, stdout and
stderr of its own), except where the process is what is tested: the command as a shell runs it,
and a reader that goes away. Each test shares one queue manager across its steps, and state that
is not under test is set up or checked with :class:`mqspark.QueueManager`.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mqspark import MQError, QueueManager, Reason
from mqspark.qmgr import engine

from .support.cli import mqspark, mqspark_process
from .support.samples import dead_letters

REPO_CONF = Path(__file__).parents[1] / "examples" / "queue-manager.toml"
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
MSG_ID = re.compile(r"[0-9a-f]{32}")
PUT_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00")


def ok(root: str | Path, *args: str, input: str | None = None) -> str:
    """Stdout of a command that must succeed silently on stderr."""
    result = mqspark(root, *args, input=input)
    assert (result.returncode, result.stderr) == (0, ""), f"mqspark {' '.join(args)}: {result.stderr}"
    return result.stdout


def ok_json(root: str | Path, *args: str, input: str | None = None):
    return json.loads(ok(root, "--json", *args, input=input))


def lines(text: str) -> list[str]:
    """Output lines without trailing blanks (table cells are padded)."""
    return [line.rstrip() for line in text.splitlines()]


def fails(root: str | Path, *args: str) -> str:
    """The one error line of a command that must fail with exit code 1 and print nothing on stdout."""
    result = mqspark(root, *args)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    error_lines = result.stderr.splitlines()
    assert len(error_lines) == 1, result.stderr
    assert error_lines[0].startswith("mqspark: error: "), result.stderr
    return error_lines[0]


def parse_table(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """Columns and rows of a table printed by the CLI, cut at the header's column positions."""
    header, *rows = text.splitlines()
    names = header.split()
    starts, position = [], 0
    for name in names:
        position = header.index(name, position)
        starts.append(position)
        position += len(name)
    ends = starts[1:] + [None]
    return names, [{n: row[s:e].strip() for n, s, e in zip(names, starts, ends, strict=True)} for row in rows]


def test_queue_manager_and_queue_administration(tmp_path):
    root = tmp_path / "qm"
    assert ok_json(root, "qmgr", "create", "QM1") == {"name": "QM1", "root": str(root), "dead_letter_queue": DLQ}
    assert (root / "_qmgr" / "_delta_log").is_dir()
    assert (root / "queues" / DLQ / "_delta_log").is_dir()

    defined = ok_json(
        root,
        "queue",
        "define",
        "ORDERS",
        "--max-depth",
        "5",
        "--put-inhibited",
        "true",
        "--cluster",
        "A,B",
        "--retry-delay",
        "1.5",
        "--description",
        "incoming orders",
    )
    expected = {
        "name": "ORDERS",
        "type": "local",
        "target_queue": None,
        "default_priority": 0,
        "delivery_sequence": "priority",
        "put_inhibited": True,
        "get_inhibited": False,
        "max_depth": 5,
        "max_message_length": 4194304,
        "default_bind": "on_open",
        "backout_threshold": 0,
        "backout_queue": None,
        "retry_count": 0,
        "retry_delay": 1.5,
        "error_queue": None,
        "lock_duration": 30.0,
        "consumer_group_expiry": 604800.0,
        "duplicate_window": 0.0,
        "cluster": ["A", "B"],
        "description": "incoming orders",
    }
    assert defined == expected
    assert (root / "queues" / "ORDERS" / "_delta_log").is_dir()
    with pytest.raises(MQError) as inhibited:
        QueueManager.open(root).put("ORDERS", [{"payload": "x"}])
    assert inhibited.value.reason == Reason.MQRC_PUT_INHIBITED

    altered = ok_json(root, "queue", "alter", "ORDERS", "--put-inhibited", "false", "--default-priority", "3")
    assert altered == expected | {"put_inhibited": False, "default_priority": 3}
    assert ok_json(root, "queue", "show", "ORDERS") == altered

    assert lines(ok(root, "queue", "show", "ORDERS")) == [
        "name: ORDERS",
        "type: local",
        "target_queue:",
        "default_priority: 3",
        "delivery_sequence: priority",
        "put_inhibited: False",
        "get_inhibited: False",
        "max_depth: 5",
        "max_message_length: 4194304",
        "default_bind: on_open",
        "backout_threshold: 0",
        "backout_queue:",
        "retry_count: 0",
        "retry_delay: 1.5",
        "error_queue:",
        "lock_duration: 30.0",
        "consumer_group_expiry: 604800.0",
        "duplicate_window: 0.0",
        "cluster:",
        "  A",
        "  B",
        "description: incoming orders",
    ]

    spare = lines(ok(root, "queue", "define", "SPARE", "--delivery-sequence", "fifo", "--description", "spare"))
    assert spare[:5] == [
        "name: SPARE",
        "type: local",
        "target_queue:",
        "default_priority: 0",
        "delivery_sequence: fifo",
    ]
    assert spare[-2:] == ["cluster: []", "description: spare"]

    put = ok_json(root, "put", "ORDERS", "one", "two")
    assert put["queue"] == "ORDERS" and len(put["msg_ids"]) == 2

    assert lines(ok(root, "queue", "list")) == [
        "name                      type   depth  description",
        "ORDERS                    local  2      incoming orders",
        "SPARE                     local  0      spare",
        f"{DLQ}  local  0      dead-letter queue",
    ]
    shown = ok_json(root, "qmgr", "show")
    assert shown == {
        "name": "QM1",
        "qmid": QueueManager.open(root).qmid,
        "root": str(root),
        "dead_letter_queue": DLQ,
        "default_reconnect": "no",
        "description": "",
        "queues": 3,
    }
    assert shown["qmid"].startswith("QM1_")
    altered = ok_json(root, "qmgr", "alter", "--default-reconnect", "disabled", "--description", "the orders hub")
    assert altered == {**shown, "default_reconnect": "disabled", "description": "the orders hub"}
    assert engine(QueueManager.open(root)).definition.default_reconnect == "disabled"

    assert ok(root, "queue", "delete", "SPARE") == "deleted: SPARE\n"
    assert not (root / "queues" / "SPARE").exists()

    assert fails(root, "queue", "delete", "ORDERS") == (
        "mqspark: error: MQRC_Q_NOT_EMPTY (2055): queue ORDERS holds 2 messages; delete with purge to discard them"
    )
    assert QueueManager.open(root).depth("ORDERS") == 2

    assert ok(root, "queue", "delete", "ORDERS", "--purge") == "deleted: ORDERS\n"
    assert not (root / "queues" / "ORDERS").exists()
    assert [q.name for q in QueueManager.open(root).queues()] == [DLQ]


def test_put_browse_and_depth(qm, tmp_path):
    root = qm.root
    qm.define_queue("ORDERS", default_priority=2)

    first = ok_json(
        root, "put", "ORDERS", "order 1", "order 2", "--correl-id", "C1", "--property", "k=v", "--property", "team=blue"
    )
    assert first["queue"] == "ORDERS" and len(first["msg_ids"]) == 2

    lines_file = tmp_path / "lines.txt"
    lines_file.write_text("file 1\nfile 2\n", encoding="utf-8")
    from_file = lines(ok(root, "put", "ORDERS", "--file", str(lines_file)))
    assert from_file[:2] == ["queue: ORDERS", "msg_ids:"] and len(from_file) == 4
    file_ids = [line.strip() for line in from_file[2:]]
    assert all(MSG_ID.fullmatch(msg_id) for msg_id in file_ids)

    group = ok_json(root, "put", "ORDERS", "--group-id", "BASKET-7", input="item 1\nitem 2\nitem 3\n")
    assert len(group["msg_ids"]) == 3

    rush = ok_json(root, "put", "ORDERS", "rush", "--priority", "7")
    msg_ids = rush["msg_ids"] + first["msg_ids"] + file_ids + group["msg_ids"]
    assert len(set(msg_ids)) == 8 and all(MSG_ID.fullmatch(msg_id) for msg_id in msg_ids)

    # Physical order under priority delivery: priority 7 first, then priority 2 in put order.
    payloads = ["rush", "order 1", "order 2", "file 1", "file 2", "item 1", "item 2", "item 3"]
    priorities = ["7"] + ["2"] * 7
    columns, rows = parse_table(ok(root, "browse", "ORDERS"))
    assert columns == ["msg_id", "priority", "group_id", "msg_seq_number", "offset", "correl_id", "put_time", "payload"]
    assert [row["payload"] for row in rows] == payloads
    assert [row["msg_id"] for row in rows] == msg_ids
    assert [row["priority"] for row in rows] == priorities
    assert [row["group_id"] for row in rows] == [""] * 5 + ["BASKET-7"] * 3
    assert [row["msg_seq_number"] for row in rows] == ["1"] * 6 + ["2", "3"]
    assert [row["offset"] for row in rows] == ["0"] * 8
    assert [row["correl_id"] for row in rows] == ["", "C1", "C1", "", "", "", "", ""]
    assert all(PUT_TIME.fullmatch(row["put_time"]) for row in rows)

    table = lines(ok(root, "depth", "ORDERS"))
    assert table[0] == "queue   consumer  depth  oldest_age_s"
    assert re.fullmatch(r"ORDERS            8      \d+\.\d", table[1]) and len(table) == 2
    depths = ok_json(root, "depth")
    assert [(d["queue"], d["consumer"], d["depth"]) for d in depths] == [("ORDERS", None, 8), (DLQ, None, 0)]
    assert 0 <= depths[0]["oldest_age_s"] < 600 and depths[1]["oldest_age_s"] is None

    browsed = ok_json(root, "browse", "ORDERS")
    assert [m["payload"] for m in browsed] == payloads
    assert [m["msg_id"] for m in browsed] == msg_ids
    assert [m["priority"] for m in browsed] == [int(p) for p in priorities]
    assert [m["correl_id"] for m in browsed] == [None, "C1", "C1", None, None, None, None, None]
    assert [m["group_id"] for m in browsed] == [None] * 5 + ["BASKET-7"] * 3
    assert [m["msg_seq_number"] for m in browsed] == [1] * 6 + [2, 3]
    assert [m["last_in_group"] for m in browsed] == [False] * 7 + [True]
    assert [(m["offset"], m["segmented"], m["last_segment"], m["backout_count"]) for m in browsed] == [
        (0, False, False, 0)
    ] * 8
    assert [m["put_seq"] for m in browsed] == [0, 0, 1, 0, 1, 0, 1, 2]
    assert browsed[1]["put_time"] == browsed[2]["put_time"] != browsed[3]["put_time"]
    # Message properties are string key/value pairs: JSON shows them as an object.
    assert [m["properties"] for m in browsed] == [
        None,
        {"k": "v", "team": "blue"},
        {"k": "v", "team": "blue"},
        None,
        None,
        None,
        None,
        None,
    ]


UNTRUSTED = [b"line 1\nline 2", b"\x00\x1b[31mred", b"\xff\xfe", "h\u00e9llo".encode()]


def test_payloads_print_as_escaped_text_hex_or_base64_and_json_keeps_their_bytes(qm):
    """Untrusted payloads: a newline, NUL and a terminal escape sequence, bytes that are not UTF-8."""
    qm.define_queue("ORDERS")
    qm.put("ORDERS", [{"payload": payload} for payload in UNTRUSTED])
    columns, rows = parse_table(ok(qm.root, "browse", "ORDERS"))
    assert [row["payload"] for row in rows] == ["line 1\\nline 2", "\\x00\\x1b[31mred", "\\xff\\xfe", "h\u00e9llo"]
    _, rows = parse_table(ok(qm.root, "browse", "ORDERS", "--payload", "hex"))
    assert [row["payload"] for row in rows] == [payload.hex() for payload in UNTRUSTED]
    browsed = ok_json(qm.root, "browse", "ORDERS")
    assert [(m["payload"], m["payload_encoding"]) for m in browsed] == [
        ("line 1\nline 2", "text"),
        ("\x00\x1b[31mred", "text"),
        ("//4=", "base64"),
        ("h\u00e9llo", "text"),
    ]
    encoded = ok_json(qm.root, "browse", "ORDERS", "--payload", "base64")
    assert [base64.b64decode(m["payload"]) for m in encoded] == UNTRUSTED
    assert {m["payload_encoding"] for m in encoded} == {"base64"}


def test_put_options_may_come_between_queue_and_payloads(qm):
    qm.define_queue("ORDERS")
    put = ok_json(qm.root, "put", "ORDERS", "--priority", "9", "--correl-id", "C9", "rush order")
    assert put["queue"] == "ORDERS" and len(put["msg_ids"]) == 1
    message = qm.browse("ORDERS").to_pylist()
    assert [(m["msg_id"], m["payload"], m["priority"], m["correl_id"]) for m in message] == [
        (put["msg_ids"][0], b"rush order", 9, "C9")
    ]


def test_apply_creates_then_alters_what_changed_and_refuses_a_type_change(tmp_path):
    root = tmp_path / "qm"
    first = ok_json(root, "apply", str(REPO_CONF))
    assert first == {
        "queue_manager": "QM1",
        "root": str(root),
        "changes": [
            # Queues naming a backout queue after the others, aliases last.
            {"queue": name, "action": "defined"}
            for name in ("ORDERS.BACKOUT", "REPLIES", "ORDERS", "ORDERS.ALIAS")
        ],
    }
    qm = QueueManager.open(root)
    definitions = {q.name: q for q in qm.queues()}
    assert sorted(definitions) == ["ORDERS", "ORDERS.ALIAS", "ORDERS.BACKOUT", "REPLIES", DLQ]
    orders = definitions["ORDERS"]
    assert (
        orders.description,
        orders.default_priority,
        orders.max_depth,
        orders.backout_threshold,
        orders.backout_queue,
    ) == ("incoming orders", 4, 100000, 3, "ORDERS.BACKOUT")
    assert definitions["REPLIES"].delivery_sequence == "fifo"
    assert (definitions["ORDERS.ALIAS"].type, definitions["ORDERS.ALIAS"].target_queue) == ("alias", "ORDERS")

    # An unchanged queue is not altered: the catalog gets no commit.
    commits = sorted((root / "_qmgr" / "_delta_log").glob("*.json"))
    again = ok_json(root, "apply", str(REPO_CONF))
    assert again == {
        "queue_manager": "QM1",
        "root": str(root),
        "changes": [
            {"queue": name, "action": "unchanged"} for name in ("ORDERS.BACKOUT", "REPLIES", "ORDERS", "ORDERS.ALIAS")
        ],
    }
    assert {q.name: q for q in qm.queues()} == definitions
    assert sorted((root / "_qmgr" / "_delta_log").glob("*.json")) == commits

    text = REPO_CONF.read_text(encoding="utf-8")
    deeper = tmp_path / "deeper.toml"
    deeper.write_text(text.replace("max_depth = 100000", "max_depth = 200000"), encoding="utf-8")
    assert ok_json(root, "apply", str(deeper))["changes"] == [
        {"queue": "ORDERS.BACKOUT", "action": "unchanged"},
        {"queue": "REPLIES", "action": "unchanged"},
        {"queue": "ORDERS", "action": "altered"},
        {"queue": "ORDERS.ALIAS", "action": "unchanged"},
    ]
    assert qm.inquire_queue("ORDERS").max_depth == 200000
    ok(root, "apply", str(REPO_CONF))
    definitions = {q.name: q for q in qm.queues()}

    retyped = tmp_path / "retyped.toml"
    assert text.count('type = "alias"') == 1
    retyped.write_text(text.replace('type = "alias"', 'type = "local"'), encoding="utf-8")
    assert fails(root, "apply", str(retyped)) == (
        f"mqspark: error: {retyped}: queue ORDERS.ALIAS is alias; its type cannot change to local"
    )
    assert {q.name: q for q in qm.queues()} == definitions

    half_bad = tmp_path / "half-bad.toml"
    half_bad.write_text(
        text.replace("max_depth = 100000", "max_depth = 5").replace(
            'delivery_sequence = "fifo"', 'delivery_sequence = "lifo"'
        ),
        encoding="utf-8",
    )
    assert fails(root, "apply", str(half_bad)) == (
        "mqspark: error: queue REPLIES: attribute delivery_sequence must be one of priority, fifo; got 'lifo'"
    )
    assert qm.inquire_queue("ORDERS").max_depth == 100000


def test_json_may_follow_the_command(qm):
    qm.define_queue("ORDERS")
    qm.put("ORDERS", [{"payload": "one"}])
    [depth] = json.loads(ok(qm.root, "depth", "ORDERS", "--json"))
    assert (depth["queue"], depth["consumer"], depth["depth"]) == ("ORDERS", None, 1)


@pytest.fixture(scope="module")
def error_qm(tmp_path_factory) -> QueueManager:
    qm = QueueManager.create(tmp_path_factory.mktemp("errors") / "qm", "QM1")
    qm.define_queue("ORDERS")
    qm.put("ORDERS", [{"payload": "kept"}])
    return qm


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("put", "NOPE", "hello"), "MQRC_UNKNOWN_OBJECT_NAME (2085): queue NOPE is not defined in queue manager QM1"),
        (
            ("put", "ORDERS", "hello", "--priority", "10"),
            "MQRC_PRIORITY_ERROR (2050): queue ORDERS: field priority has value 10 in message 0: must be 0-9",
        ),
        (
            ("queue", "define", "NEWQ", "--default-priority", "10"),
            "queue NEWQ: attribute default_priority must be between 0 and 9, got 10",
        ),
        (("submit",), "submit: give the job file to run (mqspark submit [OPTIONS] JOB [ARGS])"),
        (
            ("monitor", "--queue", "ORDERS", "--consumer", "nobody", "--watch-interval", "1", "--watch-count", "1")
            + ("--expected-count", "1", "--points", "1"),
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue ORDERS has no consumer group 'nobody'; its groups: none "
            "(a group exists once declared, or once it first reads)",
        ),
        (("maintain", "ORDERS", "--retention", "-1h"), "retention must be 0 or more, got -3600 seconds"),
        (
            ("consumer", "delete", "ORDERS", "nobody"),
            "MQRC_UNKNOWN_OBJECT_NAME (2085): queue ORDERS: consumer group 'nobody' does not exist",
        ),
    ],
    ids=[
        "unknown-queue",
        "put-priority-10",
        "define-default-priority-10",
        "submit-without-job",
        "monitor-unknown-group",
        "negative-retention",
        "delete-unknown-group",
    ],
)
def test_errors_name_the_bad_value_and_change_nothing(error_qm, args, message):
    assert fails(error_qm.root, *args) == f"mqspark: error: {message}"
    assert [q.name for q in error_qm.queues()] == ["ORDERS", DLQ]
    assert error_qm.browse("ORDERS").column("payload").to_pylist() == [b"kept"]


def test_error_when_no_queue_manager_at_root(tmp_path):
    root = tmp_path / "nothing-here"
    assert fails(root, "queue", "list") == (
        f"mqspark: error: MQRC_UNKNOWN_OBJECT_NAME (2085): no queue manager at {root}"
    )
    assert not root.exists()


def test_a_root_that_is_a_file_is_refused_in_the_same_line_by_every_command(tmp_path):
    root = tmp_path / "notes.txt"
    root.write_text("not a queue manager")
    for command in (("qmgr", "create", "QM1"), ("queue", "list"), ("apply", str(REPO_CONF)), ("console",)):
        assert fails(root, *command) == f"mqspark: error: --root {root} is a file, not a queue manager folder"
    assert root.read_text() == "not a queue manager"


def test_the_command_as_a_process_puts_the_lines_of_stdin_and_browses_them(qm):
    """``python -m mqspark.cli`` itself, as a shell runs it: put reads a pipe, browse prints the table.
    (The other tests run the command's main() in this process.)"""
    qm.define_queue("ORDERS")
    put = mqspark_process(qm.root, "put", "ORDERS", input="first\nsecond\n")
    first, second = qm.browse("ORDERS").to_pylist()
    assert (put.returncode, put.stdout, put.stderr) == (
        0,
        f"queue: ORDERS\nmsg_ids:\n  {first['msg_id']}\n  {second['msg_id']}\n",
        "",
    )
    browse = mqspark_process(qm.root, "browse", "ORDERS")
    times = [message["put_time"].isoformat() for message in (first, second)]
    width = max(len("put_time"), *map(len, times))
    header = f"{'msg_id':32}  priority  group_id  msg_seq_number  offset  correl_id  {'put_time':{width}}  payload\n"
    rows = [
        f"{message['msg_id']}  0         {'':8}  1               0       {'':9}  {time:{width}}  {payload}\n"
        for message, time, payload in zip((first, second), times, ("first", "second"), strict=True)
    ]
    assert (browse.returncode, browse.stdout, browse.stderr) == (0, header + "".join(rows), "")


def test_a_reader_that_stops_reading_ends_the_output_without_a_traceback(qm):
    """``mqspark browse Q | head -1``: more output than a pipe holds, and the reader goes away."""
    qm.define_queue("ORDERS")
    qm.put("ORDERS", [{"payload": "x" * 100} for _ in range(3000)])
    command = [sys.executable, "-m", "mqspark.cli", "--root", qm.root, "browse", "ORDERS"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL) as run:
        assert run.stdout.readline().split()[:2] == [b"msg_id", b"priority"]
        run.stdout.close()
        assert (run.wait(timeout=120), run.stderr.read()) == (1, b"")


def test_retry_delay_must_be_a_finite_number(qm):
    # float("nan") passes a ">= 0" check by comparing false; stored, it prints as NaN, which is not JSON.
    error = fails(qm.root, "queue", "define", "NEWQ", "--retry-delay", "nan")
    assert "retry_delay" in error and "nan" in error
    assert [q.name for q in qm.queues()] == [DLQ]


def test_key_value_output_shows_whole_values(qm):
    # Tables cut cells at 40 characters to keep columns narrow; a single object's "key: value" lines must not.
    assert len(qm.root) > 40
    assert ok(qm.root, "qmgr", "show") == (
        f"name: QM1\nqmid: {qm.qmid}\nroot: {qm.root}\ndead_letter_queue: {DLQ}\ndefault_reconnect: no\n"
        "description:\nqueues: 1\n"
    )


@pytest.mark.parametrize(
    ("args", "last_line"),
    [
        ((), "mqspark: error: the following arguments are required: command"),
        (
            ("put", "ORDERS", "x", "--priority", "high"),
            "mqspark put: error: argument --priority: invalid int value: 'high'",
        ),
    ],
    ids=["no-command", "priority-not-a-number"],
)
def test_usage_errors_exit_2(error_qm, args, last_line):
    result = mqspark(error_qm.root, *args)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("usage: mqspark")
    assert result.stderr.splitlines()[-1] == last_line


def test_put_ordering_overrides(qm):
    qm.define_queue("ORDERS", delivery_sequence="fifo")
    qm.put("ORDERS", [{"payload": "a", "msg_id": "A"}, {"payload": "b", "msg_id": "B"}])
    ok(qm.root, "put", "ORDERS", "first", "--top-of-queue")
    ok(qm.root, "put", "ORDERS", "before-b", "--before-msg-id", "B")
    browsed = json.loads(ok(qm.root, "browse", "ORDERS", "--json"))
    assert [row["payload"] for row in browsed] == ["first", "a", "before-b", "b"]


def test_browse_shows_the_dead_letter_header_and_depth_shows_failed_messages_beside_their_queue(qm):
    root = qm.root
    qm.define_queue("BOQ")
    qm.define_queue("ERRQ")
    qm.define_queue("Q", backout_threshold=2, backout_queue="BOQ", error_queue="ERRQ", retry_count=5)
    qm.define_queue("OTHER")
    qm.put("Q", [{"payload": "waiting"}])
    dead_letters(qm, "BOQ", [{"payload": p, "fields": {"msg_id": p}, "reason": 2362} for p in ("b1", "b2")])
    dead_letters(qm, "ERRQ", [{"payload": "e1", "fields": {"msg_id": "e1"}, "reason": 65536}])
    dead_letters(qm, DLQ, [{"payload": "d1", "fields": {"msg_id": "d1"}, "reason": 2362}])
    dead_letters(qm, DLQ, [{"payload": "d2", "fields": {"msg_id": "d2"}, "reason": 2085}], original="OTHER")

    header = ["backout_count", "dlq_reason", "dlq_reason_text", "dlq_original_queue", "dlq_original_qmgr"]
    header += ["dlq_consumer_group", "dlq_time"]
    plain = ["msg_id", "priority", "group_id", "msg_seq_number", "offset", "correl_id", "put_time"]
    columns, rows = parse_table(ok(root, "browse", "BOQ"))
    assert columns == [*plain, *header, "payload"]
    assert [
        [row[c] for c in ("msg_id", "backout_count", "dlq_reason", "dlq_reason_text", "dlq_original_queue")]
        for row in rows
    ] == [["b1", "0", "2362", "moved", "Q"], ["b2", "0", "2362", "moved", "Q"]]
    assert [row["dlq_original_qmgr"] for row in rows] == ["QM1", "QM1"]
    assert all(PUT_TIME.fullmatch(row["dlq_time"]) for row in rows)
    # The dead-letter queue shows the header even when empty; an ordinary queue does not.
    assert parse_table(ok(root, "browse", DLQ))[0] == [*plain, *header, "payload"]
    assert parse_table(ok(root, "browse", "Q"))[0] == [*plain, "payload"]

    failure_keys = ("backout_queue", "backed_out", "error_queue", "errors", "dead_letters")
    depths = ok_json(root, "depth")
    assert [(d["queue"], d["depth"], *(d[k] for k in failure_keys)) for d in depths] == [
        ("BOQ", 2, None, None, None, None, 0),
        ("ERRQ", 1, None, None, None, None, 0),
        ("OTHER", 0, None, None, None, None, 1),
        ("Q", 1, "BOQ", 2, "ERRQ", 1, 1),
        (DLQ, 2, None, None, None, None, None),
    ]
    table = lines(ok(root, "depth", "Q"))
    assert table[0].split() == ["queue", "consumer", "depth", "oldest_age_s", *failure_keys]
    assert re.fullmatch(r"Q\s+1\s+\d+\.\d\s+BOQ\s+2\s+ERRQ\s+1\s+1", table[1]) and len(table) == 2


def test_get_takes_messages_for_a_consumer_group_and_reports_2033_when_none_is_left(qm):
    root = qm.root
    qm.define_queue("ORDERS")
    qm.put(
        "ORDERS", [{"payload": "one", "correl_id": "C1"}, {"payload": "two"}, {"payload": "three", "correl_id": "C1"}]
    )
    columns, rows = parse_table(ok(root, "get", "ORDERS"))
    assert columns == ["msg_id", "priority", "group_id", "msg_seq_number", "offset", "correl_id", "put_time", "payload"]
    assert [row["payload"] for row in rows] == ["one"]
    got = ok_json(root, "get", "ORDERS", "--correl-id", "C1", "--max", "5")
    assert [(m["payload"], m["delivery_seq"], m["queue"]) for m in got] == [("three", 1, "ORDERS")]
    # Another consumer group gets every message; it is new beside the queue's group, which is said.
    audit = mqspark(root, "--json", "get", "ORDERS", "--consumer", "audit", "--max", "5")
    assert [m["payload"] for m in json.loads(audit.stdout)] == ["one", "two", "three"]
    assert (audit.returncode, audit.stderr) == (
        0,
        "mqspark: warning: queue ORDERS: consumer group 'audit' is new: it reads every message still on the "
        "queue, and messages wait for it from now on; the queue's groups were default (declare a group first "
        "to create it on purpose)\n",
    )
    assert qm.depth("ORDERS", consumer="default") == 1
    assert [m["payload"] for m in ok_json(root, "get", "ORDERS", "--wait", "0.2")] == ["two"]
    assert fails(root, "get", "ORDERS", "--wait", "0.2") == (
        "mqspark: error: MQRC_NO_MSG_AVAILABLE (2033): queue ORDERS: no message available"
    )
    assert fails(root, "get", "ORDERS", "--max", "0") == (
        "mqspark: error: get: queue ORDERS: max_messages must be an integer >= 1, got 0"
    )


def test_get_count_takes_that_many_messages_with_the_block_consumer_and_no_more(qm):
    root = qm.root
    qm.define_queue("ORDERS")
    qm.put("ORDERS", [{"payload": name} for name in ("one", "two", "three", "four", "five")])
    _, rows = parse_table(ok(root, "get", "ORDERS", "--count", "3"))
    assert [row["payload"] for row in rows] == ["one", "two", "three"]
    # Only the messages taken are consumed: the rest is free for the next get at once.
    assert qm.depth("ORDERS") == 2
    got = ok_json(root, "get", "ORDERS", "--count", "5", "--wait", "0.2")
    assert [(m["payload"], m["delivery_seq"]) for m in got] == [("four", 3), ("five", 4)]
    assert fails(root, "get", "ORDERS", "--count", "2", "--wait", "0.2") == (
        "mqspark: error: MQRC_NO_MSG_AVAILABLE (2033): queue ORDERS: no message available"
    )
    assert fails(root, "get", "ORDERS", "--count", "0") == (
        "mqspark: error: get: queue ORDERS: --count must be an integer >= 1, got 0"
    )
    assert fails(root, "get", "ORDERS", "--count", "2", "--msg-id", "M1") == (
        "mqspark: error: get: queue ORDERS: --count takes messages in order; --msg-id and --correl-id need --max"
    )
