"""The block consumer: a Python get for throughput. ``QueueManager.consumer`` returns one.

It claims a block of up to ``prefetch`` messages in one commit (a claim of :mod:`mqspark.engine.get`,
renewed while the block is worked on) and hands them out one at a time. When the application asks
for the message after the block's last one, the commit that claims the next block also acknowledges
this one (alone when there is none). So a message handed out is acknowledged once the application
came back for more: delivery is **at least once**. A consumer
killed mid-block gives the whole block back when its lock passes (each message counting one failed
delivery), the messages it had processed included.

Leaving the ``with`` block ends the consumer cleanly, in one commit: the messages handed out are
consumed, the rest of the block goes back without counting a failure. When the block raises, the
message being processed counts one failed delivery (the queue's retry and backout rules apply);
the messages handed out before it are consumed.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Any

from mqspark import store
from mqspark.engine.get import Claim, GetRequest, plan_get
from mqspark.engine.queues import Queues
from mqspark.model.numbers import check_number

# The most messages one block may claim.
MAX_PREFETCH = 100_000


class Consumer:
    """Messages of ``queue`` for consumer group ``consumer``, one at a time, claimed ``prefetch`` at
    a time. Iterating ends once no message came for ``wait`` seconds. Use it in a ``with`` block."""

    def __init__(self, qm: Queues, queue: str, consumer: str = "default", prefetch: int = 500, wait: float = 0.0):
        check_number(
            prefetch,
            f"consumer of queue {queue}: prefetch must be an integer from 1 to {MAX_PREFETCH}, got {prefetch!r}",
            whole=True,
            at_least=1,
            at_most=MAX_PREFETCH,
        )
        self.qm = qm
        self.request = GetRequest(queue, consumer, max_messages=prefetch, wait=wait)
        self._block: Claim | None = None
        self._rows: list[dict[str, Any]] = []
        self._handed = 0

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if error is None or self._handed == 0:
            self._end(self._handed)
        else:
            self._end(self._handed - 1, f"{type(error).__name__}: {error}")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            if self._handed == len(self._rows):
                # The block handed out is acknowledged in the commit claiming the next.
                block, self._block = self._block, None
                settling = block.acknowledgement() if block is not None else None
                self._rows, self._handed = [], 0
                with store.answering(self.qm.root):
                    self._block = plan_get(self.qm, self.request, settling)
                if self._block is None:
                    return
                self._block.hold()
                self._rows = self._block.messages.to_pylist()
            row = self._rows[self._handed]
            self._handed += 1
            yield row

    def _end(self, processed: int, error: str | None = None) -> None:
        """Settle the block being worked on, if any (see :meth:`Claim.settle`)."""
        block, self._block = self._block, None
        self._rows, self._handed = [], 0
        if block is not None:
            block.settle(processed, error)
