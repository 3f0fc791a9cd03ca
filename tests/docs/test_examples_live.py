"""The examples against real services: the billing consumer end to end (a failing handler
dead-lettered, fixed and replayed, a duplicate absorbed), the signal handlers on PostgreSQL, the
documented hazard of swallowing a database error, and the command line."""

from __future__ import annotations

import asyncio
import importlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from types import ModuleType
from typing import TypeAlias, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from consumerkit import DeadLetterEntry, Envelope, HandlerContext, Retry
from consumerkit.cli import main as cli_main
from consumerkit.testing.services import MakeTopic

T = TypeVar("T")
Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record]"


def example(name: str) -> ModuleType:
    return importlib.import_module(f"examples.{name}")


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` with ``search_path`` as a server setting (asyncpg reads unknown parameters so)."""
    parts = urlsplit(dsn)
    query = [*parse_qsl(parts.query), ("search_path", schema)]
    return urlunsplit(parts._replace(query=urlencode(query)))


async def wait_until(probe: Callable[[], Awaitable[T | None]], what: str,
                     timeout: float = 60.0) -> T:
    """Poll ``probe`` until it returns something truthy, or fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_billing_example_end_to_end(
    postgres_dsn: str, pg_schema: str, kafka_bootstrap: str, make_topic: MakeTopic,
) -> None:
    billing, running, wire = example("billing"), example("running"), example("wire_format")
    dead_letters = example("dead_letters")
    topic = await make_topic(partitions=2)
    dsn = with_search_path(postgres_dsn, pg_schema)
    conn: Conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE SCHEMA "{pg_schema}"')
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    run = uuid.uuid4().hex[:8]
    first, second = f"evt-{run}-1", f"evt-{run}-2"
    consumer = billing.build(kafka_bootstrap, dsn, [topic])
    try:
        async with running.running(consumer):
            # no charges table yet: the handler fails every attempt and the record is parked
            await wire.publish(producer, topic, key="order-1", event_id=first,
                               event_type="order.created",
                               payload=billing.OrderCreated(order_id="order-1", amount=10))

            async def parked() -> DeadLetterEntry | None:
                entries = await dead_letters.show_dead_letters(postgres_dsn, "billing")
                return next((e for e in entries if e.event_id == first), None)

            entry = await wait_until(parked, "the first order in the dead letters")
            assert (entry.topic, entry.reason, entry.attempts) == (topic, "handler_failed", 5)

            # the fix: create the table; replay the parked order; send a new one twice
            await conn.execute(billing.SCHEMA_SQL)
            await dead_letters.republish(producer, entry)
            for _ in range(2):
                await wire.publish(producer, topic, key="order-2", event_id=second,
                                   event_type="order.created",
                                   payload=billing.OrderCreated(order_id="order-2", amount=20))

            async def charged() -> list[tuple[str, int]] | None:
                rows = await conn.fetch("SELECT order_id, amount FROM charges ORDER BY 1")
                settled = consumer.stats.applied == 2 and consumer.stats.duplicates >= 1
                return [(r["order_id"], r["amount"]) for r in rows] if settled else None

            assert await wait_until(charged, "both orders charged, the duplicate absorbed") == [
                ("order-1", 10), ("order-2", 20)]
        stats = consumer.stats
        assert set(stats.dead_letter_reasons) == {"handler_failed"}  # only the first order
        assert stats.retries >= 4  # 5 attempts of the first order
        rows = await conn.fetch(
            "SELECT event_id, topic FROM consumerkit.processed_events "
            "WHERE namespace = 'billing' AND event_id = ANY($1::text[]) ORDER BY 1",
            [first, second])
        assert [(r["event_id"], r["topic"]) for r in rows] == [(first, topic), (second, topic)]
    finally:
        await producer.stop()
        await conn.execute("DELETE FROM consumerkit.dead_letters WHERE topic = $1", topic)
        await conn.execute("DELETE FROM consumerkit.processed_events WHERE namespace = 'billing'"
                           " AND event_id = ANY($1::text[])", [first, second])
        await conn.close()


# -- handlers called directly, on a real transaction -------------------------------------------

def context(conn: Conn, event_type: str) -> HandlerContext:
    envelope = Envelope("evt-1", "header", event_type, "k", "t", 0, 0, datetime.now(UTC))
    return HandlerContext(conn, envelope, 1, logging.LoggerAdapter(logging.getLogger("t"), {}))


async def signal_tables(postgres_dsn: str, schema: str) -> Conn:
    conn: Conn = await asyncpg.connect(with_search_path(postgres_dsn, schema))
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.execute("""
        CREATE TABLE accounts (account_id text PRIMARY KEY, balance int NOT NULL);
        CREATE TABLE coupon_uses (code text PRIMARY KEY, order_id text NOT NULL);
        CREATE TABLE orders (order_id text PRIMARY KEY, discounted bool NOT NULL DEFAULT false);
        INSERT INTO orders (order_id) VALUES ('o-1'), ('o-2');
    """)
    return conn


async def test_signals_example_on_postgres(postgres_dsn: str, pg_schema: str) -> None:
    signals = example("signals")
    conn = await signal_tables(postgres_dsn, pg_schema)
    ctx = context(conn, "charge.requested")
    try:
        event = signals.ChargeRequested(order_id="o-1", account_id="a-1", amount=10,
                                        currency="EUR")
        with pytest.raises(Retry) as retry:
            async with conn.transaction():
                await signals.charge(event, ctx)
        assert retry.value.delay == 5.0

        await conn.execute("INSERT INTO accounts VALUES ('a-1', 5)")
        with pytest.raises(signals.PaymentDeclined):
            async with conn.transaction():
                await signals.charge(event, ctx)

        await conn.execute("UPDATE accounts SET balance = 50")
        async with conn.transaction():
            await signals.charge(event, ctx)
        assert await conn.fetchval("SELECT balance FROM accounts") == 40
    finally:
        await conn.close()


async def test_a_savepoint_keeps_the_transaction_after_an_expected_error(
    postgres_dsn: str, pg_schema: str,
) -> None:
    signals = example("signals")
    conn = await signal_tables(postgres_dsn, pg_schema)
    ctx = context(conn, "coupon.applied")
    try:
        for order in ("o-1", "o-2"):  # the second use of the coupon is refused, then ignored
            async with conn.transaction():
                await signals.apply_coupon(signals.CouponApplied(order_id=order, code="C"), ctx)
                await conn.execute("INSERT INTO accounts VALUES ($1, 0)", f"marker-{order}")
        discounted = await conn.fetch("SELECT order_id FROM orders WHERE discounted")
        assert [r["order_id"] for r in discounted] == ["o-1"]
        assert await conn.fetchval("SELECT count(*) FROM accounts") == 2  # both committed
    finally:
        await conn.close()


# -- the command line on a real database -------------------------------------------------------

async def test_cli_against_postgres(
    postgres_dsn: str, pg_schema: str, capsys: pytest.CaptureFixture[str],
) -> None:
    def cli(*argv: str) -> int:
        return cli_main([*argv, "--postgres", postgres_dsn, "--schema", pg_schema])

    assert await asyncio.to_thread(cli, "migrate") == 0
    assert f"schema {pg_schema} is up to date" in capsys.readouterr().out
    assert await asyncio.to_thread(cli, "dedup", "partitions") == 0
    listing = capsys.readouterr().out
    assert listing.count("processed_events_p") == 5  # previous, current, 3 ahead
    assert await asyncio.to_thread(cli, "dedup", "maintain") == 0
    assert capsys.readouterr().out.strip() == "created none; dropped none; deferred none"
    assert await asyncio.to_thread(cli, "dead-letters", "--consumer", "billing") == 0
    assert capsys.readouterr().out.strip() == "0 dead letters"
