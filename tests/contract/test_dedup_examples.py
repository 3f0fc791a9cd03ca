"""The dedup strategies example does what docs/dedup.md says it does."""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from consumerkit.dedup.memory_cache import MemoryDedupCache
from consumerkit.dedup.redis import RedisDedupCache
from consumerkit.types import ClaimStatus
from examples import dedup_strategies


async def test_the_in_memory_example(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        statuses = await dedup_strategies.claim_twice_in_memory(conn)
    finally:
        await conn.close()
    assert statuses == [ClaimStatus.CLAIMED, ClaimStatus.DUPLICATE, ClaimStatus.DUPLICATE]


def test_the_cache_example_builds_a_consumer_with_a_checked_cache() -> None:
    consumer = dedup_strategies.with_redis_cache(
        "127.0.0.1:9092", "postgresql://app@db.invalid/app", "redis://:pw@127.0.0.1:6379/0")
    assert isinstance(consumer.dedup_cache, RedisDedupCache)
    assert consumer.dedup_cache.ttl == timedelta(days=1) <= consumer.dedup.retention
    assert dedup_strategies.table.layout == "table"
    assert "pw" not in repr(consumer.dedup_cache)


def test_the_memory_cache_example_builds_a_consumer_with_a_checked_cache() -> None:
    consumer = dedup_strategies.with_memory_cache(
        "127.0.0.1:9092", "postgresql://app@db.invalid/app")
    assert isinstance(consumer.dedup_cache, MemoryDedupCache)
    assert consumer.dedup_cache.max_ids == 200_000
    assert consumer.dedup_cache.ttl <= consumer.dedup.retention  # checked by the consumer
