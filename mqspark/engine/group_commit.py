"""Group commit: concurrent puts to one queue in one process share Delta commits.

A Delta commit costs the same for one message as for many, and concurrent commits to one table
conflict and retry. So a put that finds another put of its process committing to the same queue
waits, and the puts that gathered meanwhile go together in the next commit, in one data file
(Kafka's producer batches, a database's group commit). Each call returns once the commit holding
its messages landed; a commit that fails fails every call in it, and none of their messages is
committed.

Only plain puts go together: a put with a producer's transaction, with grouped messages (their
group rules are checked per put) or with ``before_msg_id`` targets commits alone.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

# One put's commit: it writes and commits the message rows of every put given.
CommitRows = Callable[[list[pa.Table]], object]


@dataclass
class _Put:
    messages: pa.Table
    done: bool = False
    error: BaseException | None = None


@dataclass
class _Queue:
    """The puts of one queue waiting for the next commit, and whether one is being made."""

    condition: threading.Condition = field(default_factory=threading.Condition)
    waiting: list[_Put] = field(default_factory=list)
    committing: bool = False


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
        # A commit in flight takes no more files: wait for it, then lead the next one if no one does.
        shared.condition.wait_for(lambda: mine.done or not shared.committing)
        if mine.done:
            _raise(mine)
            return
        batch, shared.waiting, shared.committing = shared.waiting, [], True
    error: BaseException | None = None
    try:
        commit_rows([put.messages for put in batch])
    except BaseException as failed:
        error = failed
    with shared.condition:
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
