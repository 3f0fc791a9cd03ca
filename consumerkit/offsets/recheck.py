"""The offsets written with the effects, and the check that the database did not move back.

**What a transaction stores.** Each transaction that settles records of a partition stores,
before its COMMIT, the partition's contiguous watermark as known then, counting its own
records as done (:meth:`Recheck.write`). The row only moves forward (``GREATEST``). Why this
never claims a record that is not durably settled:

- every record below that watermark is either one of the transaction's own (it commits with
  the row, or neither does), or one whose outcome was final before the statement ran: its own
  transaction had committed (PostgreSQL answered its COMMIT), or it went where the database
  is not the record (a dead-letter topic, the dedup cache's answer, a parked key's row
  committed first). A commit that was answered comes before this one in the write-ahead log,
  so a database that keeps this commit keeps those (a standby replays the log in order);
- records of the partition still in flight (other keys, other transactions) sit at or above
  the watermark, so they are not claimed, whichever order the transactions commit in; a
  transaction that commits later with a lower watermark leaves the row as it is.

So a restart that reads the row never skips a settled-looking record that is not: at worst it
reads again records that were applied after the row was written (the dedup rows absorb them).

**The database moved back.** A failover to a standby that missed the last commits, or a
restore, takes effects, dedup rows and offset rows back together, but not the consumer's
memory: its watermarks would go on from where it was, and the records in between would never
be applied. So after any loss of a database connection (:meth:`Recheck.lost`, told by the pool
for every connection closed or opened), the first transaction, before anything else is
applied on any connection, reads the rows of the owned partitions again
(:meth:`Recheck.ready`). Every transaction that settles records of a partition writes its
row, even when the watermark stays, and the row counts those commits; they take the row's lock
in turn, so they commit in the order of their count. A database that lost any commit this
consumer saw answered has lost every later one of that row too, so its count is below the
highest this consumer saw (``commits``). Such a partition (or one whose row is gone, or below
the offset this consumer saw stored) ends its ownership at once, as a revocation does, and is
owned again from the row: its records are read and applied again, in order. The offset alone
would not tell: a transaction whose records sat above a lower one still in flight committed
without moving the row's offset, and the database may have lost it alone.

**The dedup cache.** The cache (Redis) remembers the ids of effects committed on the old
primary; after the database moved back it would answer "applied" for records whose effects
are gone, and they would be lost. So each check also reads the database's timeline
(``epoch``), which a promotion or a point-in-time restore changes, and the cache is asked
only within the current timeline, and not at all while a check is owed.

**Behind a transaction pooler** (PgBouncer's ``pool_mode = transaction``) a failover closes
only the connections of clients in a transaction at that moment: the others' next transaction
reaches the new primary on the same client connection, and no check is owed. So each
transaction that writes a row also compares the row's count of commits with the highest this
consumer saw: a count not above it means the database moved back, and the transaction rolls
back, owing the check (:meth:`Recheck.went_back`), as does the committer's own write of the
watermarks. A partition with nothing more to apply writes no row: for it, the background task
reads the timeline every ``poll`` seconds, and a new one (a promotion) owes the check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from ..shared.failures import ConnectionLost
from ..types import Claim, ClaimStatus, DbConnection
from .postgres import PostgresOffsets
from .state import PartitionState

if TYPE_CHECKING:
    import asyncpg

    from ..engine.decode import Decoded
    from ..observability.observer import Observer
    from ..transport.source import Partition

log = logging.getLogger("consumerkit.consumer")

_RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)  # seconds between checks while the database is away
# the timeline: the first eight hex digits of a WAL file's name
_EPOCH = "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"


class Rewound(ConnectionLost):
    """The records' ownership ended because the database moved back: they are read again
    (judged as the connection loss it follows; the records are abandoned, not failed)."""

    def __init__(self, part: Partition) -> None:
        super().__init__(RuntimeError(
            f"{part[0]}/{part[1]}: the database moved back; the partition is read again"),
            during_handler=False)


class Owner(Protocol):
    """Who owns the partitions (the engine)."""

    @property
    def states(self) -> Mapping[Partition, PartitionState]: ...

    def rewind(self, state: PartitionState, offset: int) -> None:
        """End ``state``'s ownership now, and own its partition again from ``offset``."""


Written = list[tuple[PartitionState, int, int]]
"""Each partition's state, the offset stored and the row's count of commits after it."""


