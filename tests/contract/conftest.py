"""Every dedup store behind one face, so one suite checks them all.

A :class:`Subject` claims the way the consumer does: the cache (if any) is asked before the
transaction, ``claim_many`` is the first statement of a READ COMMITTED transaction on a real
PostgreSQL connection, ``ended`` follows the COMMIT or ROLLBACK, and only committed claims
are remembered by the cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeAlias

import asyncpg
import pytest
import redis.asyncio

from consumerkit import migrate
from consumerkit.dedup import DedupPolicy, InMemoryDedupStore, maintain, store_for
from consumerkit.dedup.memory_cache import MemoryDedupCache
from consumerkit.dedup.postgres import PostgresDedupStore
from consumerkit.dedup.redis import RedisDedupCache
from consumerkit.envelope import Envelope
from consumerkit.types import Claim, ClaimRequest, ClaimStatus, DedupStore

Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record]"
Connect: TypeAlias = Callable[[], Awaitable[Conn]]

NAMESPACE = "billing"
RETENTION = timedelta(days=7)
SKEW = timedelta(hours=1)
KINDS = ["partitioned", "table", "memory", "redis", "memory-cache"]


def envelope(event_id: str, event_time: datetime | None = None, offset: int = 7) -> Envelope:
    return Envelope(event_id=event_id, id_source="header", event_type="order.created",
                    key="order-1", topic="orders", partition=2, offset=offset,
                    timestamp=event_time or datetime.now().astimezone())


@dataclass
class OpenClaim:
    """Claims made in a transaction that is still open; :meth:`end` commits or rolls back."""

    subject: Subject
    conn: Conn
    namespace: str
    claims: list[Claim]  # one per envelope; ids the cache knew are DUPLICATE
    requests: list[ClaimRequest]  # what went to the store
    answers: list[Claim]  # the store's claims, one per request
    tx: asyncpg.transaction.Transaction | None

    async def end(self, commit: bool = True) -> list[Claim]:
        claimed = [r for r, c in zip(self.requests, self.answers, strict=True)
                   if c.status is ClaimStatus.CLAIMED]
        if self.tx is not None:
            await (self.tx.commit() if commit else self.tx.rollback())
            await self.subject.store.ended(self.conn, self.namespace, claimed, commit)
        if commit and claimed and self.subject.cache is not None:
            await self.subject.cache.remember(
                self.namespace, [r.envelope.event_id for r in claimed])
        return self.claims


@dataclass
class Subject:
    kind: str
    store: DedupStore
    policy: DedupPolicy
    schema: str
    cache: RedisDedupCache | MemoryDedupCache | None = None

    async def begin(
        self, conn: Conn, envelopes: Sequence[Envelope], *, namespace: str = NAMESPACE,
        enforce_window: bool = True,
    ) -> OpenClaim:
        """Ask the cache, open a transaction and claim what the cache did not know."""
        known = (await self.cache.known(namespace, [e.event_id for e in envelopes])
                 if self.cache is not None else set())
        requests = [ClaimRequest(e, "charge") for e in envelopes if e.event_id not in known]
        answers: list[Claim] = []
        tx = None
        if requests:
            tx = conn.transaction(isolation="read_committed")
            await tx.start()
            try:
                answers = await self.store.claim_many(
                    conn, namespace, requests, enforce_window=enforce_window)
            except BaseException:
                await tx.rollback()
                raise
        stored = iter(answers)
        claims = [Claim(ClaimStatus.DUPLICATE) if e.event_id in known else next(stored)
                  for e in envelopes]
        return OpenClaim(self, conn, namespace, claims, requests, answers, tx)

    async def claim(
        self, conn: Conn, *envelopes: Envelope, commit: bool = True,
        namespace: str = NAMESPACE, enforce_window: bool = True,
    ) -> list[Claim]:
        """Claim ``envelopes`` in one transaction and end it."""
        opened = await self.begin(conn, envelopes, namespace=namespace,
                                  enforce_window=enforce_window)
        return await opened.end(commit)

    async def seen(self, conn: Conn, event_id: str, namespace: str = NAMESPACE
                   ) -> datetime | None:
        store = self.store
        assert isinstance(store, PostgresDedupStore | InMemoryDedupStore)
        return await store.seen(conn, namespace, event_id)

    async def retire(self, conn: Conn, now: datetime) -> None:
        """Apply the retention as of ``now``, then make the store usable at the real time
        again (the partitioned layout needs a partition for the database's ``now()``)."""
        if isinstance(self.store, InMemoryDedupStore):
            self.store.purge(now)
            return
        await maintain(conn, self.schema, self.policy, now=now)
        await maintain(conn, self.schema, self.policy)

    def impatient(self, timeout: timedelta) -> DedupStore:
        """A store over the same data whose claims wait at most ``timeout``."""
        if isinstance(self.store, InMemoryDedupStore):
            self.store.lock_timeout = timeout
            return self.store
        return store_for(self.schema, dataclasses.replace(self.policy,
                                                          claim_lock_timeout=timeout))

    async def wait_until_blocked(self, observer: Conn, blocked: Conn) -> None:
        """Return once a claim on ``blocked`` waits for another transaction (bounded)."""
        pid = blocked.get_server_pid()
        for _ in range(1000):
            if isinstance(self.store, InMemoryDedupStore):
                if self.store.waiting:
                    return
            elif await observer.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted", pid):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the second claim never waited for the first")


@pytest.fixture
async def connect(postgres_dsn: str, pg_schema: str) -> AsyncIterator[Connect]:
    opened: list[Conn] = []

    async def _connect() -> Conn:
        conn: Conn = await asyncpg.connect(postgres_dsn)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        await conn.close()


@pytest.fixture
async def conn(connect: Connect) -> Conn:
    return await connect()


@pytest.fixture(params=KINDS)
async def subject(
    request: pytest.FixtureRequest, conn: Conn, pg_schema: str,
) -> AsyncIterator[Subject]:
    kind: str = request.param
    policy = DedupPolicy(retention=RETENTION, clock_skew=SKEW,
                         claim_lock_timeout=timedelta(seconds=10),
                         layout="table" if kind == "table" else "partitioned")
    if kind == "memory":
        yield Subject(kind, InMemoryDedupStore(RETENTION, clock_skew=SKEW,
                                               lock_timeout=timedelta(seconds=10)),
                      policy, pg_schema)
        return
    await migrate(conn, pg_schema, policy, namespace=NAMESPACE)
    if kind == "memory-cache":
        memory = MemoryDedupCache()
        memory.check(policy)
        await memory.open()
        yield Subject(kind, store_for(pg_schema, policy), policy, pg_schema, memory)
        await memory.close()
        return
    if kind != "redis":
        yield Subject(kind, store_for(pg_schema, policy), policy, pg_schema)
        return
    redis_url: str = request.getfixturevalue("redis_url")
    prefix = f"ck-contract-{uuid.uuid4().hex[:8]}"
    cache = RedisDedupCache(redis_url, prefix=prefix, socket_timeout=1.0)
    cache.check(policy)
    await cache.open()
    try:
        assert cache.available
        yield Subject(kind, store_for(pg_schema, policy), policy, pg_schema, cache)
    finally:
        await cache.close()
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()
