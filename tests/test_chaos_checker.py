"""The chaos checker on hand-written run folders: a valid run passes with exact counts, and each
guarantee, broken alone, is reported alone (so every check is shown able to fail)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chaos.checker import Report, check
from chaos.history import Final, History

REPOSITORY = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0  # the events' times are T0 + a few seconds


def _message(id: str, **fields: Any) -> dict[str, Any]:
    base = {"id": id, "group": None, "seq": 1, "last": False, "priority": 0, "poison": False, "request": None}
    return base | fields


MESSAGES = {
    m["id"]: m
    for m in [
        _message("a1", priority=5),
        _message("a2", priority=1),
        _message("g1", group="G", seq=1, priority=4),
        _message("g2", group="G", seq=2, priority=4),
        _message("g3", group="G", seq=3, last=True, priority=4),
        _message("f1"),
        _message("x1", poison=True),
        _message("r1", request="REPLY", priority=3),
        _message("d1", priority=2),
        _message("d2", priority=2),
        _message("n1"),
        _message("t1"),
        _message("t2"),
    ]
}


@dataclass
class Scenario:
    """A run folder's content before it is written: events (actor, kind, fields), final, plan, faults."""

    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    final: Final = field(default_factory=Final)
    plan: dict[str, Any] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)

    def put(self, actor: str, op: str, at: float, ids: list[str], outcome: str | None) -> None:
        invoke = {"t": T0 + at, "phase": "invoke", "op": op, "queue": "Q", "messages": [MESSAGES[i] for i in ids]}
        self.events.append((actor, "put", invoke))
        if outcome == "fail":
            self.events.append((actor, "put", {"t": T0 + at + 0.1, "phase": "fail", "op": op, "error": "MQRC 2053"}))
        elif outcome == "ok":
            self.events.append((actor, "put", {"t": T0 + at + 0.1, "phase": "ok", "op": op}))

    def get(
        self, actor: str, op: str, at: float, ids: list[str], outcome: str | None, consumer: str = "workers"
    ) -> None:
        """A syncpoint get of group ``consumer``; ``outcome`` None: its actor was killed with them in hand."""
        self.events.append((actor, "get", {"t": T0 + at, "phase": "got", "op": op, "consumer": consumer, "ids": ids}))
        if outcome is not None:
            self.events.append((actor, "get", {"t": T0 + at + 0.1, "phase": outcome, "op": op}))

    def batch(self, actor: str, at: float, number: int, rows: list[tuple[str, int]]) -> None:
        """A streaming batch of group audit: (id, delivery_seq) rows, the rest from the message."""
        fields = ("priority", "group", "seq")
        recorded = [{"id": i, "delivery_seq": n} | {k: MESSAGES[i][k] for k in fields} for i, n in rows]
        self.events.append((actor, "batch", {"t": T0 + at, "consumer": "audit", "batch": number, "rows": recorded}))

    def without(self, actor: str, op: str) -> None:
        self.events = [e for e in self.events if not (e[0] == actor and e[2].get("op") == op)]

    def write(self, run: Path) -> Path:
        histories: dict[str, History] = {}
        for actor, kind, fields in self.events:
            histories.setdefault(actor, History(run, actor)).record(kind, **fields)
        for history in histories.values():
            history.close()
        self.final.save(run)
        (run / "plan.json").write_text(json.dumps(self.plan))
        (run / "faults.jsonl").write_text("".join(json.dumps(f) + "\n" for f in self.faults))
        return run


