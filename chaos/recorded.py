"""What a chaos run recorded, indexed for the checker (:mod:`chaos.checker`): its puts, every
delivery to every consumer group, the redrives, the forwarder's calls and replies, and the final
state, read from a run folder (the format is :mod:`chaos.history`'s). The words the checks use
(put, committed, in doubt, seen, on a replica) are defined in :mod:`chaos.checker`.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.history import Final, events, json_lines

Message = dict[str, Any]


@dataclass(frozen=True)
class Delivery:
    """One message handed to a consumer group: one id of a syncpoint get, or one row of a batch."""

    group: str
    id: str
    actor: str
    t: float  # of the ``got`` or ``batch`` event
    outcome: str  # "ok" (committed, or a batch row), "backout" or "doubt"
    # Its place among its group's deliveries of the same source: (time, position) for a syncpoint
    # get, (delivery_seq,) for a plain get or a batch row.
    key: tuple[float, ...]
    source: str  # "get" or "batch"
    batch: int | None = None  # a batch row's Spark batch id


@dataclass(frozen=True)
class Put:
    op: str
    actor: str
    messages: list[Message]
    phase: str  # "ok", "fail" or "doubt"
    queue: str | None


@dataclass
class Run:
    """A run's history and final state, indexed the way the checks ask for them."""

    plan: dict[str, Any]
    final: Final
    faults: list[dict[str, Any]]
    puts: list[Put]
    deliveries: list[Delivery]
    batches: list[dict[str, Any]]  # the raw batch events, for the priority check
    reply_requests: list[str]  # the ``request`` of every reply event
    calls: dict[str, set[str]]  # per consumer group, the ids a forwarder's service was called with
    given_up: dict[str, set[int]]  # per consumer group, the batches its planner gave up after the sink wrote them
    failures: list[dict[str, Any]]  # the ``failure`` events
    # Per consumer group, the ids a redrive that did not fail gave back to it, with its time.
    redriven: dict[str, dict[str, float]]
    redrives: int  # the redrives that returned
    # Per consumer group, its plain gets that ended without saying what they got (killed, or the
    # store did not answer): each may have consumed a message nobody saw.
    unfinished_gets: Counter[str]
    messages: dict[str, Message] = field(init=False)
    # Per id, the queue managers it was seen on (None: the main one), and each replica's groups.
    placed: dict[str, set[str | None]] = field(init=False)
    replica_groups: dict[str, str] = field(init=False)
    routers: set[str] = field(init=False)  # the actors that put through the cluster
    put_of: dict[str, Put] = field(init=False)
    seen: set[str] = field(init=False)
    committed: set[str] = field(init=False)
    moved: Counter[str] = field(init=False)
    replies: Counter[str] = field(init=False)
    _delivered: dict[str, dict[str, list[Delivery]]] = field(init=False)
    _in_doubt: dict[str, set[str]] = field(init=False)
    _waiting: dict[str, set[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.messages = {m["id"]: m for put in self.puts for m in put.messages}
        self.put_of = {m["id"]: put for put in self.puts for m in put.messages}
        self.moved = Counter(record["id"] for record in self.final.moved)
        self._waiting = {group: set(ids) for group, ids in self.final.waiting.items()}
        self._delivered, self._in_doubt = defaultdict(lambda: defaultdict(list)), defaultdict(set)
        for d in self.deliveries:
            if d.outcome == "ok":
                self._delivered[d.group][d.id].append(d)
            elif d.outcome == "doubt":
                self._in_doubt[d.group].add(d.id)
        # Each reply or failure record: read by its requester, or still waiting on the reply queue.
        self.replies = Counter(self.final.replies) + Counter(self.reply_requests)
        self.seen = (
            {d.id for d in self.deliveries}
            | {i for ids in self.final.waiting.values() for i in ids}
            | set(self.moved)
            | set(self.replies)
            | set(self.reply_requests)
            | {i for ids in self.calls.values() for i in ids}
        )
        self.committed = {
            m["id"]
            for put in self.puts
            if put.phase == "ok" or (put.phase == "doubt" and all(m["id"] in self.seen for m in put.messages))
            for m in put.messages
        }
        self.replica_groups = {g: qmgr for qmgr, names in self.plan.get("replicas", {}).items() for g in names}
        self.routers = {actor["name"] for actor in self.plan.get("actors", []) if actor["kind"] == "routed-put"}
        self.placed = defaultdict(set)
        front = self.plan.get("front")
        sightings: list[tuple[str, str | None]] = [(d.id, self.replica_groups.get(d.group)) for d in self.deliveries]
        sightings += [(i, self.replica_groups.get(g)) for g, ids in self.final.waiting.items() for i in ids]
        sightings += [(i, self.replica_groups.get(g)) for g, ids in self.calls.items() for i in ids]
        for record in self.final.moved:
            # A dead letter of the routed put's own queue manager (no replica qualified) is on it.
            on_front = front is not None and str(record["queue"]).startswith(f"{front}/")
            sightings.append(
                (record["id"], front if on_front else self.replica_groups.get(record.get("consumer") or ""))
            )
        for i, qmgr in sightings:
            self.placed[i].add(qmgr)

    def routed(self, i: str) -> bool:
        """Whether message ``i`` was put through the cluster (and may be on any replica)."""
        put = self.put_of.get(i)
        return put is not None and put.actor.split("#")[0] in self.routers

    def on(self, i: str) -> str | None:
        """The queue manager message ``i`` is on (None: the main one): the one it was seen on, for a
        routed message seen on one only."""
        where = self.placed.get(i, set())
        return next(iter(where)) if self.routed(i) and len(where) == 1 else None

    def groups_of(self, i: str) -> list[str]:
        """The consumer groups of the queue manager message ``i`` is on."""
        qmgr = self.on(i)
        return [g for g in self.final.consumers if self.replica_groups.get(g) == qmgr]

    def committed_for(self, group: str) -> set[str]:
        """The committed ids on the queue manager of consumer group ``group``."""
        return {i for i in self.committed if group in self.groups_of(i)}

    def groups(self) -> list[str]:
        """Every consumer group: those final.json names, then any other one a delivery names."""
        named = list(self.final.consumers)
        return named + sorted({d.group for d in self.deliveries} - set(named))

    def waiting(self, group: str) -> set[str]:
        return self._waiting.get(group, set())

    def delivered(self, group: str) -> dict[str, list[Delivery]]:
        """The committed deliveries to ``group``, by id, in the order the history lists them."""
        return self._delivered.get(group, {})

    def called(self, group: str) -> set[str]:
        return self.calls.get(group, set())

    def in_doubt(self, group: str) -> set[str]:
        return self._in_doubt.get(group, set())

    def involving(self, ids: Iterable[str], group: str | None = None) -> list[Delivery]:
        """Every delivery (any outcome) of these ids, to ``group`` or to any group."""
        wanted = set(ids)
        return [d for d in self.deliveries if d.id in wanted and group in (None, d.group)]


def load(run: Path) -> Run:
    plan_path = run / "plan.json"
    plan: dict[str, Any] = json.loads(plan_path.read_text()) if plan_path.exists() else {}
    puts: dict[tuple[str, str], dict[str, Any]] = {}
    gets: dict[tuple[str, str], dict[str, Any]] = {}
    deliveries: list[Delivery] = []
    batches: list[dict[str, Any]] = []
    reply_requests: list[str] = []
    calls: dict[str, set[str]] = defaultdict(set)
    given_up: dict[str, set[int]] = defaultdict(set)
    failures: list[dict[str, Any]] = []
    redrives: dict[tuple[str, str], dict[str, Any]] = {}
    for event in events(run):
        kind, actor = event["e"], event["actor"]
        t = event["t"]
        if kind == "put":
            puts.setdefault((actor, event["op"]), {"actor": actor, "op": event["op"]})[event["phase"]] = event
        elif kind == "get":
            gets.setdefault((actor, event["op"]), {})[event["phase"]] = {**event, "t": t}
        elif kind == "batch":
            batches.append({**event, "t": t})
            consumer, batch = event["consumer"], event["batch"]
            for row in event["rows"]:
                key = (float(row["delivery_seq"]),)
                deliveries.append(Delivery(consumer, row["id"], actor, t, "ok", key, "batch", batch))
        elif kind == "reply":
            reply_requests.append(event["request"])
        elif kind == "given_up":
            given_up[event["consumer"]].add(event["batch"])
        elif kind == "call":
            calls[event["consumer"]].add(event["id"])
        elif kind == "failure":
            failures.append(event)
        elif kind == "redrive":
            redrives.setdefault((actor, event["op"]), {})[event["phase"]] = event
    for phases in gets.values():
        deliveries.extend(_get_deliveries(phases))
    return Run(
        plan=plan,
        final=Final.load(run),
        faults=list(json_lines(run / "faults.jsonl")),
        puts=[_put(phases) for phases in puts.values() if "invoke" in phases],
        deliveries=deliveries,
        batches=batches,
        reply_requests=reply_requests,
        calls=calls,
        given_up=given_up,
        failures=failures,
        redriven=_redriven(redrives.values()),
        redrives=sum(1 for phases in redrives.values() if "ok" in phases),
        unfinished_gets=Counter(
            phases["invoke"]["consumer"]
            for phases in gets.values()
            if "invoke" in phases and "got" not in phases and "fail" not in phases
        ),
    )


def _redriven(redrives: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per consumer group, each id a redrive gave back to it (or may have: one killed meanwhile),
    with the time of the first such redrive; a redrive that failed gave nothing back."""
    redriven: dict[str, dict[str, float]] = defaultdict(dict)
    for phases in redrives:
        invoke = phases.get("invoke")
        if invoke is None or "fail" in phases:
            continue
        for item in invoke["items"]:
            since = redriven[item["consumer"]]
            since[item["id"]] = min(since.get(item["id"], invoke["t"]), invoke["t"])
    return redriven


def _put(phases: dict[str, Any]) -> Put:
    invoke = phases["invoke"]
    phase = "ok" if "ok" in phases else "fail" if "fail" in phases else "doubt"
    return Put(phases["op"], phases["actor"], invoke["messages"], phase, invoke.get("queue"))


def _get_deliveries(phases: dict[str, dict[str, Any]]) -> list[Delivery]:
    got = phases.get("got")
    if got is None:  # an ok or backout whose got line was lost: nothing was recorded in hand
        return []
    outcome = "ok" if "ok" in phases else "backout" if "backout" in phases else "doubt"
    # A plain get's messages are placed by their delivery_seq: the gets of one round return together.
    keys = (
        [(float(n),) for n in got["seqs"]] if "seqs" in got else [(got["t"], float(n)) for n in range(len(got["ids"]))]
    )
    return [
        Delivery(got["consumer"], i, got["actor"], got["t"], outcome, key, "get")
        for i, key in zip(got["ids"], keys, strict=True)
    ]
