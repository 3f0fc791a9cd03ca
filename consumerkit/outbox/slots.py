"""Slot ownership: which relay publishes which aggregates.

Aggregates hash into :data:`~consumerkit.outbox.table.SLOTS` slots; a relay owns a slot by
holding a session advisory lock on it, on one dedicated connection. Every live relay also
holds a shared "member" lock on that connection, so counting that lock's holders in
``pg_locks`` counts the live relays. Each relay keeps its fair share,
``ceil(SLOTS / members)``: it releases extra slots and takes free ones. A relay that dies
loses its connection, and with it every lock: its slots are free at once.

The same connection LISTENs for the writers' notifications.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
from collections.abc import AsyncIterator, Callable

import asyncpg

from ..shared.pooler import Pooler, connect
from .admin import leasing_relays, locking_relays
from .leases import mixed
from .table import SLOTS, OutboxTable

log = logging.getLogger("consumerkit.outbox")


class SlotOwner:
    """The relay's lock connection and the slots it holds."""

    def __init__(self, dsn: str, table: OutboxTable, *, name: str,
                 on_notify: Callable[[], None] | None, pooler: Pooler = "none") -> None:
        self._dsn = dsn
        self._pooler: Pooler = pooler
        self._table = table
        self._name = name
        self._on_notify = on_notify
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        self.owned: frozenset[int] = frozenset()
        self.members = 0

    @property
    def healthy(self) -> bool:
        """Whether the lock connection is open: if not, no slot is owned any more."""
        return self._conn is not None and not self._conn.is_closed()

    async def connect(self) -> None:
        await self.close()
        conn = await connect(self._dsn, pooler=self._pooler,
                             application_name=f"consumerkit-relay {self._name}")
        try:
            await conn.execute("SELECT pg_advisory_lock_shared($1, $2)",
                               *self._table.members_lock)
            if self._on_notify is not None:
                await conn.add_listener(self._table.channel, self._notified)
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn

    def _notified(self, *_: object) -> None:
        if self._on_notify is not None:
            self._on_notify()

    async def rebalance(self) -> frozenset[int]:
        """Count the live relays, release slots beyond the fair share, take free ones up to
        it. Call it between batches only: a released slot's rows may go to another relay."""
        if not self.healthy:
            self.owned = frozenset()
            await self.connect()
        assert self._conn is not None
        if await leasing_relays(self._conn, self._table):
            raise mixed(self._table)
        self.members = max(1, await locking_relays(self._conn, self._table))
        cls = self._table.lock_class
        fair = math.ceil(SLOTS / self.members)
        owned = set(self.owned)
        if len(owned) > fair:
            extra = sorted(owned)[fair:]
            await self._conn.execute(
                "SELECT pg_advisory_unlock($1, s) FROM unnest($2::int[]) AS s", cls, extra)
            owned -= set(extra)
        elif len(owned) < fair:
            start = random.randrange(SLOTS)
            candidates = [(start + i) % SLOTS for i in range(SLOTS)]
            taken = await self._conn.fetch(
                """SELECT s FROM unnest($2::int[]) WITH ORDINALITY AS c(s, o)
                   WHERE pg_try_advisory_lock($1, s) LIMIT $3""",
                cls, [s for s in candidates if s not in owned], fair - len(owned))
            owned |= {r["s"] for r in taken}
        if owned != self.owned:
            log.info("outbox relay %s owns %d of %d slots (%d relays)", self._name,
                     len(owned), SLOTS, self.members)
        self.owned = frozenset(owned)
        return self.owned

    @contextlib.asynccontextmanager
    async def kept(self) -> AsyncIterator[None]:
        """While a batch is sent: session locks stay with the session, nothing to renew."""
        yield

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        self.owned = frozenset()
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=5)
            except (OSError, TimeoutError, asyncpg.PostgresError):
                conn.terminate()
