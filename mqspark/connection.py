"""Client reconnection (spec section 8): what a client does when its queue manager's storage breaks,
such as a root that cannot be reached, a mount that is gone or an object store answering errors.

This module owns the reconnect modes (MQ's ``MQCNO_RECONNECT*`` options, with the queue manager's
``default_reconnect`` as DefRecon), the reconnect timeout, the Python API's connection list
(:class:`Connection`) and the exact resolution of a put or get in doubt. The sink and the streaming
get reconnect through :meth:`Connection.call` with a one-root connection that never follows.

A failure counts as a broken connection when the queue manager's catalog cannot be read right after
it. Any other failure belongs to the operation itself and reaches the caller unchanged.

Modes:

- ``no``: fail at once with 2009 ``MQRC_CONNECTION_BROKEN``.
- ``yes``: retry with backoff up to the reconnect timeout, going along the connection list to the
  next queue manager that hosts the queue.
- ``qmgr``: retry, but only to the same queue manager (the same :attr:`QueueManager.qmid`, at
  any root of the list).
- ``disabled``: the queue manager's ``default_reconnect`` only. It overrides every client's own
  mode, as ``DefRecon=DISABLED`` does.

If the timeout passes, the call fails with 2548 ``MQRC_RECONNECT_FAILED``, or with 2545
``MQRC_RECONNECT_QMID_MISMATCH`` when in ``qmgr`` mode only other queue managers answered.

**In doubt.** A put whose connection broke once its commit had begun, or a get whose consumption
commit broke, is resolved on its own queue manager, never moved. A put checks the connection's
producer transaction (:meth:`QueueManager.committed_transaction`) and is put again only if it did
not land. A get checks whether its plan was recorded consumed. If it was not, and its lease has
lapsed meanwhile, the get is backed out with 2003 ``MQRC_BACKED_OUT``: its messages wait again,
each counting one rolled-back delivery. No call answers "interrupted, outcome unknown".
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from enum import StrEnum
from typing import Any, TypeVar

import pyarrow as pa

from . import storage
from .errors import MQError, MQValidationError, Reason
from .get import plan_get
from .qmgr import BROWSE_SCHEMA, QueueManager

DEFAULT_RECONNECT_TIMEOUT = timedelta(seconds=1800)
_FIRST_DELAY = 0.2
_MAX_DELAY = 5.0
_Result = TypeVar("_Result")
_log = logging.getLogger("mqspark.connection")


class ReconnectMode(StrEnum):
    NO = "no"
    YES = "yes"
    QMGR = "qmgr"
    DISABLED = "disabled"


def reconnect_mode(value: Any, what: str = "reconnect") -> ReconnectMode | None:
    """``value`` as a mode (None stays None: the queue manager's ``default_reconnect`` applies).
    ``disabled`` is the administrator's, so a client may not ask for it."""
    if value is None:
        return None
    choices = ("no", "yes", "qmgr")
    if value not in choices:
        raise MQValidationError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
    return ReconnectMode(value)


def reconnect_timeout_of(value: Any, what: str = "reconnect_timeout") -> timedelta:
    """``value`` (seconds, or a timedelta) as the reconnect timeout."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < float("inf"):
        raise MQValidationError(f"{what} must be a number of seconds >= 0, got {value!r}")
    return timedelta(seconds=seconds)


def reachable(root: str, storage_options: storage.StorageOptions) -> bool:
    """Whether the queue manager's catalog at ``root`` can be read now."""
    try:
        return storage.table_exists(storage.catalog_location(root), storage_options)
    except Exception:  # noqa: BLE001 - any failure to read the catalog is a broken connection
        return False


class Connection:
    """A client's connection to the first queue manager of ``roots`` that answers.

    Its puts are exactly once: each carries this connection's producer id and the next transaction
    number, so a put in doubt is resolved on reconnect. ``follow`` (the Python API) lets mode
    ``yes`` move along the list to another queue manager; without it (the sink and the streaming get,
    whose files and offsets belong to one queue manager) a different queue manager found at the root
    fails the call with 2547 ``MQRC_RECONNECT_INCOMPATIBLE``.
    """

    def __init__(
        self,
        roots: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        reconnect: str | None = None,
        reconnect_timeout: float | timedelta = DEFAULT_RECONNECT_TIMEOUT,
        storage_options: dict[str, str] | None = None,
        follow: bool = True,
        qm: QueueManager | None = None,
    ) -> None:
        listed = [roots] if isinstance(roots, str | os.PathLike) else list(roots)
        if not listed:
            raise MQValidationError("connection list is empty: give at least one queue manager root")
        self.roots = [storage.normalize_root(root) for root in listed]
        self.mode = reconnect_mode(reconnect)
        self.timeout = reconnect_timeout_of(reconnect_timeout)
        self.storage_options = storage_options
        self.follow = follow
        self.producer = f"connection:{uuid.uuid4().hex}"
        self._transactions = 0
        self.qm = qm if qm is not None else self._first()

    def _first(self) -> QueueManager:
        failures = []
        for root in self.roots:
            try:
                return QueueManager.open(root, storage_options=self.storage_options)
            except Exception as error:  # noqa: BLE001 - tried the next root; all are reported below
                failures.append(f"{root}: {_summary(error)}")
        raise MQError(
            f"no queue manager of the connection list answered ({'; '.join(failures)})", Reason.MQRC_Q_MGR_NOT_AVAILABLE
        )

    @property
    def effective_mode(self) -> ReconnectMode:
        """The mode in force: the client's, unless its queue manager disables reconnection."""
        default = ReconnectMode(self.qm.definition.default_reconnect)
        if default is ReconnectMode.DISABLED:
            return default
        return self.mode or default

    def call(
        self,
        operation: Callable[[QueueManager], _Result],
        what: str,
        queue: str | None = None,
        in_doubt: Callable[[], bool] = lambda: False,
    ) -> _Result:
        """``operation(qm)``, reconnecting as the mode says when the connection breaks under it.
        While ``in_doubt()`` holds, only the same queue manager is taken back."""
        deadline: float | None = None
        while True:
            qm = self.qm
            try:
                return operation(qm)
            except Exception as error:
                if isinstance(error, MQValidationError) or reachable(qm.root, self.storage_options):
                    raise
                mode = self.effective_mode
                if mode in (ReconnectMode.NO, ReconnectMode.DISABLED):
                    why = (
                        "reconnection is disabled on the queue manager"
                        if mode is ReconnectMode.DISABLED
                        else "reconnect is no"
                    )
                    raise MQError(
                        f"{what}: queue manager {qm.name} at {qm.root} cannot be reached ({_summary(error)}); {why}",
                        Reason.MQRC_CONNECTION_BROKEN,
                    ) from error
                if deadline is None:
                    deadline = time.monotonic() + self.timeout.total_seconds()
                _log.warning(
                    "%s: queue manager %s at %s cannot be reached (%s); reconnecting",
                    what,
                    qm.name,
                    qm.root,
                    _summary(error),
                )
                self._reconnect(mode, what, queue, in_doubt(), deadline, error)

    def _reconnect(
        self, mode: ReconnectMode, what: str, queue: str | None, in_doubt: bool, deadline: float, error: Exception
    ) -> None:
        """Wait, with backoff, for a queue manager of the list the mode accepts, and switch to it."""
        lost = self.qm
        same_only = mode is ReconnectMode.QMGR or in_doubt or not self.follow
        start = self.roots.index(lost.root) if lost.root in self.roots else 0
        order = self.roots[start:] + self.roots[:start] if self.follow else [lost.root]
        delay = _FIRST_DELAY
        others: list[str] = []
        while True:
            for root in order:
                try:
                    found = QueueManager.open(root, storage_options=self.storage_options)
                    if found.qmid != lost.qmid:
                        if not self.follow and mode is ReconnectMode.YES:
                            raise MQError(
                                f"{what}: the root {root} now holds queue manager {found.qmid}, not {lost.qmid}; "
                                "what this client wrote and read belongs to the lost one",
                                Reason.MQRC_RECONNECT_INCOMPATIBLE,
                            ) from error
                        if same_only:
                            others.append(f"{found.qmid} at {root}")
                            continue
                        if queue is not None:
                            found.inquire_queue(queue)
                except MQError as refused:
                    if refused.reason is Reason.MQRC_RECONNECT_INCOMPATIBLE:
                        raise
                    continue
                except Exception:  # noqa: BLE001 - this root does not answer yet
                    continue
                self.qm = found
                _log.warning("%s: reconnected to queue manager %s at %s", what, found.name, root)
                return
            if time.monotonic() + delay > deadline:
                waited = self.timeout.total_seconds()
                if others and mode is ReconnectMode.QMGR:
                    raise MQError(
                        f"{what}: queue manager {lost.qmid} did not come back within the reconnect timeout "
                        f"of {waited:g} s; only other queue managers answered ({'; '.join(sorted(set(others)))})",
                        Reason.MQRC_RECONNECT_QMID_MISMATCH,
                    ) from error
                doubt = " The call was in doubt and stays unresolved until it comes back." if in_doubt else ""
                raise MQError(
                    f"{what}: no queue manager of the connection list answered within the reconnect timeout "
                    f"of {waited:g} s (lost {lost.name} at {lost.root}: {_summary(error)}).{doubt}",
                    Reason.MQRC_RECONNECT_FAILED,
                ) from error
            time.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY)

    # The Python API

    def put(self, queue: str, rows: Iterable[Mapping[str, Any]] | pa.Table, *, segmentation: bool = False) -> list[str]:
        """:meth:`QueueManager.put`, exactly once through reconnects."""
        self._transactions += 1
        transaction = self._transactions
        committing: list[list[str]] = []

        def put(qm: QueueManager) -> list[str]:
            if committing:
                # In doubt: the earlier attempt reached its commit on this same queue manager.
                done = qm.committed_transaction(queue, self.producer)
                if done is not None and done >= transaction:
                    return committing[0]
                committing.clear()
            return qm.put(
                queue,
                rows,
                segmentation=segmentation,
                producer=self.producer,
                batch_id=transaction,
                before_commit=committing.append,
            )

        return self.call(put, f"put to queue {queue}", queue, in_doubt=lambda: bool(committing))

    def get(
        self, queue: str, consumer: str = "default", max_messages: int = 1, wait: float = 0.0, **match: str
    ) -> pa.Table:
        """:meth:`QueueManager.get`, resolved exactly when the connection breaks under its commit."""
        planned = self.call(
            lambda qm: plan_get(qm, queue, consumer, max_messages, wait, **match), f"get from queue {queue}", queue
        )
        if planned is None:
            return BROWSE_SCHEMA.empty_table()
        self.call(lambda qm: planned.settle(), f"get from queue {queue}", queue, in_doubt=lambda: True)
        return planned.messages

    def browse(self, queue: str, **options: Any) -> pa.Table:
        return self.call(lambda qm: qm.browse(queue, **options), f"browse of queue {queue}", queue)

    def depth(self, queue: str, consumer: str | None = None) -> int:
        return self.call(lambda qm: qm.depth(queue, consumer), f"depth of queue {queue}", queue)


def connect(
    roots: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    reconnect: str | None = None,
    reconnect_timeout: float | timedelta = DEFAULT_RECONNECT_TIMEOUT,
    storage_options: dict[str, str] | None = None,
) -> Connection:
    """Connect to the first queue manager of ``roots`` that answers (MQCONNX with a connection list)."""
    return Connection(roots, reconnect=reconnect, reconnect_timeout=reconnect_timeout, storage_options=storage_options)


def _summary(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]
