"""Compaction of a queue's state table: what its compact form keeps (:func:`compact_rows`), and the
rewrite to it (:class:`Compaction`), every :data:`~mqspark.engine.state_table.COMPACT_EVERY`
versions and at every maintenance run, so the table's size follows the backlog in flight, not the
history. A compaction that lost to a concurrent commit is tried again at the committer's next
commit. One compaction in :data:`TRIM_EVERY` also trims the table's history; the others write a
Delta checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from mqspark import store
from mqspark.engine.state_rows import STATE_SCHEMA, EventKind, checkpoint_rows, claims_of, without_backouts
from mqspark.engine.state_table import COMPACT_EVERY, STATE_RETENTION, StateTable
from mqspark.model.messages import TIMESTAMP, origin_versions
from mqspark.model.ranges import RANGE_COLUMNS, in_ranges, merge_ranges

_log = logging.getLogger(__name__)
# One compaction in this many also trims the history (log entries, removed files): each trim lists
# the log and the table's folder, and trims by several processes at once race each other.
TRIM_EVERY = 10


def compact_rows(rows: pa.Table, forget: Callable[[pa.Table], pa.Array] | None = None) -> pa.Table:
    """The compact form of a state table's rows, per consumer group: one checkpoint of merged
    ranges for everything consumed, finished moves included (and the group's position, if it
    planned), the plans that may still run (those after the last consumed one, and Python gets'
    claims with their renewals), and the newest lease, abort and switchover records. Rolled-back
    plans are dropped.

    ``forget`` marks merged ranges to leave out (messages no longer in the queue table). A group
    whose every range goes keeps one checkpoint row without a range, for its position."""
    pieces = []
    for consumer in pc.unique(rows["consumer"]).to_pylist():
        mine = rows.filter(pc.equal(rows["consumer"], consumer))
        event = mine["event"]
        consumed = pc.unique(mine.filter(pc.equal(event, EventKind.CONSUMED))["plan_id"])
        plans = pc.equal(event, EventKind.PLAN)
        folded = mine.filter(
            pc.or_(pc.equal(event, EventKind.CHECKPOINT), pc.and_(plans, pc.is_in(mine["plan_id"], consumed)))
        )
        moves = pc.equal(event, EventKind.MOVE)
        finished_moves = mine.filter(pc.and_(moves, pc.is_in(mine["plan_id"], consumed)))
        # Failures, the batch limits of messages returned from a plan given up, and the forwarding
        # service's reply records (see :mod:`mqspark.services.forward`).
        failed = pc.or_(
            pc.is_in(event, pa.array([EventKind.BACKOUT, EventKind.ROLLBACK, EventKind.REPLY, EventKind.UNREPLIED])),
            pc.and_(pc.equal(event, EventKind.RETURN), pc.is_valid(mine["batch_limit"])),
        )
        position = pc.max(folded["seq"]).as_py()
        ranges = None  # the merged ranges of the folded rows, when there are any
        # A group that only moves messages (redrive) has finished moves and nothing else to fold.
        if folded.num_rows or finished_moves.num_rows:
            following = pc.if_else(
                pc.equal(folded["event"], EventKind.PLAN),
                pc.add(folded["delivery_seq"], folded["count"]),
                folded["delivery_seq"],
            )
            ranges = merge_ranges(
                pa.concat_tables([without_backouts(folded, mine), finished_moves.select(RANGE_COLUMNS)])
            )
            if forget is not None:
                ranges = ranges.filter(pc.invert(forget(ranges)))
            if ranges.num_rows == 0:
                ranges = pa.table({name: pa.nulls(1, STATE_SCHEMA.field(name).type) for name in RANGE_COLUMNS})
            # At the group's newest record time, so that compaction does not make an idle group look active.
            newest = pc.max(mine["at"]).cast(TIMESTAMP)
            pieces.append(checkpoint_rows(consumer, position, pc.max(following).as_py(), newest, ranges))
        waiting = pc.invert(pc.is_in(mine["plan_id"], consumed))
        if position is not None:
            # A Python get's claim stays until it is consumed or rolled back, whatever plans follow it.
            waiting = pc.and_(waiting, pc.or_(pc.greater(mine["seq"], position), claims_of(mine)))
        kept = mine.filter(pc.and_(plans, waiting))
        pieces.append(kept)
        renewals = mine.filter(pc.equal(event, EventKind.RENEW))
        pieces.append(renewals.filter(pc.is_in(renewals["plan_id"], kept["plan_id"])))
        ended = pa.concat_arrays([consumed, pc.unique(mine.filter(pc.equal(event, EventKind.ABANDONED))["plan_id"])])
        pieces.append(mine.filter(pc.and_(moves, pc.invert(pc.is_in(mine["plan_id"], ended)))))
        # Failures are kept while their message still waits for the group: they make its backout count.
        failures = mine.filter(failed)
        if ranges is not None and failures.num_rows:
            consumed_all = in_ranges(failures["origin"], failures["row"], ranges, pc.fill_null(failures["count"], 1))
            failures = failures.filter(pc.invert(consumed_all))
        pieces.append(failures)
        for kinds in ([EventKind.LEASE, EventKind.RELEASE], [EventKind.ABORT], [EventKind.SWITCHOVER]):
            latest = mine.filter(pc.is_in(event, pa.array(kinds)))
            if latest.num_rows:
                pieces.append(latest.take(pc.sort_indices(latest, [("at", "descending")])[:1]))
        pieces.append(mine.filter(pc.equal(event, EventKind.DECLARE)).slice(0, 1))
    return pa.concat_tables([piece.cast(STATE_SCHEMA) for piece in pieces]) if pieces else STATE_SCHEMA.empty_table()


class Compaction:
    """The compaction of one state table (a :class:`StateTable` handle), and whether one is due
    because the last one lost to a concurrent commit."""

    def __init__(self, table: StateTable) -> None:
        self._table = table
        self._due = False

    def after_commit(self, version: int | None) -> None:
        """Compact after a commit that landed at ``version`` (None: nothing was committed) when it is
        a multiple of ``COMPACT_EVERY``, or when the last compaction lost to a concurrent commit (a
        lease renewal): it is tried again at this instance's next commit, not a hundred versions
        later. The commit landed: nothing the compaction after it raises may report it failed (a
        caller would redo what is done)."""
        if version is not None and (version % COMPACT_EVERY == 0 or self._due):
            try:
                self._due = not self.compact()
            except Exception as error:  # noqa: BLE001 - logged; the next commit compacts again
                _log.warning("queue %s: compaction of the state table failed: %s", self._table.queue, error)
                self._due = True

    def compact(self, live: pa.Array | None = None, seen_version: int = -1) -> bool:
        """Rewrite the table in its compact form (see :func:`compact_rows`) in one commit at exactly the
        next version; False when a concurrent commit got in first (a later compaction does it).

        With ``live`` (the origins of the queue's live messages at version ``seen_version``), consumed
        ranges of messages no longer in the queue table are dropped: maintenance removed them, so
        they can never be delivered again. Log entries and files it replaces stay for readers still on
        an older version (:data:`~mqspark.engine.state_table.STATE_RETENTION`, ``STATE_FILE_RETENTION``)."""
        state = self._table
        table = state.table()
        if table is None:
            return False
        forget = None
        if live is not None:

            def forget(ranges: pa.Table) -> pa.Array:
                gone = pc.invert(pc.is_in(ranges["origin"], value_set=live))
                return pc.and_(gone, pc.less_equal(origin_versions(ranges["origin"]), seen_version))

        compacted = compact_rows(state.rows(), forget)
        if not state.overwrite(table, compacted, "compact"):
            return False
        table = state.table()
        if table is None:
            return True  # deleted with its queue since: nothing is left to clean up
        if table.version() % (COMPACT_EVERY * TRIM_EVERY) >= COMPACT_EVERY:
            # A reader opens at the newest checkpoint and reads the entries after it.
            table.create_checkpoint()
        elif not _unsettled_share(state):
            try:
                store.trim_history(table, table.version(), int(STATE_RETENTION.total_seconds()))
            except Exception as error:  # noqa: BLE001 - a trim beside this one got in first; the next one trims
                _log.info("queue %s: trimming the state table's history: %s", state.queue, error)
        return True


def _unsettled_share(state: StateTable) -> bool:
    """Whether a shared get's share waits to be settled by the log since more than half the log's
    retention (its holder died mid-round): the entries that tell whether it landed must stay."""
    if store.is_uri(state.location):
        return False
    oldest = store.oldest_tentative(state.location)
    return oldest is not None and oldest < time.time() - STATE_RETENTION.total_seconds() / 2
