"""The processes of a chaos run: ``python -m chaos.actor RUN KIND NAME INCARNATION SEED``.

Each actor works against the run's queue manager until the file ``RUN/stop`` appears (or, for a
producer, ``RUN/stop-producers``), recording what it does in its history (:mod:`chaos.history`).
The nemesis kills and pauses them; the run starts a killed actor again as its next incarnation.

- ``producer``: ``qm.put`` of 1 to 6 messages at a time: ungrouped messages of random priority,
  message groups put whole or spread over two puts, now and then a poison message (in a message
  group too);
- ``client``: the producer, through a client connection (``mqspark.connect``);
- ``single-producer``: ``qm.put`` of one ungrouped message at a time, with pauses half as long: two of
  them and the producers find the queue's commit lock held, and share its holder's commits
  (staged puts, :mod:`mqspark.engine.staged_puts`);
- ``requester``: ``mqspark.request``, one request at a time, each answered by the forwarder
  (:mod:`chaos.forward`);
- ``getter``: a competing get of consumer group ``python`` under syncpoint, one message at a time;
  a poison message fails its block (one failed delivery), so it moves at the queue's backout
  threshold;
- ``plain-getter``: a get of consumer group ``plain`` of one message at a time, not under syncpoint:
  consumed as it is returned. Two of them share the group's rounds (shared gets,
  :mod:`mqspark.engine.shared_gets`). One killed before it recorded what it got has lost it, as
  the get's semantics say: the checker allows one lost message per such get;
- ``replica-getter``: the same, on the queue's second replica (queue manager ``CHAOS2``), which
  the routed put (:mod:`chaos.stream_put`) puts to as well; its history names the group
  ``CHAOS2/python``;
- ``monitor``: the backlog monitor of group ``python``, a point every two seconds;
- ``maintenance``: ``qm.maintain`` every two seconds, with a retention of five minutes (on the
  second replica too, when the run has one);
- ``redrive``: now and then, some of the messages that wait on the backout queue (chosen by msg_id)
  redriven to the queue, each for the consumer group that moved it; a message at most
  :data:`REDRIVES` times, as an operator gives up on one that keeps failing.

The streaming get's instances (:mod:`chaos.stream`) and the forwarder are started the same way.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import mqspark
from chaos.history import History, json_lines
from mqspark import Connection, MQError, QueueManager, Reason
from mqspark.engine.waiting import waiting_messages
from mqspark.qmgr import engine
from mqspark.services.monitor import Monitor

QUEUE = "Q"
BACKOUT_QUEUE = "Q.BACKOUT"
REPLY_QUEUE = "REPLIES"
PYTHON_GROUP = "python"
PLAIN_GROUP = "plain"
STREAM_GROUP = "stream"
FORWARD_GROUP = "forward"
POISON = "poison"
# The run's queue managers: the main one, which every actor but the routed put and the replica's
# getter works on; the one that hosts the cluster queue's second replica; and the one the routed put
# puts from (it hosts no replica: a local one would take every message).
MAIN, REPLICA, FRONT = "CHAOS", "CHAOS2", "FRONT"
CLUSTER = "CHAOSCL"
# Longer than any micro-batch of the run, paused ones included: with a shorter one, a query may read a
# file maintenance removed and deleted meanwhile (docs/limits.md). With 30 s, on two cores under a
# load of 8 to 15, every first batch of a streaming instance failed so, again after each restart.
RETENTION = timedelta(minutes=5)
# How many times the redrive actor redrives one message: in the 60-minute run of seed 1 without a
# limit, the poison messages came back every redrive (one 71 times), and half of the python gets
# (6,221 of 12,633) were their failures.
REDRIVES = 2
# How long a requester waits for its reply: past a forwarder that restarts (its first batch took 78 s
# on two cores under a load of 9).
REQUEST_TIMEOUT = 60.0


class Poisoned(Exception):
    """A getter's block fails on a poison message, as an application would."""


@dataclass(frozen=True)
class Timing:
    """How fast the producers put (``pace``: their pauses are multiplied by it) and how long a
    stream instance's lease and a claim's lock last."""

    pace: float
    lease_timeout: int  # seconds, as the streaming get's option takes it
    lock_duration: float


# Locally the producers put a third of what they could (and still, after ten minutes, the getters
# fall back: docs/chaos.md): at full pace (pauses of 0.5 to 2 s) a 60-minute run's backlog grew
# from its first minutes, and with it the cost of every maintenance
# run and monitor point, until the python gets fell from 1,146 to about 120 in five minutes
# (docs/chaos.md). On the object store a get or a lease renewal is a few commits of a dozen requests
# each, and under the run's load they take seconds: the producers put at a quarter of the full pace
# (sized for three-minute runs), and the lease and the lock are three times as long.
TIMINGS = {"local": Timing(3.0, 10, 5.0), "azure": Timing(4.0, 30, 15.0)}


