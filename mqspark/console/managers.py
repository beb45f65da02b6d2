"""The queue managers a console serves, by name. Each serving thread opens its own
:class:`~mqspark.qmgr.QueueManager` (its Delta handles are not shared between threads)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.errors import MQError, Reason
from mqspark.model.definitions import validate_name
from mqspark.qmgr import QueueManager


class Managers:
    """The queue managers at ``roots``, by name; two roots holding the same name are refused."""

    def __init__(self, roots: Sequence[str], clock: Clock = SYSTEM_CLOCK) -> None:
        """``clock``: the time the queue managers read (see :mod:`mqspark.clock`)."""
        if not roots:
            raise MQError("console: give at least one queue manager root (--root)")
        self.roots: dict[str, str] = {}
        for root in roots:
            name = QueueManager.open(root, clock=clock).name
            if name in self.roots:
                raise MQError(f"console: roots {self.roots[name]} and {root} both hold queue manager {name}")
            self.roots[name] = root
        self.clock = clock
        self._local = threading.local()

    @property
    def names(self) -> list[str]:
        """The queue managers served, by name."""
        return sorted(self.roots)

    def get(self, name: str) -> QueueManager:
        """This thread's queue manager ``name``; raises ``MQRC_UNKNOWN_OBJECT_NAME`` when none is served."""
        validate_name(name, "queue manager")
        if name not in self.roots:
            raise MQError(f"queue manager {name} is not served here", Reason.MQRC_UNKNOWN_OBJECT_NAME)
        opened: dict[str, QueueManager] = self._local.__dict__.setdefault("opened", {})
        if name not in opened:
            opened[name] = QueueManager.open(self.roots[name], clock=self.clock)
        return opened[name]
