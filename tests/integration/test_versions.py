"""Old events meet new code on a real broker and PostgreSQL: a live version 1 event, a version
1 record parked by the old code and a version 1 dead letter republished all reach a version 3
handler through two upcasters; a version newer than the handler's is dead-lettered with its
reason while the consumer keeps running."""

from __future__ import annotations

from typing import Any, ClassVar

import asyncpg
import orjson
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from consumerkit import (
    Consumer,
    DeadLetter,
    HandlerContext,
    HandlerRegistry,
    Kafka,
    Postgres,
    RetryPolicy,
    handler,
)
from consumerkit.deadletter import list_dead_letters
from consumerkit.engine.replay import replay_key
from consumerkit.testing.services import MakeTopic
from examples.event_versions import rename_amount, split_customer

from ..pooling import POOLER
from .ledger import FAST_GROUP, Running, group, publish_raw, wait_for

PARK = RetryPolicy(max_attempts=1, on_exhausted="park")


class OrderV1(BaseModel):
    order_id: str
    amount: int
    customer: str


class OrderV3(BaseModel):
    __event_version__: ClassVar[int] = 3
    order_id: str
    total_cents: int
    first_name: str
    last_name: str


def v1(order_id: str) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """A record as the old code published it: no version header, so version 1."""
    value = orjson.dumps({"order_id": order_id, "amount": 1250, "customer": "Ada Lovelace"})
    return order_id.encode(), value, [("id", f"evt-{order_id}".encode()),
                                      ("event_type", b"order.created")]


def consumers(schema: str, topic: str, dsn: str, bootstrap: str) -> tuple[Consumer, Consumer]:
    """The old code (version 1, parks k-park, dead-letters k-dead) and the new code (version
    3 with its upcasters); one consumer name, so the new one replays what the old one parked."""

    @handler("order.created")
    async def old(event: OrderV1, ctx: HandlerContext) -> None:
        if event.order_id == "k-dead":
            raise DeadLetter("the old code cannot take it")
        raise ValueError("the old code cannot take it yet")

    new = HandlerRegistry()

    @new.handler("order.created")
    async def record(event: OrderV3, ctx: HandlerContext) -> None:
        await ctx.tx.execute(
            f'INSERT INTO "{schema}".orders VALUES ($1, $2, $3, $4, $5)',
            ctx.envelope.event_id, event.order_id, event.total_cents, event.first_name,
            event.last_name)

    new.include(rename_amount).include(split_customer)  # the documented example's upcasters

    options: dict[str, Any] = {
        "topics": [topic], "postgres": Postgres(dsn=dsn, schema=schema, pooler=POOLER),
        "kafka": Kafka(bootstrap=bootstrap, consumer_options=FAST_GROUP),
        "handle_signals": False, "retry": PARK}
    name = group("versions", topic)
    return (Consumer(name=name, handlers=[old], **options),
            Consumer(name=name, handlers=[new], **options))


async def prepare(pool: asyncpg.Pool, schema: str) -> None:
    await pool.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    await pool.execute(f'CREATE TABLE "{schema}".orders (event_id text PRIMARY KEY, '
                       "order_id text, total_cents int, first_name text, last_name text)")


async def orders(pool: asyncpg.Pool, schema: str) -> dict[str, tuple[Any, ...]]:
    rows = await pool.fetch(f'SELECT * FROM "{schema}".orders')
    return {r["order_id"]: (r["total_cents"], r["first_name"], r["last_name"]) for r in rows}


async def test_old_events_live_parked_and_dead_lettered_reach_the_v3_handler(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    await prepare(pg_pool, pg_schema)
    topic = await make_topic(partitions=1)
    old, new = consumers(pg_schema, topic, postgres_dsn, kafka_bootstrap)
    await publish_raw(kafka_bootstrap, topic, [v1("k-park"), v1("k-dead")])
    async with Running(old):
        await wait_for(lambda: _is(old.stats.parked + old.stats.dead_lettered == 2), 60,
                       "the old code parks one record and dead-letters the other")
    async with pg_pool.acquire() as conn:
        [dead] = await list_dead_letters(conn, pg_schema, old.name)
    assert (dead.reason, dead.event_id) == ("dead_lettered_by_handler", "evt-k-dead")

    async with Running(new):
        # the documented dead-letter replay: the record sent back with its bytes unchanged
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(dead.topic, key=dead.key, value=dead.value,
                                         headers=list(dead.headers))
        finally:
            await producer.stop()
        await publish_raw(kafka_bootstrap, topic, [v1("k-live")])
        await wait_for(lambda: _is(new.stats.applied == 2), 60,
                       "the live and the dead-lettered version 1 events applied")
    report = await replay_key(new, b"k-park")
    assert (report.applied, report.records) == (1, 1)
    ada = (1250, "Ada", "Lovelace")
    assert await orders(pg_pool, pg_schema) == {"k-park": ada, "k-dead": ada, "k-live": ada}
    assert new.stats.dead_lettered == 0


async def test_a_newer_version_dead_letters_with_its_reason(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    await prepare(pg_pool, pg_schema)
    topic = await make_topic(partitions=1)
    _, new = consumers(pg_schema, topic, postgres_dsn, kafka_bootstrap)
    key, value, headers = v1("k-future")
    await publish_raw(kafka_bootstrap, topic, [
        (key, value, [*headers, ("event_version", b"4")]), v1("k-after")])
    async with Running(new):
        await wait_for(lambda: _is(new.stats.applied + new.stats.dead_lettered == 2), 60,
                       "the newer version dead-lettered and the next record applied")
    async with pg_pool.acquire() as conn:
        [dead] = await list_dead_letters(conn, pg_schema, new.name)
    assert (dead.reason, dead.detail, dead.attempts) == (
        "unknown_version",
        "event version 4 of 'order.created' is newer than its handler takes (3)", 0)
    assert await orders(pg_pool, pg_schema) == {"k-after": (1250, "Ada", "Lovelace")}


async def _is(value: bool) -> bool:
    return value
