"""Slot ownership without a session: leases in a table, for relays behind a transaction pooler.

Behind PgBouncer in transaction mode a backend serves this relay for one transaction, then
others: a session advisory lock would stay on a backend after the relay is gone, and a
``LISTEN`` would hear nothing. So ownership is data, as River and Oban keep it where there is
no session: each live relay renews a row of ``T_relays`` and the rows of ``T_leases`` for the
slots it holds, ``ttl`` seconds ahead in the database's clock. A slot whose lease expired
may be taken by any relay (the upsert re-checks the expiry on the row it locks, so two
relays never both take it). A relay that dies stops renewing; its slots are free once its
leases expire. Each relay keeps ``ceil(SLOTS / live relays)`` slots, as with the locks.

The claim itself checks the lease (:meth:`LeaseOwner.claim_condition`): only rows of slots
this relay holds for at least ``ttl / 2`` more seconds are claimed, in the claim's own
statement, so a relay whose renewals stopped reaching the database publishes nothing once
its leases run short, and a batch is sent well before another relay may take its slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg

from ..errors import ConfigurationError
from ..shared.pooler import Pooler, connect
from .admin import locking_relays
from .table import SLOTS, OutboxTable

log = logging.getLogger("consumerkit.outbox")

DEFAULT_TTL = 15.0


def mixed(table: OutboxTable) -> ConfigurationError:
    """Relays holding slots by session locks and by leases would not see each other's."""
    return ConfigurationError(
        f"relays of outbox {table.schema}.{table.table} hold slots both by session locks and "
        "by leases: run every relay of one outbox with the same Postgres(pooler=...) "
        "(CONSUMERKIT_POSTGRES_POOLER, --postgres-pooler): transaction, or none / session")