def valid() -> Scenario:
    """Every event kind, faults, an in-doubt put fully visible and one never seen, a failed put, an
    in-doubt get, a poison message moved, a request with its reply, two competing getters."""
    s = Scenario()
    s.put("P1#0", "p1", 1, ["a1", "a2"], "ok")
    s.put("P1#0", "p2", 2, ["g1", "g2", "g3"], "ok")
    s.put("P1#0", "p3", 3, ["f1"], "fail")
    s.put("P1#0", "p4", 4, ["x1"], "ok")
    s.put("P1#0", "p5", 5, ["r1"], "ok")
    s.put("P2#0", "q1", 6, ["d1", "d2"], None)  # killed: d1 and d2 show it put both
    s.put("P2#1", "q2", 7, ["n1"], None)  # killed: n1 shows it put nothing
    s.get("W1#0", "w1", 10, ["a1", "a2"], "ok")
    s.get("W1#0", "w2", 11, ["g1"], "ok")
    s.get("W1#0", "w4", 13, ["x1"], "backout")  # backout threshold 1: moved
    s.get("W1#0", "w5", 14, ["r1"], "ok")
    s.get("W1#0", "w6", 15, ["d1"], None)  # killed in hand; it committed (d1 waits no more)
    s.get("W2#0", "v1", 12, ["g2"], "ok")
    s.get("W1#1", "w7", 17, ["d2"], "ok")
    s.batch("S1#0", 20, 0, [("a1", 1), ("a2", 2), ("g1", 3)])
    s.batch("S1#0", 21, 1, [("g2", 4), ("g3", 5), ("r1", 6), ("d1", 7), ("d2", 8)])
    s.events.append(("R1#0", "reply", {"t": T0 + 22, "request": "r1", "failed": False}))
    s.events.append(("M#0", "maintain", {"t": T0 + 23, "removed": 3}))
    s.final = Final(
        consumers={"workers": "syncpoint", "audit": "stream"},
        waiting={"workers": ["g3"], "audit": ["x1"]},
        moved=[
            {
                "id": "x1",
                "queue": "Q.BACKOUT",
                "reason": None,
                "backout_count": 1,
                "original_queue": "Q",
                "consumer": "workers",
            }
        ],
        replies=[],  # the requester read r1's reply
        storage={"Q": {"files": 12, "bytes": 4096, "live": 2}, "Q.BACKOUT": {"files": 1, "bytes": 900, "live": 1}},
    )
    s.plan = {"seed": 7, "forwarder_consumer": "workers", "max_files": 50, "documented": []}
    s.faults = [
        {"t": T0 + 6.5, "kind": "kill", "target": "P2", "incarnation": 0},
        {"t": T0 + 7.5, "kind": "kill", "target": "P2", "incarnation": 1},
        {"t": T0 + 15.5, "kind": "kill", "target": "W1", "incarnation": 0},
        {"t": T0 + 19, "kind": "pause", "target": "S1", "incarnation": 0},
        {"t": T0, "kind": "skew", "target": "W2", "fault": {"amount": -10.0, "duration": 30.0}},
        {"t": T0 + 20, "kind": "skew_end", "target": "W2"},
    ]
    return s


def found(report: Report) -> list[tuple[str, list[str]]]:
    return [(v.kind, v.ids) for v in report.violations]


def checked(tmp_path: Path, change: Callable[[Scenario], None]) -> Report:
    scenario = valid()
    change(scenario)
    return check(scenario.write(tmp_path))


def test_valid_run_has_no_violation_and_exact_counts(tmp_path: Path) -> None:
    run = valid().write(tmp_path)
    # Lines cut by a kill are not read.
    with (run / "history" / "W1#0.jsonl").open("a") as cut:
        cut.write('{"t": 1, "actor": "W1#0", "e": "get", "phase": "ok", "op"')
    with (run / "faults.jsonl").open("a") as cut:
        cut.write('{"t": 1, "kind": "ki')

    report = check(run)

    assert report.violations == [] and report.documented == []
    assert report.summary == {
        "puts": {"ok": 4, "failed": 1, "in_doubt": 2},
        "messages_put": 7,
        "messages_committed": 9,
        "consumers": {
            "workers": {"kind": "syncpoint", "delivered": 6, "in_doubt": 1, "waiting": 1, "moved": 1},
            "audit": {"kind": "stream", "delivered": 8, "in_doubt": 0, "waiting": 1, "moved": 0},
        },
        "replies": 1,
        "redrives": 0,
        "redriven": 0,
        "faults": {"kill": 3, "pause": 1, "skew": 1},
    }


def test_lost(tmp_path: Path) -> None:
    report = checked(tmp_path, lambda s: s.final.waiting.update(workers=[]))
    assert found(report) == [("lost", ["g3"])]
    assert report.violations[0].message == "group workers: g3 put but neither delivered, in doubt, waiting nor moved"


def test_torn_put(tmp_path: Path) -> None:
    def tear(s: Scenario) -> None:
        s.put("P3#0", "t", 8, ["t1", "t2"], None)
        s.final.waiting["workers"].append("t1")
        s.final.waiting["audit"].append("t1")

    report = checked(tmp_path, tear)
    assert found(report) == [("torn_put", ["t1", "t2"])]
    assert report.violations[0].message == "put t by P3#0 in doubt: t1 seen but t2 never"


