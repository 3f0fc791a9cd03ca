"""The dedup cache is asked before a connection is taken: a delivery it knows settles as a
duplicate without a connection (or a transaction slot), so also while every connection is
busy or the database is away. On a real PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg

from consumerkit import HandlerContext, RetryPolicy, handler, migrate
from consumerkit.deadletter.writer import DeadLetterWriter
from consumerkit.dedup import PostgresDedupStore
from consumerkit.dedup.redis import RedisDedupCache
from consumerkit.engine.decode import Decoder
from consumerkit.engine.pipeline import Outcome, Pipeline
from consumerkit.envelope import WireFormat
from consumerkit.route_table import RouteTable
from consumerkit.stats import ConsumerStats
from consumerkit.types import ClaimStatus

from .own_redis import REDIS_TIMEOUT
from .test_batch_handlers import Line, ListSink, rec


async def test_a_delivery_the_cache_knows_needs_no_connection(
    postgres_dsn: str, pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str, redis_url: str,
) -> None:
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)

    @handler("note.taken")
    async def take(event: Line, ctx: HandlerContext) -> None:
        await ctx.tx.execute("SELECT 1")

    name = f"cache-first-{uuid.uuid4().hex[:8]}"
    cache = RedisDedupCache(redis_url, ttl=timedelta(minutes=5), socket_timeout=REDIS_TIMEOUT)
    await cache.open()
    pool = await asyncpg.create_pool(postgres_dsn, min_size=1, max_size=1)
    try:
        pipeline = Pipeline(
            consumer=name, namespace=name, pool=pool, dedup=PostgresDedupStore(pg_schema),
            decoder=Decoder(RouteTable.build([take]), WireFormat(), 1 << 20),
            retry=RetryPolicy(max_attempts=1), dead_letters=DeadLetterWriter([ListSink()]),
            expired="dead_letter", stats=ConsumerStats(), concurrency=1, handler_timeout=30.0,
            cache=cache)
        assert await pipeline.process(rec("cf-1", "a", 0, "note.taken"),
                                      asyncio.Event()) is Outcome.APPLIED
        async with pool.acquire():  # the pool's only connection is busy from here on
            async with pipeline.slots:  # and so is the only transaction slot
                outcome = await asyncio.wait_for(pipeline.process(
                    rec("cf-1", "a", 0, "note.taken"), asyncio.Event()), 10)
            decoded = pipeline.decoder.decode(rec("cf-1", "a", 0, "note.taken"))
            [claim] = await asyncio.wait_for(pipeline.apply_batch([decoded]), 10)
        assert outcome is Outcome.DUPLICATE
        assert claim.cached
        assert pipeline.stats.cache_hits == 1
    finally:
        await pool.close()
        await cache.close()


async def test_records_apply_on_a_connection_in_hand(
    pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str,
) -> None:
    """A caller that holds a connection already (a replay, say) passes it instead."""
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)

    @handler("note.taken")
    async def take(event: Line, ctx: HandlerContext) -> None:
        await ctx.tx.execute("SELECT 1")

    name = f"in-hand-{uuid.uuid4().hex[:8]}"
    pipeline = Pipeline(
        consumer=name, namespace=name, pool=pg_pool, dedup=PostgresDedupStore(pg_schema),
        decoder=Decoder(RouteTable.build([take]), WireFormat(), 1 << 20),
        retry=RetryPolicy(max_attempts=1), dead_letters=DeadLetterWriter([ListSink()]),
        expired="dead_letter", stats=ConsumerStats(), concurrency=1, handler_timeout=30.0)
    decoded = pipeline.decoder.decode(rec("ih-1", "a", 0, "note.taken"))
    async with pg_pool.acquire() as conn:
        [first] = await pipeline.applier.apply(conn, [decoded])
        [again] = await pipeline.applier.apply(conn, [decoded])
        assert not conn.is_in_transaction()
    assert (first.status, again.status) == (ClaimStatus.CLAIMED, ClaimStatus.DUPLICATE)
