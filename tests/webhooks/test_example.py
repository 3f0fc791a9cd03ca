"""examples/webhooks.py against PostgreSQL and uvicorn: its receiver applies a payment posted
twice once, served with the lifespan protocol or opened by its lifespan helper; its sinks keep
the token to themselves and route by event type."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TypeAlias

import asyncpg
import pytest

from consumerkit import WebhookSink
from consumerkit.outbox import OutboxEvent
from consumerkit.webhook import generate_secret
from examples import webhooks

from .conftest import Lifespan, serve
from .handlers import with_search_path

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"


def captured(payment_id: str) -> OutboxEvent:
    payload = webhooks.PaymentCaptured(payment_id=payment_id, order_id="o-1", amount_cents=990)
    return OutboxEvent(seq=1, event_id=uuid.uuid4(), event_type="payment.captured",
                       aggregate_type="payment", aggregate_id=payment_id,
                       payload=payload.model_dump_json().encode(),
                       occurred_at=datetime.now(UTC))


@pytest.mark.parametrize("lifespan", ["on", "off"])
async def test_the_example_receiver_applies_a_payment_posted_twice_once(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool, lifespan: Lifespan,
) -> None:
    await pg_pool.execute(f'CREATE SCHEMA "{pg_schema}"')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".payments (payment_id text PRIMARY KEY, '
                          "order_id text NOT NULL, amount_cents bigint NOT NULL)")
    secret = generate_secret()
    receiver = webhooks.build_receiver(with_search_path(postgres_dsn, pg_schema), [secret],
                                       pg_schema)
    event = captured(f"pay-{uuid.uuid4().hex[:8]}")
    async with serve(receiver, lifespan=lifespan) as url:
        sink = WebhookSink(f"{url}/hooks/payments", secrets=secret)
        await sink.open()
        try:
            if lifespan == "off":  # mounted elsewhere: the application's lifespan opens it
                async with webhooks.lifespan_for(receiver)(None):
                    results = [*await sink.send([event]), *await sink.send([event])]
            else:
                results = [*await sink.send([event]), *await sink.send([event])]
        finally:
            await sink.close()
    assert results == [None, None]
    rows = await pg_pool.fetch(f'SELECT * FROM "{pg_schema}".payments')
    assert [(r["payment_id"], r["amount_cents"]) for r in rows] == [(event.aggregate_id, 990)]


def test_the_example_sinks_hide_secrets_and_token_and_route_by_event_type() -> None:
    secret = generate_secret()
    sink = webhooks.build_sink([secret])
    assert secret not in repr(sink)
    assert secret[6:] not in repr(sink)
    assert "https://partner.example.com/hooks/payments" in repr(sink)
    routed = repr(webhooks.build_routed_sink([secret], "tok-123"))
    assert "tok-123" not in routed
    assert secret[6:] not in routed
    refund = OutboxEvent(seq=1, event_id=uuid.uuid4(), event_type="refund.issued",
                         aggregate_type="payment", aggregate_id="p-1", payload=b"{}",
                         occurred_at=datetime.now(UTC))
    assert webhooks.partner_url(refund) == "https://partner.example.com/hooks/refunds"
    relay = webhooks.build_relay("postgresql://app@db.invalid/app", [secret])
    assert isinstance(relay.sink, WebhookSink)
    assert secret[6:] not in repr(relay.sink)
