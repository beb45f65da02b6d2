"""One chaos run: set up the queue manager, start the actors, apply the nemesis's faults, let the
consumers drain, record what the queues hold, and check the history (:mod:`chaos.checker`).

The run's folder keeps everything (history, faults, actor logs, the queue manager), so a failure can
be looked at afterwards.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos import faults, nemesis
from chaos.actor import (
    BACKOUT_QUEUE,
    CLUSTER,
    FORWARD_GROUP,
    FRONT,
    MAIN,
    PLAIN_GROUP,
    PYTHON_GROUP,
    QUEUE,
    REPLICA,
    REPLY_QUEUE,
    STREAM_GROUP,
    TIMINGS,
    replica_group,
)
from chaos.checker import Report, Violation, check
from chaos.final import final_state, record_stream_output
from chaos.history import run_clock, start_clock
from mqspark import MQError, QueueManager, Reason
from mqspark.cluster.repository import Cluster
from mqspark.qmgr import engine
from mqspark.services.instances import switchover
from tests.support.azurite import ACCOUNT, Azurite

BACKOUT_THRESHOLD = 3
# The actors of every run: kind and name. Maintenance is a target too: a kill mid-commit is its
# hardest case.
ACTORS = [("producer", "P1"), ("client", "P2"), ("single-producer", "P3"), ("single-producer", "P4")]
ACTORS += [("getter", "G1"), ("getter", "G2"), ("getter", "G3"), ("monitor", "O"), ("maintenance", "M")]
ACTORS += [("redrive", "D"), ("plain-getter", "G5"), ("plain-getter", "G6")]
ACTORS += [("stream", "S1"), ("stream", "S2")]
# The seed adds a choice of these: at most four Spark drivers on two cores. The routed put brings
# the queue's second replica, and a getter there.
CHOICES = {
    "forwarder": [("requester", "R"), ("forwarder", "F")],
    "stream-put": [("stream-put", "W")],
    "routed-put": [("routed-put", "W"), ("replica-getter", "G4")],
}
MIXES = [["forwarder"], ["stream-put"], ["routed-put"], ["forwarder", "stream-put"], ["forwarder", "routed-put"]]
# The actors that stop when the producers do, before the consumers drain (a poison message redriven
# then would cycle between the queue and its backout queue for ever).
PRODUCING = ("producer", "client", "single-producer", "requester", "stream-put", "routed-put", "redrive")
# The module each kind of actor runs as: ``python -m MODULE RUN KIND NAME INCARNATION SEED``.
MODULES = {
    "stream": "chaos.stream",
    "forwarder": "chaos.forward",
    "stream-put": "chaos.stream_put",
    "routed-put": "chaos.stream_put",
}


def mix(seed: int) -> list[tuple[str, str]]:
    """The actors of the run of ``seed``."""
    chosen = random.Random(f"{seed}/mix").choice(MIXES)
    return ACTORS + [actor for choice in chosen for actor in CHOICES[choice]]


def groups(actors: list[tuple[str, str]]) -> dict[str, str]:
    """Each consumer group of the main queue manager's queue, and how it reads."""
    forwarding = any(kind == "forwarder" for kind, _ in actors)
    base = {PYTHON_GROUP: "syncpoint", PLAIN_GROUP: "plain", STREAM_GROUP: "stream"}
    return base | ({FORWARD_GROUP: "forward"} if forwarding else {})


def routed(actors: list[tuple[str, str]]) -> bool:
    """Whether the run has the routed put, and with it the queue's second replica."""
    return any(kind == "routed-put" for kind, _ in actors)


@dataclass
class Actor:
    kind: str
    name: str
    # The process's clock skew and slow disk (chaos.faults).
    control: faults.Control
    incarnation: int = 0
    process: subprocess.Popen[bytes] | None = None
    # When a killed actor starts again, or a paused one goes on.
    restart_at: float | None = None
    resume_at: float | None = None
    # The clock skew and slow disk on now: kind -> (amount, when it ends).
    disturbed: dict[str, tuple[float, float]] = field(default_factory=dict)

    def set_faults(self) -> None:
        amounts = {kind: amount for kind, (amount, _) in self.disturbed.items()}
        self.control.set(skew=amounts.get("skew", 0.0), write_delay=amounts.get("slow", 0.0))


