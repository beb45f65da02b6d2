"""Client reconnection (spec section 8): what a client does when its queue manager's storage breaks,
such as a root that cannot be reached, a mount that is gone or an object store answering errors.

This module owns the reconnect modes (MQ's ``MQCNO_RECONNECT*`` options, with the queue manager's
``default_reconnect`` as DefRecon), the reconnect timeout, the Python API's connection list
(:class:`Connection`) and the exact resolution of a put or get in doubt. The sink and the streaming
get reconnect through :class:`Reconnect`: one root, and only the same queue manager, whose files
and offsets they hold (another one found there fails them with 2547 ``MQRC_RECONNECT_INCOMPATIBLE``
in mode ``yes``, 2545 at the timeout in mode ``qmgr``).

A failure counts as a broken connection when the store did not answer (the store's client gave up on
a request it may retry: no connection, a timeout, a server error) or when the queue manager's
catalog cannot be read right after it (a root or a mount gone). Any other failure belongs to the
operation itself and reaches the caller unchanged.

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
producer transaction (:meth:`~mqspark.engine.queues.Queues.committed_transaction`) and is put again only if it did
not land. A get checks whether its plan was recorded consumed. If it was not, and its lease has
lapsed meanwhile, the get is backed out with 2003 ``MQRC_BACKED_OUT``: its messages wait again,
each counting one rolled-back delivery. No call answers "interrupted, outcome unknown".
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any, TypeVar

import pyarrow as pa

from mqspark import store
from mqspark.clock import SYSTEM_CLOCK, Clock
from mqspark.engine.get import GetRequest, plan_get
from mqspark.engine.queues import Queues
from mqspark.errors import MQError, MQValidationError, Reason
from mqspark.model.messages import BROWSE_SCHEMA
from mqspark.model.numbers import check_number
from mqspark.qmgr import QueueManager, engine

DEFAULT_RECONNECT_TIMEOUT = timedelta(seconds=1800)
_FIRST_DELAY = 0.2
_MAX_DELAY = 5.0
_Result = TypeVar("_Result")
_log = logging.getLogger("mqspark.reconnect")


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
    check_number(seconds, f"{what} must be a number of seconds >= 0, got {value!r}", at_least=0, below=float("inf"))
    return timedelta(seconds=seconds)


class Connection:
    """A client's connection to the first queue manager of ``roots`` that answers.

    Its puts are exactly once: each carries this connection's producer id and the next transaction
    number, so a put in doubt is resolved on reconnect. In mode ``yes`` a call moves along the list
    to the next queue manager that hosts its queue, except while it is in doubt. Its reconnect
    deadlines and backoff, and the queue managers it opens, read ``clock``.
    """

    def __init__(
        self,
        roots: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        reconnect: str | None = None,
        reconnect_timeout: float | timedelta = DEFAULT_RECONNECT_TIMEOUT,
        storage_options: dict[str, str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        listed = [roots] if isinstance(roots, str | os.PathLike) else list(roots)
        if not listed:
            raise MQValidationError("connection list is empty: give at least one queue manager root")
        self.roots = [store.normalize_root(root) for root in listed]
        self.mode = reconnect_mode(reconnect)
        self.timeout = reconnect_timeout_of(reconnect_timeout)
        self.storage_options = storage_options
        self.clock = clock
        self.producer = f"connection:{uuid.uuid4().hex}"
        self._transactions = 0
        self.qm = self._first()

    def _first(self) -> QueueManager:
        failures = []
        for root in self.roots:
            try:
                return QueueManager.open(root, storage_options=self.storage_options, clock=self.clock)
            except Exception as error:  # noqa: BLE001 - tried the next root; all are reported below
                failures.append(f"{root}: {_summary(error)}")
        raise MQError(
            f"no queue manager of the connection list answered ({'; '.join(failures)})", Reason.MQRC_Q_MGR_NOT_AVAILABLE
        )

    @property
    def effective_mode(self) -> ReconnectMode:
        """The mode in force: the client's, unless its queue manager disables reconnection."""
        return mode_in_force(engine(self.qm), self.mode)

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
                broken = _broken(
                    error, qm, self.effective_mode, self.timeout, self.storage_options, what, deadline, self.clock
                )
                deadline = broken.deadline
                doubt = in_doubt()
                follow = broken.mode is ReconnectMode.YES and not doubt
                start = self.roots.index(qm.root) if qm.root in self.roots else 0
                order = self.roots[start:] + self.roots[:start]
                self.qm = _wait_for(order, broken, follow=follow, queue=queue, in_doubt=doubt)

    # The Python API

    def put(self, queue: str, rows: Iterable[Mapping[str, Any]] | pa.Table, *, segmentation: bool = False) -> list[str]:
        """:meth:`QueueManager.put`, exactly once through reconnects."""
        self._transactions += 1
        transaction = self._transactions
        committing: list[list[str]] = []

        def put(qm: QueueManager) -> list[str]:
            if committing:
                # In doubt: the earlier attempt reached its commit on this same queue manager.
                done = engine(qm).puts.committed_transaction(queue, self.producer)
                if done is not None and done >= transaction:
                    return committing[0]
                committing.clear()
            return engine(qm).puts.put(
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
            lambda qm: plan_get(engine(qm), GetRequest(queue, consumer, max_messages, wait, **match)),
            f"get from queue {queue}",
            queue,
        )
        if planned is None:
            return BROWSE_SCHEMA.empty_table()
        self.call(lambda qm: planned.commit_in_doubt(), f"get from queue {queue}", queue, in_doubt=lambda: True)
        return planned.messages

    def browse(self, queue: str, **options: Any) -> pa.Table:
        return self.call(lambda qm: qm.browse(queue, **options), f"browse of queue {queue}", queue)

    def depth(self, queue: str, consumer: str | None = None) -> int:
        return self.call(lambda qm: qm.depth(queue, consumer), f"depth of queue {queue}", queue)