def test_failed_put_visible(tmp_path: Path) -> None:
    report = checked(tmp_path, lambda s: s.final.waiting["audit"].append("f1"))
    assert found(report) == [("failed_put_visible", ["f1"])]
    assert report.violations[0].message == "put p3 by P1#0 failed but f1 seen"


def test_phantom(tmp_path: Path) -> None:
    report = checked(tmp_path, lambda s: s.get("W1#1", "w9", 18, ["zz"], "ok"))
    assert found(report) == [("phantom", ["zz"])]
    assert report.violations[0].message == "zz seen but never put"


def test_duplicate(tmp_path: Path) -> None:
    report = checked(tmp_path, lambda s: s.get("W1#1", "w9", 18, ["a1"], "ok"))
    assert found(report) == [("duplicate", ["a1"])]
    assert report.violations[0].message == "group workers: a1 delivered 2 times (by W1#0, W1#1)"


def test_delivered_and_waiting(tmp_path: Path) -> None:
    report = checked(tmp_path, lambda s: s.final.waiting["audit"].append("a2"))
    assert found(report) == [("delivered_and_waiting", ["a2"])]
    assert report.violations[0].message == "group audit: a2 delivered (by S1#0) and still waiting"


def _swap_stream_order(s: Scenario) -> None:
    s.events = [e for e in s.events if e[1] != "batch" or e[2]["batch"] != 1]
    s.batch("S1#0", 21, 1, [("g3", 4), ("g2", 5), ("r1", 6), ("d1", 7), ("d2", 8)])


def _get_g2_first(s: Scenario) -> None:
    s.without("W2#0", "v1")
    s.get("W2#0", "v1", 2, ["g2"], "ok")


def _leave_g2_behind(s: Scenario) -> None:
    s.without("W2#0", "v1")
    s.get("W1#1", "w8", 18, ["g3"], "ok")
    s.final.waiting["workers"] = ["g2"]


@pytest.mark.parametrize(
    ("change", "expected", "message"),
    [
        (
            _swap_stream_order,
            ["g3", "g2"],
            "group audit, message group G: g2 (seq 2, by S1#0) delivered after g3 (seq 3, by S1#0)",
        ),
        # Competing getters: W2's get of g2 (at 2) before W1's of g1 (at 11).
        (
            _get_g2_first,
            ["g2", "g1"],
            "group workers, message group G: g1 (seq 1, by W1#0) delivered after g2 (seq 2, by W2#0)",
        ),
        (
            _leave_g2_behind,
            ["g2", "g3"],
            "group workers, message group G: g2 (seq 2) waiting but g3 (seq 3) delivered by W1#1",
        ),
    ],
    ids=["stream", "gets", "waiting"],
)
def test_order(tmp_path: Path, change: Callable[[Scenario], None], expected: list[str], message: str) -> None:
    report = checked(tmp_path, change)
    assert found(report) == [("order", expected)]
    assert report.violations[0].message == message


PLAIN_ORDER = ["a1", "a2", "g1", "g2", "g3", "x1", "r1", "d1", "d2"]  # every committed id


def _plain_gets(s: Scenario, got: list[tuple[str, int, float]], unfinished: int) -> None:
    """Group plain: a plain get of each (id, delivery_seq, time), and ``unfinished`` gets killed
    before they said what they got."""
    s.final.consumers["plain"] = "plain"
    s.final.waiting["plain"] = []
    for n, (i, seq, at) in enumerate(got):
        op = f"u{n}"
        s.events.append(("G5#0", "get", {"t": T0 + at, "phase": "invoke", "op": op, "consumer": "plain"}))
        s.events.append(
            ("G5#0", "get", {"t": T0 + at, "phase": "got", "op": op, "consumer": "plain", "ids": [i], "seqs": [seq]})
        )
        s.events.append(("G5#0", "get", {"t": T0 + at, "phase": "ok", "op": op}))
    for n in range(unfinished):
        s.events.append(("G6#0", "get", {"t": T0 + 30 + n, "phase": "invoke", "op": f"k{n}", "consumer": "plain"}))
    s.events.append(("G6#0", "get", {"t": T0 + 40, "phase": "invoke", "op": "refused", "consumer": "plain"}))
    s.events.append(("G6#0", "get", {"t": T0 + 40, "phase": "fail", "op": "refused", "error": "MQRC 2042"}))


