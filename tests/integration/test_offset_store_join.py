"""A group joined before the fetch loop starts (Apache Kafka answers a join at once): the
first ownerships are still placed at the offsets the database holds."""

from __future__ import annotations

import asyncpg
import pytest

from consumerkit.testing import TestConsumer
from consumerkit.transport.memory import MemorySource
from consumerkit.transport.source import RebalanceHandler, Source

from ..testing.handlers import TABLE_SQL, Step, effects, registry


class JoinsAtOnce(MemorySource):
    """A member whose group assigns its partitions within ``start``, before any fetch."""

    async def start(self) -> None:
        await super().start()
        await self._follow_group()


@pytest.fixture
async def effects_table(consumerkit_dsn: str) -> None:
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute(TABLE_SQL)
    finally:
        await conn.close()


async def test_an_assignment_before_the_fetch_loop_starts_at_the_stored_offset(
    consumerkit_dsn: str, consumerkit_schema: str, effects_table: None,
) -> None:
    kit = TestConsumer([registry], postgres_dsn=consumerkit_dsn, schema=consumerkit_schema,
                       partitions=1, offset_store="postgres")
    sources: list[Source] = []

    def source(rebalance: RebalanceHandler) -> Source:
        made = JoinsAtOnce(kit.broker, topics=kit.consumer.topics,
                           group_id=kit.consumer.name, rebalance=rebalance)
        sources.append(made)
        return made

    kit.consumer.source_factory = source
    for n in range(6):
        kit.publish(Step(key=f"k{n % 2}", seq=n), key=f"k{n % 2}")
    async with kit:
        await kit.drain(timeout=20)
    assert sources, "the consumer read through the source that joins at once"
    assert kit.stats.applied == 6
    assert sorted(seq for _, seq in await effects(consumerkit_dsn)) == list(range(6))
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        stored = await conn.fetchval(
            f'SELECT next_offset FROM "{consumerkit_schema}".consumer_offsets')
    finally:
        await conn.close()
    assert stored == 6
