"""A saga step: billing consumes ``order.created``, records the payment and emits
``payment.completed`` through the consumer's outbox with ``ctx.publish``, in the same
transaction as the payment and the dedup row. A redelivery of the order (after a crash, say)
is absorbed as a duplicate, so ``payment.completed`` is emitted once in effect; a relay then
publishes it (see docs/outbox.md)."""

from __future__ import annotations

from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Kafka, Postgres, handler
from consumerkit.outbox import Outbox


class OrderCreated(BaseModel):
    order_id: str
    amount: int


class PaymentCompleted(BaseModel):
    order_id: str
    amount: int


@handler("order.created")
async def take_payment(event: OrderCreated, ctx: HandlerContext) -> None:
    await ctx.tx.execute(
        "INSERT INTO payments (order_id, amount) VALUES ($1, $2)", event.order_id, event.amount)
    # an outbox row in this transaction: it commits with the payment and the dedup row, or
    # not at all; causation_id and correlation_id link it to the order event
    await ctx.publish(
        event_type="payment.completed", aggregate_type="payment", aggregate_id=event.order_id,
        payload=PaymentCompleted(order_id=event.order_id, amount=event.amount))


SCHEMA_SQL = "CREATE TABLE IF NOT EXISTS payments (order_id text PRIMARY KEY, amount int NOT NULL)"


def build(kafka: str, postgres: str, topics: list[str] | None = None,
          schema: str = "consumerkit") -> Consumer:
    return Consumer(
        name="billing-saga",
        handlers=[take_payment],
        topics=topics or ["orders"],
        postgres=Postgres(dsn=postgres, schema=schema),
        kafka=Kafka(bootstrap=kafka),
        outbox=Outbox(schema=schema, table="outbox"),  # created at start-up, like the dedup table
    )
