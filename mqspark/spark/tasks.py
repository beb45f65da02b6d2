"""What Spark hands the code of the ``mq`` data sources: the context of the task running it, and, on
the driver, the commit messages the tasks' ``write`` returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage

_Message = TypeVar("_Message", bound=WriterCommitMessage)


def task_context() -> TaskContext:
    """The context of the Spark task running this code (in an executor's Python worker)."""
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("no Spark task is running: this code runs only inside one")
    return context


def commit_messages(messages: Sequence[WriterCommitMessage | None], kind: type[_Message]) -> list[_Message | None]:
    """The messages Spark hands a writer's ``commit`` or ``abort``: what each task's ``write`` returned,
    a ``kind`` (pyspark types them as the base class), or None for a task that failed."""
    for message in messages:
        if message is not None and not isinstance(message, kind):
            raise TypeError(f"a task's commit message is a {type(message).__name__}, not a {kind.__name__}")
    return [message if isinstance(message, kind) else None for message in messages]
