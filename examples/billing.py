"""Billing: charge every created order exactly once.

Run it against your services. The consumer creates consumerkit's own tables, but not the
``charges`` table its handlers write to: create that first (``SCHEMA_SQL``), or every order
ends in the dead letters as ``handler_failed``::

    export CONSUMERKIT_KAFKA=127.0.0.1:9092 CONSUMERKIT_POSTGRES=postgresql://...
    python -c 'import examples.billing as b; print(b.SCHEMA_SQL)' | psql "$CONSUMERKIT_POSTGRES"
    python -m examples.billing

It stops gracefully on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import logging
import os

from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, HandlerRegistry, handler


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
        kafka_bootstrap=kafka,
        postgres_dsn=postgres,
    )


async def main() -> None:
    consumer = build(os.environ["CONSUMERKIT_KAFKA"], os.environ["CONSUMERKIT_POSTGRES"])
    await consumer.run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