class LeaseOwner:
    """A relay's slots held as leases; the same surface as :class:`~.slots.SlotOwner`."""

    def __init__(self, dsn: str, table: OutboxTable, *, name: str, pooler: Pooler,
                 ttl: float = DEFAULT_TTL) -> None:
        self._dsn = dsn
        self._table = table
        self._name = name
        self._pooler: Pooler = pooler
        self.ttl = ttl
        # unique per run: a restarted relay of the same name never inherits live leases
        self.holder = f"{name}/{uuid.uuid4().hex[:12]}"
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        self._valid_until = 0.0  # monotonic: when the last renewal's leases run short
        self.owned: frozenset[int] = frozenset()
        self.members = 0
        t = table
        self._join = f"""
            INSERT INTO {t.members} (holder, expires_at)
            VALUES ($1, now() + $2 * interval '1 second')
            ON CONFLICT (holder) DO UPDATE SET expires_at = excluded.expires_at"""
        self._count = f"SELECT count(*) FROM {t.members} WHERE expires_at > now()"
        self._renew = f"""
            UPDATE {t.leases} SET expires_at = now() + $2 * interval '1 second'
            WHERE holder = $1 AND expires_at > now() RETURNING slot"""
        self._release = f"DELETE FROM {t.leases} WHERE holder = $1 AND slot = ANY($2::int[])"
        # free: no lease, or an expired one; the upsert's WHERE re-checks on the locked row
        self._take = f"""
            INSERT INTO {t.leases} AS l (slot, holder, expires_at)
            SELECT s, $1, now() + $2 * interval '1 second'
            FROM unnest($3::int[]) WITH ORDINALITY AS c(s, o)
            WHERE NOT EXISTS (SELECT 1 FROM {t.leases} x
                              WHERE x.slot = c.s AND x.expires_at > now())
            ORDER BY o LIMIT $4
            ON CONFLICT (slot) DO UPDATE SET holder = excluded.holder,
                expires_at = excluded.expires_at
            WHERE l.expires_at <= now()
            RETURNING slot"""
        self._leave = [f"DELETE FROM {t.leases} WHERE holder = $1",
                       f"DELETE FROM {t.members} WHERE holder = $1"]

    @property
    def healthy(self) -> bool:
        """Whether the last renewal is recent enough for the leases to be trusted."""
        return (self._conn is not None and not self._conn.is_closed()
                and time.monotonic() < self._valid_until)

    def claim_condition(self, events: str, holder: str, margin: str) -> str:
        """The SQL that keeps a claim to rows of slots leased to ``holder`` (a parameter)
        for ``margin`` (a parameter, seconds) more at least."""
        # OFFSET 0 keeps the EXISTS a per-row filter: pulled up into a join, it made the
        # planner join the whole backlog with the leases and sort it before the LIMIT, 50
        # times slower than the scan in seq order that stops at the LIMIT
        return (f"EXISTS (SELECT 1 FROM {self._table.leases} l WHERE l.slot = {events}.slot "
                f"AND l.holder = {holder} AND l.expires_at > now() + {margin} * "
                "interval '1 second' OFFSET 0)")

    async def connect(self) -> None:
        await self.close()
        self._conn = await connect(self._dsn, pooler=self._pooler,
                                   application_name=f"consumerkit-relay {self._name}")

    async def rebalance(self) -> frozenset[int]:
        """Renew membership and leases, release slots beyond the fair share, take expired or
        free ones up to it: one transaction."""
        if self._conn is None or self._conn.is_closed():
            self.owned = frozenset()
            await self.connect()
        assert self._conn is not None
        started = time.monotonic()
        if await locking_relays(self._conn, self._table):
            raise mixed(self._table)
        async with self._conn.transaction():
            await self._conn.execute(self._join, self.holder, self.ttl)
            self.members = max(1, await self._conn.fetchval(self._count))
            fair = math.ceil(SLOTS / self.members)
            owned = {r["slot"] for r in await self._conn.fetch(self._renew, self.holder,
                                                                 self.ttl)}
            if len(owned) > fair:
                extra = sorted(owned)[fair:]
                await self._conn.execute(self._release, self.holder, extra)
                owned -= set(extra)
            elif len(owned) < fair:
                start = random.randrange(SLOTS)
                candidates = [(start + i) % SLOTS for i in range(SLOTS)
                              if (start + i) % SLOTS not in owned]
                taken = await self._conn.fetch(self._take, self.holder, self.ttl, candidates,
                                               fair - len(owned))
                owned |= {r["slot"] for r in taken}
        # trusted until half the lease is gone, measured from before the renewal was sent
        self._valid_until = started + self.ttl / 2
        if owned != self.owned:
            log.info("outbox relay %s leases %d of %d slots (%d relays)", self._name,
                     len(owned), SLOTS, self.members)
        self.owned = frozenset(owned)
        return self.owned

    @contextlib.asynccontextmanager
    async def kept(self) -> AsyncIterator[None]:
        """Renew the leases every quarter of their time to live while the body runs (a batch
        being sent, however long the broker takes): they never run short under a relay that
        still reaches the database, so no other relay takes its slots mid-send."""
        done = asyncio.Event()
        keeper = asyncio.create_task(self._keep(done), name="consumerkit-relay-leases")
        try:
            yield
        finally:
            done.set()  # the renewal under way, if any, ends before the connection is reused
            await keeper

    async def _keep(self, done: asyncio.Event) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ttl / 4):
                    await done.wait()
                    return
            await self.renew()

    async def renew(self) -> None:
        """Extend the membership and the leases still held; a lease lost meanwhile (it had
        expired and another relay took it) leaves :attr:`owned`. A failure is logged: the
        leases then run short by themselves, and the claim stops."""
        conn = self._conn
        if conn is None or conn.is_closed():
            return
        started = time.monotonic()
        try:
            async with conn.transaction():
                await conn.execute(self._join, self.holder, self.ttl)
                kept = {r["slot"] for r in await conn.fetch(self._renew, self.holder,
                                                             self.ttl)}
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("outbox relay %s could not renew its leases: %r", self._name, exc)
            return
        self._valid_until = started + self.ttl / 2
        self.owned = self.owned & kept

    async def close(self) -> None:
        """Give the leases back (the other relays take them at their next rebalance)."""
        conn, self._conn = self._conn, None
        self.owned = frozenset()
        self._valid_until = 0.0
        if conn is None or conn.is_closed():
            return
        try:
            async with conn.transaction():
                for statement in self._leave:
                    await conn.execute(statement, self.holder)
            await conn.close(timeout=5)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            conn.terminate()  # the leases expire by themselves