class Recheck:
    """The offsets of a consumer whose database keeps them: written in the effects'
    transactions, and read again after a connection loss (see the module's text)."""

    def __init__(self, store: PostgresOffsets, observe: Observer, *, skip_expired: bool,
                 poll: float | None = None) -> None:
        self.store = store
        self.owner: Owner | None = None  # the engine, once made
        self.observe = observe
        self.skip_expired = skip_expired  # an expired record settles with its claim then
        self._lost = 1  # connection losses told; the first check is owed from the start
        self._checked = 0
        self.epoch = ""  # the database's timeline at the last check (see the module's text)
        self.poll = poll  # seconds between reads of the timeline (behind a transaction pooler)
        self._lock = asyncio.Lock()
        self._wanted = asyncio.Event()
        self._wanted.set()

    def lost(self, *_: object) -> None:
        """A database connection closed or opened: the next transaction checks first."""
        self._lost += 1
        self._wanted.set()

    @property
    def pending(self) -> bool:
        return self._checked < self._lost

    async def ready(self, conn: DbConnection, items: Sequence[Decoded] = ()) -> None:
        """Check on ``conn`` if a check is owed (others wait for it); raise :class:`Rewound`
        if a record of ``items`` belongs to an ownership that ended."""
        while self._checked < self._lost:
            async with self._lock:
                owed = self._lost
                if self._checked < owed:
                    await self._check(conn)
                    self._checked = owed
        if not items or self.owner is None:
            return
        states = self.owner.states
        for decoded in items:
            env = decoded.envelope
            state = states.get((env.topic, env.partition))
            if state is not None and state.rewound:
                raise Rewound((env.topic, env.partition))

    async def _check(self, conn: DbConnection) -> None:
        self.epoch = str(await conn.fetchval(_EPOCH))
        if self.owner is None:
            return
        states = [s for s in list(self.owner.states.values()) if not s.rewound]
        # what was confirmed before the query was sent, which its snapshot holds: a commit
        # answered while it runs may be newer than the rows it returns, and is no loss
        known = [(s.offsets.stored, s.offsets.commits) for s in states]
        rows = await self.store.rows(conn, [s.partition for s in states])
        for state, (stored, commits) in zip(states, known, strict=True):
            part, row = state.partition, rows.get(state.partition)
            if not state.placed:  # its row could not be read when the ownership began
                state.placed = True
                if row is not None:
                    log.info("%s/%d: starting again at the stored offset %d", *part, row[0])
                    self.owner.rewind(state, row[0])
                continue
            if stored is None and commits is None:
                continue  # nothing stored by this ownership yet: nothing it could miss
            if row is not None and (commits is None or row[1] >= commits) and (
                    stored is None or row[0] >= stored):
                continue
            # no row: it went back before the first this ownership found or wrote
            back = row[0] if row is not None else state.start or 0
            position = state.offsets.watermark()
            self.observe.offsets_moved_back(
                part[0], part[1], None if row is None else row[0],
                position if position is not None else back)
            self.owner.rewind(state, back)

    async def write(self, conn: DbConnection, items: Sequence[Decoded],
                    claims: Sequence[Claim]) -> Written:
        """Write, in the transaction open on ``conn``, the row of each partition of the
        records whose outcome commits with it (applied, duplicate, skipped): its watermark,
        and one more commit."""
        own: dict[Partition, list[int]] = {}
        for decoded, claim in zip(items, claims, strict=True):
            if claim.status is ClaimStatus.EXPIRED and not self.skip_expired:
                continue  # bound for the dead letters, after this transaction
            env = decoded.envelope
            own.setdefault((env.topic, env.partition), []).append(env.offset)
        if self.owner is None or not own:
            return []
        offsets: dict[Partition, int] = {}
        outside: list[Partition] = []
        touched: list[PartitionState] = []
        states = self.owner.states
        for part, mine in own.items():
            state = states.get(part)
            if state is None:
                continue  # revoked meanwhile: its new owner reads from the stored offsets
            if state.rewound:
                raise Rewound(part)
            mark = state.offsets.watermark(set(mine))
            if mark is None:
                continue
            offsets[part] = mark
            touched.append(state)
            if state.outside:
                outside.append(part)
        counts = await self.store.write_in(conn, offsets, reset=outside)
        self.went_back(touched, counts)
        return [(s, offsets[s.partition], counts[s.partition]) for s in touched]

    def went_back(self, states: Sequence[PartitionState], counts: Mapping[Partition, int],
                  ) -> None:
        """Raise :class:`Rewound`, owing the check, if a row just written (``counts``, in the
        transaction still open) counts no more commits than this consumer saw answered: the
        database moved back, and no connection of ours closed (behind a transaction pooler a
        failover reaches only the clients in a transaction then). The transaction must roll
        back: it would store a watermark past records whose effects the database lost."""
        for state in states:
            seen, count = state.offsets.commits, counts.get(state.partition)
            if seen is not None and count is not None and count <= seen:
                self.lost()
                raise Rewound(state.partition)

    @staticmethod
    def confirm(written: Written) -> None:
        """The transaction that wrote ``written`` committed."""
        for state, offset, commits in written:
            state.offsets.confirmed(offset, commits)
            state.outside = False

    async def run(self, pool: asyncpg.Pool, stopping: asyncio.Event) -> None:
        """Check after each connection loss even when no record comes to apply: records the
        database lost are applied again without waiting for new ones."""
        failures = 0
        while not stopping.is_set():
            if not await self._woken():
                await self._timeline(pool)
                continue
            self._wanted.clear()
            try:
                async with pool.acquire() as conn:
                    await self.ready(conn)
                failures = 0
            except Exception as exc:  # the database is still away: try again
                if stopping.is_set():  # the stop's doing, or an outage that the draining
                    return  # transactions meet and report themselves: they check first
                (log.warning if failures % 10 == 0 else log.debug)(
                    "reading the stored offsets again failed (%s: %s; %d in a row); retrying",
                    type(exc).__name__, exc, failures + 1)
                await asyncio.sleep(_RETRY_DELAYS[min(failures, len(_RETRY_DELAYS) - 1)])
                failures += 1
                self._wanted.set()

    async def _woken(self) -> bool:
        """Wait until a check is wanted (True), or ``poll`` seconds pass (False)."""
        if self.poll is None:
            await self._wanted.wait()
            return True
        try:
            async with asyncio.timeout(self.poll):
                await self._wanted.wait()
        except TimeoutError:
            return False
        return True

    async def _timeline(self, pool: asyncpg.Pool) -> None:
        """A timeline other than the last check's owes a check (a promotion that closed none
        of this consumer's connections, behind a transaction pooler)."""
        try:
            async with pool.acquire() as conn:
                epoch = str(await conn.fetchval(_EPOCH))
        except Exception:  # the database is away: the transactions meet it and say so
            return
        if self.epoch and epoch != self.epoch:
            log.info("the database's timeline is now %s (was %s): reading the stored offsets "
                     "again", epoch, self.epoch)
            self.lost()
