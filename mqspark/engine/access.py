"""How code below the :class:`~mqspark.qmgr.QueueManager` facade reaches the engine of a queue manager
a user hands it (``Monitor(qm, ...)``, ``Instance(qm, ...)``, ``Cluster.join(qm)``): the facade holds a
:class:`~mqspark.engine.queues.Queues` and is none, and nothing below it may import it, so those entry
points take ``Queues | HoldsQueues`` and call :func:`queues_of`. The layers above the facade use
:func:`mqspark.qmgr.engine` instead.
"""

from __future__ import annotations

from typing import Protocol

from mqspark.engine.queues import Queues


class HoldsQueues(Protocol):
    """What holds a :class:`Queues` without being one: the ``QueueManager`` facade."""

    # A dunder, so that it is no name of the facade's public API.
    def __mqspark_queues__(self) -> Queues: ...


def queues_of(qm: Queues | HoldsQueues) -> Queues:
    """The engine of ``qm``: itself, or the one a facade holds."""
    return qm if isinstance(qm, Queues) else qm.__mqspark_queues__()
