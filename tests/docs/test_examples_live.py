"""The examples against real services: the billing consumer end to end (a failing handler
dead-lettered, fixed and replayed, a duplicate absorbed), the saga step emitting one event per
order through its outbox, several consumers stopped by one signal, the signal handlers on
PostgreSQL, what happens to handlers that misuse ``ctx.tx`` as docs/handlers.md describes it,
and the command line."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from types import ModuleType
from typing import TypeAlias, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from consumerkit import (
    DeadLetterEntry,
    Envelope,
    HandlerContext,
    Record,
    Retry,
    RetryPolicy,
    WireFormat,
    handler,
    migrate,
)
from consumerkit.cli import main as cli_main
from consumerkit.deadletter.writer import DeadLetterWriter
from consumerkit.dedup.postgres import PostgresDedupStore
from consumerkit.engine.decode import Decoder
from consumerkit.engine.pipeline import Outcome, Pipeline
from consumerkit.route_table import RouteTable
from consumerkit.schema import applied_versions
from consumerkit.stats import ConsumerStats
from consumerkit.testing.services import MakeTopic
from consumerkit.types import SinkResources

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


@pytest.mark.slow
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
    first, second, again = f"evt-{run}-1", f"evt-{run}-2", f"evt-{run}-3"
    consumer = billing.build(kafka_bootstrap, dsn, [topic])
    try:
        async with running.running(consumer):
            # no charges table yet: every record would fail, so the consumer stalls on the
            # first one instead of dead-lettering it, and goes on once the table exists
            await wire.publish(producer, topic, key="order-1", event_id=first,
                               event_type="order.created",
                               payload=billing.OrderCreated(order_id="order-1", amount=10))

            async def stalled() -> bool:
                return bool(consumer.stats.stalls >= 1)

            await wait_until(stalled, "the consumer stalled on the missing table")
            entries = await dead_letters.show_dead_letters(postgres_dsn, "billing")
            assert not [e for e in entries if e.topic == topic]
            await conn.execute(billing.SCHEMA_SQL)

            async def charged_first() -> bool:
                return bool(await conn.fetchval(
                    "SELECT count(*) FROM charges WHERE order_id = 'order-1'"))

            await wait_until(charged_first, "the first order charged once the table exists")

            # a poison record: a second charge of order-1 under another event id breaks the
            # table's key on every attempt, and that record alone is dead-lettered
            await wire.publish(producer, topic, key="order-1", event_id=again,
                               event_type="order.created",
                               payload=billing.OrderCreated(order_id="order-1", amount=15))

            async def parked() -> DeadLetterEntry | None:
                entries = await dead_letters.show_dead_letters(postgres_dsn, "billing")
                return next((e for e in entries if e.event_id == again), None)

            entry = await wait_until(parked, "the second charge of order-1 in the dead letters")
            assert (entry.topic, entry.reason, entry.attempts) == (topic, "handler_failed", 5)

            # the fix: refund the first charge, replay the dead letter; send a new order twice
            await wire.publish(producer, topic, key="order-1", event_id=f"evt-{run}-4",
                               event_type="order.cancelled",
                               payload=billing.OrderCancelled(order_id="order-1"))

            async def refunded() -> bool:
                return bool(consumer.stats.applied == 2)

            await wait_until(refunded, "the first charge refunded")
            report = await dead_letters.replay_after_fix(consumer, topic, "refund issued")
            assert (report.replayed, report.failed) == (1, 0)
            for _ in range(2):
                await wire.publish(producer, topic, key="order-2", event_id=second,
                                   event_type="order.created",
                                   payload=billing.OrderCreated(order_id="order-2", amount=20))

            async def charged() -> list[tuple[str, int]] | None:
                rows = await conn.fetch("SELECT order_id, amount FROM charges ORDER BY 1")
                settled = consumer.stats.applied == 4 and consumer.stats.duplicates >= 1
                return [(r["order_id"], r["amount"]) for r in rows] if settled else None

            assert await wait_until(charged, "both orders charged, the duplicate absorbed") == [
                ("order-1", 15), ("order-2", 20)]
        stats = consumer.stats
        assert set(stats.dead_letter_reasons) == {"handler_failed"}  # only the second charge
        assert stats.dead_lettered == 1
        assert stats.stalls == 1
        assert stats.retries >= 4  # 5 attempts of the second charge
        rows = await conn.fetch(
            "SELECT event_id FROM consumerkit.processed_events_ids "
            "WHERE namespace = 'billing' AND event_id = ANY($1::text[]) ORDER BY 1",
            [first, second, again])
        assert [r["event_id"] for r in rows] == sorted([first, second, again])
    finally:
        await producer.stop()
        await conn.execute("DELETE FROM consumerkit.dead_letters WHERE topic = $1", topic)
        await conn.execute(  # the rows holding them: this test's own claims
            "DELETE FROM consumerkit.processed_events WHERE texts && $1::text[] COLLATE \"C\""
            " OR uuids::text[] && $1::text[] COLLATE \"C\"", [first, second, again,
                                                           f"evt-{run}-4"])
        await conn.close()


@pytest.mark.slow
async def test_one_signal_stops_every_consumer_of_the_process(
    postgres_dsn: str, pg_schema: str, kafka_bootstrap: str, make_topic: MakeTopic,
) -> None:
    billing, running = example("billing"), example("running")
    topics = [await make_topic(partitions=1), await make_topic(partitions=1)]
    dsn = with_search_path(postgres_dsn, pg_schema)
    consumers = [billing.build(kafka_bootstrap, dsn, [topic]) for topic in topics]
    serving = asyncio.create_task(running.serve_all(consumers))
    started = asyncio.gather(*(c.started.wait() for c in consumers))
    await asyncio.wait({serving, started}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    assert not serving.done(), serving.exception()
    assert started.done(), "the consumers did not start"
    os.kill(os.getpid(), signal.SIGTERM)  # both installed a handler: it reaches them both
    await asyncio.wait_for(serving, 60)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the default is back



async def test_the_deploy_step_migrates_the_consumers_tables_and_its_outbox(
    postgres_dsn: str, pg_schema: str,
) -> None:
    saga, running = example("saga"), example("running")
    consumer = saga.build("127.0.0.1:1", postgres_dsn, schema=pg_schema)  # never connected
    await running.migrate_only(consumer, postgres_dsn)
    conn: Conn = await asyncpg.connect(postgres_dsn)
    try:
        components = set(await applied_versions(conn, pg_schema))
    finally:
        await conn.close()
    assert components == {"core", "dedup:processed_events", "parking", "outbox:outbox"}


async def test_saga_example_emits_one_payment_event_per_order(
    postgres_dsn: str, pg_schema: str, kafka_bootstrap: str, make_topic: MakeTopic,
) -> None:
    saga, running, wire = example("saga"), example("running"), example("wire_format")
    topic = await make_topic(partitions=2)
    dsn = with_search_path(postgres_dsn, pg_schema)
    conn: Conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE SCHEMA "{pg_schema}"')
    await conn.execute(saga.SCHEMA_SQL)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    run = uuid.uuid4().hex[:8]
    orders = {f"order-{n}": f"evt-{run}-{n}" for n in range(3)}
    consumer = saga.build(kafka_bootstrap, dsn, [topic], schema=pg_schema)
    try:
        async with running.running(consumer):
            for _ in range(2):  # every order sent twice, as after a producer's retry
                for order, event_id in orders.items():
                    await wire.publish(producer, topic, key=order, event_id=event_id,
                                       event_type="order.created",
                                       payload=saga.OrderCreated(order_id=order, amount=10))

            async def settled() -> bool:
                return bool(consumer.stats.applied + consumer.stats.duplicates == 2 * len(orders))

            await wait_until(settled, "every order applied or absorbed")
        assert (consumer.stats.applied, consumer.stats.duplicates) == (len(orders), len(orders))
        payments = await conn.fetch("SELECT order_id FROM payments ORDER BY 1")
        assert [r["order_id"] for r in payments] == sorted(orders)
        emitted = await conn.fetch(
            f'SELECT type, aggregateid, headers->>\'causation_id\' AS cause, '
            f'headers->>\'correlation_id\' AS correlation FROM "{pg_schema}".outbox '
            "ORDER BY aggregateid")
        # one payment.completed per order, caused by (and correlated with) the order event
        assert [(r["type"], r["aggregateid"], r["cause"], r["correlation"]) for r in emitted] == [
            ("payment.completed", order, event_id, event_id)
            for order, event_id in sorted(orders.items())]
    finally:
        await producer.stop()
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
    assert capsys.readouterr().out.strip() == "0 dead letters waiting"


# -- handlers that misuse ctx.tx, as docs/handlers.md describes them ---------------------------

class Misuse(BaseModel):
    mode: str


@handler("misuse")
async def misuse(event: Misuse, ctx: HandlerContext) -> None:
    await ctx.tx.execute("INSERT INTO effects VALUES ($1, 'first')", event.mode)
    if event.mode == "swallow":
        with contextlib.suppress(asyncpg.DivisionByZeroError):  # the mistake
            await ctx.tx.execute("SELECT 1 / 0")
    elif event.mode == "commit":
        await ctx.tx.execute("COMMIT")
    elif event.mode == "rollback":
        await ctx.tx.execute("ROLLBACK")
        await ctx.tx.execute("INSERT INTO effects VALUES ($1, 'after')", event.mode)
    elif event.mode in ("rollback-begin", "commit-begin"):
        await ctx.tx.execute("ROLLBACK" if event.mode == "rollback-begin" else "COMMIT")
        await ctx.tx.execute("BEGIN")
        await ctx.tx.execute("INSERT INTO effects VALUES ($1, 'after')", event.mode)
    elif event.mode == "cancel":
        raise asyncio.CancelledError
    elif event.mode == "hang":
        await asyncio.sleep(60)


class ListSink:
    def __init__(self) -> None:
        self.entries: list[DeadLetterEntry] = []

    async def open(self, resources: SinkResources) -> None:
        del resources

    async def send(self, entry: DeadLetterEntry) -> None:
        self.entries.append(entry)

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(("mode", "outcome", "dead_letter", "effects", "claimed"), [
    # a swallowed database error fails the attempt; nothing commits
    ("swallow", Outcome.DEAD_LETTERED, ("handler_failed", 3, "InFailedSQLTransactionError"),
     [], False),
    # COMMIT: the effect and the dedup row are committed, and the record is dead-lettered
    ("commit", Outcome.DEAD_LETTERED, ("handler_failed", 1, "HandlerEndedTransaction"),
     ["first"], True),
    # ROLLBACK: the claim is gone, later statements commit on their own
    ("rollback", Outcome.DEAD_LETTERED, ("handler_failed", 1, "HandlerEndedTransaction"),
     ["after"], False),
    # ROLLBACK then BEGIN: noticed (not the marked transaction); what followed rolls back
    ("rollback-begin", Outcome.DEAD_LETTERED, ("handler_failed", 1, "began another"), [],
     False),
    # COMMIT then BEGIN: the claim and the effect before it committed early; the rest
    # commits at the end (logged as an error)
    ("commit-begin", Outcome.APPLIED, None, ["first", "after"], True),
    # CancelledError raised by the handler itself is an ordinary failure
    ("cancel", Outcome.DEAD_LETTERED, ("handler_failed", 3, "CancelledError"), [], False),
    # past handler_timeout: cancelled, a failed attempt
    ("hang", Outcome.DEAD_LETTERED, ("handler_failed", 3, "TimeoutError"), [], False),
])
async def test_handlers_that_misuse_ctx_tx(
    postgres_dsn: str, pg_schema: str, mode: str, outcome: Outcome,
    dead_letter: tuple[str, int, str] | None, effects: list[str], claimed: bool,
) -> None:
    dsn = with_search_path(postgres_dsn, pg_schema)
    conn: Conn = await asyncpg.connect(dsn)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        await migrate(conn, pg_schema)
        await conn.execute("CREATE TABLE effects (mode text, step text)")
        sink, stats = ListSink(), ConsumerStats()
        pipeline = Pipeline(
            consumer="misuse", namespace="misuse", pool=pool,
            dedup=PostgresDedupStore(pg_schema),
            decoder=Decoder(RouteTable.build([misuse]), WireFormat(), 1 << 20),
            retry=RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.02),
            dead_letters=DeadLetterWriter([sink]), expired="dead_letter", stats=stats,
            # short only where the timeout is the point: on a loaded machine half a second
            # can pass inside any handler, and a timed-out attempt is retried
            concurrency=1, handler_timeout=0.5 if mode == "hang" else 30.0)
        value = Misuse(mode=mode).model_dump_json().encode()
        record = Record("t", 0, 0, b"k", value, [("id", b"evt-1"), ("event_type", b"misuse")],
                        timestamp=None)
        assert await pipeline.process(record, asyncio.Event()) is outcome
        letters = [(e.reason, e.attempts, e.detail) for e in sink.entries]
        if dead_letter is None:
            assert letters == []
        else:
            [(reason, attempts, detail)] = letters
            assert (reason, attempts) == dead_letter[:2]
            assert dead_letter[2] in detail
        steps = await conn.fetch("SELECT step FROM effects WHERE mode = $1", mode)
        assert [r["step"] for r in steps] == effects
        rows = await conn.fetchval(
            f'SELECT count(*) FROM "{pg_schema}".processed_events_ids WHERE event_id = $1', "evt-1")
        assert rows == (1 if claimed else 0)
    finally:
        await pool.close()
        await conn.close()
