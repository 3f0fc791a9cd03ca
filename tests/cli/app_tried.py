"""A consumer for the ``consumerkit check --try-handlers`` tests, loaded by MODULE:ATTR: its
handlers need tables of their own (``charges``, ``order_lines``, ``order_notes`` with a
``note`` column) in
the schema named by ``$CHECK_TEST_SCHEMA``, and ``audit``, whose failure one catches. One
reads a row it expects to find, one takes a model no instance of which can be made up."""

from __future__ import annotations

import os

import asyncpg
from pydantic import BaseModel, ConfigDict

from consumerkit import BatchContext, Consumer, HandlerContext, HandlerRegistry, Outbox, Postgres

handlers = HandlerRegistry()


def _schema() -> str:
    return os.environ["CHECK_TEST_SCHEMA"]


class Order(BaseModel):
    order_id: str
    amount: int


class Payment(BaseModel):
    order_id: str
    amount_cents: int


class Cancellation(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"order_id": "o-9"}]})
    order_id: str


class Money:
    """Not a model, and not a type a value can be made up for."""


class Refund(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    money: Money


@handlers.handler("payment.captured")
async def record_charge(event: Payment, ctx: HandlerContext) -> None:
    async with ctx.tx.transaction():  # a savepoint
        await ctx.tx.execute(
            f'INSERT INTO "{_schema()}".charges (order_id, amount_cents) VALUES ($1, $2)',
            event.order_id, event.amount_cents)
    await ctx.publish(event_type="charge.recorded", aggregate_type="charge",
                      aggregate_id=event.order_id, payload={"order_id": event.order_id})


@handlers.handler("order.created", batch=True)
async def note_orders(events: list[Order], ctx: BatchContext) -> None:
    await ctx.tx.copy_records_to_table(
        "order_lines", records=[(e.order_id, e.amount) for e in events],
        columns=["order_id", "amount"], schema_name=_schema())
    for event in events:
        ctx.defer(f'INSERT INTO "{_schema()}".order_notes (order_id, note) VALUES ($1, $2)',
                  event.order_id, f"{event.amount} cents")


@handlers.handler("order.cancelled")
async def cancel(event: Cancellation, ctx: HandlerContext) -> None:
    row = await ctx.tx.fetchrow(
        f'SELECT order_id FROM "{_schema()}".order_notes WHERE order_id = $1', event.order_id)
    if row is None:
        raise LookupError(f"no order {event.order_id}")


@handlers.handler("order.shipped")
async def audit(event: Cancellation, ctx: HandlerContext) -> None:
    try:  # an audit row is best effort: its failure is logged, not raised
        await ctx.tx.execute(f'INSERT INTO "{_schema()}".audit (order_id) VALUES ($1)',
                             event.order_id)
    except asyncpg.PostgresError as exc:
        ctx.log.warning("audit row not written: %s", exc)


@handlers.handler("refund.issued")
async def refund(event: Refund, ctx: HandlerContext) -> None:
    del event, ctx


def consumer() -> Consumer:
    return Consumer(name="orders", handlers=[handlers], topics=["orders"],
                    postgres=Postgres(schema=_schema()),
                    outbox=Outbox(_schema(), "shop_outbox"), handle_signals=False)
