"""Real storage outages for reconnect tests: a queue manager root that cannot be reached.

The root's folder is moved away and a plain file takes its place, as when a mount is gone; a file,
not nothing, so that nothing can create the folder again meanwhile (a write there fails with
NotADirectoryError). Putting the folder back ends the outage.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def break_root(root: str) -> None:
    """The root cannot be reached from now on."""
    os.rename(root, f"{root}.away")
    with open(root, "w") as placeholder:
        placeholder.write("outage\n")


def restore_root(root: str) -> None:
    os.remove(root)
    os.rename(f"{root}.away", root)


def break_root_for(root: str, seconds: float) -> threading.Timer:
    """The root cannot be reached from now for ``seconds``; join the timer to wait for the end."""
    break_root(root)
    timer = threading.Timer(seconds, restore_root, (root,))
    timer.start()
    return timer


@contextmanager
def outage(root: str, seconds: float | None) -> Iterator[None]:
    """The root cannot be reached inside the block, for ``seconds`` from its start (None: to its end)."""
    if seconds is None:
        break_root(root)
        try:
            yield
        finally:
            restore_root(root)
        return
    timer = break_root_for(root, seconds)
    try:
        yield
    finally:
        timer.join()
