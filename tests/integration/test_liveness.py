"""Liveness under stress: a full consumer stays in its group, a revoked partition's stuck
handler is cut short, and stop() returns even when the broker stops answering."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import asyncpg
import pytest

from consumerkit import Consumer, HandlerContext, Kafka, Limits, Timeouts
from consumerkit.testing.services import start_tansu
from consumerkit.transport.kafka_admin import create_topic

from .conftest import LedgerTopic
from .ledger import (
    FAST_GROUP,
    Running,
    Step,
    build,
    create_ledger,
    engine_of,
    ledger_rows,
    make_events,
    publish,
    settled,
    verify,
    wait_for,
)


@pytest.mark.slow
async def test_a_full_consumer_keeps_polling_and_stays_in_its_group(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    """max_in_flight is reached while one key's handler takes longer than the poll interval:
    the partitions are paused, the member keeps polling and is not thrown out."""
    topic = await ledger_topic(partitions=1)
    release = asyncio.Event()

    async def slow(event: Step, ctx: HandlerContext) -> None:
        if event.seq == 1 and event.key == "key-0":
            await release.wait()

    events = make_events(keys=4, per_key=5)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("full", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=slow,
                     kafka=Kafka(consumer_options={**FAST_GROUP, "max_poll_interval_ms": 2000}),
                     limits=Limits(max_in_flight=3))
    async with Running(consumer):
        await wait_for(lambda: _in_flight(consumer, 3), 30, "the consumer to fill up")
        deadline = time.monotonic() + 4  # twice max_poll_interval_ms while full
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # observing a period of time is the point here
        assert consumer.stats.revocations == 0, "the member left its group while full"
        release.set()
        await wait_for(lambda: settled(consumer, len(events)), 60, "every event")
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)


async def _in_flight(consumer: Consumer, value: int) -> bool:
    engine = engine_of(consumer)
    return engine is not None and int(engine.in_flight) >= value


@pytest.mark.slow
async def test_a_stuck_handler_of_a_revoked_partition_is_cut_short(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=2)
    stuck_in = asyncio.Event()
    first_seen: list[str] = []

    async def stick(event: Step, ctx: HandlerContext) -> None:
        if not first_seen:
            first_seen.append(ctx.envelope.event_id)
            stuck_in.set()
            await asyncio.Event().wait()  # hangs until cancelled

    events = make_events(keys=6, per_key=4)
    await publish(kafka_bootstrap, topic, events)
    first = build("revoke", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=stick)
    second = build("revoke", pg_schema, topic, postgres_dsn, kafka_bootstrap)
    async with Running(first):
        await asyncio.wait_for(stuck_in.wait(), 30)
        async with Running(second):
            await wait_for(lambda: _revoked(first), 60, "a rebalance")
            await wait_for(lambda: _count(pg_pool, pg_schema, len(events)), 60, "all effects")
    assert first.stats.abandoned >= 1
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)


async def _revoked(consumer: Consumer) -> bool:
    return consumer.stats.revocations > 0


async def _count(pool: asyncpg.Pool, schema: str, value: int) -> bool:
    return int(await pool.fetchval(f'SELECT count(*) FROM "{schema}".ledger')) >= value


async def test_stop_returns_when_the_broker_stops_answering(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    broker = start_tansu()  # a broker of its own: it is frozen below
    try:
        topic = "frozen"
        await create_topic(broker.bootstrap, topic, 1)
        async with pg_pool.acquire() as conn:
            await create_ledger(conn, pg_schema)
        events = make_events(keys=2, per_key=3)
        await publish(broker.bootstrap, topic, events, idempotence=False)  # Tansu has none
        consumer = build("frozen", pg_schema, topic, postgres_dsn, broker.bootstrap,
                         timeouts=Timeouts(shutdown=3.0))
        task = asyncio.create_task(consumer.run())
        await wait_for(lambda: settled(consumer, len(events)), 60, "every event")
        os.kill(broker.pid, signal.SIGSTOP)
        started = time.monotonic()
        try:
            await asyncio.wait_for(consumer.stop(), 60)
            await asyncio.wait_for(task, 5)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        assert time.monotonic() - started < 40
    finally:
        broker.stop()
