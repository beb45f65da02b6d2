"""The heartbeat: renews a consumer group's lease, or a Python get's claim, in the background while
its reader lives (see :mod:`mqspark.engine.leases`)."""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from datetime import timedelta

from mqspark import store
from mqspark.engine.consumer_groups import ConsumerState
from mqspark.errors import MQError

# The heartbeats whose thread may still run: the interpreter's exit waits for them (see _join_all).
_running: weakref.WeakSet[Heartbeat] = weakref.WeakSet()


class Heartbeat:
    """Renews a lease in the background while the query's planner process lives.

    The planner process is killed when the query ends (``stop()`` is never called), which ends the
    renewals; the lease then lapses after its timeout unless the query's end was seen and released.
    """

    def __init__(
        self,
        state: ConsumerState,
        consumer: str,
        owner: str,
        timeout: timedelta,
        renew: Callable[[ConsumerState], None] | None = None,
    ) -> None:
        """``renew(state)`` renews what is held (default: the group's lease) on the heartbeat's own
        handle of the state table, every third of ``timeout``."""
        # Its own handle on the table: a DeltaTable is not shared between threads.
        self.state = state.reopened()
        self.consumer, self.owner, self.timeout = consumer, owner, timeout
        self._renew = renew or (lambda state: state.renew(consumer, owner, timeout))
        self.lost: MQError | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mqspark-lease-{consumer}", daemon=True)
        self._thread.start()
        _running.add(self)

    def stop(self) -> None:
        """End the renewals. One still in flight is refused once the lease is released (a renewal
        needs its owner to hold the lease), so this does not wait for it: the store may be out of reach."""
        self._stopped.set()

    def join(self, timeout: float) -> None:
        """Stop and wait up to ``timeout`` seconds for a renewal in flight to end."""
        self.stop()
        self._thread.join(timeout)

    def _run(self) -> None:
        interval = self.timeout.total_seconds() / 3
        while not self._stopped.wait(interval):
            try:
                if self.state.version() is None:
                    if store.reachable(self.state.root, self.state.storage_options):
                        return  # the queue was deleted
                    continue
                self._renew(self.state)
            except MQError as error:
                self.lost = error
                return
            except Exception as error:
                if not store.broken(error, self.state.root, self.state.storage_options):
                    raise
                # Out of reach: renewals go on once it is back (see :mod:`mqspark.reconnect`).
                continue


@atexit.register
def _join_all() -> None:
    """At the interpreter's exit, stop the heartbeats and let a renewal in flight end: a daemon thread
    still inside delta-rs while the interpreter finalizes crashes the process (SIGSEGV), seen when a
    get paused past its lock was refused and its process then ended."""
    for heartbeat in list(_running):
        heartbeat.join(timeout=heartbeat.timeout.total_seconds())
