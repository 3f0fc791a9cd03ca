"""Billing: charge every created order exactly once.

Run it against your services. The consumer creates consumerkit's own tables; ``main`` also
creates the ``charges`` table the handlers write to (``SCHEMA_SQL``). The topic ``orders`` must
exist: the consumer creates no topics, and stops at start-up with a one-line error naming a
missing one. On a local or test broker, create it with ``consumerkit topics create`` (on a
production cluster, with your broker's tools)::

    export CONSUMERKIT_KAFKA_BOOTSTRAP=127.0.0.1:9092 CONSUMERKIT_POSTGRES_DSN=postgresql://...
    consumerkit topics create orders --partitions 4
    python -m examples.billing

It stops gracefully on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import logging
import os

import asyncpg
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, HandlerRegistry, Kafka, Postgres, handler


class OrderCreated(BaseModel):
    order_id: str
    amount: int


class OrderCancelled(BaseModel):
    order_id: str


@handler("order.created")
async def charge(event: OrderCreated, ctx: HandlerContext) -> None:
    # ctx.tx is already inside the transaction that holds the dedup row
    await ctx.tx.execute(
        "INSERT INTO charges (order_id, amount) VALUES ($1, $2)", event.order_id, event.amount)


@handler("order.cancelled")
async def refund(event: OrderCancelled, ctx: HandlerContext) -> None:
    await ctx.tx.execute("DELETE FROM charges WHERE order_id = $1", event.order_id)


billing = HandlerRegistry([charge, refund])

SCHEMA_SQL = "CREATE TABLE IF NOT EXISTS charges (order_id text PRIMARY KEY, amount int NOT NULL)"


def build(kafka: str, postgres: str, topics: list[str] | None = None) -> Consumer:
    return Consumer(
        name="billing",
        handlers=[billing],
        topics=topics or ["orders"],
        postgres=Postgres(dsn=postgres),
        kafka=Kafka(bootstrap=kafka),
    )


async def main() -> None:
    dsn = os.environ["CONSUMERKIT_POSTGRES_DSN"]
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA_SQL)
    finally:
        await conn.close()
    consumer = build(os.environ["CONSUMERKIT_KAFKA_BOOTSTRAP"], dsn)
    await consumer.run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
