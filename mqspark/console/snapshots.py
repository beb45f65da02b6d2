"""The answers many console clients poll (the overview, a queue's page, the charts), kept fresh by
one background thread: a client is served the newest answer at once, and only the first client to
ask for one waits while it is computed. An answer is computed again every ``refresh`` seconds while
clients keep asking for it, and dropped once none has asked for ``idle`` seconds. As RabbitMQ's
management plugin does with its statistics interval, the console so costs the queue managers the
same whether one client watches or fifty. While ``busy()`` says the machine is busy with other work
(:class:`~mqspark.console.machine.MachineLoad`), an answer is computed again only every
``busy_refresh`` seconds: on a busy machine the console's answers get older, not the queue
managers' work slower.

Inside :func:`ready_only`, an answer not computed yet is not waited for: :class:`NotReady` is raised
instead, so that a page can be served on the event loop when its answers are ready, and in a thread
only when they are not."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from starlette.concurrency import run_in_threadpool

_log = logging.getLogger(__name__)


T = TypeVar("T")
R = TypeVar("R")
A = TypeVar("A")
_READY_ONLY: ContextVar[bool] = ContextVar("ready_only", default=False)


class NotReady(Exception):
    """Raised inside :func:`ready_only` for an answer that is not computed yet."""


def polled(endpoint: Callable[[R], A]) -> Callable[[R], Awaitable[A]]:
    """``endpoint`` (a handler that must let :class:`NotReady` through) for what clients poll: run on
    the event loop when the answers it reads are ready, which spares a thread hand-off for each of
    the pages 50 clients ask a second; else in a worker thread, where it may wait for them."""

    async def answered(request: R) -> A:
        try:
            with ready_only():
                return endpoint(request)
        except NotReady:
            return await run_in_threadpool(endpoint, request)

    return answered


@contextmanager
def ready_only() -> Iterator[None]:
    """In the block (and in the task or thread running it), :meth:`Snapshots.get` raises
    :class:`NotReady` instead of computing an answer or waiting for one being computed."""
    token = _READY_ONLY.set(True)
    try:
        yield
    finally:
        _READY_ONLY.reset(token)


@dataclass(frozen=True)
class Dated(Generic[T]):
    """An answer, and when it was computed (``time.time()``): what pages show as its age."""

    value: T
    at: float


@dataclass
class _Answer:
    compute: Callable[[], Any]
    value: Any = None
    computed: float | None = None  # time.monotonic() of the last computation; None: being computed
    at: float = 0.0  # time.time() of the last computation
    asked: float = 0.0


class Snapshots:
    """Answers by key, each computed by the callable first given with it (which must look up what
    it reads when called: it runs in the refresher's thread too)."""

    def __init__(
        self, refresh: float, idle: float, busy: Callable[[], bool] = lambda: False, busy_refresh: float | None = None
    ) -> None:
        self.refresh, self.idle = refresh, idle
        self.busy, self.busy_refresh = busy, refresh if busy_refresh is None else busy_refresh
        self._answers: dict[tuple, _Answer] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def get(self, key: tuple, compute: Callable[[], Any]) -> Dated[Any]:
        """The newest answer for ``key``, dated; computed now when there is none, by one caller at a
        time (inside :func:`ready_only`, :class:`NotReady` is raised instead)."""
        with self._changed:
            answer = self._answers.get(key)
            if _READY_ONLY.get() and (answer is None or answer.computed is None):
                raise NotReady(key)
            while answer is not None and answer.computed is None:
                self._changed.wait()
                answer = self._answers.get(key)
            if answer is not None:
                answer.asked = time.monotonic()
                return Dated(answer.value, answer.at)
            answer = self._answers[key] = _Answer(compute, asked=time.monotonic())
        try:
            value = compute()
        except BaseException:
            with self._changed:
                del self._answers[key]
                self._changed.notify_all()
            raise
        with self._changed:
            answer.value, answer.computed, answer.at = value, time.monotonic(), time.time()
            self._changed.notify_all()
            self._start()
        return Dated(value, answer.at)

    def forget(self, matches: Callable[[tuple], bool]) -> None:
        """Drop the answers whose keys ``matches``: what they show has changed, and the next client
        to ask waits for a new answer."""
        with self._changed:
            for key in [key for key, answer in self._answers.items() if answer.computed is not None and matches(key)]:
                del self._answers[key]

    def close(self) -> None:
        """Stop the refresher."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="console-refresh", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while (due := self._next()) is not None:
            key, answer = due
            try:
                value = answer.compute()
            except Exception:  # noqa: BLE001 - the next client to ask computes it and sees the error
                _log.debug("console: refreshing %r failed", key, exc_info=True)
                with self._changed:
                    if self._answers.get(key) is answer:
                        del self._answers[key]
                continue
            with self._changed:
                if self._answers.get(key) is answer:
                    answer.value, answer.computed, answer.at = value, time.monotonic(), time.time()

    def _next(self) -> tuple[tuple, _Answer] | None:
        """The next answer to compute, once one is due; None once closed."""
        while True:
            refresh = self.busy_refresh if self.busy() else self.refresh
            with self._changed:
                if self._closed:
                    return None
                due = self._due(refresh)
                if due is not None:
                    return due
                self._changed.wait(self.refresh / 4)

    def _due(self, refresh: float) -> tuple[tuple, _Answer] | None:
        """The answer to compute next (the one computed longest ago, when that was ``refresh``
        seconds ago or more), after dropping the answers nobody asked for in ``idle`` seconds."""
        now = time.monotonic()
        for key in [key for key, answer in self._answers.items() if now - answer.asked > self.idle]:
            if self._answers[key].computed is not None:
                del self._answers[key]
        ready = [(answer.computed, key) for key, answer in self._answers.items() if answer.computed is not None]
        if not ready:
            return None
        computed, key = min(ready, key=lambda item: item[0])
        return (key, self._answers[key]) if now - computed >= refresh else None
