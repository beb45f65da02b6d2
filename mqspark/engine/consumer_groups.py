"""Consumer groups: the state table of a queue, where plans, consumption and leases are recorded.

``<root>/state/<queue>`` is a small Delta table. Rows, by ``event``:

- ``plan``: the messages of a planned micro-batch as ranges: ``count`` messages of origin ``origin``
  from row ``row`` on (a message's identity, see :func:`mqspark.model.messages.origins`), delivered as
  ``delivery_seq``, ``delivery_seq`` + 1, ... (null: expired messages the batch discards).
  Recorded before the batch runs, so a replay after a crash delivers the same messages.
- ``consumed``: the plan ``plan_id`` has been processed; its messages are gone for the group.
- ``checkpoint``: what compaction folded the group's consumed plans and finished moves into: ranges
  of consumed messages, with the group's position (``seq``, next ``delivery_seq``) on every row
  (null for a group that only moves messages, as redrive's does).
- ``lease`` / ``release``: the query (``owner``) reading for the group, renewed while it runs.
- ``declare``: the group was declared on the queue before it first read, so it counts already.
- ``abort``: the backlog monitor stopped the group's reader (its ``reason`` and ``error`` text); a
  query whose lease began before it fails at its next trigger (see :mod:`mqspark.services.monitor`).
- ``switchover``: an administrator asked the group's active instance to hand over (``endmqm -s``):
  a query whose lease began before it records its last micro-batch, releases the lease and plans
  nothing more (see :mod:`mqspark.services.instances`).
- ``backout`` / ``rollback``: a delivery of a message in plan ``plan_id`` failed, explicitly (given
  back, with its ``error``) or because the plan's batch was replayed; see
  :mod:`mqspark.engine.backout`. A backed-out message is not consumed with its plan.
- ``return``: a later item of a backed-out message's group in the same plan, which goes back with
  it (not a failure of its own); or, with ``batch_limit``, a message of a plan given up after its
  replay failed too, delivered from then on in batches of at most ``batch_limit`` units.
- ``reply`` / ``unreplied``: the forwarding service's record of the replies it puts for a range of
  requests (``target`` queue, ``txn`` version in ``seq``), and its cancellation when that put did not land;
  see :mod:`mqspark.services.forward`.
- ``move``: messages that failed too often, on their way to queue ``target`` (the put's ``txn``
  version in ``seq``, each message's backout count in ``delivery_seq``, the dead-letter ``reason``
  and ``error`` text). A ``consumed`` record with the move's ``plan_id`` finishes it; an
  ``abandoned`` one ends it with its messages left in place (the target refused them).

A consumer group's depth is the queue's live messages minus its checkpoint, its consumed plans
(without the messages backed out of them) and its finished moves.
Plans never consumed are rolled back: their messages are delivered again. Every
:data:`COMPACT_EVERY` versions (and at every maintenance run) the table is rewritten to that
compact form, so its size follows the backlog in flight, not the history; a compaction that lost to
a concurrent commit is tried again at the committer's next commit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from mqspark import store
from mqspark.engine.leases import DEFAULT_LEASE_TIMEOUT, GET_OWNER, LEASE_POLL, HeldByGet, Lease
from mqspark.engine.state_rows import STATE_SCHEMA, claims_of, compact_rows, consumed_of, event_rows, position_of
from mqspark.errors import MQError, Reason
from mqspark.model.messages import TIMESTAMP, origin_versions
from mqspark.model.ranges import KEY_COLUMNS, RANGE_COLUMNS

_log = logging.getLogger(__name__)
# Old log entries are kept this long for readers still on an older version: a reader whose entries
# went opens the table afresh, and a commit is made at exactly the next version or not at all. Every
# look lists the log, and the getters of a busy queue commit several times a second: kept an hour,
# the log had 15,000 entries and a get took twice as long.
STATE_RETENTION = timedelta(minutes=2)
# Removed files are kept longer: a reader may be reading the files of the version it looked at, and
# a file written for a commit still under way must not look like one left behind.
STATE_FILE_RETENTION = store.VACUUM_FLOOR
STATE_TABLE_CONFIGURATION = {
    "delta.logRetentionDuration": f"interval {int(STATE_RETENTION.total_seconds())} seconds",
    "delta.deletedFileRetentionDuration": f"interval {int(STATE_FILE_RETENTION.total_seconds())} seconds",
}
# Compaction runs when the table has grown this many versions since the last one: a commit costs
# more with each file the table holds.
COMPACT_EVERY = 20
# One compaction in this many also trims the history (log entries, removed files): each trim lists
# the log and the table's folder, and trims by several processes at once race each other.
TRIM_EVERY = 10
_ATTEMPTS = 100
# The events that say who holds a group's lease: the newest of them by time.
LEASE_EVENTS = ("lease", "release")
# Long enough that a lease record never expires: whether it is the newest is what counts.
_FOREVER = timedelta(days=3650)
_Derived = TypeVar("_Derived")
# How many log entries a reader reads at most to tell compactions from other rewrites.
_COMPACTIONS_READ = 2 * COMPACT_EVERY
# The ``mqspark.operation`` of a commit deleting a consumer group: unlike a compaction, it takes back
# what the group consumed.
DELETE_OPERATION = "delete group"


class _OutOfOrder(MQError):
    """A lease record would commit with a time older than one committed since it was stamped."""


class _NotHeld(MQError):
    """A release of a lease its owner no longer holds."""


class Stale(MQError):
    """What a commit was decided on changed before it landed: decide again on a fresh look."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, Reason.MQRC_BACKED_OUT)


