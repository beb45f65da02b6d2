"""Shared gets: plain gets of several processes from one consumer group share a state commit.

Each get records its plan and the plan's consumption in one commit to the queue's state table, and
gets of one group that commit at once conflict: one lands, the others plan again. So a plain get
(:func:`mqspark.engine.get.get`, no match options, a local queue) leaves a request in the group's
folder (:mod:`mqspark.store.get_requests`) and takes the folder's lock when it is free: its holder
takes every request, plans one get of all the messages they want together, and commits it in one
commit. Each request's share is the next messages of the plan in logical order, requests in arrival
order: the same messages, in the same order, as had the gets run one after another. A getter whose
lock is held sleeps until the holder's round ends, then looks at its answer.

The holder commits in rounds (take, plan, commit, answer), and keeps the lock for up to
:data:`~mqspark.engine.staged_puts.DRAIN_ROUNDS` more rounds of the requests made during its own,
each gathered as staged puts are. The rules:

- a request's share is written before the commit, with the plan's id, and is its getter's once a
  commit names the plan consumed (``mqspark.consumed`` in its ``commitInfo``);
- a holder killed mid-round loses and doubles nothing: the next holder settles its requests by the
  log (a share whose plan landed is given, any other request is asked again), and the state
  table's history is not trimmed past an unsettled share;
- a request whose getter is gone (its lock is free) is dropped before it is planned; a getter
  killed after its request was planned loses its share, as a get killed mid-get does;
- a request no holder took within :data:`~mqspark.engine.staged_puts.HOLDER_PATIENCE` (a holder
  paused holding the lock) is taken back, and its getter gets alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa

from mqspark import store
from mqspark.engine.staged_puts import DRAIN_ROUNDS, GATHER, GATHER_POLL, HOLDER_PATIENCE
from mqspark.engine.state_table import CONSUMED_KEY
from mqspark.errors import MQError, MQValidationError, Reason

# Plans, reads and commits a consumed get of up to the given number of messages, and calls the
# given share function with the plan's id and messages after the read, before the commit; returns
# the messages (empty when nothing matched).
Serve = Callable[[int, Callable[[str, pa.Table], None]], pa.Table]


def take(folder: str, state_location: str, max_messages: int, serve: Serve) -> pa.Table | None:
    """Get up to ``max_messages`` messages through the shared-gets folder ``folder`` of a group of
    the local state table at ``state_location``: in this process's get, with the other processes'
    requests, when the lock is free; else the getter's share of the holder's. None when no holder
    took the request in time: the caller gets alone."""
    requests = store.GetRequests(folder)
    with requests.lock.locked() as held:
        if held:
            served, messages = _hold(requests, state_location, serve, max_messages)
            _drain(requests, state_location, serve, served)
            return messages
    name, descriptor = requests.request(max_messages)
    try:
        return _await(requests, name, state_location, serve)
    finally:
        requests.forget(name, descriptor)


def _await(requests: store.GetRequests, name: str, state_location: str, serve: Serve) -> pa.Table | None:
    deadline = time.monotonic() + HOLDER_PATIENCE
    pause = store.BETWEEN_ROUNDS
    while True:
        answer = requests.answer(name)
        if answer is not None:
            if answer.messages is not None:
                return answer.messages
            if answer.reason is not None:
                if not answer.reason:
                    raise MQValidationError(answer.message)
                raise MQError(answer.message, Reason(answer.reason))
            requests.ask_again(name)
            continue
        if requests.gone(name):
            raise MQError(f"table {state_location} was deleted with the get asked of it", Reason.MQRC_Q_DELETED)
        remaining = deadline - time.monotonic()
        if remaining <= 0 and requests.withdraw(name):
            return None
        if requests.lock.try_lock():
            try:
                _drain(requests, state_location, serve, _hold(requests, state_location, serve)[0])
            finally:
                requests.lock.unlock()
        else:
            pause = requests.lock.pause(remaining, pause)


def _drain(requests: store.GetRequests, state_location: str, serve: Serve, served: int) -> None:
    """Serve the requests made during the holder's round, up to ``DRAIN_ROUNDS`` more rounds, each
    gathered as staged puts are (see :func:`mqspark.engine.staged_puts._drain`)."""
    for _ in range(DRAIN_ROUNDS):
        if not served and not requests.wanted():
            return
        try:
            taken, _ = _hold(requests, state_location, serve, gather=served)
        except MQError:
            # Its requests were refused with it; the holder's own get is through already.
            return
        if not taken:
            return
        served = max(served, taken)


def _hold(
    requests: store.GetRequests, state_location: str, serve: Serve, own: int = 0, gather: int = 0
) -> tuple[int, pa.Table | None]:
    """As the lock's holder, one round: settle what a dead holder left, take every request (waiting
    up to ``GATHER`` seconds for ``gather`` of them) and serve them in one get, with the holder's
    ``own`` get of that many messages first. Returns how many requests it served, and the holder's
    own messages (None without an own get)."""
    deadline = time.monotonic() + GATHER
    while gather and len(requests.wanted()) < gather and time.monotonic() < deadline:
        time.sleep(GATHER_POLL)
    if not own and not requests.wanted() and not requests.taken():
        return 0, None
    requests.lock.start_round()
    try:
        _settle(requests, state_location, requests.taken())
        names, wants = [], []
        for name in requests.wanted():
            wanted = requests.take(name)
            if wanted is not None:
                names.append(name)
                wants.append(wanted)
        messages = _serve(requests, state_location, serve, own, names, wants) if names or own else None
        return len(names), None if messages is None or not own else messages.slice(0, own)
    finally:
        requests.lock.end_round()


def _serve(
    requests: store.GetRequests, state_location: str, serve: Serve, own: int, names: list[str], wants: list[int]
) -> pa.Table:
    """Get the holder's ``own`` messages and those the requests ``names`` want (``wants``) in one
    get, answer each request with its share, and return what the get got."""

    def share(plan_id: str, messages: pa.Table) -> None:
        offset = own
        for name, wanted in zip(names, wants, strict=True):
            if offset < messages.num_rows:
                requests.tentative(name, messages.slice(offset, wanted), plan_id)
            else:
                requests.drop_tentative(name)
            offset += wanted

    try:
        messages = serve(own + sum(wants), share)
    except MQError as refused:
        _settle(requests, state_location, names, refused)
        raise
    except BaseException:
        _settle(requests, state_location, names)
        raise
    offset = own
    for name, wanted in zip(names, wants, strict=True):
        if not messages.num_rows:
            requests.nothing(name, messages.schema)
        elif offset < messages.num_rows:
            requests.grant(name)
        else:
            # The plan was short of messages for this request (some had expired): it asks again.
            requests.again(name)
        offset += wanted
    return messages


def _settle(requests: store.GetRequests, state_location: str, names: list[str], refused: MQError | None = None) -> None:
    """Settle requests whose round ended without answering them: a share whose plan a commit names
    consumed is given; the others are refused with ``refused`` when given, else asked again."""
    plans = {name: requests.tentative_plan(name) for name in names}
    written = [requests.tentative_time(name) for name, plan in plans.items() if plan is not None]
    landed = store.landed_names(state_location, min(written), CONSUMED_KEY) if written else set()
    for name, plan in plans.items():
        if plan is not None and plan in landed:
            requests.grant(name)
        elif refused is not None:
            requests.refuse(name, 0 if refused.reason is None else refused.reason.value, refused.detail)
        else:
            requests.ask_again(name)
