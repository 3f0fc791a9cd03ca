"""A self-contained demonstration: a billing consumer fed with duplicate-laden order events.

Runs on embedded services (Tansu broker, embedded PostgreSQL) unless ``--kafka`` and
``--postgres`` point at real ones. Prints deliveries against effects applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
from pydantic import BaseModel

from .consumer import Consumer
from .context import HandlerContext
from .registry import handler
from .transport.kafka import KafkaProducer, create_topic

SCHEMA = "consumerkit_demo"


class OrderCreated(BaseModel):
    order_id: str
    amount: int


@handler("order.created")
async def charge(event: OrderCreated, ctx: HandlerContext) -> None:
    """Billing: charge the order. The insert commits together with the dedup row."""
    await ctx.tx.execute(
        f"INSERT INTO {SCHEMA}.charges (order_id, amount, event_id) VALUES ($1, $2, $3)",
        event.order_id, event.amount, ctx.envelope.event_id)


@dataclass(frozen=True, slots=True)
class Services:
    kafka: str
    postgres: str


@contextlib.asynccontextmanager
async def services(kafka: str | None, postgres: str | None) -> AsyncIterator[Services]:
    with contextlib.ExitStack() as stack:
        if kafka is None or postgres is None:
            from .testing.services import start_postgres, start_tansu

            print("starting embedded services (Tansu broker, PostgreSQL) ...")
            if kafka is None:
                kafka = stack.enter_context(start_tansu()).bootstrap
            if postgres is None:
                postgres = stack.enter_context(start_postgres()).dsn
        yield Services(kafka, postgres)


@dataclass(frozen=True, slots=True)
class DemoResult:
    orders: int
    deliveries: int
    applied: int
    charges: int
    distinct: int

    @property
    def exactly_once(self) -> bool:
        return self.charges == self.distinct == self.applied == self.orders


async def run_demo(orders: int = 500, duplicate_rate: float = 0.3, *,
                   kafka: str | None = None, postgres: str | None = None) -> DemoResult:
    """Publish ``orders`` events plus re-sent copies, consume them, count the charges."""
    async with services(kafka, postgres) as svc:
        run = uuid.uuid4().hex[:8]  # fresh topic, group and event ids on every run
        topic = f"orders-{run}"
        await _prepare(svc, topic)
        sent = await _publish(svc.kafka, topic, run, orders, duplicate_rate)
        print(f"published {orders} order events and {sent - orders} duplicate deliveries "
              f"to {topic}")
        consumer = Consumer(
            name=f"billing-demo-{run}", handlers=[charge], topics=[topic],
            kafka_bootstrap=svc.kafka, postgres_dsn=svc.postgres, schema=SCHEMA,
            handle_signals=False)
        task = asyncio.create_task(consumer.run())
        async with asyncio.timeout(120):
            while consumer.stats.applied + consumer.stats.duplicates < sent:
                if task.done():
                    task.result()
                await asyncio.sleep(0.1)
        await consumer.stop()
        await task
        conn = await asyncpg.connect(svc.postgres)
        try:
            charges = await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.charges")
            distinct = await conn.fetchval(
                f"SELECT count(DISTINCT order_id) FROM {SCHEMA}.charges")
        finally:
            await conn.close()
        stats = consumer.stats
        result = DemoResult(orders, stats.delivered, stats.applied, charges, distinct)
        print(f"deliveries: {stats.delivered}  duplicates absorbed: {stats.duplicates}  "
              f"effects applied: {stats.applied}  charges in the database: {charges} "
              f"({distinct} distinct orders)")
        print("every order charged exactly once" if result.exactly_once
              else "MISMATCH: some order was charged twice or not at all")
        return result


async def _prepare(svc: Services, topic: str) -> None:
    await create_topic(svc.kafka, topic, 4)
    conn = await asyncpg.connect(svc.postgres)
    try:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        await conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.charges")
        await conn.execute(f"CREATE TABLE {SCHEMA}.charges (id bigserial PRIMARY KEY, "
                           "order_id text NOT NULL, amount int NOT NULL, event_id text NOT NULL)")
    finally:
        await conn.close()


async def _publish(bootstrap: str, topic: str, run: str, orders: int,
                   duplicate_rate: float) -> int:
    rng = random.Random(42)
    # the embedded broker has no idempotent producer; real Kafka keeps the safe default
    producer = KafkaProducer(bootstrap, {"enable_idempotence": False})
    await producer.start()
    sent = 0
    try:
        for n in range(orders):
            event = OrderCreated(order_id=f"order-{n}", amount=rng.randint(5, 50))
            copies = 1 + (rng.random() < duplicate_rate) + (rng.random() < duplicate_rate / 3)
            for _ in range(copies):  # a relay retry or a re-publish sends the same event again
                await producer.send(
                    topic, key=event.order_id.encode(), value=event.model_dump_json().encode(),
                    headers=[("id", f"{run}-{n}".encode()), ("event_type", b"order.created")])
                sent += 1
    finally:
        await producer.stop()
    return sent


def main(orders: int, kafka: str | None, postgres: str | None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    result = asyncio.run(run_demo(orders, kafka=kafka, postgres=postgres))
    return 0 if result.exactly_once else 1