class Run:
    def __init__(
        self,
        qm: QueueManager,
        folder: Path,
        seconds: float,
        seed: int,
        mean_interval: float,
        actors: list[tuple[str, str]],
        azurite: Azurite | None = None,
        replica: QueueManager | None = None,
    ) -> None:
        self.qm = qm
        # The queue manager of the queue's second replica (with the routed put), read by group python.
        self.replica = replica
        self.folder = folder
        self.seconds = seconds
        self.seed = seed
        self.groups = groups(actors)
        self.actors = {
            name: Actor(kind, name, faults.Control(folder / "faults" / f"{name}.control")) for kind, name in actors
        }
        self.library = faults.build(folder)
        self.faults = nemesis.schedule(
            seed, seconds, sorted(self.actors), mean_interval, [STREAM_GROUP], outages=azurite is not None
        )
        # The object store's emulator (on the object store only), and when it starts again after an outage.
        self.azurite = azurite
        self.store_back_at: float | None = None
        # Kinds of actor told to finish: their exit is expected, and they are not started again.
        self.finishing: set[str] = set()
        # Actors that ended by themselves (an error they did not expect): each is a violation.
        self.failures: list[str] = []
        self._faults_log = (folder / "faults.jsonl").open("a")

    def _record(self, kind: str, target: str, **fields: Any) -> None:
        self._faults_log.write(json.dumps({"t": run_clock(), "kind": kind, "target": target, **fields}) + "\n")
        self._faults_log.flush()

    def _start(self, actor: Actor) -> None:
        actor.incarnation += 1
        logs = self.folder / "logs"
        logs.mkdir(exist_ok=True)
        module = MODULES.get(actor.kind, "chaos.actor")
        command = [sys.executable, "-m", module, str(self.folder), actor.kind, actor.name]
        command += [str(actor.incarnation), str(self.seed)]
        environment = _environment() | actor.control.environment(self.library)
        with (logs / f"{actor.name}#{actor.incarnation}.log").open("w") as output:
            actor.process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, env=environment
            )
        actor.restart_at = None

    def _tend(self, now: float) -> None:
        """Start killed actors again when due, let paused ones go on, and start again any that ended
        by itself (recorded: an actor that exits on its own during a run is a finding)."""
        if self.store_back_at is not None and now >= self.store_back_at:
            self._store_back()
        for actor in self.actors.values():
            if any(now >= end for _, end in actor.disturbed.values()):
                self._end_faults(actor, now)
            if actor.resume_at is not None and now >= actor.resume_at:
                _signal(actor, signal.SIGCONT)
                actor.resume_at = None
            if actor.restart_at is not None and now >= actor.restart_at:
                self._start(actor)
            elif (
                actor.restart_at is None
                and actor.kind not in self.finishing
                and (code := _exit_code(actor)) is not None
            ):
                self._record("exited", actor.name, code=code, incarnation=actor.incarnation)
                self.failures.append(f"{actor.name}#{actor.incarnation} exited by itself with code {code}")
                self._start(actor)

    def _apply(self, fault: nemesis.Fault, now: float) -> None:
        if fault.kind == "switchover":
            try:
                switchover(self.qm, QUEUE, fault.target)
            except MQError as error:  # an operator's command that fails: a finding, and the run goes on
                if self.store_back_at is None:
                    self.failures.append(f"switchover of group {fault.target} failed: {error}")
            self._record(fault.kind, fault.target, fault=fault.as_dict())
            return
        if fault.kind == "outage":
            self._outage(fault, now)
            return
        actor = self.actors[fault.target]
        if fault.kind in ("skew", "slow"):
            self._disturb(actor, fault, now)
            return
        if actor.process is None or actor.restart_at is not None:
            self._record("skipped", fault.target, fault=fault.as_dict())
            return
        if fault.kind == "kill":
            _signal(actor, signal.SIGKILL)
            actor.process.wait()
            actor.resume_at = None
            actor.restart_at = now + fault.restart_after
        elif actor.resume_at is None:
            _signal(actor, signal.SIGSTOP)
            actor.resume_at = now + fault.duration
        self._record(fault.kind, fault.target, incarnation=actor.incarnation, fault=fault.as_dict())

    def _outage(self, fault: nemesis.Fault, now: float) -> None:
        """Stop the object store (its emulator saves its data as it stops) for ``fault.duration``."""
        assert self.azurite is not None
        if self.store_back_at is not None:
            self._record("skipped", fault.target, fault=fault.as_dict())
            return
        self.azurite.stop()
        self.store_back_at = now + fault.duration
        self._record(fault.kind, fault.target, fault=fault.as_dict())

    def _store_back(self) -> None:
        assert self.azurite is not None
        self.azurite.start()
        self.store_back_at = None
        self._record("outage_end", nemesis.STORE)

    def _disturb(self, actor: Actor, fault: nemesis.Fault, now: float) -> None:
        """Skew the actor's clock or slow its disk until ``fault.duration`` has passed (a fault of the
        same kind already on it is replaced)."""
        actor.disturbed[fault.kind] = (fault.amount, now + fault.duration)
        actor.set_faults()
        self._record(fault.kind, fault.target, incarnation=actor.incarnation, fault=fault.as_dict())

    def _end_faults(self, actor: Actor, now: float, every: bool = False) -> None:
        """End the actor's skew or slow disk whose time has come (``every``: all of them)."""
        for kind in [kind for kind, (_, end) in actor.disturbed.items() if every or now >= end]:
            del actor.disturbed[kind]
            self._record(f"{kind}_end", actor.name, incarnation=actor.incarnation)
        actor.set_faults()

    def faulty_phase(self) -> None:
        for actor in self.actors.values():
            self._start(actor)
        started = time.monotonic()
        pending = list(self.faults)
        while (now := time.monotonic()) < started + self.seconds:
            while pending and now >= started + pending[0].at:
                self._apply(pending.pop(0), now)
            self._tend(now)
            time.sleep(0.05)

    def drain(self, stall: float, limit: float) -> bool:
        """Producers stop, every fault ends, and the consumers run on until nothing waits for their
        groups: True then; False once what waits has not gone down for ``stall`` seconds (a message
        nothing delivers), or after ``limit``."""
        (self.folder / "stop-producers").touch()
        self.finishing.update(PRODUCING)
        started = time.monotonic()
        if self.store_back_at is not None:
            self._store_back()
        redrive_finished = False
        least, progress_at, looked_at = None, started, 0.0
        while (now := time.monotonic()) < started + limit and now - progress_at < stall:
            for actor in self.actors.values():
                if actor.resume_at is not None:
                    actor.resume_at = now
                if actor.disturbed:
                    self._end_faults(actor, now, every=True)
            self._tend(now)
            if _producers_done(self.actors) and now - looked_at >= 1.0:
                redrive_finished = redrive_finished or finish_redrive(self.qm)
                if redrive_finished:
                    looked_at, waiting = now, self._waiting()
                    if waiting == 0:
                        return True
                    if least is None or waiting < least:
                        least, progress_at = waiting, now
            time.sleep(0.2)
        return False

    def _waiting(self) -> int:
        """How many messages wait for the consumer groups, on the queue and its second replica."""
        waiting = sum(self.qm.depth(QUEUE, consumer=group) for group in self.groups)
        return waiting + (0 if self.replica is None else self.replica.depth(QUEUE, consumer=PYTHON_GROUP))

    def stop(self) -> None:
        (self.folder / "stop").touch()
        for actor in self.actors.values():
            if actor.process is not None and actor.process.poll() is None:
                _signal(actor, signal.SIGCONT)
        deadline = time.monotonic() + 60
        for actor in self.actors.values():
            if actor.process is None:
                continue
            try:
                actor.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(actor, signal.SIGKILL)
                actor.process.wait()
                self._record("stuck", actor.name, incarnation=actor.incarnation)
        self._faults_log.close()


