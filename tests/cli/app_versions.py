"""Consumers for the ``consumerkit check --handlers`` tests, loaded by MODULE:ATTR: the same
consumer before a deploy that renamed ``amount`` to ``total_cents`` carelessly (the model
changed, its version did not) and with the fix (version 2 and an upcaster). Each reads its
schema from ``$CHECK_TEST_SCHEMA`` when called."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, HandlerRegistry, Postgres, handler


class Order(BaseModel):
    order_id: str
    total_cents: int


class OrderV2(Order):
    __event_version__: ClassVar[int] = 2


@handler("order.created")
async def take(event: Order, ctx: HandlerContext) -> None:
    del event, ctx


fixed_handlers = HandlerRegistry()


@fixed_handlers.handler("order.created")
async def take_v2(event: OrderV2, ctx: HandlerContext) -> None:
    del event, ctx


@fixed_handlers.upcaster("order.created", from_version=1)
def rename_amount(doc: dict[str, Any]) -> dict[str, Any]:
    doc["total_cents"] = doc.pop("amount")
    return doc


def _consumer(handlers: Any) -> Consumer:
    return Consumer(name="orders", handlers=[handlers], topics=["orders"],
                    postgres=Postgres(schema=os.environ["CHECK_TEST_SCHEMA"]),
                    handle_signals=False)


def careless() -> Consumer:
    return _consumer(take)


def fixed() -> Consumer:
    return _consumer(fixed_handlers)
