"""Fixtures for the end-to-end tests: a fresh topic whose consumers write to a ledger."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
import pytest_asyncio

from consumerkit.testing.services import MakeTopic

from .ledger import create_ledger

LedgerTopic = Callable[..., Awaitable[str]]


@pytest_asyncio.fixture(loop_scope="session")
async def ledger_topic(make_topic: MakeTopic, pg_schema: str, pg_pool: asyncpg.Pool
                       ) -> LedgerTopic:
    """``await ledger_topic(partitions)``: a new topic, and the ledger table in ``pg_schema``."""

    async def make(partitions: int = 4) -> str:
        topic = await make_topic(partitions=partitions)
        async with pg_pool.acquire() as conn:
            await create_ledger(conn, pg_schema)
        return topic

    return make