@dataclass(frozen=True)
class Reconnect:
    """The reconnect policy of a Spark query (sink or streaming get), fixed on the driver when it
    starts and shipped to its tasks: one queue manager, one root, never another queue manager. Its
    waits read the system's clock, which every task has (a test's clock stays in the test)."""

    root: str
    name: str
    qmid: str
    mode: ReconnectMode
    timeout: timedelta
    storage_options: dict[str, str] | None = None

    @classmethod
    def open(
        cls, root: str, asked: ReconnectMode | None, timeout: timedelta, what: str, *, reopen: bool = False
    ) -> tuple[Queues, Reconnect]:
        """Open the queue manager at ``root`` (its engine: the sink and the streaming get need more
        than users are shown) and fix the policy. A root out of reach is waited for
        when the client asked for ``yes`` or ``qmgr``, and fails with 2009 otherwise: the queue
        manager's own default cannot be read then. A root whose store answers that it holds no queue
        manager fails with 2085, unless this is a ``reopen``: Spark makes a streaming sink's writer
        again for each micro-batch, and a root that vanished mid-stream (a disk unmounted) looks the
        same as one that never held a queue manager."""
        location = store.normalize_root(root)
        deadline = SYSTEM_CLOCK.monotonic() + timeout.total_seconds()
        while True:
            try:
                qm = Queues.open(location)
                return qm, cls(qm.root, qm.name, qm.qmid, mode_in_force(qm, asked), timeout, qm.storage_options)
            except Exception as error:
                if not store.broken(error, location, None):
                    raise
                if asked not in (ReconnectMode.YES, ReconnectMode.QMGR):
                    if not reopen and not store.unanswered(error):
                        raise
                    raise MQError(
                        f"{what}: the queue manager at {location} cannot be reached ({_summary(error)}); "
                        f"reconnect is {asked or 'the default'}",
                        Reason.MQRC_CONNECTION_BROKEN,
                    ) from error
                if SYSTEM_CLOCK.monotonic() >= deadline:
                    raise MQError(
                        f"{what}: the queue manager at {location} did not answer within the reconnect timeout "
                        f"of {timeout.total_seconds():g} s ({_summary(error)})",
                        Reason.MQRC_RECONNECT_FAILED,
                    ) from error
                SYSTEM_CLOCK.sleep(_FIRST_DELAY)

    def call(self, operation: Callable[[], _Result], what: str) -> _Result:
        """``operation()``, retried as the mode says while the root cannot be reached."""
        deadline: float | None = None
        while True:
            try:
                return operation()
            except Exception as error:
                broken = _broken(
                    error, self, self.mode, self.timeout, self.storage_options, what, deadline, SYSTEM_CLOCK
                )
                deadline = broken.deadline
                _wait_for([self.root], broken)