def _plan(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "plan.json").read_text()))


def root(run: Path, qmgr: str = MAIN) -> str:
    """The root of the run's queue manager ``qmgr``, as its plan names it (a folder, or a container of
    the object store, whose credentials come from the environment)."""
    return str(_plan(run)["roots"][qmgr])


def timing(run: Path) -> Timing:
    """The run's timing, by its store."""
    return TIMINGS[_plan(run)["store"]]


def queue_manager(run: Path, qmgr: str = MAIN) -> QueueManager:
    """The run's queue manager ``qmgr``, once its store answers (an actor may start during an outage)."""
    while True:
        try:
            return QueueManager.open(root(run, qmgr))
        except MQError as error:
            if error.reason is not Reason.MQRC_Q_MGR_NOT_AVAILABLE:
                raise
        time.sleep(0.5)


def broken(error: MQError) -> bool:
    """Whether ``error`` says the store could not be reached (the object store stopped): a put or a
    commit it ended may have landed or not."""
    return error.reason is Reason.MQRC_CONNECTION_BROKEN


def stopping(run: Path, *names: str) -> bool:
    """Whether the run asked its actors to end (the file ``stop``, or one of ``names``)."""
    return any((run / name).exists() for name in ("stop", *names))


def _message(id: str, **fields: Any) -> dict[str, Any]:
    return {"id": id, "group": None, "seq": 1, "last": False, "poison": False, "request": None} | fields


def puts(name: str, rng: random.Random) -> Any:
    """The producer's puts, each a list of history messages: ungrouped ones, and message groups whose
    items go in one put or over two consecutive puts."""
    number = 0
    while True:
        count = rng.randint(1, 6)
        batch: list[dict[str, Any]] = []
        carried: list[dict[str, Any]] = []
        while len(batch) < count:
            number += 1
            if rng.random() < 0.3:
                group = f"{name}-G{number}"
                size = rng.randint(2, 5)
                priority = rng.randint(0, 9)
                items = [
                    _message(
                        f"{name}-{number}.{seq}",
                        group=group,
                        seq=seq,
                        last=seq == size,
                        priority=priority,
                        poison=rng.random() < 0.02,
                    )
                    for seq in range(1, size + 1)
                ]
                if rng.random() < 0.5:
                    split = rng.randint(1, size - 1)
                    batch += items[:split]
                    carried += items[split:]
                else:
                    batch += items
            else:
                batch.append(_message(f"{name}-{number}", priority=rng.randint(0, 9), poison=rng.random() < 0.02))
        yield batch
        if carried:
            yield carried


def singles(name: str, rng: random.Random) -> Any:
    """The single-message producer's puts: one ungrouped message each, of random priority, now and
    then a poison message."""
    for number in itertools.count(1):
        yield [_message(f"{name}-{number}", priority=rng.randint(0, 9), poison=rng.random() < 0.02)]


def put_row(message: dict[str, Any]) -> dict[str, Any]:
    """The row a history message is put as: its id as payload (behind a poison mark), its priority and
    its group fields."""
    mark = POISON + ":" if message["poison"] else ""
    row = {"payload": (mark + message["id"]).encode(), "priority": message["priority"]}
    if message["group"]:
        row |= {"group_id": message["group"], "msg_seq_number": message["seq"], "last_in_group": message["last"]}
    return row


def produce(run: Path, qm: QueueManager, history: History, rng: random.Random) -> None:
    _produce(run, qm, history, rng, puts(history.actor, rng), (0.5, 2.0))


def produce_as_client(run: Path, qm: QueueManager, history: History, rng: random.Random) -> None:
    """The producer, through a client connection (``mqspark.connect``) that reconnects to the same
    queue manager when its storage breaks, and settles a put in doubt exactly once."""
    _produce(run, mqspark.connect(qm.root, reconnect="qmgr"), history, rng, puts(history.actor, rng), (0.5, 2.0))


def produce_singles(run: Path, qm: QueueManager, history: History, rng: random.Random) -> None:
    """Single-message puts with shorter pauses: with the other producers' puts, they find the
    queue's commit lock held and share its holder's commits (staged puts)."""
    _produce(run, qm, history, rng, singles(history.actor, rng), (0.25, 1.0))


