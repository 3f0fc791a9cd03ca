"""Failures that are not the message's: a table that appears late, a service down for every
key, a batch handler without its table. The consumer stalls (no new records, offsets kept,
/readyz 503 with the reason, the metric set), dead-letters nothing for it, and resumes by
itself once the cause is fixed; a poison record among them still dead-letters alone."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from consumerkit import (
    BatchContext,
    Consumer,
    HandlerContext,
    Limits,
    Metrics,
    RetryPolicy,
    Stall,
    Timeouts,
    handler,
)
from consumerkit.shared.identifiers import identifier
from consumerkit.testing.services import MakeTopic, free_port

from ..observability.scrape import get, samples, value
from .ledger import (
    Event,
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
from .test_failures import dead_letters

LATE = 20.0  # seconds after the start when the table appears, as a late migration would


async def is_stalled(port: int) -> bool:
    status, body = await get(port, "/readyz")
    return status == 503 and body.startswith("stalled: ")


async def is_ready(port: int) -> bool:
    return (await get(port, "/readyz"))[0] == 200


async def metric(port: int, name: str, consumer: Consumer) -> float | None:
    return value(await samples(port), name, consumer=consumer.name)


def later_events(keys: int, after: int, count: int) -> list[Event]:
    """``count`` more events of each key, their sequence going on after ``after``."""
    return [Event(f"late-{k}-{s}", f"key-{k}", after + s)
            for s in range(1, count + 1) for k in range(keys)]


@pytest.mark.parametrize("max_batch", [500, 1], ids=["batches", "one-by-one"])
async def test_a_table_that_appears_late_stalls_the_consumer_and_nothing_is_dead_lettered(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, max_batch: int,
) -> None:
    topic = await make_topic(partitions=2)
    poison = "evt-1-3"

    async def refuse(event: Step, ctx: HandlerContext) -> None:
        if ctx.envelope.event_id == poison:
            raise ValueError("this event can never be applied")

    first = make_events(keys=6, per_key=4)
    await publish(kafka_bootstrap, topic, first)
    port = free_port()
    consumer = build("late", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=refuse,
                     limits=Limits(max_batch=max_batch),
                     stall=Stall(max_delay=1.0),
                     metrics=Metrics(port=port, host="127.0.0.1"))
    started = time.monotonic()
    async with Running(consumer):
        await wait_for(lambda: is_stalled(port), 60, "the stall on /readyz")
        body = (await get(port, "/readyz"))[1]
        assert "cannot run: undefined_table: UndefinedTableError" in body, body
        assert f'relation "{pg_schema}.ledger" does not exist' in body, body
        assert await metric(port, "consumerkit_stalled", consumer) == 1
        assert await metric(port, "consumerkit_stalls_total", consumer) == 1

        # records published during the stall are not taken; nothing is committed
        second = later_events(keys=6, after=4, count=2)
        await publish(kafka_bootstrap, topic, second)
        total = len(first) + len(second)

        async def held() -> bool:
            assert await is_stalled(port)
            return time.monotonic() - started >= LATE

        await wait_for(held, LATE + 30, f"{LATE:g}s of stall")
        assert consumer.stats.commits == 0  # no offset moved past the waiting records
        engine = engine_of(consumer)
        assert engine is not None
        assert engine.in_flight <= len(first)  # the second wave stayed on the broker
        assert await dead_letters(pg_pool, pg_schema) == []
        assert consumer.stats.dead_lettered == 0
        assert consumer.stats.applied == 0

        async with pg_pool.acquire() as conn:  # the migration runs at last
            await create_ledger(conn, pg_schema)
        await wait_for(lambda: settled(consumer, total), 60, "every event settled")
        await wait_for(lambda: is_ready(port), 30, "/readyz to turn 200")
        assert await metric(port, "consumerkit_stalled", consumer) == 0
        assert await metric(port, "consumerkit_stalls_total", consumer) == 1
        assert consumer.stats.stalls == 1
    async with pg_pool.acquire() as conn:
        rows = await ledger_rows(conn, pg_schema)
    # once each, in per-key order; the poison's key goes on past it
    verify([r for r in rows if r["key"] != "key-1"],
           [e for e in first + second if e.key != "key-1"])
    assert [r["event_id"] for r in rows if r["key"] == "key-1"] == [
        e.event_id for e in first + second if e.key == "key-1" and e.event_id != poison]
    letters = await dead_letters(pg_pool, pg_schema)
    assert [(x.event_id, x.reason) for x in letters] == [(poison, "handler_failed")]
    assert "ValueError: this event can never be applied" in letters[0].detail


async def test_one_error_for_every_key_stalls_until_the_service_is_back(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(partitions=2)
    async with pg_pool.acquire() as conn:
        await create_ledger(conn, pg_schema)
    down = asyncio.Event()
    down.set()
    calls = 0

    async def payments(event: Step, ctx: HandlerContext) -> None:
        nonlocal calls
        calls += 1
        if down.is_set():
            raise ConnectionRefusedError("the payment service refuses connections")

    events = make_events(keys=6, per_key=3)
    await publish(kafka_bootstrap, topic, events)
    port = free_port()
    consumer = build("down", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=payments,
                     stall=Stall(after_keys=3, max_delay=0.5),
                     metrics=Metrics(port=port, host="127.0.0.1"),
                     retry=RetryPolicy(max_attempts=4, initial_delay=0.2, max_delay=0.5))
    async with Running(consumer):
        await wait_for(lambda: is_stalled(port), 60, "the stall on /readyz")
        body = (await get(port, "/readyz"))[1]
        assert "failed for 3 keys in a row: ConnectionRefusedError" in body, body
        # it keeps trying (the probe), long past every record's max_attempts
        tried = calls
        await wait_for(lambda: _true(calls >= tried + 8), 60, "the probe to keep trying")
        assert await is_stalled(port)
        assert consumer.stats.dead_lettered == 0
        down.clear()  # the service is back
        await wait_for(lambda: settled(consumer, len(events)), 60, "every event settled")
        await wait_for(lambda: is_ready(port), 30, "/readyz to turn 200")
        assert await metric(port, "consumerkit_stalled", consumer) == 0
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
    assert await dead_letters(pg_pool, pg_schema) == []


def batch_ledger(schema: str) -> object:
    s = identifier(schema)

    @handler("step.recorded", batch=True)
    async def record_steps(events: list[Step], ctx: BatchContext) -> None:
        await ctx.tx.executemany(
            f"INSERT INTO {s}.ledger (event_id, key, seq) VALUES ($1, $2, $3)",
            [(env.event_id, e.key, e.seq) for env, e in zip(ctx.envelopes, events,
                                                             strict=True)])

    return record_steps


async def test_a_batch_handler_without_its_table_stalls_and_resumes(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(partitions=2)
    events = make_events(keys=5, per_key=4)
    await publish(kafka_bootstrap, topic, events)
    port = free_port()
    consumer = build("batchlate", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     handlers=[batch_ledger(pg_schema)],
                     stall=Stall(max_delay=0.5),
                     metrics=Metrics(port=port, host="127.0.0.1"))
    async with Running(consumer):
        await wait_for(lambda: is_stalled(port), 60, "the stall on /readyz")
        body = (await get(port, "/readyz"))[1]
        assert "record_steps cannot run: undefined_table" in body, body
        assert await metric(port, "consumerkit_stalled", consumer) == 1
        assert consumer.stats.dead_lettered == 0
        async with pg_pool.acquire() as conn:
            await create_ledger(conn, pg_schema)
        await wait_for(lambda: settled(consumer, len(events)), 60, "every event settled")
        await wait_for(lambda: is_ready(port), 30, "/readyz to turn 200")
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
    assert await dead_letters(pg_pool, pg_schema) == []
    assert consumer.stats.stalls == 1


@pytest.mark.slow
async def test_a_rebalance_and_a_stop_during_a_stall_end_cleanly_and_lose_nothing(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(partitions=4)
    events = make_events(keys=8, per_key=3)
    await publish(kafka_bootstrap, topic, events)
    one, two = (build("rebal", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                      timeouts=Timeouts(shutdown=5.0),
                      stall=Stall(max_delay=0.5)) for _ in range(2))
    async with Running(one):
        await wait_for(lambda: _is(one, "stalled: "), 60, "the first consumer to stall")
        async with Running(two):  # joins the group: the stalled one gives up partitions
            await wait_for(lambda: _true(bool(one.assignment) and bool(two.assignment)), 60,
                           "the partitions to be shared")
            await wait_for(lambda: _is(two, "stalled: "), 60, "the second consumer to stall")
            # a stop during the stall ends within shutdown_timeout (the bound is the test's)
            await asyncio.wait_for(one.stop(), 30)
            assert await dead_letters(pg_pool, pg_schema) == []
            async with pg_pool.acquire() as conn:
                await create_ledger(conn, pg_schema)
            await wait_for(lambda: _true(len(two.assignment) == 4), 60,
                           "the second consumer to own every partition")
            await wait_for(lambda: _applied(pg_pool, pg_schema, len(events)), 60,
                           "every event applied")
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
    assert await dead_letters(pg_pool, pg_schema) == []


async def _is(consumer: Consumer, prefix: str) -> bool:
    return (await consumer.readiness() or "").startswith(prefix)


async def _true(condition: bool) -> bool:
    return condition


async def _applied(pool: asyncpg.Pool, schema: str, count: int) -> bool:
    async with pool.acquire() as conn:
        return len(await ledger_rows(conn, schema)) >= count
