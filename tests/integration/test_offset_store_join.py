"""Ownerships placed at the offsets the database holds, however the group's assignment and
the first fetch interleave: a group joined before the fetch loop starts (Apache Kafka
answers a join at once), and an assignment made beside a fetch in flight (aiokafka's
coordinator runs in a task of its own)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from consumerkit import Postgres
from consumerkit.envelope import RecordLike
from consumerkit.testing import TestConsumer
from consumerkit.transport.memory import MemorySource
from consumerkit.transport.source import Partition, RebalanceHandler, Source

from ..testing.handlers import TABLE_SQL, Step, effects, registry


class JoinsAtOnce(MemorySource):
    """A member whose group assigns its partitions within ``start``, before any fetch."""

    async def start(self) -> None:
        await super().start()
        await self._follow_group()


class AssignsBesideTheFetch(MemorySource):
    """A member whose group assigns in a task of its own, as aiokafka's coordinator does: the
    first fetch returns records from the broker's committed offset while the consumer is
    still reading the database's, and the committed-offset lookup answers only after the
    consumer has placed the ownership (a slow coordinator)."""

    async def start(self) -> None:
        await super().start()
        self.assigning = asyncio.Event()
        self.placed = asyncio.Event()
        self.first_fetch: dict[Partition, int] = {}
        self._assigner = asyncio.create_task(self._assign())

    async def _assign(self) -> None:
        self.assigning.set()  # the rebalance's first await is the database read
        await self._follow_group()

    async def stop(self) -> None:
        await asyncio.gather(self._assigner, return_exceptions=True)
        await super().stop()

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[Partition, list[RecordLike]]:
        await self.assigning.wait()
        fetched = await super().fetch(timeout_ms, max_records)
        for part, records in fetched.items():
            self.first_fetch.setdefault(part, records[0].offset)
        return fetched

    def seek(self, part: Partition, offset: int) -> None:
        super().seek(part, offset)
        self.placed.set()

    async def committed(self, part: Partition) -> int | None:
        await self.placed.wait()
        return await super().committed(part)


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
    kit = TestConsumer([registry],
                       postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
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


async def test_records_fetched_while_placing_are_read_again_from_the_stored_offset(
    consumerkit_dsn: str, consumerkit_schema: str, effects_table: None,
) -> None:
    first = TestConsumer([registry],
                         postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                         partitions=1, offset_store="postgres")
    for n in range(6):
        first.publish(Step(key="k", seq=n), key="k")
    async with first:
        await first.drain(timeout=20)
    # the broker lost the group's commits (a failover's): its offset is behind the database's
    first.broker.reset(first.consumer.name, {(first.consumer.topics[0], 0): 0})
    again = TestConsumer([registry],
                         postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                         partitions=1, offset_store="postgres", broker=first.broker)
    sources: list[AssignsBesideTheFetch] = []

    def source(rebalance: RebalanceHandler) -> Source:
        made = AssignsBesideTheFetch(again.broker, topics=again.consumer.topics,
                                     group_id=again.consumer.name, rebalance=rebalance)
        sources.append(made)
        return made

    again.consumer.source_factory = source
    for n in range(6, 10):
        again.publish(Step(key="k", seq=n), key="k")
    async with again:
        await again.drain(timeout=20)
    assert sources
    assert sources[0].first_fetch == {(again.consumer.topics[0], 0): 0}, \
        "the first fetch came from the broker's offset, before the stored one was placed"
    assert again.stats.duplicates == 0
    assert again.stats.delivered == again.stats.applied == 4
    assert sorted(seq for _, seq in await effects(consumerkit_dsn)) == list(range(10))
