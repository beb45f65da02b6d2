"""Real storage outages for reconnect tests: a queue manager root that cannot be reached.

The root's folder is moved away and a plain file takes its place, as when a mount is gone; a file,
not nothing, so that nothing can create the folder again meanwhile (a write there fails with
NotADirectoryError). Putting the folder back ends the outage: after real seconds (:func:`outage`,
for Spark queries, which read the system's clock), or when a test's :class:`ManualClock` reaches
the end (:func:`break_root_on`, :func:`clocked_outage`), without real waiting.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from mqspark.clock import ManualClock


def break_root(root: str) -> None:
    """The root cannot be reached from now on."""
    os.rename(root, f"{root}.away")
    with open(root, "w") as placeholder:
        placeholder.write("outage\n")


def restore_root(root: str) -> None:
    os.remove(root)
    os.rename(f"{root}.away", root)


@contextmanager
def outage(root: str, seconds: float | None) -> Iterator[None]:
    """The root cannot be reached inside the block, for ``seconds`` from its start (None: to its end)."""
    break_root(root)
    if seconds is None:
        try:
            yield
        finally:
            restore_root(root)
        return
    timer = threading.Timer(seconds, restore_root, (root,))
    timer.start()
    try:
        yield
    finally:
        timer.join()


def break_root_on(clock: ManualClock, root: str, seconds: float) -> None:
    """The root cannot be reached from now until ``clock`` has moved ``seconds``: it comes back
    inside the advance, or the sleep on the clock (a reconnect's backoff), that gets there."""
    break_root(root)
    clock.after(seconds, lambda: restore_root(root))


@contextmanager
def clocked_outage(clock: ManualClock, root: str, seconds: float) -> Iterator[None]:
    """The root cannot be reached for ``seconds`` of ``clock`` from the block's start. At the block's
    end the clock is moved to the outage's end if it is not there yet: the outage is waited out, as
    :func:`outage` waits for its timer."""
    end = clock.monotonic() + seconds
    break_root_on(clock, root, seconds)
    try:
        yield
    finally:
        clock.advance(max(0.0, end - clock.monotonic()))
