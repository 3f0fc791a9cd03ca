"""Handlers collected explicitly: a function, a module, a registry and a topic route.

The payload model of each handler comes from the annotation of its first parameter, which
works under ``from __future__ import annotations`` as long as the model is defined at module
level (where ``typing.get_type_hints`` can find it).
"""

from __future__ import annotations

from pydantic import BaseModel

import examples.billing
from consumerkit import Consumer, HandlerContext, HandlerRegistry, Kafka, Postgres, handler


class StockReserved(BaseModel):
    sku: str
    quantity: int


class LegacyOrder(BaseModel):
    order_id: str


inventory = HandlerRegistry()


@inventory.handler("stock.reserved")
async def reserve(event: StockReserved, ctx: HandlerContext) -> None:
    await ctx.tx.execute(
        "UPDATE stock SET reserved = reserved + $2 WHERE sku = $1", event.sku, event.quantity)
    ctx.log.info("reserved %d of %s", event.quantity, event.sku)


@handler(topic="legacy-orders")
async def import_legacy(event: LegacyOrder, ctx: HandlerContext) -> None:
    # every record on legacy-orders whose event type has no handler of its own
    await ctx.tx.execute(
        "INSERT INTO legacy_orders (order_id, source_offset) VALUES ($1, $2)",
        event.order_id, ctx.envelope.offset)


everything = (
    HandlerRegistry()
    .include(examples.billing)  # a module: every @handler function in it
    .include(inventory)         # a registry: all of its handlers
    .include(import_legacy)     # a single function
)


def build(kafka: str, postgres: str) -> Consumer:
    # the consumer freezes `everything`: it can no longer change
    return Consumer(
        name="warehouse",
        handlers=[everything],
        topics=["orders", "stock", "legacy-orders"],
        postgres=Postgres(dsn=postgres),
        kafka=Kafka(bootstrap=kafka),
    )