def finish_redrive(qm: QueueManager) -> bool:
    """Finish what a redrive killed between its put and its record left (the next redrive finishes
    it before it selects; this one selects nothing), as an operator's next redrive would: else the
    backout queue would still show a message whose copy went back. False while the killed redrive's
    lease lasts (2042), or while the store does not answer yet after an outage (2009)."""
    try:
        qm.redrive(BACKOUT_QUEUE, msg_ids=["none: only what a killed redrive left"])
    except MQError as error:
        if error.reason not in (Reason.MQRC_OBJECT_IN_USE, Reason.MQRC_CONNECTION_BROKEN):
            raise
        return False
    return True


def _exit_code(actor: Actor) -> int | None:
    return None if actor.process is None else actor.process.poll()


def _producers_done(actors: dict[str, Actor]) -> bool:
    return all(_exit_code(a) is not None for a in actors.values() if a.kind in PRODUCING)


def _signal(actor: Actor, number: int) -> None:
    assert actor.process is not None
    try:
        os.killpg(actor.process.pid, number)
    except ProcessLookupError:
        pass


def _environment() -> dict[str, str]:
    repository = str(Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": repository + (os.pathsep + path if path else ""),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # The actors' drivers are killed within minutes: the JIT's first tier and the serial collector
        # start them with less CPU, which the run's other processes need (two cores for all of them).
        "JDK_JAVA_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    }


def start_store(folder: Path, kind: str) -> tuple[str, Azurite | None]:
    """Where the run's queue managers and cluster go: a folder of the run, or on the object store
    (``azure``: a container of an Azurite started for the run, its credentials put in the environment
    the actors inherit), with the emulator."""
    if kind == "local":
        return str(folder), None
    azurite = Azurite(folder / "azurite")
    azurite.start()
    os.environ.update(azurite.environment)
    azurite.filesystem().create_dir("chaos")
    return f"abfs://chaos@{ACCOUNT}.dfs.core.windows.net", azurite


def roots(base: str) -> dict[str, str]:
    """The root of each queue manager of the run, and of its cluster's repository (``cluster``)."""
    return {MAIN: f"{base}/qm", REPLICA: f"{base}/qm2", FRONT: f"{base}/front", "cluster": f"{base}/cluster"}


def _define_queue(qm: QueueManager, consumers: list[str], lock_duration: float) -> None:
    qm.define_queue(BACKOUT_QUEUE)
    qm.define_queue(
        QUEUE, backout_threshold=BACKOUT_THRESHOLD, backout_queue=BACKOUT_QUEUE, lock_duration=lock_duration
    )
    for group in consumers:
        qm.declare_consumer(QUEUE, group)


def set_up(
    where: dict[str, str], consumers: dict[str, str], lock_duration: float, cluster: bool
) -> tuple[QueueManager, QueueManager | None]:
    """The main queue manager, and with ``cluster`` the second replica's (cluster ``CHAOSCL`` of
    both, and of the routed put's queue manager, which hosts no replica)."""
    qm = QueueManager.create(where[MAIN], MAIN)
    qm.define_queue(REPLY_QUEUE)
    _define_queue(qm, list(consumers), lock_duration)
    if not cluster:
        return qm, None
    replica = QueueManager.create(where[REPLICA], REPLICA)
    _define_queue(replica, [PYTHON_GROUP], lock_duration)
    repository = Cluster.create(where["cluster"], CLUSTER, storage_options=engine(qm).storage_options)
    for member in (qm, replica, QueueManager.create(where[FRONT], FRONT)):
        repository.join(member)
    for member in (qm, replica):
        repository.advertise(member, QUEUE)
    return qm, replica


def run(
    folder: Path,
    minutes: float,
    seed: int,
    mean_interval: float = 8.0,
    drain_stall: float = 120.0,
    drain_limit: float = 1800.0,
    store_kind: str = "local",
) -> Report:
    """One run of ``minutes`` with ``seed`` in ``folder``, its queue manager in a folder of the run
    (``store_kind`` ``local``) or on the object store (``azure``); the checker's report."""
    folder.mkdir(parents=True, exist_ok=False)
    start_clock()
    actors = mix(seed)
    base, azurite = start_store(folder, store_kind)
    where = roots(base)
    try:
        qm, replica = set_up(where, groups(actors), TIMINGS[store_kind].lock_duration, routed(actors))
        chaos = Run(qm, folder, minutes * 60, seed, mean_interval, actors, azurite, replica)
        plan = {
            "seed": seed,
            "minutes": minutes,
            "store": store_kind,
            "qmgr": MAIN,
            "roots": where,
            # The groups of the queue's second replica, as the history names them.
            "replicas": {REPLICA: [replica_group(PYTHON_GROUP)]} if replica is not None else {},
            "front": FRONT if replica is not None else None,
            "actors": [{"kind": kind, "name": name} for kind, name in actors],
            "faults": [fault.as_dict() for fault in chaos.faults],
            "lock_duration": TIMINGS[store_kind].lock_duration,
            "backout_threshold": BACKOUT_THRESHOLD,
            "forwarder_consumer": FORWARD_GROUP if FORWARD_GROUP in chaos.groups else None,
        }
        (folder / "plan.json").write_text(json.dumps(plan, indent=1))
        try:
            chaos.faulty_phase()
            drain_started = time.monotonic()
            drained = chaos.drain(drain_stall, drain_limit)
            drained_in = time.monotonic() - drain_started
        finally:
            chaos.stop()
        final = final_state(qm, chaos.groups, replica, where[FRONT])
    finally:
        if azurite is not None:
            azurite.stop()
    final.save(folder)
    record_stream_output(folder)
    report = check(folder)
    report.summary["drain_s"] = round(drained_in)
    report.violations += [Violation("actor_failed", failure + " (see logs/)", []) for failure in chaos.failures]
    if not drained:
        report.violations.append(
            Violation(
                "not_drained",
                f"after {drained_in:.0f} s of draining ({drain_stall:g} s without progress, or the limit of "
                f"{drain_limit:g} s), messages still wait: "
                + ", ".join(f"{len(ids)} for group {group}" for group, ids in final.waiting.items() if ids),
                [],
            )
        )
    return report
