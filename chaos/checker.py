"""The chaos run's checker: reads what a run recorded and reports each broken guarantee.

It owns the judgement, and only that: :func:`check` reads a run folder (through
:func:`chaos.recorded.load`: ``history/*.jsonl``, ``final.json``, ``plan.json`` and ``faults.jsonl``;
the format is described in :mod:`chaos.history`) and returns a
:class:`Report`. It starts no Spark and opens no queue manager, so it can judge a run long after it
ended, or a history written by hand.

``python -m chaos.checker RUN_FOLDER`` prints the report as JSON and exits 1 when a guarantee was
broken (a violation explained by a documented fault does not count).

Words used below:

- an id is *put* when its put op ended ``ok``, *failed* when it ended ``fail``, *in doubt* when the
  op has an ``invoke`` only. An in-doubt op is *committed* when every one of its ids was seen
  somewhere (it put all of them), and then its ids are judged as put ids are;
- for consumer group G an id is *delivered* by a ``got`` followed by ``ok`` or by a ``batch`` row,
  *in doubt* by a ``got`` with neither ``ok`` nor ``backout`` (the consumer was killed);
- a *plain* group's gets consume as they return: one that has an ``invoke`` and neither ``got`` nor
  ``fail`` is *unfinished*, and may have consumed its one message unseen. Such a group may leave as
  many committed ids unseen as it has unfinished gets, and its poison messages are delivered like
  any other (no get of it fails);
- for a forwarder's consumer group an id is *called* when a ``call`` event names it (calls are at
  least once, so only replies are counted: exactly one per request consumed);
- *seen* means delivered, got (any outcome), called, waiting, moved, or named by a reply.
- with the routed put, the queue has a second replica on another queue manager, whose consumer
  groups the plan's ``replicas`` names (``CHAOS2/python``): a message the routed put put is *on*
  the queue manager whose groups saw it (or moved it; a dead letter of the plan's ``front``, the
  routed put's own queue manager, is on that one), any other message on the main queue manager;
  each is judged only for the groups of the queue manager it is on (``routing`` checks the
  placement itself).

An event's time is its ``t``, on the run's clock (:func:`chaos.history.run_clock`, which a skewed
actor's clock does not change), both to order a syncpoint group's gets and to match a documented
fault's window.

The poison check compares a put's ``queue`` with the moved records' ``original_queue``, and skips
that comparison for a hand-written put without one.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.recorded import Delivery, Run, load

# The documented limit a duplicate is when its first delivery was in a batch the planner gave up.
GIVEN_UP = "a batch given up after its replay failed, whose sink had written it (docs/failed-messages.md)"


@dataclass
class Violation:
    kind: str
    message: str
    ids: list[str]
    # The deliveries that broke the guarantee: what a documented fault must account for.
    deliveries: list[Delivery] = field(default_factory=list, repr=False, compare=False)
    # The documented limit the history itself names (a ``failure`` event), if any.
    documented: str | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "ids": self.ids}


@dataclass
class Report:
    violations: list[Violation]
    documented: list[Violation]
    summary: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "violations": [v.to_json() for v in self.violations],
            "documented": [v.to_json() for v in self.documented],
            "summary": self.summary,
        }


# ---------------------------------------------------------------------------------------------
# The checks: each returns its violations, in a stable order.


def _names(ids: Iterable[str], most: int = 10) -> str:
    """Ids for a one-line message: the first few, and how many more."""
    listed = list(ids)
    shown = ", ".join(listed[:most])
    return shown if len(listed) <= most else f"{shown} and {len(listed) - most} more"


def _unseen(run: Run, group: str) -> list[str]:
    """The committed ids of ``group`` neither delivered, in doubt, waiting, moved nor called."""
    accounted = set(run.delivered(group)) | run.in_doubt(group) | run.waiting(group) | set(run.moved)
    return sorted(run.committed_for(group) - accounted - run.called(group))


def check_lost(run: Run) -> list[Violation]:
    found = []
    for group, kind in run.final.consumers.items():
        lost = _unseen(run, group)
        unfinished = run.unfinished_gets[group] if kind == "plain" else 0
        if len(lost) > unfinished:
            message = f"group {group}: {_names(lost)} put but neither delivered, in doubt, waiting nor moved"
            if unfinished:
                message += f" ({len(lost)}, more than its {unfinished} unfinished gets of one message may have taken)"
            found.append(Violation("lost", message, lost))
    return found


def check_torn_puts(run: Run) -> list[Violation]:
    found = []
    for put in run.puts:
        ids = [m["id"] for m in put.messages]
        seen = [i for i in ids if i in run.seen]
        if put.phase == "doubt" and seen and len(seen) < len(ids):
            unseen = [i for i in ids if i not in run.seen]
            message = f"put {put.op} by {put.actor} in doubt: {_names(seen)} seen but {_names(unseen)} never"
            found.append(Violation("torn_put", message, ids))
    return found


def check_failed_puts(run: Run) -> list[Violation]:
    found = []
    for put in run.puts:
        visible = [m["id"] for m in put.messages if m["id"] in run.seen]
        if put.phase == "fail" and visible:
            message = f"put {put.op} by {put.actor} failed but {_names(visible)} seen"
            found.append(Violation("failed_put_visible", message, visible, run.involving(visible)))
    return found


def check_phantoms(run: Run) -> list[Violation]:
    phantoms = sorted(run.seen - set(run.messages))
    if not phantoms:
        return []
    message = f"{_names(phantoms)} seen but never put"
    return [Violation("phantom", message, phantoms, run.involving(phantoms))]


def check_duplicates(run: Run) -> list[Violation]:
    found = []
    for group in run.groups():
        delivered, waiting = run.delivered(group), run.waiting(group)
        for i in sorted(delivered):
            times = delivered[i]
            if len(times) > 1:
                by = ", ".join(sorted({d.actor for d in times}))
                message = f"group {group}: {i} delivered {len(times)} times (by {by})"
                given_up = times[0].batch in run.given_up.get(group, set())
                found.append(Violation("duplicate", message, [i], times, documented=GIVEN_UP if given_up else None))
            if i in waiting:
                # A batch given up waits to be delivered again: at the end of a run not drained.
                documented = GIVEN_UP if times[-1].batch in run.given_up.get(group, set()) else None
                message = f"group {group}: {i} delivered (by {times[0].actor}) and still waiting"
                found.append(Violation("delivered_and_waiting", message, [i], times, documented=documented))
    return found


def check_order(run: Run) -> list[Violation]:
    found = []
    for group in run.groups():
        waiting = run.waiting(group)
        # A poison message moved off the queue for this group no longer holds its message group back.
        skipped = {i for i, m in run.messages.items() if m.get("poison") and i in run.moved and i not in waiting}
        # A copy redriven for the group comes back outside its message group's run (docs/failed-messages.md).
        redriven = run.redriven.get(group, {})
        for source in ("get", "batch"):
            found += _order_of_deliveries(run, group, source, skipped, redriven)
        found += _order_of_waiting(run, group, waiting - skipped - set(redriven))
    return found


def _order_of_deliveries(
    run: Run, group: str, source: str, skipped: set[str], redriven: dict[str, float]
) -> list[Violation]:
    """A message group's items delivered with strictly increasing ``seq`` (each id's first delivery:
    a second one is a duplicate, reported as such), leaving out deliveries of redriven copies."""
    streams: dict[str, list[Delivery]] = defaultdict(list)
    firsts: set[str] = set()
    for d in sorted(run.deliveries, key=lambda d: d.key):
        message = run.messages.get(d.id)
        if d.group != group or d.source != source or d.outcome != "ok" or d.id in firsts or d.id in skipped:
            continue
        if d.id in redriven and d.t >= redriven[d.id]:
            continue
        firsts.add(d.id)
        if message is not None and message.get("group") is not None:
            streams[message["group"]].append(d)
    found = []
    for name, stream in sorted(streams.items()):
        for before, after in zip(stream, stream[1:], strict=False):
            seq_before, seq_after = run.messages[before.id]["seq"], run.messages[after.id]["seq"]
            if seq_after <= seq_before:
                text = (
                    f"group {group}, message group {name}: {after.id} (seq {seq_after}, by {after.actor}) "
                    f"delivered after {before.id} (seq {seq_before}, by {before.actor})"
                )
                found.append(Violation("order", text, [before.id, after.id], [before, after]))
    return found


def _order_of_waiting(run: Run, group: str, waiting: set[str]) -> list[Violation]:
    """No item of a message group left waiting behind a later item already delivered."""
    latest: dict[str, Delivery] = {}  # per message group, the delivery of its highest seq
    for i, times in run.delivered(group).items():
        message = run.messages.get(i)
        if message is None or message.get("group") is None:
            continue
        best = latest.get(message["group"])
        if best is None or message["seq"] > run.messages[best.id]["seq"]:
            latest[message["group"]] = times[0]
    found = []
    for i in sorted(waiting):
        message = run.messages.get(i)
        best = latest.get(message["group"]) if message and message.get("group") is not None else None
        if message and best and message["seq"] < run.messages[best.id]["seq"]:
            text = (
                f"group {group}, message group {message['group']}: {i} (seq {message['seq']}) waiting "
                f"but {best.id} (seq {run.messages[best.id]['seq']}) delivered by {best.actor}"
            )
            documented = GIVEN_UP if best.batch in run.given_up.get(group, set()) else None
            found.append(Violation("order", text, [i, best.id], [best], documented=documented))
    return found


def check_priority(run: Run) -> list[Violation]:
    found = []
    for event in run.batches:
        rows = sorted((r for r in event["rows"] if r.get("group") is None), key=lambda r: r["delivery_seq"])
        for before, after in zip(rows, rows[1:], strict=False):
            if after["priority"] > before["priority"]:
                message = (
                    f"group {event['consumer']}, batch {event['batch']} by {event['actor']}: {after['id']} "
                    f"(priority {after['priority']}) after {before['id']} (priority {before['priority']})"
                )
                deliveries = run.involving([before["id"], after["id"]], event["consumer"])
                mine = [d for d in deliveries if d.source == "batch" and d.actor == event["actor"]]
                found.append(Violation("priority", message, [before["id"], after["id"]], mine))
    return found


def check_poison(run: Run) -> list[Violation]:
    found = []
    for i in sorted(run.committed):
        if not run.messages[i].get("poison"):
            continue
        # A plain get never fails a message: a poison one is consumed like any other.
        groups = [g for g in run.groups_of(i) if run.final.consumers.get(g) != "plain"]
        problems, delivered = [], []
        for group in (g for g in run.groups() if run.final.consumers.get(g) != "plain"):
            times = run.delivered(group).get(i, [])
            if times:
                delivered += times
                problems.append(f"delivered to {group} by {', '.join(sorted({d.actor for d in times}))}")
        gone = [g for g in groups if i not in run.waiting(g)]
        movers = [str(r.get("consumer")) for r in run.final.moved if r["id"] == i]
        if run.moved[i] != len(gone):
            problems.append(
                f"{run.moved[i]} moved records (by groups {', '.join(sorted(movers))}) for {len(gone)} groups it is"
                f" not waiting for ({', '.join(sorted(gone))})"
            )
        elif sorted(movers) != sorted(gone):  # each record names the group that moved it
            problems.append(f"moved by groups {', '.join(sorted(movers))}, not waiting for {', '.join(sorted(gone))}")
        queue = run.put_of[i].queue
        for record in (r for r in run.final.moved if r["id"] == i):
            if (record.get("backout_count") or 0) < 1:
                problems.append(f"moved to {record.get('queue')} with backout count {record.get('backout_count')}")
            if queue is not None and record.get("original_queue") != queue:
                problems.append(f"moved with original queue {record.get('original_queue')}, put to {queue}")
        if problems:
            found.append(Violation("poison", f"poison {i}: " + "; ".join(problems), [i], delivered))
    return found


def check_replies(run: Run) -> list[Violation]:
    found = []
    forwarder = run.plan.get("forwarder_consumer")
    for i in sorted(run.committed):
        request = run.messages[i].get("request") is not None
        count = run.replies[i]
        if not request and count:
            found.append(Violation("reply", f"{i} is not a request but has {count} reply entries", [i]))
        if not request or forwarder is None:
            continue
        if i in run.waiting(forwarder):
            expected, state = (0, 0), f"waiting for {forwarder}"
        elif i in run.delivered(forwarder) or i in run.called(forwarder) or i in run.moved:
            expected, state = (1, 1), f"delivered to {forwarder} or moved"
        elif i in run.in_doubt(forwarder):  # the forwarder may have died before or after it replied
            expected, state = (0, 1), f"in doubt for {forwarder}"
        else:
            continue  # lost: reported as such
        if run.put_of[i].phase == "doubt":  # its requester may have read the reply, then died
            expected = (0, expected[1])
        if not expected[0] <= count <= expected[1]:
            message = f"request {i} {state} has {count} reply entries"
            found.append(Violation("reply", message, [i], run.involving([i], forwarder)))
    return found


def check_routing(run: Run) -> list[Violation]:
    """A routed message is on one replica of the queue, and a routed message group on one replica
    (bind ``on_group``); a message put on the main queue manager is there only; the routed put
    dead-letters nothing (every replica qualifies all along)."""
    found = []
    main, front = str(run.plan.get("qmgr", "main")), run.plan.get("front")
    for i in sorted(run.placed):
        where = run.placed[i]
        names = ", ".join(sorted(qmgr or main for qmgr in where))
        if not run.routed(i) and where != {None}:
            found.append(Violation("misplaced", f"{i} put on {main} but seen on {names}", [i], run.involving([i])))
        elif len(where) > 1:
            found.append(Violation("routed_twice", f"{i} seen on queue managers {names}", [i], run.involving([i])))
        elif front is not None and where == {front}:
            found.append(Violation("dead_lettered", f"{i} dead-lettered on {front} by the routed put", [i]))
    placements: dict[str, set[str | None]] = defaultdict(set)
    for i in run.placed:
        message = run.messages.get(i)
        if run.routed(i) and message is not None and message.get("group") is not None:
            placements[message["group"]] |= run.placed[i]
    for name, where in sorted(placements.items()):
        if len(where) > 1:
            names = ", ".join(sorted(qmgr or main for qmgr in where))
            text = f"message group {name} put with bind on_group is on queue managers {names}"
            found.append(Violation("group_split", text, []))
    return found


def check_storage(run: Run) -> list[Violation]:
    most = run.plan.get("max_files", 50)
    return [
        Violation("storage", f"queue {queue}: {sizes['files']} files, more than {most}", [])
        for queue, sizes in sorted(run.final.storage.items())
        if sizes.get("files", 0) > most
    ]


def check_failures(run: Run) -> list[Violation]:
    """Every streaming query that failed: a violation, unless the history names the documented limit
    it is."""
    return [
        Violation("query_failed", f"{event['actor']}: {event['error']}", [], documented=event.get("documented"))
        for event in run.failures
    ]


CHECKS = (
    check_lost,
    check_torn_puts,
    check_failed_puts,
    check_phantoms,
    check_duplicates,
    check_order,
    check_priority,
    check_poison,
    check_replies,
    check_routing,
    check_storage,
    check_failures,
)


# ---------------------------------------------------------------------------------------------
# Documented faults, the summary, the report


def documented_by(violation: Violation, documented: list[dict[str, Any]]) -> str | None:
    """The name of the documented fault that explains every delivery of ``violation``, if any. A
    violation without deliveries (a loss, a torn put, storage) is never explained away."""
    for fault in documented:
        if violation.deliveries and all(
            d.actor.split("#")[0] == fault["actor"] and fault["from"] <= d.t <= fault["to"]
            for d in violation.deliveries
        ):
            return str(fault["name"])
    return None


def summarize(run: Run) -> dict[str, Any]:
    """Counts for the reader. Per consumer group, each committed id counts once: ``delivered``, else
    ``waiting``, else ``moved``, else ``in_doubt`` (in hand when its consumer died, seen nowhere since)."""
    phases = Counter(put.phase for put in run.puts)
    consumers = {}
    for group, kind in run.final.consumers.items():
        waiting, committed = run.waiting(group), run.committed_for(group)
        moved = (set(run.moved) & committed) - set(run.delivered(group)) - waiting
        # A forwarder's group: consumed is called, and neither waiting nor moved.
        delivered = set(run.delivered(group)) | ((run.called(group) & committed) - waiting - moved)
        in_doubt = (run.in_doubt(group) & committed) - delivered - waiting - moved
        consumers[group] = {
            "kind": kind,
            "delivered": len(delivered),
            "in_doubt": len(in_doubt),
            "waiting": len(waiting),
            "moved": len(moved),
        }
        if kind == "plain":
            consumers[group] |= {"unfinished_gets": run.unfinished_gets[group], "unseen": len(_unseen(run, group))}
    return {
        "puts": {"ok": phases["ok"], "failed": phases["fail"], "in_doubt": phases["doubt"]},
        "messages_put": sum(len(put.messages) for put in run.puts if put.phase == "ok"),
        "messages_committed": len(run.committed),
        "consumers": consumers,
        "replies": sum(run.replies.values()),
        "redrives": run.redrives,
        "redriven": sum(len(ids) for ids in run.redriven.values()),
        "faults": dict(sorted(Counter(str(f["kind"]) for f in run.faults if not f["kind"].endswith("_end")).items())),
    }


def check(run: Path) -> Report:
    """Judge the run recorded in folder ``run``."""
    loaded = load(run)
    report = Report([], [], summarize(loaded))
    documented = loaded.plan.get("documented") or []
    for one_check in CHECKS:
        for violation in one_check(loaded):
            name = violation.documented or documented_by(violation, documented)
            if name is None:
                report.violations.append(violation)
            else:
                violation.message += f" (documented: {name})"
                report.documented.append(violation)
    return report


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m chaos.checker RUN_FOLDER", file=sys.stderr)
        return 2
    report = check(Path(argv[0]))
    print(json.dumps(report.to_json(), indent=1))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
