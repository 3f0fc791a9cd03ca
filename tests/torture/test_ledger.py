"""The torture ledger on a real PostgreSQL: its handler counts an order violation instead of
raising, keeps a duplicate effect countable, dead-letters poison, and the history and the
drain progress read back what happened."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import asyncpg
import pytest

from consumerkit import Postgres, migrate
from consumerkit.registry import HandlerSource
from consumerkit.testing import TestConsumer

from . import ledger
from .check import Produced, check


@pytest.mark.parametrize("make", [ledger.make_handler, ledger.make_batch_handler],
                         ids=["one-by-one", "batch-and-defer"])
async def test_the_ledger_records_what_a_checker_needs(
    postgres_dsn: str, pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str,
    make: Callable[[str], HandlerSource],
) -> None:
    async with pg_pool.acquire() as conn:
        await conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        await migrate(conn, pg_schema)
        await ledger.create(conn, pg_schema, aggregates=2)
        await conn.execute(f'CREATE TABLE "{pg_schema}".outbox (seq int)')  # read by progress
    ids = {s: str(uuid.uuid4()) for s in (1, 2, 3)}
    poison = str(uuid.uuid4())
    async with pg_pool.acquire() as conn:
        await conn.executemany(
            f'INSERT INTO "{pg_schema}".business (event_id, aggregate, seq, poison) '
            "VALUES ($1, $2, $3, $4)",
            [*((i, "agg-0", s, False) for s, i in ids.items()), (poison, "poison-x", 0, True)])
        assert (await ledger.progress(conn, pg_schema))[:2] == (4, 0)

    async with TestConsumer([make(pg_schema)],
                            postgres=Postgres(dsn=postgres_dsn, schema=pg_schema),
                            partitions=1) as consumer:
        for seq in (1, 3, 2):  # out of order on purpose: counted, never raised
            consumer.publish(ledger.Step(aggregate="agg-0", seq=seq), key="agg-0",
                             event_id=ids[seq])
        consumer.publish(ledger.Step(aggregate="poison-x", seq=0, poison=True),
                         key="poison-x", event_id=poison)
        await consumer.drain(fail_fast=False)

    async with pg_pool.acquire() as conn:
        history = await ledger.read_history(conn, pg_schema)
        assert await ledger.progress(conn, pg_schema) == (0, 0, 3)
        p50, p99 = await ledger.latency_ms(conn, pg_schema)
    assert 0 < p50 <= p99
    assert history.committed[poison] == Produced("poison-x", 0, poison=True)
    assert [seq for _, _, seq in history.effects] == [1, 3, 2]
    assert history.projection_violations == 2  # 3 after 1, then 2 after 3
    assert [reason for _, reason in history.dead_letters] == ["handler_failed"]
    history.published = [*ids.values(), poison]
    found = check(history)
    assert (found.order_violations, found.lost, found.duplicate_effects) == (2, 0, 0)
    assert not found.verdict