def test_a_plain_group_may_leave_unseen_as_many_ids_as_it_has_unfinished_gets(tmp_path: Path) -> None:
    # Two gets of one round return together: g2 recorded before g1, but placed by delivery_seq. The
    # poison message x1 is consumed like any other.
    got = [(i, n, n + 10.0) for n, i in enumerate(PLAIN_ORDER) if i not in ("g3", "d2")]
    got[2], got[3] = (got[2][0], got[2][1], got[3][2]), (got[3][0], got[3][1], got[2][2])
    report = checked(tmp_path, lambda s: _plain_gets(s, got, 2))
    assert report.violations == []
    assert report.summary["consumers"]["plain"] == {
        "kind": "plain",
        "delivered": 7,
        "in_doubt": 0,
        "waiting": 0,
        "moved": 0,
        "unfinished_gets": 2,
        "unseen": 2,
    }
    one_short = checked(tmp_path / "one", lambda s: _plain_gets(s, got, 1))
    assert found(one_short) == [("lost", ["d2", "g3"])]
    assert one_short.violations[0].message == (
        "group plain: d2, g3 put but neither delivered, in doubt, waiting nor moved "
        "(2, more than its 1 unfinished gets of one message may have taken)"
    )


def test_a_plain_group_s_message_group_is_ordered_by_delivery_seq(tmp_path: Path) -> None:
    got = [(i, n, n + 10.0) for n, i in enumerate(PLAIN_ORDER)]
    got[2], got[3] = (got[2][0], got[3][1], got[2][2]), (got[3][0], got[2][1], got[3][2])  # g1 after g2
    report = checked(tmp_path, lambda s: _plain_gets(s, got, 0))
    assert found(report) == [("order", ["g2", "g1"])]


def test_priority(tmp_path: Path) -> None:
    def invert(s: Scenario) -> None:
        s.events = [e for e in s.events if e[1] != "batch" or e[2]["batch"] != 0]
        s.batch("S1#0", 20, 0, [("a2", 1), ("a1", 2), ("g1", 3)])

    report = checked(tmp_path, invert)
    assert found(report) == [("priority", ["a2", "a1"])]
    assert report.violations[0].message == "group audit, batch 0 by S1#0: a1 (priority 5) after a2 (priority 1)"


def _deliver_poison(s: Scenario) -> None:
    s.without("W1#0", "w4")
    s.get("W1#0", "w4", 13, ["x1"], "ok")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_deliver_poison, "poison x1: delivered to workers by W1#0"),
        (lambda s: s.final.moved[0].update(backout_count=0), "poison x1: moved to Q.BACKOUT with backout count 0"),
        (lambda s: s.final.moved[0].update(original_queue="P"), "poison x1: moved with original queue P, put to Q"),
        (
            lambda s: s.final.moved.append(dict(s.final.moved[0])),
            "poison x1: 2 moved records (by groups workers, workers) for 1 groups it is not waiting for (workers)",
        ),
        (
            lambda s: s.final.moved[0].update(consumer="audit"),
            "poison x1: moved by groups audit, not waiting for workers",
        ),
        (
            lambda s: s.final.moved[0].update(consumer=None),
            "poison x1: moved by groups None, not waiting for workers",
        ),
    ],
    ids=["delivered", "backout-count", "original-queue", "moved-twice", "moved-by-another-group", "no-group"],
)
def test_poison(tmp_path: Path, change: Callable[[Scenario], None], message: str) -> None:
    report = checked(tmp_path, change)
    assert found(report) == [("poison", ["x1"])]
    assert report.violations[0].message == message


def _g2_moved_then_redriven(s: Scenario, outcome: str | None, at: float = 19) -> None:
    """Group workers fails g2 until it moves, takes g3, and gets g2 at 25; a redrive of g2 for
    workers at ``at`` ended with ``outcome`` (None: no redrive)."""
    s.without("W2#0", "v1")
    s.get("W2#0", "v1", 12, ["g2"], "backout")
    s.get("W1#1", "w8", 18, ["g3"], "ok")
    s.final.waiting["workers"] = []
    if outcome is not None:
        items = [{"id": "g2", "consumer": "workers"}]
        invoke = {"t": T0 + at, "phase": "invoke", "op": "D#0:1", "queue": "Q.BACKOUT", "items": items}
        s.events.append(("D#0", "redrive", invoke))
        s.events.append(("D#0", "redrive", {"t": T0 + at + 0.5, "phase": outcome, "op": "D#0:1", "moved": {"Q": 1}}))
    s.get("W2#0", "v2", 25, ["g2"], "ok")


