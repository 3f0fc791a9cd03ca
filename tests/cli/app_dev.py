"""The consumer of the ``consumerkit dev`` test: a team's first service, with no setting in
the code. It charges an order and announces the payment through the outbox."""

from __future__ import annotations

from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Kafka, handler
from consumerkit.outbox import Outbox


class OrderCreated(BaseModel):
    order_id: str
    amount: int


@handler("order.created")
async def charge(event: OrderCreated, ctx: HandlerContext) -> None:
    await ctx.tx.execute("INSERT INTO charges (order_id, amount) VALUES ($1, $2)",
                         event.order_id, event.amount)
    await ctx.publish(event_type="payment.completed", aggregate_type="payments",
                      aggregate_id=event.order_id, payload={"order_id": event.order_id})


consumer = Consumer(name="billing", handlers=[charge], topics=["orders"], outbox=Outbox(),
                    kafka=Kafka(consumer_options={"session_timeout_ms": 3000,
                                            "heartbeat_interval_ms": 300}))
