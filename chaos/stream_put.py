"""The streaming put of a chaos run: ``python -m chaos.stream_put RUN KIND NAME INCARNATION SEED``
puts what lands in a folder of JSON files on the run's queue with ``writeStream.format("mq")``:
kind ``stream-put`` on the main queue manager, kind ``routed-put`` from queue manager ``FRONT``
through cluster ``CHAOSCL`` (``.option("cluster", ...)``, bind ``on_group``), which routes each
message or message group to one of the queue's two replicas (the main queue manager's and
``CHAOS2``'s).

A thread of the same process writes the files (the producer's puts of :mod:`chaos.actor`, one file
each, moved into the folder whole), and records each as a put: ``invoke`` before the file is
written, ``ok`` once it is in the folder, for from then on the query puts it exactly once, across
its restarts (the file source's checkpoint and the ``mq`` sink's batch ids). After the run's
``stop-producers``, the process ends once the query has put every file.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from pyspark.sql.streaming import StreamingQuery

from chaos import driver
from chaos.actor import CLUSTER, FRONT, MAIN, QUEUE, put_row, puts, root, stopping, timing
from chaos.history import History

SCHEMA = "payload string, priority int, group_id string, msg_seq_number int, last_in_group boolean"


def _json(message: dict[str, Any]) -> str:
    row = put_row(message)
    return json.dumps(row | {"payload": row["payload"].decode()})


def feed(run: Path, folder: Path, history: History, rng: random.Random) -> None:
    """Write the puts as files into ``folder`` until the producers stop."""
    staging = run / "staging" / history.actor
    pace = timing(run).pace
    staging.mkdir(parents=True, exist_ok=True)
    for op, batch in enumerate(puts(history.actor, rng)):
        if stopping(run, "stop-producers"):
            return
        key = f"{history.actor}:{op}"
        history.record("put", phase="invoke", op=key, queue=QUEUE, messages=batch)
        name = f"{history.actor.replace('#', '-')}-{op}.json"
        (staging / name).write_text("".join(_json(m) + "\n" for m in batch))
        os.replace(staging / name, folder / name)
        history.record("put", phase="ok", op=key)
        time.sleep(rng.uniform(1.0, 3.0) * pace)


def _caught_up(query: Any) -> bool:
    """Whether the query's last trigger found no new file."""
    status = query.status
    return not status["isDataAvailable"] and not status["isTriggerActive"]


def main(argv: list[str]) -> None:
    run, kind, name, incarnation, seed = Path(argv[0]), argv[1], argv[2], int(argv[3]), int(argv[4])
    routed = kind == "routed-put"
    history = History(run, f"{name}#{incarnation}")
    rng = random.Random(f"{seed}/{name}/{incarnation}")
    folder = run / "input" / name
    folder.mkdir(parents=True, exist_ok=True)
    spark = driver.session(name)
    writer = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 5)
        .json(str(folder))
        .writeStream.format("mq")
        .option("queue", QUEUE)
        .option("reconnect", "qmgr")
        .option("checkpointLocation", str(run / "checkpoints" / name))
        .trigger(processingTime="1 second")
    )
    if routed:
        writer = writer.option("cluster", CLUSTER).option("bind", "on_group")
    feeder = threading.Thread(target=feed, args=(run, folder, history, rng), daemon=True)
    feeder.start()
    quiet = 0

    def done(query: StreamingQuery) -> bool:
        # Done once the producers stopped, this feeder with them, and three looks found nothing new.
        nonlocal quiet
        quiet = quiet + 1 if not feeder.is_alive() and _caught_up(query) else 0
        return stopping(run) or quiet >= 3

    start = partial(writer.start, root(run, FRONT if routed else MAIN))
    try:
        driver.run_query(start, done, history, "the streaming put", every=1.0)
    finally:
        history.close()
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