def test_a_copy_redriven_for_a_group_is_outside_its_message_groups_order(tmp_path: Path) -> None:
    report = checked(tmp_path, lambda s: _g2_moved_then_redriven(s, "ok"))
    assert found(report) == []
    assert (report.summary["redrives"], report.summary["redriven"]) == (1, 1)

    # The same deliveries without a redrive, after one that failed, and before one: g2 came after g3.
    for name, outcome, at in (("none", None, 19), ("failed", "fail", 19), ("later", "ok", 30)):
        report = checked(tmp_path / name, lambda s, o=outcome, t=at: _g2_moved_then_redriven(s, o, t))
        assert found(report) == [("order", ["g3", "g2"])], name
        assert report.violations[0].message == (
            "group workers, message group G: g2 (seq 2, by W2#0) delivered after g3 (seq 3, by W1#1)"
        )


def _routed(s: Scenario, on_replica: list[str], on_main: list[str]) -> None:
    """A second replica whose group ``CHAOS2/workers`` got ``on_replica`` (put by a routed put), and
    group workers of the main queue manager ``on_main`` as well."""
    s.plan |= {"replicas": {"CHAOS2": ["CHAOS2/workers"]}, "qmgr": "CHAOS", "front": "FRONT"}
    s.plan["actors"] = [{"kind": "routed-put", "name": "W"}]
    s.final.consumers["CHAOS2/workers"] = "syncpoint"
    s.final.waiting["CHAOS2/workers"] = []
    s.put("W#0", "u1", 8, ["t1", "t2"], "ok")
    s.get("G4#0", "z1", 9, on_replica, "ok", consumer="CHAOS2/workers")
    for number, i in enumerate(on_main):
        s.get("W1#1", f"m{number}", 19 + number, [i], "ok")


def test_a_message_routed_to_the_second_replica_is_judged_by_that_replicas_groups(tmp_path: Path) -> None:
    report = checked(tmp_path, lambda s: _routed(s, ["t1", "t2"], []))
    assert found(report) == []
    assert report.summary["consumers"]["CHAOS2/workers"] == {
        "kind": "syncpoint",
        "delivered": 2,
        "in_doubt": 0,
        "waiting": 0,
        "moved": 0,
    }
    # Not counted against the main queue manager's groups: their counts are those of the valid run.
    assert report.summary["consumers"]["audit"]["delivered"] == 8

    # t2 routed to the main queue manager instead: its groups miss it there (audit never got it).
    report = checked(tmp_path / "main", lambda s: _routed(s, ["t1"], ["t2"]))
    assert found(report) == [("lost", ["t2"])]
    assert report.violations[0].message == "group audit: t2 put but neither delivered, in doubt, waiting nor moved"

    report = checked(tmp_path / "twice", lambda s: _routed(s, ["t1", "t2"], ["t2"]))
    assert found(report) == [("lost", ["t2"]), ("routed_twice", ["t2"])]
    assert report.violations[1].message == "t2 seen on queue managers CHAOS, CHAOS2"


def _dead_lettered_on_front(s: Scenario) -> None:
    _routed(s, ["t1"], [])
    record = {"id": "t2", "queue": "FRONT/SYSTEM.DEAD.LETTER.QUEUE", "reason": 2085, "backout_count": 0}
    s.final.moved.append(record | {"original_queue": "Q", "consumer": None})


def _put_on_main_seen_on_the_replica(s: Scenario) -> None:
    _routed(s, ["t1", "t2"], [])
    s.get("G4#0", "z2", 24, ["a1"], "backout", consumer="CHAOS2/workers")


