"""The nemesis of a chaos run: which fault, when, to whom, drawn from the seed before the run starts.

The same seed gives the same schedule (not the same timing: processes run as fast as the machine
lets them). Kinds:

- ``kill``: SIGKILL; the actor starts again as its next incarnation after ``restart_after`` seconds;
- ``pause``: SIGSTOP for ``for`` seconds, then SIGCONT (past the queue's lock duration now and then,
  so another getter takes the paused one's messages back);
- ``switchover``: ``mqspark instance switchover`` of a consumer group's instances (MQ's
  ``endmqm -s``): the active one hands over to a standby at its next micro-batch boundary;
- ``skew``: the process's wall clock ``amount`` seconds off (ahead or behind) for ``duration`` seconds;
- ``slow``: each of the process's file writes sleeps ``amount`` seconds first, for ``duration``
  seconds (a slow disk). Both through :mod:`chaos.faults`, and they last across restarts;
- ``outage`` (runs on the object store only): the store (Azurite) stopped for ``duration`` seconds,
  then started again with the same data.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

KINDS = ("kill", "pause", "switchover", "skew", "slow")
WEIGHTS = (9, 9, 2, 3, 3)


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    target: str
    duration: float = 0.0
    restart_after: float = 0.0
    amount: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The target of an outage: the object store itself.
STORE = "store"


def schedule(
    seed: int, seconds: float, targets: list[str], mean_interval: float, services: list[str], outages: bool = False
) -> list[Fault]:
    """Faults at random times (exponential gaps of ``mean_interval`` on average) over ``seconds``, each
    on a target drawn at random (a process, or for a switchover one of the consumer groups
    ``services`` run as instances), leaving the first and last few seconds quiet. ``outages``: the
    run's store can be stopped (an object store's emulator). Every schedule holds a kill and a pause:
    a run without them would test nothing it is for."""
    rng = random.Random(seed)
    kinds, weights = (KINDS + ("outage",), WEIGHTS + (2,)) if outages else (KINDS, WEIGHTS)
    faults: list[Fault] = []
    at = 3.0
    while True:
        at += rng.expovariate(1.0 / mean_interval)
        if at > seconds - 3.0:
            return _with_kill_and_pause(rng, faults, targets)
        kind = rng.choices(kinds, weights)[0]
        if kind == "switchover":
            faults.append(Fault(round(at, 2), kind, rng.choice(services)))
            continue
        if kind == "outage":
            faults.append(Fault(round(at, 2), kind, STORE, duration=round(rng.uniform(2.0, 10.0), 2)))
            continue
        faults.append(_fault(rng, round(at, 2), kind, rng.choice(targets)))


def _with_kill_and_pause(rng: random.Random, faults: list[Fault], targets: list[str]) -> list[Fault]:
    """``faults``, with a fault of another kind made a kill or a pause where the draw gave none."""
    for kind in ("kill", "pause"):
        if any(f.kind == kind for f in faults):
            continue
        others = [i for i, f in enumerate(faults) if f.kind not in ("kill", "pause")]
        if others:
            i = rng.choice(others)
            faults[i] = _fault(rng, faults[i].at, kind, rng.choice(targets))
    return faults


def _fault(rng: random.Random, at: float, kind: str, target: str) -> Fault:
    """A fault of ``kind`` on a process, with its own parameters drawn."""
    if kind == "kill":
        return Fault(at, kind, target, restart_after=round(rng.uniform(0.2, 3.0), 2))
    if kind == "pause":
        return Fault(at, kind, target, duration=round(rng.uniform(0.5, 12.0), 2))
    if kind == "skew":
        offset = rng.choice((-1, 1)) * rng.uniform(0.5, 3.0)
        return Fault(at, kind, target, duration=round(rng.uniform(10.0, 40.0), 2), amount=round(offset, 3))
    return Fault(at, kind, target, duration=round(rng.uniform(5.0, 20.0), 2), amount=round(rng.uniform(0.01, 0.1), 3))