def _produce(
    run: Path,
    qm: QueueManager | Connection,
    history: History,
    rng: random.Random,
    batches: Any,
    pauses: tuple[float, float],
) -> None:
    pace = timing(run).pace
    for op, batch in enumerate(batches):
        if stopping(run, "stop-producers"):
            return
        key = f"{history.actor}:{op}"
        history.record("put", phase="invoke", op=key, queue=QUEUE, messages=batch)
        try:
            qm.put(QUEUE, [put_row(m) for m in batch])
        except MQError as error:
            if not broken(error):  # else in doubt: its history has the invoke only
                history.record("put", phase="fail", op=key, error=str(error))
            time.sleep(0.2)
            continue
        history.record("put", phase="ok", op=key)
        time.sleep(rng.uniform(*pauses) * pace)


def message_id(payload: bytes) -> str:
    """The history id a payload carries."""
    text = payload.decode()
    return text.removeprefix(POISON + ":")


def replica_group(group: str) -> str:
    """How the history names consumer group ``group`` of the second replica's queue."""
    return f"{REPLICA}/{group}"


def get(run: Path, qm: QueueManager, history: History, rng: random.Random, label: str = PYTHON_GROUP) -> None:
    """Competing gets of group ``python`` under syncpoint, recorded as gets of group ``label``."""
    op = 0
    while not stopping(run):
        op += 1
        key = f"{history.actor}:{op}"
        try:
            with qm.syncpoint_get(QUEUE, PYTHON_GROUP, max_messages=1, wait=1.0) as messages:
                if messages.num_rows == 0:
                    continue
                payloads = messages["payload"].to_pylist()
                history.record("get", phase="got", op=key, consumer=label, ids=[message_id(p) for p in payloads])
                time.sleep(rng.uniform(0.0, 0.05))  # the application's work
                if any(p.startswith(POISON.encode()) for p in payloads):
                    raise Poisoned("a poison message")
        except Poisoned:
            history.record("get", phase="backout", op=key)
            continue
        except MQError as error:
            # A commit refused once the claim's lock passed (a pause): the messages wait again. One
            # the store did not answer may have landed: the get stays in doubt.
            if not broken(error):
                history.record("get", phase="backout", op=key, error=str(error))
            time.sleep(0.2)
            continue
        history.record("get", phase="ok", op=key)


def get_plain(run: Path, qm: QueueManager, history: History, rng: random.Random) -> None:
    """Gets of group ``plain``, one message at a time, consumed as they return. Each records its
    invocation first: one without a ``got`` may have consumed a message nobody saw."""
    op = 0
    while not stopping(run):
        op += 1
        key = f"{history.actor}:{op}"
        history.record("get", phase="invoke", op=key, consumer=PLAIN_GROUP)
        try:
            messages = qm.get(QUEUE, PLAIN_GROUP, max_messages=1, wait=1.0)
        except MQError as error:
            # One the store did not answer may have consumed: it stays unfinished.
            if not broken(error):
                history.record("get", phase="fail", op=key, error=str(error))
            time.sleep(0.2)
            continue
        ids = [message_id(p) for p in messages["payload"].to_pylist()]
        seqs = messages["delivery_seq"].to_pylist()
        history.record("get", phase="got", op=key, consumer=PLAIN_GROUP, ids=ids, seqs=seqs)
        history.record("get", phase="ok", op=key)
        time.sleep(rng.uniform(0.0, 0.05))  # the application's work


def get_on_replica(run: Path, qm: QueueManager, history: History, rng: random.Random) -> None:
    """Gets of group ``python`` on the second replica of the queue, where the routed put puts too."""
    get(run, queue_manager(run, REPLICA), history, rng, label=replica_group(PYTHON_GROUP))


def request(run: Path, qm: QueueManager, history: History, rng: random.Random) -> None:
    """Requests with ``mqspark.request``, one at a time: its put and the wait for the reply, which the
    forwarder (:mod:`chaos.forward`) gives with the request's payload."""
    pace = timing(run).pace
    op = 0
    while not stopping(run, "stop-producers"):
        op += 1
        key = f"{history.actor}:{op}"
        message = _message(f"{history.actor}-{op}", priority=rng.randint(0, 9), request=REPLY_QUEUE)
        history.record("put", phase="invoke", op=key, queue=QUEUE, messages=[message])
        try:
            reply = mqspark.request(
                qm, QUEUE, message["id"], reply_to=REPLY_QUEUE, timeout=REQUEST_TIMEOUT, priority=message["priority"]
            )
        except MQError as error:
            if error.reason is Reason.MQRC_NO_MSG_AVAILABLE:  # put, and no reply in time
                history.record("put", phase="ok", op=key)
            # Else the put or the get failed: which, the error does not say, so the put stays in doubt.
            continue
        history.record("put", phase="ok", op=key)
        history.record("reply", request=message_id(reply["payload"][0].as_py()), failed=False)
        time.sleep(rng.uniform(0.0, 1.0) * pace)