def _group_split(s: Scenario) -> None:
    """Message group G put by the routed put: g1 on CHAOS2, g2 and g3 on the main queue manager."""
    _routed(s, ["t1", "t2"], [])
    s.events = [e for e in s.events if not (e[1] == "put" and e[2]["op"] == "p2")]
    s.put("W#0", "u2", 2, ["g1", "g2", "g3"], "ok")
    s.without("W1#0", "w2")
    s.events = [e for e in s.events if e[1] != "batch" or e[2]["batch"] != 0]
    s.batch("S1#0", 20, 0, [("a1", 1), ("a2", 2)])
    s.get("G4#0", "z3", 11, ["g1"], "ok", consumer="CHAOS2/workers")


@pytest.mark.parametrize(
    ("change", "expected", "message"),
    [
        (_dead_lettered_on_front, [("dead_lettered", ["t2"])], "t2 dead-lettered on FRONT by the routed put"),
        (_put_on_main_seen_on_the_replica, [("misplaced", ["a1"])], "a1 put on CHAOS but seen on CHAOS, CHAOS2"),
        (
            _group_split,
            [("group_split", [])],
            "message group G put with bind on_group is on queue managers CHAOS, CHAOS2",
        ),
    ],
    ids=["dead-lettered", "misplaced", "group-split"],
)
def test_routing(tmp_path: Path, change: Callable[[Scenario], None], expected: list, message: str) -> None:
    report = checked(tmp_path, change)
    assert found(report) == expected
    assert report.violations[-1].message == message


def _reply_unread(s: Scenario) -> None:
    s.events = [e for e in s.events if e[1] != "reply"]


def test_a_request_whose_requester_was_killed_may_have_had_its_reply_read(tmp_path: Path) -> None:
    """Killed after it read the reply and before it recorded the put's end or the reply: in doubt."""

    def killed(s: Scenario) -> None:
        _reply_unread(s)
        s.events = [e for e in s.events if not (e[1] == "put" and e[2]["op"] == "p5" and e[2]["phase"] == "ok")]

    report = checked(tmp_path, killed)
    assert found(report) == []
    assert report.summary["puts"]["in_doubt"] == 3

    # Its put returned: the reply cannot have gone unrecorded.
    report = checked(tmp_path / "returned", _reply_unread)
    assert found(report) == [("reply", ["r1"])]


def _request_waiting(s: Scenario) -> None:
    s.without("W1#0", "w5")
    s.final.waiting["workers"].append("r1")


@pytest.mark.parametrize(
    ("change", "expected", "message"),
    [
        (lambda s: s.final.replies.append("r1"), "r1", "request r1 delivered to workers or moved has 2 reply entries"),
        (_reply_unread, "r1", "request r1 delivered to workers or moved has 0 reply entries"),
        (_request_waiting, "r1", "request r1 waiting for workers has 1 reply entries"),
        (lambda s: s.final.replies.append("a1"), "a1", "a1 is not a request but has 1 reply entries"),
    ],
    ids=["two", "none", "waiting", "not-a-request"],
)
def test_reply(tmp_path: Path, change: Callable[[Scenario], None], expected: str, message: str) -> None:
    report = checked(tmp_path, change)
    assert found(report) == [("reply", [expected])]
    assert report.violations[0].message == message


def _forwarded(s: Scenario, called: list[str]) -> None:
    """The forwarder's group ``fwd`` instead of ``workers``: its service was called with ``called``."""
    s.plan["forwarder_consumer"] = "fwd"
    s.final.consumers["fwd"] = "forward"
    s.final.waiting["fwd"] = []
    s.final.moved.append(s.final.moved[0] | {"consumer": "fwd"})  # the poison x1 moved for fwd too
    for i in called:
        s.events.append(("F#0.77", "call", {"t": T0 + 18, "consumer": "fwd", "id": i}))


def test_a_forwarder_consumes_what_it_was_called_with_and_replies_once_per_request(tmp_path: Path) -> None:
    everything = ["a1", "a2", "g1", "g2", "g3", "x1", "r1", "d1", "d2"]
    report = checked(tmp_path, lambda s: _forwarded(s, everything + ["r1", "x1"]))  # r1 and x1 called twice
    assert found(report) == []
    assert report.summary["consumers"]["fwd"] == {
        "kind": "forward",
        "delivered": 8,
        "in_doubt": 0,
        "waiting": 0,
        "moved": 1,
    }

    report = checked(tmp_path / "lost", lambda s: _forwarded(s, [i for i in everything if i != "g2"]))
    assert found(report) == [("lost", ["g2"])]

    def unanswered(s: Scenario) -> None:
        _forwarded(s, everything)
        _reply_unread(s)

    report = checked(tmp_path / "unanswered", unanswered)
    assert found(report) == [("reply", ["r1"])]
    assert report.violations[0].message == "request r1 delivered to fwd or moved has 0 reply entries"


