"""Fixtures of the parking tests: a topic with the ledger, a switch that breaks keys, and the
parked rows as stored."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumerkit import HandlerContext
from consumerkit.shared.identifiers import identifier
from consumerkit.testing.services import MakeTopic

from ..integration.ledger import Step, create_ledger, ledger_rows

ParkTopic = Callable[..., Awaitable[str]]


@pytest_asyncio.fixture(loop_scope="session")
async def park_topic(make_topic: MakeTopic, pg_schema: str, pg_pool: asyncpg.Pool) -> ParkTopic:
    """``await park_topic(partitions)``: a new topic, and the ledger table in ``pg_schema``."""

    async def make(partitions: int = 2) -> str:
        topic = await make_topic(partitions=partitions)
        async with pg_pool.acquire() as conn:
            await create_ledger(conn, pg_schema)
        return topic

    return make


class Broken:
    """Keys whose handler fails (from ``seq`` ``since`` on) until they are fixed."""

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}
        self.attempts: dict[str, int] = {}

    def brake(self, key: str, since: int = 1) -> None:
        self.keys[key] = since

    def fix(self, key: str) -> None:
        self.keys.pop(key, None)

    async def __call__(self, event: Step, ctx: HandlerContext) -> None:
        self.attempts[ctx.envelope.event_id] = ctx.attempt
        since = self.keys.get(event.key)
        if since is not None and event.seq >= since:
            raise ValueError(f"{event.key} cannot be applied yet")


async def ledger(pool: asyncpg.Pool, schema: str) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return await ledger_rows(conn, schema)


async def parked_rows(pool: asyncpg.Pool, schema: str) -> list[asyncpg.Record]:
    return list(await pool.fetch(
        f'SELECT topic, "partition", "offset", convert_from(key, \'UTF8\') AS key, event_id, '
        f"reason, attempts, replayed_at FROM {identifier(schema)}.parked_records "
        'ORDER BY topic, "partition", "offset"'))


async def parked_key_names(pool: asyncpg.Pool, schema: str) -> list[str]:
    return [r["key"] for r in await pool.fetch(
        f"SELECT convert_from(key, 'UTF8') AS key FROM {identifier(schema)}.parked_keys "
        "ORDER BY 1")]


async def committed_total(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False)
    await probe.start()
    try:
        offsets = [await probe.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        await probe.stop()
    return sum(o or 0 for o in offsets)