def watch(run: Path, qm: QueueManager, history: History, rng: random.Random) -> None:
    """The backlog monitor of group ``python``, a point every two seconds, recorded in its history
    table as the ``mqspark monitor`` command does."""
    monitor = Monitor(qm, QUEUE, PYTHON_GROUP, watch_interval=2.0, watch_count=100, expected_count=5)
    while not stopping(run):
        try:
            point = monitor.point()
        except MQError as error:
            if not broken(error):
                raise
            history.record("monitor", consumer=PYTHON_GROUP, error=str(error))
        else:
            history.record("monitor", consumer=PYTHON_GROUP, backlog=point.backlog, verdict=str(point.verdict))
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not stopping(run):
            time.sleep(0.1)


def maintain(run: Path, qm: QueueManager, history: History, rng: random.Random) -> None:
    """``qm.maintain`` of the queue every two seconds, and of its second replica's when the run has one."""
    targets = [qm] + [queue_manager(run, replica) for replica in _plan(run)["replicas"]]
    while not stopping(run):
        for target in targets:
            try:
                summary = target.maintain(QUEUE, retention=RETENTION)
                history.record("maintain", qmgr=target.name, removed=summary.removed_consumed)
            except MQError as error:
                history.record("maintain", qmgr=target.name, error=str(error))
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not stopping(run):
            time.sleep(0.1)


def redriven(run: Path) -> Counter[str]:
    """How many redrives of the run so far (of every incarnation of the redrive) named each
    message, by its history id."""
    counts: Counter[str] = Counter()
    for path in (run / "history").glob("D#*.jsonl"):
        for event in json_lines(path):
            if event.get("e") == "redrive" and event.get("phase") == "invoke":
                counts.update({item["id"] for item in event["items"]})
    return counts


def redrive(run: Path, qm: QueueManager, history: History, rng: random.Random) -> None:
    """An operator's redrive of the backout queue every 10 to 30 seconds: of a random part of what
    waits there, chosen by msg_id, recorded as ``redrive`` ``invoke`` (each message's id and the
    consumer group it goes back for), then ``ok`` or ``fail``. A message redriven :data:`REDRIVES`
    times stays: a poison message redriven again and again would come back for ever, and its
    failures would crowd out the getters' work as more of them circulate."""
    op = 0
    while not stopping(run, "stop-producers"):
        deadline = time.monotonic() + rng.uniform(10.0, 30.0)
        while time.monotonic() < deadline and not stopping(run, "stop-producers"):
            time.sleep(0.1)
        try:
            # What waits there: a browse shows too what redrive took until maintenance removes it.
            held = waiting_messages(engine(qm), BACKOUT_QUEUE, columns=["msg_id", "payload", "dlq_consumer_group"])
        except MQError as error:
            if not broken(error):
                raise
            continue
        tried = redriven(run)
        msg_ids = sorted({row["msg_id"] for row in held.to_pylist() if tried[message_id(row["payload"])] < REDRIVES})
        if not msg_ids:
            continue
        op += 1
        key = f"{history.actor}:{op}"
        # A message several groups failed has a copy for each, with the same msg_id: all go back.
        chosen = set(rng.sample(msg_ids, rng.randint(1, len(msg_ids))))
        items = [
            {"id": message_id(row["payload"]), "consumer": row["dlq_consumer_group"]}
            for row in held.to_pylist()
            if row["msg_id"] in chosen
        ]
        history.record("redrive", phase="invoke", op=key, queue=BACKOUT_QUEUE, items=items)
        try:
            moved = qm.redrive(BACKOUT_QUEUE, msg_ids=sorted(chosen))
        except MQError as error:
            if not broken(error):  # else in doubt: the redrive may have moved them or not
                history.record("redrive", phase="fail", op=key, error=str(error))
            continue
        history.record("redrive", phase="ok", op=key, moved=moved)


KINDS = {
    "producer": produce,
    "client": produce_as_client,
    "single-producer": produce_singles,
    "requester": request,
    "getter": get,
    "replica-getter": get_on_replica,
    "monitor": watch,
    "maintenance": maintain,
    "redrive": redrive,
    "plain-getter": get_plain,
}


def main(argv: list[str]) -> None:
    run, kind, name, incarnation, seed = Path(argv[0]), argv[1], argv[2], int(argv[3]), int(argv[4])
    history = History(run, f"{name}#{incarnation}")
    rng = random.Random(f"{seed}/{name}/{incarnation}")
    KINDS[kind](run, queue_manager(run), history, rng)
    history.close()


if __name__ == "__main__":
    main(sys.argv[1:])