def test_storage(tmp_path: Path) -> None:
    report = checked(tmp_path, lambda s: s.final.storage["Q"].update(files=51))
    assert found(report) == [("storage", [])]
    assert report.violations[0].message == "queue Q: 51 files, more than 50"


@pytest.mark.parametrize(
    ("fault", "documented"),
    [
        ({"actor": "W1", "from": T0 + 9, "to": T0 + 19}, True),
        ({"actor": "W1", "from": T0 + 11, "to": T0 + 19}, False),  # the first delivery is outside
        ({"actor": "W2", "from": T0, "to": T0 + 30}, False),  # another actor
    ],
    ids=["covered", "too-late", "other-actor"],
)
def test_documented(tmp_path: Path, fault: dict[str, Any], documented: bool) -> None:
    def duplicate_and_lose(s: Scenario) -> None:
        s.get("W1#1", "w9", 18, ["a1"], "ok")
        s.final.waiting["workers"] = []  # g3 lost: no delivery explains a loss
        s.plan["documented"] = [{"name": "redelivery after a kill"} | fault]

    report = checked(tmp_path, duplicate_and_lose)
    duplicate = [("duplicate", ["a1"])]
    assert [(v.kind, v.ids) for v in report.documented] == (duplicate if documented else [])
    assert found(report) == [("lost", ["g3"])] + ([] if documented else duplicate)
    if documented:
        assert report.documented[0].message.endswith("(documented: redelivery after a kill)")


def test_a_failed_query_is_a_violation_unless_its_history_names_the_documented_limit(tmp_path: Path) -> None:
    def fail_twice(s: Scenario) -> None:
        failure = {"t": T0 + 20.5, "error": "FileNotFoundError: part-1.parquet"}
        s.events.append(("S1#0", "failure", failure | {"documented": "retention shorter than a micro-batch"}))
        s.events.append(("S1#1", "failure", failure | {"error": "MQRC_BACKED_OUT (2003): q", "documented": None}))

    report = checked(tmp_path, fail_twice)
    assert [(v.kind, v.message) for v in report.violations] == [("query_failed", "S1#1: MQRC_BACKED_OUT (2003): q")]
    assert [(v.kind, v.message) for v in report.documented] == [
        (
            "query_failed",
            "S1#0: FileNotFoundError: part-1.parquet (documented: retention shorter than a micro-batch)",
        )
    ]


@pytest.mark.parametrize("given_up", [False, True], ids=["replayed", "given-up"])
def test_a_duplicate_whose_first_batch_was_given_up_after_the_sink_wrote_it_is_documented(
    tmp_path: Path, given_up: bool
) -> None:
    def deliver_batch_0_again(s: Scenario) -> None:
        s.batch("S2#0", 25, 2, [("a1", 9), ("a2", 10)])
        if given_up:  # batch 0's replay delivered nothing: the planner gave it up
            s.events.append(("S2#0", "given_up", {"t": T0 + 24, "consumer": "audit", "batch": 0}))

    report = checked(tmp_path, deliver_batch_0_again)
    duplicates = [("duplicate", ["a1"]), ("duplicate", ["a2"])]
    assert (found(report), [(v.kind, v.ids) for v in report.documented]) == (
        ([], duplicates) if given_up else (duplicates, [])
    )
    if given_up:
        assert report.documented[0].message == (
            "group audit: a1 delivered 2 times (by S1#0, S2#0) (documented: a batch given up after its "
            "replay failed, whose sink had written it (docs/failed-messages.md))"
        )


def test_command_line(tmp_path: Path) -> None:
    def command(run: Path) -> subprocess.CompletedProcess[str]:
        arguments = [sys.executable, "-m", "chaos.checker", str(run)]
        return subprocess.run(arguments, cwd=REPOSITORY, capture_output=True, text=True, timeout=60)

    good = command(valid().write(tmp_path / "good"))
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["violations"] == []
    assert json.loads(good.stdout)["summary"]["puts"] == {"ok": 4, "failed": 1, "in_doubt": 2}

    broken = valid()
    broken.final.waiting["workers"] = []
    bad = command(broken.write(tmp_path / "bad"))
    assert bad.returncode == 1, bad.stderr
    assert json.loads(bad.stdout)["violations"] == [
        {
            "kind": "lost",
            "message": "group workers: g3 put but neither delivered, in doubt, waiting nor moved",
            "ids": ["g3"],
        }
    ]