def mode_in_force(qm: Queues, asked: ReconnectMode | None) -> ReconnectMode:
    """The client's mode (``asked``; None: the queue manager's default), unless the queue manager
    disables reconnection."""
    default = ReconnectMode(qm.definition.default_reconnect)
    if default is ReconnectMode.DISABLED:
        return default
    return asked or default


@dataclass(frozen=True)
class _Break:
    """A connection broken under a call, as the call reconnects: ``what`` names the call in messages,
    ``lost`` is the queue manager it had (its root, name and qmid) and ``error`` what broke it;
    ``mode`` is the reconnect mode in force, ``timeout`` the reconnect timeout and ``deadline`` its
    end (on ``clock.monotonic()``, set at the call's first break); roots open with ``storage_options``
    and ``clock``, which times the backoff too."""

    what: str
    lost: QueueManager | Reconnect
    error: Exception
    mode: ReconnectMode
    timeout: timedelta
    deadline: float
    storage_options: store.StorageOptions
    clock: Clock


def _broken(
    error: Exception,
    lost: QueueManager | Reconnect,
    mode: ReconnectMode,
    timeout: timedelta,
    storage_options: store.StorageOptions,
    what: str,
    deadline: float | None,
    clock: Clock,
) -> _Break:
    """Raise ``error`` unless it broke the connection to ``lost``; raise 2009 when the mode does not
    reconnect; else the break, its deadline the call's earlier one (None: set now on ``clock``, at
    its first)."""
    root, name = lost.root, lost.name
    if not store.broken(error, root, storage_options):
        raise error
    if mode in (ReconnectMode.NO, ReconnectMode.DISABLED):
        why = "reconnection is disabled on the queue manager" if mode is ReconnectMode.DISABLED else "reconnect is no"
        raise MQError(
            f"{what}: queue manager {name} at {root} cannot be reached ({_summary(error)}); {why}",
            Reason.MQRC_CONNECTION_BROKEN,
        ) from error
    _log.warning("%s: queue manager %s at %s cannot be reached (%s); reconnecting", what, name, root, _summary(error))
    deadline = deadline if deadline is not None else clock.monotonic() + timeout.total_seconds()
    return _Break(what, lost, error, mode, timeout, deadline, storage_options, clock)


def _wait_for(
    order: list[str], broken: _Break, *, follow: bool = False, queue: str | None = None, in_doubt: bool = False
) -> QueueManager:
    """Wait, with backoff, for a queue manager at the roots of ``order`` that the mode accepts: the
    lost one (same qmid), or with ``follow`` any that hosts ``queue``. ``in_doubt``: the call is in
    doubt, which the error at the timeout says."""
    what, lost, error, mode, clock = broken.what, broken.lost, broken.error, broken.mode, broken.clock
    delay = _FIRST_DELAY
    others: list[str] = []
    while True:
        for root in order:
            try:
                found = QueueManager.open(root, storage_options=broken.storage_options, clock=clock)
                if found.qmid != lost.qmid:
                    if not follow and mode is ReconnectMode.YES and len(order) == 1:
                        raise MQError(
                            f"{what}: the root {root} now holds queue manager {found.qmid}, not {lost.qmid}; "
                            "what this client wrote and read belongs to the lost one",
                            Reason.MQRC_RECONNECT_INCOMPATIBLE,
                        ) from error
                    if not follow:
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
            _log.warning("%s: reconnected to queue manager %s at %s", what, found.name, root)
            return found
        if clock.monotonic() + delay > broken.deadline:
            waited = broken.timeout.total_seconds()
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
        clock.sleep(delay)
        delay = min(delay * 2, _MAX_DELAY)


def connect(
    roots: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    reconnect: str | None = None,
    reconnect_timeout: float | timedelta = DEFAULT_RECONNECT_TIMEOUT,
    storage_options: dict[str, str] | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> Connection:
    """Connect to the first queue manager of ``roots`` that answers (MQCONNX with a connection list).
    ``clock`` is the time its reconnect deadlines and backoff and its queue managers read (see
    :mod:`mqspark.clock`)."""
    return Connection(
        roots,
        reconnect=reconnect,
        reconnect_timeout=reconnect_timeout,
        storage_options=storage_options,
        clock=clock,
    )


def _summary(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]
