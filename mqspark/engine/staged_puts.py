"""Group commit across processes: plain puts of several processes to one local queue share a commit.

A Delta commit costs the same for one message as for many, and commits of several processes to one
table conflict and retry. So a put (already gathered with its process's other puts, see
:mod:`mqspark.engine.group_commit`) takes the queue's commit lock when it is free and commits its
rows together with every put other processes staged meanwhile; when the lock is held, it stages its
rows (:mod:`mqspark.store.staging`) and waits for the holder to mark them landed or refused, taking
the lock itself as soon as it is free.

The holder commits in *rounds* (claim, commit, mark), and keeps the lock for up to
:data:`DRAIN_ROUNDS` more rounds of the puts staged during its own. A waiting putter sleeps until
a round ends (:meth:`~mqspark.store.staging.Staging.wait_round`) and then looks at its outcome, so
a put returns when its round ends, not when the lock is let go. Before each further round the
holder waits up to :data:`GATHER` seconds for as many puts as its fullest round had: the putters it
returned come back with their next puts, and a round that waits for them carries them all. The rules:

- commit order is arrival order (staged files sort by arrival time);
- ``max_depth`` and the queue's flags are checked at the commit: when the puts together do not fit,
  they are committed one by one in order, and those that do not fit are refused with
  ``MQRC_Q_FULL``; another refusal of the commit refuses each put in it;
- a put returns once a landed commit holds it, and a put that raised left nothing;
- a holder killed mid-commit loses and doubles nothing: the next holder finds its claims and
  settles them by the log (landed, or staged again);
- a put whose file no holder claims within :data:`HOLDER_PATIENCE` (a holder paused while holding
  the lock) takes it back and commits alone. A staged put whose process died is committed by the
  next put, or by the next get or maintenance of the queue once it waited :data:`HOLDER_PATIENCE`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from mqspark import store
from mqspark.errors import MQError, MQValidationError, Reason

# Commits the given rows in one Delta commit, with the given entries in its commitInfo.
CommitRows = Callable[[pa.Table, dict[str, Any]], object]

# Seconds a staged put waits for a holder to claim it before it commits alone.
HOLDER_PATIENCE = 1.0
# Commits a holder makes for others' puts staged during its own, before it returns.
DRAIN_ROUNDS = 4
# How long a holder waits for other processes' next puts before a round (seconds), and how often it looks.
GATHER = 0.004
GATHER_POLL = 0.0005


def commit(location: str, rows: pa.Table, commit_rows: CommitRows) -> None:
    """Commit ``rows``, plain puts' rows for the local queue table at ``location``, with the puts
    other processes staged meanwhile; raises what refused them."""
    arrival = time.time_ns()
    staging = store.Staging(location)
    with staging.lock.locked() as held:
        if held:
            others, error = _hold(staging, commit_rows, (arrival, rows))
            _drain(staging, commit_rows, others)
            if error is not None:
                raise error
            return
    name = staging.stage(rows)
    _await(staging, name, rows, commit_rows)


def commit_staged(location: str, age: float, commit_rows: CommitRows) -> int:
    """Commit the puts staged for the local queue table at ``location`` at least ``age`` seconds
    ago, and settle the claims of holders that died, unless a holder is at work; how many puts
    were settled."""
    staging = store.Staging(location)
    claimed, staged = staging.claimed(), staging.staged()
    if not claimed and not any(staging.age(name) >= age for name in staged):
        return 0
    with staging.lock.locked() as held:
        if not held:
            return 0
        settled = len(staging.claimed()) + len(staging.staged())
        _hold(staging, commit_rows, None)
        return settled


def settle_claims(location: str) -> bool:
    """Settle the claims of holders that died on the local queue table at ``location`` (landed, or
    staged again), so that the log entries that tell which landed may go. False when a holder is at
    work: its claims are its own, and its commit may be in the log already."""
    staging = store.Staging(location)
    if not staging.claimed():
        return True
    with staging.lock.locked() as held:
        if held:
            _settle_claims(staging)
        return held


def _await(staging: store.Staging, name: str, rows: pa.Table, commit_rows: CommitRows) -> None:
    """Wait for the outcome of the staged put ``name``: asleep while a holder's round goes on, it
    looks when one ends, and takes the lock when it is free: its holder then commits this put with
    the others staged, unless another holder decided it."""
    deadline = time.monotonic() + HOLDER_PATIENCE
    pause = store.BETWEEN_ROUNDS
    while True:
        if _landed(staging.outcome(name)):
            return
        if staging.gone(name):
            raise MQError(f"table {staging.location} was deleted with the put staged for it", Reason.MQRC_Q_DELETED)
        remaining = deadline - time.monotonic()
        if remaining <= 0 and staging.withdraw(name):
            # No holder claimed it in time (one paused holding the lock): committed alone.
            commit_rows(rows, {})
            return
        if staging.lock.try_lock():
            try:
                if staging.undecided(name):
                    _hold(staging, commit_rows, None)
            except BaseException:
                # Staged again by the failed commit: taken back, so that a put that raised leaves nothing.
                if staging.withdraw(name):
                    raise
            finally:
                staging.lock.unlock()
        else:
            pause = staging.lock.pause(remaining, pause)


def _landed(outcome: store.staging.Outcome | None) -> bool:
    """True when a staged put landed, False while undecided; raises what refused it."""
    if outcome is None or outcome.landed:
        return outcome is not None
    if not outcome.reason:
        raise MQValidationError(outcome.message)
    raise MQError(outcome.message, Reason(outcome.reason))


def _drain(staging: store.Staging, commit_rows: CommitRows, returned: int) -> None:
    """Commit what was staged while the holder committed, up to :data:`DRAIN_ROUNDS` more commits:
    the putters its commit returned put again meanwhile, and had each of them taken the lock
    alone, commits would carry one put each. Each round waits up to :data:`GATHER` seconds for as
    many staged puts as the fullest round had so far: the putters it returned come back with their
    next puts."""
    for _ in range(DRAIN_ROUNDS):
        deadline = time.monotonic() + GATHER
        while len(staging.staged()) < returned and time.monotonic() < deadline:
            time.sleep(GATHER_POLL)
        if not staging.staged():
            return
        returned = max(returned, _hold(staging, commit_rows, None)[0])


def _hold(
    staging: store.Staging, commit_rows: CommitRows, own: tuple[int, pa.Table] | None
) -> tuple[int, MQError | None]:
    """As the lock's holder: settle dead holders' claims, claim every staged put and commit them
    with ``own`` (the holder's own put: its arrival time and rows) in arrival order. Returns how
    many staged puts it decided, and the error that refused the holder's own put."""
    staging.lock.start_round()
    try:
        return _commit_round(staging, commit_rows, own)
    finally:
        staging.lock.end_round()


def _commit_round(
    staging: store.Staging, commit_rows: CommitRows, own: tuple[int, pa.Table] | None
) -> tuple[int, MQError | None]:
    _settle_claims(staging)
    names = [name for name in staging.staged() if staging.claim(name)]
    puts: list[tuple[int, str | None, pa.Table]] = [(staging.arrival(n), n, staging.rows(n)) for n in names]
    if own is not None:
        puts.append((own[0], None, own[1]))
    puts.sort(key=lambda put: put[0])
    if not puts:
        return 0, None
    try:
        commit_rows(pa.concat_tables([put[2] for put in puts]), {store.STAGED_KEY: names})
    except MQError as refused:
        if refused.reason == Reason.MQRC_Q_FULL and len(puts) > 1:
            return len(names), _one_by_one(staging, commit_rows, puts)
        for name in names:
            _refuse(staging, name, refused)
        return len(names), refused
    except BaseException:
        for name in names:
            staging.unclaim(name)
        raise
    for name in names:
        staging.land(name)
    return len(names), None


def _one_by_one(
    staging: store.Staging, commit_rows: CommitRows, puts: list[tuple[int, str | None, pa.Table]]
) -> MQError | None:
    """Commit ``puts`` one at a time, in order, refusing those the queue refuses (it is full)."""
    own_error: MQError | None = None
    for _, name, rows in puts:
        try:
            commit_rows(rows, {store.STAGED_KEY: [name]} if name else {})
        except MQError as refused:
            if name is None:
                own_error = refused
            else:
                _refuse(staging, name, refused)
            continue
        except BaseException:
            for _, rest, _ in puts:
                if rest is not None:
                    staging.unclaim(rest)
            raise
        if name is not None:
            staging.land(name)
    return own_error


def _settle_claims(staging: store.Staging) -> None:
    """Claims seen by the lock's holder are a dead holder's: landed if a commit names them, else
    staged again."""
    claimed = staging.claimed()
    if not claimed:
        return
    since = min(staging.claim_time(name) for name in claimed)
    landed = store.landed_names(staging.location, since)
    for name in claimed:
        if name in landed:
            staging.land(name)
        else:
            staging.unclaim(name)


def _refuse(staging: store.Staging, name: str, refused: MQError) -> None:
    """Mark ``name`` refused with what its putter raises: the reason code (0: bad input) and text."""
    staging.refuse(name, 0 if refused.reason is None else refused.reason.value, refused.detail)