def test_the_streaming_instance_names_the_documented_query_failures() -> None:
    from chaos.driver import documented_failure

    slow_worker = "org.apache.spark.SparkException: Python worker failed to connect back.\n\tat org.apache..."
    assert documented_failure(slow_worker) == "a Python data source's worker that started too slowly (docs/limits.md)"
    assert documented_failure("FileNotFoundError: /run/qm/queues/Q/part-1.parquet") == (
        "retention shorter than a micro-batch (docs/limits.md)"
    )
    assert documented_failure("MQRC_BACKED_OUT (2003): queue Q: ...") is None


def test_the_streaming_instance_records_the_line_of_a_query_failure_that_says_what_went_wrong() -> None:
    from chaos.driver import first_line

    spark = (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Python worker failed to connect back.\n"
        "\tat org.apache.spark.api.python.PythonWorkerFactory.createSimpleWorker(PythonWorkerFactory.scala:252)\n"
        "Caused by: java.net.SocketTimeoutException: Timed out while waiting for the Python worker to connect back\n"
        '"Executor task launch worker for task 0.0" Thread State: RUNNABLE\n'
    )
    assert first_line(spark) == (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Python worker failed to connect back."
    )
    python = (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An error\n"
        'Traceback (most recent call last):\n  File "stream.py", line 3, in deliver\n'
        "ValueError: the sink refused batch 4\n"
    )
    assert first_line(python) == "ValueError: the sink refused batch 4"
    mq = "StreamingQueryException: x\nmqspark.errors.MQError: MQRC_BACKED_OUT (2003): queue Q: lock passed\n"
    assert first_line(mq) == "mqspark.errors.MQError: MQRC_BACKED_OUT (2003): queue Q: lock passed"


@pytest.mark.parametrize("given_up", [True, False], ids=["given-up", "not-given-up"])
def test_items_of_a_given_up_batch_still_waiting_when_the_run_ended_are_documented(
    tmp_path: Path, given_up: bool
) -> None:
    """A given-up batch waits to be delivered again; a run that ended before that (not drained)
    finds its items delivered and waiting, and a group's first item waiting behind its second."""

    def batch_1_waits_again(s: Scenario) -> None:
        s.final.waiting["audit"] = ["g2", "g3", "x1"]
        if given_up:
            s.events.append(("S1#0", "given_up", {"t": T0 + 24, "consumer": "audit", "batch": 1}))

    report = checked(tmp_path, batch_1_waits_again)
    kinds = [("delivered_and_waiting", ["g2"]), ("delivered_and_waiting", ["g3"]), ("order", ["g2", "g3"])]
    assert (found(report), [(v.kind, v.ids) for v in report.documented]) == (([], kinds) if given_up else (kinds, []))


def test_evidence_prints_the_faults_and_what_names_the_ids_with_the_other_phases_of_their_operations(tmp_path):
    from chaos.history import evidence

    (tmp_path / "faults.jsonl").write_text('{"t":5.0,"kind":"kill","target":"G1"}\n')
    history = History(tmp_path, "G1#1")
    history.record("get", phase="got", op="G1#1:1", consumer="workers", ids=["x1"])
    history.record("get", phase="got", op="G1#1:2", consumer="workers", ids=["x10"])
    history.record("get", phase="backout", op="G1#1:1")
    history.close()
    Final(moved=[{"id": "x1", "consumer": "workers"}, {"id": "x10", "consumer": "workers"}]).save(tmp_path)

    lines = evidence(tmp_path, ["x1"])
    assert lines[0] == '{"t":5.0,"kind":"kill","target":"G1"}'
    assert [json.loads(line)["op"] for line in lines[1:3]] == ["G1#1:1", "G1#1:1"]
    assert [json.loads(line)["phase"] for line in lines[1:3]] == ["got", "backout"]
    assert lines[3:] == ['final moved: {"id":"x1","consumer":"workers"}']
    assert evidence(tmp_path, []) == []
