"""Group commit: concurrent puts to one queue in one process share Delta commits.

A Delta commit costs the same for one message as for many, and concurrent commits to one table
conflict and retry. So a put that finds another put of its process committing to the same queue
waits, and the puts that gathered meanwhile go together in the next commit, in one data file
(Kafka's producer batches, a database's group commit). Each call returns once the commit holding
its messages landed; a commit that fails fails every call in it, and none of their messages is
committed.

A leader lingers (Kafka's ``linger.ms``) for the threads whose put returned within the last
:data:`LINGER` seconds, until they put again or that time is up: without it, the threads whose
commit just landed come back a moment after the next leader took the others, and the producers
split into halves that commit in turn. A thread putting alone, or now and then, never waits.

Only plain puts go together: a put with a producer's transaction, with grouped messages (their
group rules are checked per put) or with ``before_msg_id`` targets commits alone.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

# One put's commit: it writes and commits the message rows of every put given.
CommitRows = Callable[[list[pa.Table]], object]
# How long after its put returned a thread is waited for by the next commit's leader.
LINGER = 0.1


@dataclass
class _Put:
    messages: pa.Table
    thread: int = field(default_factory=threading.get_ident)
    done: bool = False
    error: BaseException | None = None


@dataclass
class _Queue:
    """The puts of one queue waiting for the next commit, and whether one is being made."""

    condition: threading.Condition = field(default_factory=threading.Condition)
    waiting: list[_Put] = field(default_factory=list)
    committing: bool = False
    # When the put of each thread of the last commit returned (monotonic seconds).
    returned: dict[int, float] = field(default_factory=dict)

    def gathered(self) -> bool:
        """Whether every thread whose put returned within :data:`LINGER` is waiting again."""
        now = time.monotonic()
        back = {put.thread for put in self.waiting}
        return all(thread in back for thread, at in self.returned.items() if now - at < LINGER)


_queues: dict[tuple[str, str], _Queue] = {}
_registry = threading.Lock()


def commit(root: str, queue: str, messages: pa.Table, commit_rows: CommitRows) -> None:
    """Commit ``messages``, a plain put's rows for queue ``queue`` (the name put to) of the queue
    manager at ``root``, together with the rows of the process's other puts to it waiting meanwhile;
    ``commit_rows(tables)`` writes them and makes one commit. Raises what that raised."""
    with _registry:
        shared = _queues.setdefault((root, queue), _Queue())
    mine = _Put(messages)
    with shared.condition:
        shared.waiting.append(mine)
        shared.condition.notify_all()  # a lingering leader counts who joined
        # A commit in flight takes no more puts: wait for it, then lead the next one if no one does.
        shared.condition.wait_for(lambda: mine.done or not shared.committing)
        if mine.done:
            _raise(mine)
            return
        shared.committing = True
        shared.condition.wait_for(shared.gathered, timeout=LINGER)
        batch, shared.waiting = shared.waiting, []
    error: BaseException | None = None
    try:
        commit_rows([put.messages for put in batch])
    except BaseException as failed:
        error = failed
    with shared.condition:
        now = time.monotonic()
        shared.returned = {put.thread: now for put in batch}
        for put in batch:
            put.done, put.error = True, error
        shared.committing = False
        shared.condition.notify_all()
    if error is not None:
        raise error


def _raise(put: _Put) -> None:
    """Raise, in a put that another put's commit took along, a copy of what that commit raised."""
    if put.error is not None:
        raise copy.copy(put.error).with_traceback(None) from put.error
