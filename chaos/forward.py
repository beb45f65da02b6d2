"""The forwarder of a chaos run: ``python -m chaos.forward RUN forwarder NAME INCARNATION SEED`` runs
``mqspark.forward`` on the run's queue in consumer group ``forward`` until the run stops.

Every message of the queue goes through it. Its service, :func:`echo`, records each call as a
``call`` event (calls are at least once: a replayed batch calls again) and replies with the request's
payload, so a reply names its request; a poison message makes it raise, so the message moves at the
queue's backout threshold. Only the requests (messages with a reply queue, see
:func:`chaos.actor.request`) get replies.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql.streaming import StreamingQuery

import mqspark
from chaos import driver
from chaos.actor import FORWARD_GROUP, POISON, QUEUE, message_id, root, stopping
from chaos.history import History

_RUN, _ACTOR = "CHAOS_RUN", "CHAOS_ACTOR"
_calls: History | None = None


def echo(request: dict[str, Any]) -> bytes:
    """The forwarding service: the request's payload back, or an error for a poison message."""
    global _calls
    if _calls is None:  # one file per Python worker: they run beside each other
        _calls = History(Path(os.environ[_RUN]), f"{os.environ[_ACTOR]}.{os.getpid()}")
    payload: bytes = request["payload"]
    _calls.record("call", consumer=FORWARD_GROUP, id=message_id(payload))
    if payload.startswith(POISON.encode()):
        raise mqspark.ServiceError("a poison message", return_code=13)
    return payload


def main(argv: list[str]) -> None:
    run, name, incarnation = Path(argv[0]), argv[2], int(argv[3])
    # The service runs in Spark's Python workers, which inherit the driver's environment.
    os.environ[_RUN], os.environ[_ACTOR] = str(run), f"{name}#{incarnation}"
    spark = driver.session(name)

    def start() -> StreamingQuery:
        return mqspark.forward(
            spark,
            root(run),
            QUEUE,
            "chaos.forward:echo",
            consumer=FORWARD_GROUP,
            checkpoint_location=str(run / "checkpoints" / FORWARD_GROUP),
            maxMessagesPerTrigger=200,
            reconnect="qmgr",
        )

    history = History(run, f"{name}#{incarnation}")
    try:
        driver.run_query(start, lambda _: stopping(run), history, "the forwarder")
    finally:
        history.close()
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
