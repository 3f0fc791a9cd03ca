"""An event whose payload changed twice: version 2 renamed a field, version 3 split one.

The handler takes version 3; two upcasters carry version 1 and version 2 documents there
before validation (quoted by docs/event-versions.md, run by tests/unit/test_versions.py).
``catalog`` is what ``consumerkit asyncapi examples.event_versions:catalog`` documents.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from consumerkit import EventCatalog, HandlerContext, HandlerRegistry, Receives, Sends

orders = HandlerRegistry()


# Version 1 was {"order_id": "o-1", "amount": 1250, "customer": "Ada Lovelace"}.
# Version 2 renamed "amount" to "total_cents".
# Version 3 split "customer" into "first_name" and "last_name".
class OrderCreated(BaseModel):
    __event_version__: ClassVar[int] = 3

    order_id: str
    total_cents: int
    first_name: str
    last_name: str


@orders.handler("order.created")
async def record_order(event: OrderCreated, ctx: HandlerContext) -> None:
    await ctx.tx.execute(
        "INSERT INTO orders (id, total_cents, first_name, last_name) VALUES ($1, $2, $3, $4)",
        event.order_id, event.total_cents, event.first_name, event.last_name)


@orders.upcaster("order.created", from_version=1)
def rename_amount(doc: dict[str, Any]) -> dict[str, Any]:
    doc["total_cents"] = doc.pop("amount")
    return doc


@orders.upcaster("order.created", from_version=2)
def split_customer(doc: dict[str, Any]) -> dict[str, Any]:
    first, _, last = doc.pop("customer").partition(" ")
    return {**doc, "first_name": first, "last_name": last}


# What this service receives and sends, for `consumerkit asyncapi examples.event_versions:catalog`
catalog = EventCatalog(
    title="Orders",
    receives=[Receives("orders", ["orders"], [orders])],
    sends=[Sends("orders", "order.created", OrderCreated, aggregate_type="order",
                 topic="orders")],
)
