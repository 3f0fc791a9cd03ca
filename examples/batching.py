"""Sizing batch transactions: a consumer whose handlers only write through ``ctx.tx`` applies
many records per transaction; a consumer whose handlers await a slow call to another service
gets one transaction per record (``Limits(max_batch=1)``), so a slow call holds up only its own
record."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

import examples.billing
from consumerkit import Consumer, HandlerContext, Kafka, Limits, Postgres, handler


def build_database_only(kafka: str, postgres: str) -> Consumer:
    # handlers that only write through ctx.tx: few, large transactions
    return Consumer(
        name="billing",
        handlers=[examples.billing.billing],
        topics=["orders"],
        postgres=Postgres(dsn=postgres),
        kafka=Kafka(bootstrap=kafka),
        limits=Limits(
            concurrency=4,        # batch transactions at once (the pool holds 6 connections)
            max_batch=500,        # records in one transaction at most
            max_in_flight=5_000,  # records fetched and not yet settled: enough to fill them
        ),
    )


class OrderPaid(BaseModel):
    order_id: str
    email: str


async def send_receipt(email: str, order_id: str, idempotency_key: str) -> None:
    """Stands for a call to another service, such as an HTTP request."""
    await asyncio.sleep(0.2)


@handler("order.paid")
async def email_receipt(event: OrderPaid, ctx: HandlerContext) -> None:
    # not covered by the transaction: it can happen more than once, so it carries a key
    # the other service uses to recognise a repeat
    await send_receipt(event.email, event.order_id, idempotency_key=ctx.envelope.event_id)
    await ctx.tx.execute("INSERT INTO receipts (order_id) VALUES ($1)", event.order_id)


def build_slow_io(kafka: str, postgres: str) -> Consumer:
    # handlers that await slow I/O: one transaction per record, many at once
    return Consumer(
        name="receipts",
        handlers=[email_receipt],
        topics=["payments"],
        postgres=Postgres(dsn=postgres),
        kafka=Kafka(bootstrap=kafka),
        limits=Limits(
            max_batch=1,     # in a batch, handlers run one after another on one connection
            concurrency=64,  # 64 slow calls at once (the pool holds 66 connections)
        ),
    )
