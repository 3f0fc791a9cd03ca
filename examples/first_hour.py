"""The consumer of docs/first-hour.md (its `billing.py`): a handler that charges an order in
the transaction of its dedup row and announces the payment through the outbox, with the
settings left to the command line."""

import asyncio
import os

import asyncpg
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Outbox, Publishes, handler


class OrderCreated(BaseModel):
    order_id: str
    amount: int


class PaymentCompleted(BaseModel):
    order_id: str
    amount: int


PAID = Publishes("payment.completed", PaymentCompleted, aggregate_type="payment")


@handler("order.created", publishes=[PAID])
async def charge(event: OrderCreated, ctx: HandlerContext) -> None:
    await ctx.tx.execute("INSERT INTO charges (order_id, amount) VALUES ($1, $2)",
                         event.order_id, event.amount)
    await ctx.publish(event_type="payment.completed", aggregate_type="payment",
                      aggregate_id=event.order_id,
                      payload=PaymentCompleted(order_id=event.order_id, amount=event.amount))


consumer = Consumer(name="billing", handlers=[charge], topics=["orders"], outbox=Outbox())


async def create_tables() -> None:
    conn = await asyncpg.connect(os.environ["CONSUMERKIT_POSTGRES_DSN"])
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS charges "
                           "(order_id text PRIMARY KEY, amount int NOT NULL)")
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(create_tables())
