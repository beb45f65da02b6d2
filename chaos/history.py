"""What a chaos run records, and how: one JSON-lines file per actor incarnation, written line by line.

A run folder holds:

- ``plan.json``: the seed, the minutes, the store, the actors and the fault schedule;
- ``history/<actor>.jsonl``: what each actor did, one event per line (see below). An actor writes a
  whole line and flushes it before it goes on, so a SIGKILL loses at most the line being written;
  the reader skips a last line without its newline;
- ``faults.jsonl``: what the nemesis did, when;
- ``final.json``: what the queues held when the run ended (see :class:`Final`).

Every event has ``t`` (the run's clock, :func:`run_clock`), ``actor`` (``name#incarnation``: a restarted
actor is a new incarnation) and ``e``, its kind:

- ``put``: ``phase`` ``invoke`` (with ``queue`` and ``messages``), then ``ok`` or ``fail`` (with ``error``), all
  with the same ``op`` (unique in the run). A put is atomic: an ``invoke`` with neither ``ok`` nor
  ``fail`` (its actor was killed) put all of its messages or none. Each message is a dict:
  ``id`` (unique in the run, also the message's payload), ``group`` (message group id or None),
  ``seq`` (its number in the group, 1 for none), ``last`` (last in group), ``priority``,
  ``poison`` (every delivery of it fails), ``request`` (the forwarder's reply queue, or None).
- ``get``: a get under syncpoint of consumer group ``consumer``. ``phase`` ``got`` (with ``ids``, in
  the order the get returned them) when the messages are in hand, then ``ok`` when the commit
  returned, or ``backout`` when the block raised (each message back on the queue with one more
  failed delivery). A ``got`` with neither (its actor was killed) may or may not have committed.
- ``batch``: a streaming get's micro-batch as its sink recorded it: ``consumer``, ``batch`` (Spark's
  batch id) and ``rows`` (``id``, ``delivery_seq``, ``priority``, ``group``, ``seq``).
- ``given_up``: a streaming get's replay of ``batch`` that delivered nothing though its sink had
  written that batch: the planner gave the batch up (its replay failed again) and delivers its
  messages again in smaller batches, so the sink sees them twice (docs/failed-messages.md).
- ``failure``: a streaming query that failed and was started again (by a streaming instance; by
  the forwarder or the streaming put only after a documented failure): ``error``, its MQ or
  Python error line, and ``documented``, the name of the documented limit it is, or None.
- ``monitor``: a backlog monitor's point: ``consumer``, ``backlog`` and ``verdict``.
- ``maintain``: a maintenance run of queue manager ``qmgr``: ``removed`` (messages removed), or ``error``.
- ``redrive``: a redrive of backout queue ``queue``: ``phase`` ``invoke`` (with ``items``, each the
  ``id`` of a message chosen and the ``consumer`` group it goes back for), then ``ok`` (with
  ``moved``, the counts redrive returned) or ``fail`` (with ``error``), all with the same ``op``.
- ``call``: a forwarder's service called with message ``id`` for consumer group ``consumer``.
- ``reply``: the forwarder's reply or failure record as the requester read it: ``request`` (the
  request's id) and ``failed`` (a failure record rather than a reply).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

# The wall clock of the run's own process less the monotonic clock, passed to every actor.
_CLOCK = "MQSPARK_CHAOS_CLOCK"


def start_clock() -> None:
    """Start the run's clock, in the environment the actors inherit."""
    os.environ[_CLOCK] = repr(time.time() - time.monotonic())


def run_clock() -> float:
    """The run's time, the same in every process of it: the machine's monotonic clock, which is one
    for all its processes and which a fault's clock skew leaves alone, on the run's wall clock. (An
    actor's own wall clock may be skewed: it could not tell which of two events came first.)"""
    offset = os.environ.get(_CLOCK)
    return time.monotonic() + float(offset) if offset else time.time()


class History:
    """The event file of one actor incarnation."""

    def __init__(self, run: Path, actor: str) -> None:
        folder = run / "history"
        folder.mkdir(parents=True, exist_ok=True)
        self.actor = actor
        self._file: TextIO = (folder / f"{actor}.jsonl").open("a", encoding="utf-8")

    def record(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"t": run_clock(), "actor": self.actor, "e": kind, **fields}, separators=(",", ":"))
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def events(run: Path) -> Iterator[dict[str, Any]]:
    """Every whole event of the run, file by file, each file in its own order."""
    for path in sorted((run / "history").glob("*.jsonl")):
        yield from json_lines(path)


def evidence(run: Path, ids: Iterable[str], limit: int = 80) -> list[str]:
    """What a failed run's folder says about messages ``ids``, to print where the folder is out of
    reach (a CI run): the faults applied, then the history events naming one of them (with the other
    phases of their operations) in time order, at most ``limit``, and the final records naming one."""
    names = sorted(set(ids))
    if not names:
        return []
    named = re.compile("|".join(f'"{re.escape(name)}"' for name in names))
    lines = [json.dumps(fault, separators=(",", ":")) for fault in json_lines(run / "faults.jsonl")]
    every = [(event, json.dumps(event)) for event in events(run)]
    # An operation's other phases (a put's ok, a redrive's ok or fail) name its op, not the ids.
    ops = {event["op"] for event, text in every if "op" in event and named.search(text)}
    mentions = sorted(
        (event for event, text in every if event.get("op") in ops or named.search(text)),
        key=lambda event: event.get("t", 0.0),
    )
    lines += [json.dumps(event, separators=(",", ":")) for event in mentions[:limit]]
    if len(mentions) > limit:
        lines.append(f"... {len(mentions) - limit} more events")
    final = run / "final.json"
    if final.exists():
        moved = json.loads(final.read_text()).get("moved", [])
        lines += [
            f"final moved: {json.dumps(record, separators=(',', ':'))}" for record in moved if record["id"] in names
        ]
    return lines


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The whole lines of a JSON-lines file, if there is one (a writer killed mid-line leaves its
    last one cut)."""
    if path.exists():
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if line.endswith("\n") and line.strip():
                    yield json.loads(line)


@dataclass
class Final:
    """What the queues held at the end of a run, after every actor stopped and maintenance ran.

    - ``consumers``: each consumer group and how it reads (``syncpoint`` or ``stream``);
    - ``waiting``: per consumer group, the ids of the messages still waiting for it;
    - ``moved``: the messages waiting on backout, error and dead-letter queues: ``id``, ``queue``,
      ``reason`` (the MQ reason code, None on a backout queue), ``backout_count``, ``original_queue``
      and ``consumer`` (the consumer group that moved it);
    - ``replies``: the ids of the requests with a reply or failure record waiting on a reply queue
      (no requester read it), one entry per record;
    - ``storage``: per queue, ``files``, ``bytes`` and ``live`` (messages) of its Delta table.

    With the routed put, the second replica's groups and queues are named ``CHAOS2/...`` and the
    dead letters of the routed put's queue manager ``FRONT/...`` (``consumer`` None).
    """

    consumers: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, list[str]] = field(default_factory=dict)
    moved: list[dict[str, Any]] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    storage: dict[str, dict[str, int]] = field(default_factory=dict)

    def save(self, run: Path) -> None:
        temporary = run / "final.json.tmp"
        temporary.write_text(json.dumps(self.__dict__, indent=1))
        os.replace(temporary, run / "final.json")

    @classmethod
    def load(cls, run: Path) -> Final:
        return cls(**json.loads((run / "final.json").read_text()))
