"""The receiver applies deliveries through the consumer's own transaction path: batch handlers
(called with a list of one) and deferred writes work as for Kafka records, a failing deferred
write fails the delivery like a raising handler, and a webhook and a Kafka record with the same
event id in the same namespace are one event."""

from __future__ import annotations

import uuid
from typing import TypeAlias

import asyncpg
import httpx
import orjson
from pydantic import BaseModel

from consumerkit import BatchContext, HandlerContext, Limits, Postgres, WebhookReceiver, handler
from consumerkit.testing import TestConsumer

from .conftest import serve
from .handlers import with_search_path

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
NAMESPACE = "billing"


class Invoice(BaseModel):
    invoice_id: str
    amount: int


calls: list[list[str]] = []  # event ids of each batch call
read: dict[str, int] = {}  # event id -> rows of its invoice it read after deferring its write


@handler("invoice.paid", batch=True)
async def record_invoices(events: list[Invoice], ctx: BatchContext) -> None:
    calls.append([env.event_id for env in ctx.envelopes])
    for event, env in zip(events, ctx.envelopes, strict=True):
        ctx.defer("INSERT INTO invoices (event_id, invoice_id, amount) VALUES ($1, $2, $3)",
                  env.event_id, event.invoice_id, event.amount)
        read[env.event_id] = await ctx.tx.fetchval(
            "SELECT count(*) FROM invoices WHERE invoice_id = $1", event.invoice_id)


@handler("invoice.voided")
async def void_invoice(event: Invoice, ctx: HandlerContext) -> None:
    # amount must be positive: a voided invoice with amount 0 is refused by the database when
    # the deferred write is sent, before the commit
    ctx.defer("INSERT INTO invoices (event_id, invoice_id, amount) VALUES ($1, $2, $3)",
              ctx.envelope.event_id, event.invoice_id, event.amount)


async def test_webhooks_and_records_share_the_transaction_path_and_the_dedup(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool,
) -> None:
    await pg_pool.execute(f'CREATE SCHEMA IF NOT EXISTS "{pg_schema}"')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".invoices (id bigserial PRIMARY KEY, '
                          "event_id text NOT NULL, invoice_id text NOT NULL, "
                          "amount int NOT NULL CHECK (amount > 0))")
    dsn = with_search_path(postgres_dsn, pg_schema)
    receiver = WebhookReceiver([record_invoices, void_invoice], namespace=NAMESPACE,
                               postgres=Postgres(dsn=dsn, schema=pg_schema),
                               allow_unsigned=True)
    paid, voided = str(uuid.uuid4()), str(uuid.uuid4())
    invoice = f"inv-{uuid.uuid4().hex[:8]}"

    async def post(client: httpx.AsyncClient, key: str, event_type: str, amount: int,
                   ) -> httpx.Response:
        body = orjson.dumps({"invoice_id": invoice, "amount": amount})
        return await client.post("/", content=body, headers={
            "Idempotency-Key": key, "X-Event-Type": event_type})

    async with serve(receiver) as url, httpx.AsyncClient(base_url=url, timeout=20) as client:
        first = await post(client, paid, "invoice.paid", 5)
        again = await post(client, paid, "invoice.paid", 5)
        refused = await post(client, voided, "invoice.voided", 0)
    assert (first.status_code, first.json()["status"]) == (200, "applied")
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    assert calls == [[paid]]  # a batch of one; the duplicate never reached the handler
    assert read == {paid: 1}  # it read its own deferred write
    # the refused deferred write fails the delivery as a raising handler would: rolled back;
    # a row the database refuses for its values (SQLSTATE class 23) would be refused again,
    # so the sender is told not to retry it
    assert (refused.status_code, refused.json()["error"]) == (422, "rejected")
    assert "CheckViolationError" in refused.json()["detail"]

    # a Kafka record of the same event in the same namespace is the same event: a duplicate;
    # the voided one was never applied, so its record applies now (with a valid amount)
    async with TestConsumer([record_invoices, void_invoice],
                            postgres=Postgres(dsn=dsn, schema=pg_schema),
                            limits=Limits(max_batch=10),
                            name=NAMESPACE) as kit:
        kit.publish(Invoice(invoice_id=invoice, amount=5), key=invoice,
                    event_type="invoice.paid", event_id=paid)
        kit.publish(Invoice(invoice_id=invoice, amount=7), key=invoice,
                    event_type="invoice.voided", event_id=voided)
        await kit.drain()
    assert [s.event_id for s in kit.duplicates] == [paid]
    assert [s.event_id for s in kit.applied] == [voided]
    rows = await pg_pool.fetch(
        f'SELECT event_id, amount FROM "{pg_schema}".invoices ORDER BY id')
    assert [(r["event_id"], r["amount"]) for r in rows] == [(paid, 5), (voided, 7)]