@dataclass(frozen=True)
class Claims:
    """The Python gets' claims of a consumer group at one moment (see :meth:`ConsumerState.claims`):
    the plan rows of those whose lock runs, with each one's ``expiry``, and the plans of those whose
    lock has passed and whose messages no one has taken back yet."""

    live: pa.Table
    expired: dict[str, pa.Table]


@dataclass(frozen=True)
class GroupsSnapshot:
    """The counted consumer groups of a queue at one moment: each one's consumed messages, and the
    messages of every group's plans not yet consumed (``origin``/``row``/``count`` ranges)."""

    groups: list[str]
    consumed: dict[str, pa.Table]
    in_flight: pa.Table

    def require(self, queue: str, consumer: str) -> None:
        """Refuse (2085) a question about a group the queue does not have: a misspelt group must not
        be answered with a number."""
        if consumer not in self.groups:
            raise MQError(
                f"queue {queue} has no consumer group {consumer!r}; its groups: {', '.join(self.groups) or 'none'} "
                "(a group exists once declared, or once it first reads)",
                Reason.MQRC_UNKNOWN_OBJECT_NAME,
            )


def _lease_row(consumer: str, owner: str, timeout: timedelta) -> pa.Table:
    """A lease record; its ``count`` is the holder's lease timeout in milliseconds, so a reader that
    does not know the holder's timeout (a Python get) can tell whether the lease lapsed."""
    row = event_rows(consumer, owner, "lease")
    index = STATE_SCHEMA.get_field_index("count")
    milliseconds = pa.array([timeout // timedelta(milliseconds=1)], pa.int64())
    return row.set_column(index, STATE_SCHEMA.field(index), milliseconds)


class ConsumerState:
    """The state table of one queue. Open it with the queue manager root and the (local) queue name.

    The table is opened once and brought up to date incrementally, and so are its rows: only the
    data files added since the last look are read. One instance per thread.
    """

    def __init__(
        self, root: str, queue: str, storage_options: store.StorageOptions = None, location: str | None = None
    ) -> None:
        self.root = root
        self.queue = queue
        self.location = location or store.state_location(root, queue)
        self.storage_options = storage_options
        self._table: DeltaTable | None = None
        # The rows of each live data file read so far, and of the whole table at ``_rows_version``.
        self._files: dict[str, pa.Table] = {}
        self._rows = STATE_SCHEMA.empty_table()
        self._rows_version = -1
        self._pinned = self._current = False
        self._compaction_due = False
        # How many times rows seen before went (a compaction, a group deleted) or the table was
        # opened anew (deleted and created again): what was derived from them may be out of date.
        self.rewrites = 0
        # Answers derived from the rows (see :meth:`derived`), and the rows they were derived from.
        self._derived: dict[tuple, Any] = {}
        self._derived_from: tuple[int, int] = (-1, -1)

    def reopened(self) -> ConsumerState:
        """The same state table with a handle of its own: a DeltaTable is not shared between threads."""
        return ConsumerState(self.root, self.queue, self.storage_options, self.location)

    def table(self) -> DeltaTable | None:
        """The table at its latest version, None when there is none (yet, or any more). Inside
        :meth:`pinned`, the version of the first look, until this instance commits."""
        if self._table is not None:
            if self._pinned and self._current:
                return self._table
            seen = self._table.version()
            # Two file lookups, where updating the handle lists the whole log.
            if not store.version_exists(self.location, seen + 1) and store.version_exists(self.location, seen):
                self._current = self._pinned
                return self._table
            try:
                self._table.update_incremental()
                # A table deleted with its queue may have no newer entry, and no error says so.
                if self._table.version() > seen or store.version_exists(self.location, seen):
                    self._current = self._pinned
                    return self._table
            except Exception:  # noqa: BLE001 - deleted with its queue, or recreated: open it afresh
                pass
            self._table = None
            self.rewrites += 1
        self._table = store.open_table(self.location, self.storage_options)
        self._current = self._pinned and self._table is not None
        # A table opened anew may be a new table at a version the rows were kept for.
        self._rows_version = -1
        return self._table

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Answer the questions asked inside from one look at the table, taken again after this
        instance's own commits: a planning step asks several questions of the same version, and each
        look lists the table's log."""
        outer = self._pinned
        self._pinned, self._current = True, self._current and outer
        try:
            yield
        finally:
            self._pinned = outer
            self._current = self._current and outer

    def created(self) -> None:
        """Create the table when there is none yet. A look inside :meth:`pinned` holds only once
        there is a table: without one, every question would look again and might see commits the
        earlier answers did not."""
        self._table_or_create()

    def _table_or_create(self) -> DeltaTable:
        table = self.table()
        if table is not None:
            return table
        try:
            store.create_table(
                self.location, STATE_SCHEMA, self.storage_options, configuration=STATE_TABLE_CONFIGURATION
            )
        except Exception:
            # Another consumer created it first.
            if self.table() is None:
                raise
        table = self.table()
        if table is None:
            # Deleted with its queue right after it was created.
            raise MQError(f"queue {self.queue}: its state table was deleted", Reason.MQRC_Q_DELETED)
        return table

    def rows(self) -> pa.Table:
        """Every row of the table at its latest version, in no particular order (none without a table).

        Between compactions the table only grows by appends, so only the files added since the last
        call are read; a planner asks several questions of the same version per micro-batch."""
        table = self.table()
        if table is None:
            self._files, self._rows, self._rows_version = {}, STATE_SCHEMA.empty_table(), -1
            return self._rows
        version = table.version()
        if version != self._rows_version:
            files = {}
            for path in store.live_paths(table):
                known = self._files.get(path)
                files[path] = (
                    known if known is not None else store.read_data_file(self.location, path).cast(STATE_SCHEMA)
                )
            if not self._files.keys() <= files.keys() and not self._compacted_since(self._rows_version, version):
                self.rewrites += 1
            self._files = files
            self._rows = (
                pa.concat_tables(list(files.values())).combine_chunks() if files else STATE_SCHEMA.empty_table()
            )
            self._rows_version = version
        return self._rows

    def _compacted_since(self, seen: int, version: int) -> bool:
        """Whether every rewrite after version ``seen`` up to ``version`` was a compaction, which
        changes how the rows say things but not what they say."""
        if seen < 0 or version - seen > _COMPACTIONS_READ:
            return False
        try:
            operations = store.commit_operations(self.location, seen + 1, version)
        except store.LogEntryGone:
            return False
        return DELETE_OPERATION not in operations

    def derived(self, key: tuple, compute: Callable[[], _Derived]) -> _Derived:
        """``compute()``, kept until the rows change: for questions a step asks more than once."""
        self.rows()
        seen = (self._rows_version, self.rewrites)
        if seen != self._derived_from:
            self._derived, self._derived_from = {}, seen
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]

    def events(
        self,
        consumer: str,
        events: tuple[str, ...] | None = None,
        columns: list[str] | None = None,
        plan_id: str | None = None,
        since: datetime | None = None,
    ) -> pa.Table:
        """The group's recorded rows (of the given ``events``, of one plan, recorded at or after
        ``since``), in no particular order."""
        rows = self.rows()
        # Compute kernels on the columns: a filter expression would start an Acero plan per question.
        mask = pc.equal(rows["consumer"], consumer)
        if events is not None:
            mask = pc.and_(mask, pc.is_in(rows["event"], pa.array(events, pa.string())))
        if plan_id is not None:
            mask = pc.and_(mask, pc.fill_null(pc.equal(rows["plan_id"], plan_id), False))
        if since is not None:
            mask = pc.and_(mask, pc.greater_equal(rows["at"], pa.scalar(since, TIMESTAMP)))
        rows = rows.filter(mask)
        return rows.select(columns) if columns is not None else rows

    def groups(self) -> list[str]:
        """The consumer groups that count for the queue's depth, by name: those with records in the
        table (they have read the queue, or were declared on it)."""
        return sorted(pc.unique(self.rows()["consumer"]).to_pylist())

    def idle_groups(self, expiry: timedelta, now: datetime) -> dict[str, datetime]:
        """The groups with nothing recorded for longer than ``expiry``, with their newest record's time.
        Every read, lease renewal and declaration is a record, and compaction keeps the newest time."""
        newest = self.rows().group_by("consumer", use_threads=False).aggregate([("at", "max")])
        return {
            consumer: at
            for consumer, at in zip(newest["consumer"].to_pylist(), newest["at_max"].to_pylist(), strict=True)
            if at < now - expiry
        }

    def consumed_plans(self, consumer: str) -> pa.Array:
        ids = self.events(consumer, ("consumed",), ["plan_id"])["plan_id"]
        return pc.unique(ids.combine_chunks() if ids.num_chunks else pa.array([], pa.string()))

    def consumed_ranges(self, consumer: str) -> pa.Table:
        """``origin``, ``row`` and ``count`` of the messages the group has consumed or discarded."""
        return consumed_of(self.events(consumer, ("plan", "checkpoint", "consumed", "move", "backout", "return")))

    def all_groups(self) -> GroupsSnapshot:
        """Every counted group's consumed messages, and the messages of plans not yet consumed (which a
        replay may still deliver), from one read of the table; kept until the rows change."""
        return self.derived(("all_groups",), self._all_groups)

    def _all_groups(self) -> GroupsSnapshot:
        rows = self.rows()
        groups = sorted(pc.unique(rows["consumer"]).to_pylist())
        consumed = {g: consumed_of(rows.filter(pc.equal(rows["consumer"], g))) for g in groups}
        # Plans after a group's last consumed one may still run; earlier ones were rolled back.
        in_flight = []
        for group in groups:
            mine = rows.filter(pc.equal(rows["consumer"], group))
            event = mine["event"]
            done = mine.filter(pc.is_in(event, pa.array(["consumed", "checkpoint"])))
            abandoned = mine.filter(pc.equal(event, "abandoned"))["plan_id"]
            position = pc.max(done["seq"]).as_py()
            waiting = pc.and_(pc.equal(event, "plan"), pc.invert(pc.is_in(mine["plan_id"], done["plan_id"])))
            if position is not None:
                # A Python get's claim holds its messages until it is consumed or rolled back.
                waiting = pc.and_(waiting, pc.or_(pc.greater(mine["seq"], position), claims_of(mine)))
            ended = pa.concat_arrays([done["plan_id"].combine_chunks(), abandoned.combine_chunks()])
            moving = pc.and_(pc.equal(event, "move"), pc.invert(pc.is_in(mine["plan_id"], ended)))
            in_flight.append(mine.filter(pc.or_(waiting, moving)).select(RANGE_COLUMNS))
        in_flight = pa.concat_tables(in_flight) if in_flight else STATE_SCHEMA.empty_table().select(RANGE_COLUMNS)
        return GroupsSnapshot(groups, consumed, in_flight)

    def declare(self, consumer: str) -> None:
        """Make ``consumer`` a counted group of the queue before it first reads: the messages put from
        now on wait for it. A group that exists already is left as it is."""
        if consumer not in self.groups():
            self.append(event_rows(consumer, "", "declare"))

    def delete(self, consumer: str, timeout: timedelta) -> None:
        """Remove the group and everything recorded for it, which releases its messages. Refused
        (2042) while a query of the group holds its lease, and (2085) for a group that does not exist."""
        for _ in range(_ATTEMPTS):
            table = self.table()
            # Without a table there are no groups (one created after this look was not there to delete).
            if table is None or consumer not in self.groups():
                raise MQError(
                    f"queue {self.queue}: consumer group {consumer!r} does not exist", Reason.MQRC_UNKNOWN_OBJECT_NAME
                )
            holder = self.lease(consumer, timeout)
            if holder is not None:
                raise MQError(
                    f"queue {self.queue}: consumer group {consumer!r} is being read by a running query; stop it first",
                    Reason.MQRC_OBJECT_IN_USE,
                )
            rows = self.rows()
            if self._overwrite(table, rows.filter(pc.not_equal(rows["consumer"], consumer)), DELETE_OPERATION):
                return
        raise MQError(f"queue {self.queue}: deleting consumer group {consumer!r} gave up", Reason.MQRC_BACKED_OUT)

    def plan(self, consumer: str, plan_id: str) -> pa.Table:
        """The ranges of one recorded plan (a duplicate recording of the same plan counts once)."""
        rows = self.events(consumer, ("plan",), plan_id=plan_id)
        return (
            rows.select([*RANGE_COLUMNS, "delivery_seq", "partition"])
            .group_by(KEY_COLUMNS, use_threads=False)
            .aggregate([("count", "first"), ("delivery_seq", "first"), ("partition", "first")])
            .rename_columns([*RANGE_COLUMNS, "delivery_seq", "partition"])
        )

    def last_position(self, consumer: str) -> tuple[int, int]:
        """The group's last plan sequence number and the next ``delivery_seq`` (0, 0 for a new group)."""
        return position_of(self.events(consumer, ("plan", "checkpoint"), ["event", "seq", "count", "delivery_seq"]))

    def consumed_position(self, consumer: str) -> tuple[int, int]:
        """Like :meth:`last_position`, counting only the plans that were consumed."""
        rows = self.events(
            consumer, ("plan", "checkpoint", "consumed"), ["event", "plan_id", "seq", "count", "delivery_seq"]
        )
        event = rows["event"]
        done = rows.filter(pc.equal(event, "consumed"))["plan_id"]
        consumed_plans = pc.and_(pc.equal(event, "plan"), pc.is_in(rows["plan_id"], value_set=done))
        return position_of(rows.filter(pc.or_(consumed_plans, pc.equal(event, "checkpoint"))))

    def current_plan(self, consumer: str) -> tuple[str | None, str, pa.Table | None]:
        """The last plan a streaming query of the group recorded, when it is not consumed yet (the
        batch being processed): its id, its owner and its ranges; (None, "", None) when there is
        none. Python gets' plans are claims (see :meth:`claims`), not batches."""
        rows = self.events(consumer, ("plan", "consumed", "checkpoint"), ["event", "plan_id", "seq", "owner"])
        queries = pc.invert(pc.starts_with(rows["owner"], GET_OWNER))
        plans = rows.filter(pc.and_(pc.equal(rows["event"], "plan"), queries))
        if plans.num_rows == 0:
            return None, "", None
        last = plans.take(pc.sort_indices(plans, [("seq", "descending")]))
        plan_id, owner, seq = (last[name][0].as_py() for name in ("plan_id", "owner", "seq"))
        done = rows.filter(pc.not_equal(rows["event"], "plan"))
        position = pc.max(done["seq"]).as_py()
        if plan_id in done["plan_id"].to_pylist() or (position is not None and seq <= position):
            return None, "", None
        return plan_id, owner, self.plan(consumer, plan_id)

    def claims(self, consumer: str, lock: timedelta, now: datetime | None = None) -> Claims:
        """The group's claims: plans of Python gets (owner :data:`GET_OWNER` ...) neither consumed nor
        rolled back. A claim's lock runs ``lock`` from its plan's or its newest ``renew`` record."""
        rows = self.events(consumer, ("plan", "consumed", "rollback", "renew"), ["event", "plan_id", "owner", "at"])
        event = rows["event"]
        consumed = rows.filter(pc.equal(event, "consumed"))["plan_id"]
        open_ = rows.filter(pc.and_(claims_of(rows), pc.invert(pc.is_in(rows["plan_id"], value_set=consumed))))
        ids = pc.unique(open_["plan_id"])
        stamps = rows.filter(
            pc.and_(pc.is_in(event, pa.array(["plan", "renew"])), pc.is_in(rows["plan_id"], value_set=ids))
        )
        newest = stamps.group_by("plan_id", use_threads=False).aggregate([("at", "max")])
        expiry = pc.add(newest["at_max"], pa.scalar(lock, pa.duration("us")))
        locked = pc.greater(expiry, pa.scalar(now or datetime.now(UTC), TIMESTAMP))
        live_ids = newest["plan_id"].filter(locked)
        plans = self.events(consumer, ("plan",))
        live = plans.filter(pc.is_in(plans["plan_id"], value_set=live_ids))
        at = pc.index_in(live["plan_id"], value_set=newest["plan_id"])
        live = live.select([*RANGE_COLUMNS, "plan_id", "owner", "seq"]).append_column("expiry", expiry.take(at))
        lapsed = newest["plan_id"].filter(pc.invert(locked)).to_pylist()
        return Claims(live, {plan_id: self.plan(consumer, plan_id) for plan_id in lapsed})

    def pending_moves(self, consumer: str) -> pa.Table:
        """The group's ``move`` rows whose move is not finished (no ``consumed`` record yet)."""
        rows = self.events(consumer, ("move", "consumed", "abandoned"))
        done = rows.filter(pc.not_equal(rows["event"], "move"))["plan_id"]
        moves = rows.filter(pc.equal(rows["event"], "move"))
        return moves.filter(pc.invert(pc.is_in(moves["plan_id"], value_set=done)))

    def append(self, rows: pa.Table, check: Callable[[], None] | None = None) -> None:
        """Append rows; concurrent appends of other processes are fine, so conflicts just retry. With
        ``check``, only once it passes (it raises to refuse), at exactly the version it checked."""
        self._commit(rows.cast(STATE_SCHEMA), check)

    def _commit(self, rows: pa.Table, check: Callable[[], None] | None) -> None:
        """Append ``rows`` once ``check`` passes, at exactly the version it was checked against.
        Lease and release records are stamped later than every such record of their groups in the
        table, so the newest by time is the last committed (see :meth:`_stamped`)."""
        for _ in range(_ATTEMPTS):
            try:
                # One look for the stamp and the first check: were it stale, the commit at the version
                # after it fails, and the next attempt looks again.
                with self.pinned():
                    self._commit_stamped(rows, check)
                return
            except _OutOfOrder:
                continue
        raise MQError(f"queue {self.queue}: state commit gave up after {_ATTEMPTS} conflicts", Reason.MQRC_BACKED_OUT)

    def _commit_stamped(self, rows: pa.Table, check: Callable[[], None] | None) -> None:
        self._table_or_create()
        rows, stamp = self._stamped(rows)
        file = store.write_data_file(self.location, rows.to_batches(), STATE_SCHEMA)
        if file is None:
            return
        consumers = pc.unique(rows["consumer"])

        def prepare(attempt: int) -> Callable[[], int]:
            if attempt:
                self._current = False
            # The checks and the commit see one version: a look in between would move the table on.
            with self.pinned():
                table = self._table_or_create()
                if check is not None:
                    check()
                # The first attempt checks the look the stamp was taken from; a later one looks anew.
                if attempt and stamp is not None and self._newest_lease_record(consumers) >= stamp:
                    # A lease record committed after this one was stamped: stamp it again.
                    raise _OutOfOrder(f"queue {self.queue}: a lease record was stamped out of order")
            return lambda: store.commit_files(table, [file], STATE_SCHEMA)

        version = store.commit_until_landed(
            self.location,
            [file],
            prepare,
            _ATTEMPTS,
            f"queue {self.queue}: state commit gave up after {_ATTEMPTS} conflicts",
        )
        self._current = False
        if version is not None and (version % COMPACT_EVERY == 0 or self._compaction_due):
            # A compaction that lost to a concurrent commit (a lease renewal) is tried again at this
            # instance's next commit, not a hundred versions later. The commit landed: nothing the
            # compaction after it raises may report it failed (a caller would redo what is done).
            try:
                self._compaction_due = not self.compact()
            except Exception as error:  # noqa: BLE001 - logged; the next commit compacts again
                _log.warning("queue %s: compaction of the state table failed: %s", self.queue, error)
                self._compaction_due = True

    def _stamped(self, rows: pa.Table) -> tuple[pa.Table, datetime | None]:
        """``rows`` with their lease and release records stamped now, or just after the newest such
        record of their groups when that is later (another process's clock may run ahead), and the
        stamp; (rows, None) when they hold none.

        A group's holder is its newest lease record by time, but a record is stamped before it
        commits: a lease taken with a stamp older than a release committed meanwhile would look
        released, and a second reader would take the group too."""
        leases = pc.is_in(rows["event"], pa.array(LEASE_EVENTS))
        if not pc.any(leases).as_py():
            return rows, None
        newest = self._newest_lease_record(pc.unique(rows["consumer"]))
        stamp = max(datetime.now(UTC), newest + timedelta(microseconds=1))
        at = pc.if_else(leases, pa.scalar(stamp, TIMESTAMP), rows["at"])
        index = STATE_SCHEMA.get_field_index("at")
        return rows.set_column(index, STATE_SCHEMA.field(index), at), stamp

    def _newest_lease_record(self, consumers: pa.Array) -> datetime:
        """The time of the newest lease or release record of any of ``consumers`` (the epoch: none)."""
        rows = self.rows()
        mine = pc.and_(pc.is_in(rows["consumer"], consumers), pc.is_in(rows["event"], pa.array(LEASE_EVENTS)))
        return pc.max(rows["at"].filter(mine)).as_py() or datetime.fromtimestamp(0, UTC)

    def compact(self, live: pa.Array | None = None, seen_version: int = -1) -> bool:
        """Rewrite the table in its compact form (see :func:`compact_rows`) in one commit at exactly the
        next version; False when a concurrent commit got in first (a later compaction does it).

        With ``live`` (the origins of the queue's live messages at version ``seen_version``), consumed
        ranges of messages no longer in the queue table are dropped: maintenance removed them, so
        they can never be delivered again. Log entries and files it replaces stay for readers still on
        an older version (:data:`STATE_RETENTION`, :data:`STATE_FILE_RETENTION`)."""
        table = self.table()
        if table is None:
            return False
        forget = None
        if live is not None:

            def forget(ranges: pa.Table) -> pa.Array:
                gone = pc.invert(pc.is_in(ranges["origin"], value_set=live))
                return pc.and_(gone, pc.less_equal(origin_versions(ranges["origin"]), seen_version))

        compacted = compact_rows(self.rows(), forget)
        if not self._overwrite(table, compacted, "compact"):
            return False
        table = self.table()
        if table is None:
            return True  # deleted with its queue since: nothing is left to clean up
        if table.version() % (COMPACT_EVERY * TRIM_EVERY) >= COMPACT_EVERY:
            # A reader opens at the newest checkpoint and reads the entries after it.
            table.create_checkpoint()
        else:
            try:
                store.trim_history(table, table.version(), int(STATE_RETENTION.total_seconds()))
            except Exception as error:  # noqa: BLE001 - a trim beside this one got in first; the next one trims
                _log.info("queue %s: trimming the state table's history: %s", self.queue, error)
        return True

    def _overwrite(self, table: DeltaTable, rows: pa.Table, operation: str) -> bool:
        """Replace the table's rows in one commit (recorded as ``operation``) at exactly the version
        after ``table``'s; False when a concurrent commit got in first."""
        file = store.write_data_file(self.location, rows.cast(STATE_SCHEMA).to_batches(), STATE_SCHEMA)
        self._current = False
        try:
            store.commit_files(
                table,
                [file] if file is not None else [],
                STATE_SCHEMA,
                metadata={"mqspark.operation": operation},
                overwrite=True,
            )
        except CommitFailedError:
            if file is not None:
                store.remove_data_files(self.location, [file])
            return False
        return True

    def lease(self, consumer: str, timeout: timedelta | None, now: datetime | None = None) -> Lease | None:
        """The live lease of the group: the owner of the newest lease record, unless that record is
        a release or older than ``timeout`` (leases are renewed by new records, see :class:`Heartbeat`).
        ``timeout`` None: the timeout the holder recorded (:data:`DEFAULT_LEASE_TIMEOUT` if none)."""
        rows = self.events(consumer, LEASE_EVENTS, ["owner", "event", "at", "count"])
        if rows.num_rows == 0:
            return None
        latest = rows.take(pc.sort_indices(rows, [("at", "descending")]))
        owner, event, seen, recorded = (latest[name][0].as_py() for name in ("owner", "event", "at", "count"))
        if timeout is None:
            timeout = timedelta(milliseconds=recorded) if recorded is not None else DEFAULT_LEASE_TIMEOUT
        if event == "release" or seen < (now or datetime.now(UTC)) - timeout:
            return None
        return Lease(owner, seen)

    def acquire(
        self,
        consumer: str,
        owner: str,
        timeout: timedelta,
        patience: timedelta = timedelta(0),
        lock: timedelta | None = None,
    ) -> None:
        """Take the group's lease for ``owner``, refused (2042) while another live reader holds it.
        With ``lock`` (the queue's lock duration), also while Python gets' claims are locked (see
        :meth:`claims`): their end is awaited for up to ``patience``.

        The check and the lease record commit at exactly the next version, so of two readers
        starting at once only one gets the lease.
        """
        deadline = time.monotonic() + patience.total_seconds()

        def check() -> None:
            holder = self.lease(consumer, timeout)
            if holder is None and lock is not None:
                live = self.claims(consumer, lock).live
                if live.num_rows:
                    holder = Lease(live["owner"][0].as_py(), live["expiry"][0].as_py() - lock)
            if holder is not None and holder.owner != owner:
                if holder.owner.startswith(GET_OWNER):
                    raise HeldByGet(holder)
                age = (datetime.now(UTC) - holder.seen).total_seconds()
                raise MQError(
                    f"queue {self.queue}: consumer group {consumer!r} is already being read by a running query "
                    f"(last seen {age:.1f} s ago); stop it, wait {timeout.total_seconds():g} s after it died, "
                    "or read with another consumer",
                    Reason.MQRC_OBJECT_IN_USE,
                )

        while True:
            try:
                self._commit(_lease_row(consumer, owner, timeout), check)
                return
            except HeldByGet as held:
                if time.monotonic() >= deadline:
                    raise MQError(
                        f"queue {self.queue}: consumer group {consumer!r} has messages claimed by a Python get "
                        f"(owner {held.holder.owner}) for longer than {patience.total_seconds():g} s",
                        Reason.MQRC_OBJECT_IN_USE,
                    ) from None
                time.sleep(LEASE_POLL)

    def renew(self, consumer: str, owner: str, timeout: timedelta) -> None:
        """Renew ``owner``'s lease of the group; refused (2042) once another owner holds it. The check
        and the renewal commit at exactly the next version, so a reader that was paused past its
        timeout cannot renew over a reader that took the group over meanwhile, nor renew a lease it
        released (its heartbeat may be late)."""

        def check() -> None:
            holder = self.lease(consumer, _FOREVER)
            if holder is None or holder.owner != owner:
                taken = f"was taken over by {holder.owner}" if holder is not None else f"was released by {owner}"
                raise MQError(f"queue {self.queue}: consumer group {consumer!r} {taken}", Reason.MQRC_OBJECT_IN_USE)

        self._commit(_lease_row(consumer, owner, timeout), check)

    def release(self, consumer: str, owner: str) -> None:
        """Release ``owner``'s lease of the group; nothing when another owner holds it (the check and
        the release commit at exactly the next version)."""

        def check() -> None:
            holder = self.lease(consumer, _FOREVER)
            if holder is None or holder.owner != owner:
                raise _NotHeld(f"queue {self.queue}: consumer group {consumer!r} is not held by {owner}")

        holder = self.lease(consumer, _FOREVER)
        if holder is not None and holder.owner == owner:
            try:
                self._commit(event_rows(consumer, owner, "release"), check)
            except _NotHeld:
                pass
