"""``@handler(..., publishes=[...])``: a handler says what it emits through the outbox; the
test kit fails a test whose handler emits anything else, and the consumer's AsyncAPI
document lists the declared events as send operations."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Outbox, Postgres, Publishes, handler
from consumerkit.errors import HandlerDefinitionError, UndeclaredEventError
from consumerkit.testing import TestConsumer


class OrderCreated(BaseModel):
    order_id: str
    amount: int


class PaymentCompleted(BaseModel):
    order_id: str


PAID = Publishes("payment.completed", PaymentCompleted, aggregate_type="payment")


@handler("order.created", publishes=[PAID])
async def charge(event: OrderCreated, ctx: HandlerContext) -> None:
    await ctx.publish(event_type="payment.completed", aggregate_type="payment",
                      aggregate_id=event.order_id,
                      payload=PaymentCompleted(order_id=event.order_id))
    if event.amount > 100:  # a path the declaration forgot
        await ctx.publish(event_type="fraud.suspected", aggregate_type="payment",
                          aggregate_id=event.order_id, payload={"order_id": event.order_id})


async def test_the_kit_fails_a_test_whose_handler_publishes_an_undeclared_type(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    async with TestConsumer([charge],
                            postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                            outbox=Outbox(consumerkit_schema)) as kit:
        kit.publish(OrderCreated(order_id="o-1", amount=5), key="o-1", event_type="order.created")
        await kit.drain()  # declared: published
        kit.publish(OrderCreated(order_id="o-2", amount=500), key="o-2",
                    event_type="order.created")
        with pytest.raises(UndeclaredEventError, match=r"published 'fraud.suspected', which it "
                           r"does not declare .*declares 'payment.completed'"):
            await kit.drain()
        await kit.drain(fail_fast=False)
        assert [s.event_id for s in kit.applied] == [kit.applied[0].event_id]
        assert [d.reason for d in kit.dead_letters] == ["handler_failed"]  # not retried


def test_publishes_is_checked_when_the_handler_is_declared() -> None:
    async def f(event: OrderCreated, ctx: HandlerContext) -> None: ...

    for bad, said in (([PaymentCompleted], r"takes Publishes\(event_type, model, aggregate_type\)"),
                      ([PAID, PAID], "names 'payment.completed' twice"),
                      ("payment.completed", "takes a list of Publishes")):
        with pytest.raises(HandlerDefinitionError, match=said):
            handler("order.created", publishes=bad)(f)  # type: ignore[arg-type]
    with pytest.raises(HandlerDefinitionError, match="model must be a pydantic model"):
        Publishes("x", dict, "y")  # type: ignore[arg-type]


def test_the_consumer_s_document_sends_what_its_handlers_declare() -> None:
    from consumerkit.asyncapi import document
    from consumerkit.catalog import EventCatalog

    consumer = Consumer(name="billing", handlers=[charge], topics=["orders"])
    doc = document(EventCatalog.of(consumer))
    assert set(doc["operations"]) == {"billing.receive.orders", "billing.send.payment"}
    send = doc["operations"]["billing.send.payment"]
    assert send["action"] == "send"
    assert "payment.completed.v1" in doc["components"]["messages"]
