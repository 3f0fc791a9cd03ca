"""The billing service's consumer, as ``consumerkit run billing.app:consumer`` loads it.

The module leaves the broker, the database and the metrics port out: ``consumerkit run``
fills them from ``CONSUMERKIT_KAFKA_BOOTSTRAP``, ``CONSUMERKIT_POSTGRES_DSN`` and
``CONSUMERKIT_METRICS_PORT`` (or ``--kafka``, ``--postgres``, ``--metrics-port``), so one
module runs in every environment. The ``charges`` table is the service's own, created by its
migrations (``SCHEMA_SQL``); consumerkit creates only its tables.
"""

from __future__ import annotations

from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, handler

SCHEMA_SQL = "CREATE TABLE IF NOT EXISTS charges (order_id text PRIMARY KEY, amount int NOT NULL)"


class OrderCreated(BaseModel):
    order_id: str
    amount: int


@handler("order.created")
async def charge(event: OrderCreated, ctx: HandlerContext) -> None:
    # ctx.tx is already inside the transaction that holds the dedup row
    await ctx.tx.execute(
        "INSERT INTO charges (order_id, amount) VALUES ($1, $2)", event.order_id, event.amount)


consumer = Consumer(
    name="billing",  # the consumer group and the dedup namespace
    handlers=[charge],
    topics=["orders"],
)
