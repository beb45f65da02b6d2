"""Redrives the console runs in the background, at a rate an operator chooses, with their progress:
the chosen messages of a backout, error or dead-letter queue go back to their queues ``rate`` at a
time each second, each step one :meth:`~mqspark.qmgr.QueueManager.redrive` (exactly once, in
arrival order). The page and the API show how far a redrive got."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqspark.console.managers import Managers
from mqspark.engine.waiting import waiting_messages
from mqspark.errors import MQError, MQValidationError
from mqspark.model.numbers import check_number
from mqspark.qmgr import engine

# The most messages a redrive moves per second, and the default.
MAX_RATE = 1000
DEFAULT_RATE = 100
# Finished redrives kept to be looked at.
KEPT = 100


@dataclass
class Redrive:
    """One redrive: its messages (by msg_id), how many went back to which queue, and how it ended."""

    id: str
    qmgr: str
    queue: str
    msg_ids: list[str]
    rate: int
    done: int = 0
    moved: Counter = field(default_factory=Counter)
    state: str = "running"
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "qmgr": self.qmgr,
            "queue": self.queue,
            "rate": self.rate,
            "selected": len(self.msg_ids),
            "done": self.done,
            "moved": dict(self.moved),
            "state": self.state,
            "error": self.error,
        }


class Redrives:
    """The redrives started by this console, by id."""

    def __init__(self, managers: Managers) -> None:
        self.managers = managers
        self._redrives: dict[str, Redrive] = {}
        self._lock = threading.Lock()

    def start(
        self,
        qmgr: str,
        queue: str,
        msg_ids: Sequence[str] | None,
        rate: int,
        started: Callable[[Redrive], None] | None = None,
        finished: Callable[[Redrive], None] | None = None,
    ) -> Redrive:
        """Start redriving ``msg_ids`` of ``queue`` (None: every message waiting on it now) at ``rate``
        per second; ``started`` is called with the redrive before it begins, ``finished`` when it
        ends, done or failed."""
        error = f"redrive: option rate must be 1-{MAX_RATE} messages a second, got {rate!r}"
        check_number(rate, error, whole=True, at_least=1, at_most=MAX_RATE)
        queues = engine(self.managers.get(qmgr))
        name = queues.resolve_for_get(queue).name
        if msg_ids is None:
            waiting = waiting_messages(queues, name, columns=["msg_id"])
            msg_ids = list(dict.fromkeys(waiting["msg_id"].to_pylist()))
        elif (
            isinstance(msg_ids, str | bytes)
            or not isinstance(msg_ids, Sequence)
            or not msg_ids
            or not all(isinstance(msg_id, str) and msg_id for msg_id in msg_ids)
        ):
            raise MQValidationError(f"redrive: msg_ids must be a list of msg_ids, got {msg_ids!r}")
        redrive = Redrive(uuid.uuid4().hex[:12], qmgr, name, list(dict.fromkeys(msg_ids)), rate)
        if started is not None:
            started(redrive)
        with self._lock:
            self._redrives[redrive.id] = redrive
            for old in [r.id for r in self._redrives.values() if r.state != "running"][:-KEPT]:
                del self._redrives[old]
        threading.Thread(target=self._run, args=(redrive, finished), daemon=True, name=f"redrive-{redrive.id}").start()
        return redrive

    def get(self, redrive_id: str) -> Redrive | None:
        with self._lock:
            return self._redrives.get(redrive_id)

    def _run(self, redrive: Redrive, finished: Callable[[Redrive], None] | None) -> None:
        ids = iter(redrive.msg_ids)
        try:
            qm = self.managers.get(redrive.qmgr)
            clock = engine(qm).clock
            while chunk := list(itertools.islice(ids, redrive.rate)):
                started = clock.monotonic()
                redrive.moved.update(qm.redrive(redrive.queue, msg_ids=chunk))
                redrive.done += len(chunk)
                if redrive.done < len(redrive.msg_ids):
                    clock.sleep(max(0.0, 1.0 - (clock.monotonic() - started)))
            redrive.state = "done"
        except Exception as error:  # noqa: BLE001 - a redrive that fails says so, whatever failed
            redrive.state = "failed"
            redrive.error = str(error) if isinstance(error, MQError) else f"{type(error).__name__}: {error}"
        finally:
            if finished is not None:
                finished(redrive)
